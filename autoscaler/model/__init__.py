"""The autoscaler's values, parsed from the Kubernetes wire format and rendered back: spec,
status, pods, scale, metric values and history (pure)."""
