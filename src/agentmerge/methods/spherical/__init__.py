"""The spherical family of merge methods."""
