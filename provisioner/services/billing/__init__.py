"""The ledger, prices and metering (docs/billing.md)."""
