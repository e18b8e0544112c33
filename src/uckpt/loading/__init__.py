"""Load: a checkpoint's manifest and chunks up into arrays and live objects."""
