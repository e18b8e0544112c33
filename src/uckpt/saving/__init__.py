"""Save: plan, snapshot, write and commit, for any number of ranks."""
