"""The optimizer-only crossover screen (``bench screen``): ``optimizer.step()`` alone, with its launch floor."""
