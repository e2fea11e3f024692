"""The shared pure library: quantities, label selectors, Go durations and proxy choice."""
