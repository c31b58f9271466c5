"""gradebook: letter grades, weighted averages and rankings."""

__version__ = "0.2.0"
