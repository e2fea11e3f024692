"""The API groups the adapter serves and their versions (what `/apis` lists).

`metrics.k8s.io` is served only when the configuration has `resourceRules`, as upstream.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "API_GROUP_VERSIONS",
    "CUSTOM_METRICS_GROUP",
    "CUSTOM_METRICS_VERSIONS",
    "EXTERNAL_METRICS_GROUP",
    "EXTERNAL_METRICS_VERSIONS",
    "RESOURCE_METRICS_GROUP",
    "RESOURCE_METRICS_VERSIONS",
    "served_group_versions",
]

CUSTOM_METRICS_GROUP = "custom.metrics.k8s.io"
EXTERNAL_METRICS_GROUP = "external.metrics.k8s.io"
CUSTOM_METRICS_VERSIONS = ("v1beta2", "v1beta1")  # preference order
EXTERNAL_METRICS_VERSIONS = ("v1beta1",)
RESOURCE_METRICS_GROUP = "metrics.k8s.io"
RESOURCE_METRICS_VERSIONS = ("v1beta1",)
# Every group, in the order `/apis` lists them, each with its versions in preference order.
API_GROUP_VERSIONS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    CUSTOM_METRICS_GROUP: CUSTOM_METRICS_VERSIONS,
    EXTERNAL_METRICS_GROUP: EXTERNAL_METRICS_VERSIONS,
    RESOURCE_METRICS_GROUP: RESOURCE_METRICS_VERSIONS})
_WITHOUT_RESOURCE_METRICS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    group: versions for group, versions in API_GROUP_VERSIONS.items()
    if group != RESOURCE_METRICS_GROUP})


def served_group_versions(*, resource_metrics: bool) -> Mapping[str, tuple[str, ...]]:
    """The groups an adapter serves: metrics.k8s.io only with `resourceRules`."""
    return API_GROUP_VERSIONS if resource_metrics else _WITHOUT_RESOURCE_METRICS
