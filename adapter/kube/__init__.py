"""The adapter's Kubernetes operations: object caches and the authentication ConfigMap."""
