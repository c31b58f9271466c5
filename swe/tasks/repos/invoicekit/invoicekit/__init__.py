"""invoicekit: line items, totals, discounts and tax for small invoices."""

__version__ = "0.3.1"
