"""statkit: summary statistics for plain lists of numbers."""

__version__ = "0.7.0"
