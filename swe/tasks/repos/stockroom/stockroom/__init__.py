"""stockroom: a stock ledger and purchase orders."""

__version__ = "2.0.1"
