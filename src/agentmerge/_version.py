"""The package version, in one place (the package root, the model card and merge.json read it)."""

__version__ = "0.1.0"
