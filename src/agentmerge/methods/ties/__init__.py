"""The ties family of merge methods."""
