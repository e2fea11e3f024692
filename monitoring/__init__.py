"""Dashboards and alerts of both programs, generated as Kubernetes manifests."""
