"""The package version (read by the results cache key and by ``em.__version__``)."""

__version__ = "0.1.0"
