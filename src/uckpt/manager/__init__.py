"""The CheckpointManager: when to save, what to keep, on which tiers."""
