"""Shared pytest configuration: the fixtures of the shared test doubles."""

pytest_plugins = [
    "tests.fakes.kube_fixtures",
    "tests.fakes.prometheus_fixtures",
]
