"""The autoscaler: HPA-compatible decisions, a controller that acts on them, and explain."""
