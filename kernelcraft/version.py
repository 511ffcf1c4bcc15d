"""The package version (its own module: lower stages record it without importing the public API)."""
__version__ = "0.1.0"
