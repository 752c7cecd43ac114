"""Your own command as a tier (``bench command``): a fresh process per trial, the same protocol."""
