"""The adapter's Prometheus I/O: the async HTTP API client and metric relisting."""
