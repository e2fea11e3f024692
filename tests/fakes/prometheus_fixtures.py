"""Pytest fixtures for the real Prometheus test double (filled in by its author)."""
