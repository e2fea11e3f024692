"""Pytest fixtures for the fake Kubernetes API server (filled in by the fake's author)."""
