"""State trees: flattening a state into a skeleton and array leaves, and back."""
