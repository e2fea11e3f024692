"""prometheus-adapter's rules as pure code: config, naming, templates, resources, PromQL."""
