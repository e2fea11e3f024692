"""metricscale: shared pieces of the adapter and the autoscaler, and the `metricscale` command."""

__version__ = "0.1.0"
