"""Accounts, projects and tokens (docs/accounts.md)."""
