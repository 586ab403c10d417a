"""Linear merging and task arithmetic: weighted sums of the models or of their task vectors."""
