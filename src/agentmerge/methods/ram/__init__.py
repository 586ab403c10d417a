"""The ram family of merge methods."""
