"""pagekit: pagination of sequences and cursor-based APIs."""

__version__ = "0.9.0"
