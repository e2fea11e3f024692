"""The API groups the adapter serves and their versions (what `/apis` lists)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = [
    "API_GROUP_VERSIONS",
    "CUSTOM_METRICS_GROUP",
    "CUSTOM_METRICS_VERSIONS",
    "EXTERNAL_METRICS_GROUP",
    "EXTERNAL_METRICS_VERSIONS",
]

CUSTOM_METRICS_GROUP = "custom.metrics.k8s.io"
EXTERNAL_METRICS_GROUP = "external.metrics.k8s.io"
CUSTOM_METRICS_VERSIONS = ("v1beta2", "v1beta1")  # preference order
EXTERNAL_METRICS_VERSIONS = ("v1beta1",)
# Both groups, in the order `/apis` lists them, each with its versions in preference order.
API_GROUP_VERSIONS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    CUSTOM_METRICS_GROUP: CUSTOM_METRICS_VERSIONS,
    EXTERNAL_METRICS_GROUP: EXTERNAL_METRICS_VERSIONS})
