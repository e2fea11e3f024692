"""Test doubles shared by every test: a fake Kubernetes API server and a real Prometheus."""
