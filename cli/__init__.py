"""The `metricscale` command: the subcommand dispatcher, `certs` and `demo`."""
