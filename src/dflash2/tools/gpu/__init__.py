"""The remote-GPU training path: `job` (train, smoke, check) and `parts` (split, join, collect)."""
