"""The head-memory probe tier (``bench probe``): a head's time and memory together under a device budget."""
