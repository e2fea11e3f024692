"""Delegated authentication and authorization against the cluster, and serving TLS."""
