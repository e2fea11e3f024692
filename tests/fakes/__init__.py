"""Temporary aliases: the test doubles moved to testbed.fakes (work in flight still imports
tests.fakes.*). Removed once nothing does."""

import importlib
import sys

_MODULES = (
    "cadvisor",
    "exporter",
    "keda_metrics",
    "kube_aggregator",
    "kube_api",
    "kube_cel",
    "kube_errors",
    "kube_fixtures",
    "kube_handlers",
    "kube_http",
    "kube_objects",
    "kube_patch",
    "kube_resources",
    "kube_schema",
    "kube_selectors",
    "kube_store",
    "kube_strategy",
    "prometheus",
    "prometheus_fixtures",
    "tools",
)

for _name in _MODULES:
    sys.modules[f"{__name__}.{_name}"] = importlib.import_module(f"testbed.fakes.{_name}")
