"""The autoscaler's Kubernetes operations: scale, status, events, leases and the metrics APIs."""
