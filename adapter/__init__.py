"""The metrics adapter: custom, external and resource metrics APIs served from Prometheus."""
