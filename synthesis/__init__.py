"""Verifiable training environments synthesised from capability gaps (issue 5)."""
