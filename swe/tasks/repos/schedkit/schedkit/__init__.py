"""schedkit: clock times and meeting intervals."""

__version__ = "0.4.2"
