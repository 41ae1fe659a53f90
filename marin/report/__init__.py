"""Transparency reports built from the ledger."""
