"""The release of this package (pyproject.toml reads it from here)."""

__version__ = "0.3.0"
