"""textkit: slugs, truncation, wrapping and casing."""

__version__ = "1.2.0"
