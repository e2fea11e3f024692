"""PodMetrics and NodeMetrics as a `meta.k8s.io` Table, for `kubectl get podmetrics|nodemetrics`.

The columns and cells are metrics-server's (v0.8.0 `pkg/api/table.go`: `Name`, one column per
resource of the first object, sorted, a pod's containers summed, then `Window`); the rows'
objects follow the generic apiserver's `asTable` (`includeObject`: `Metadata` by default, a
`PartialObjectMetadata`; `Object`, the whole object; `None`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from adapter.api.usage import API_VERSION
from metricscale.core.quantity import Format, format_quantity, parse_quantity
from metricscale.core.selectors import quote_go_string

__all__ = ["IncludeObjectError", "metrics_table", "parse_include_object"]

_INCLUDE_OBJECT = {"": "Metadata", "Metadata": "Metadata", "Object": "Object", "None": "None"}
_NAME_COLUMN = {"name": "Name", "type": "string", "format": "name",
                "description": "Name of the resource", "priority": 0}
_WINDOW_COLUMN = {"name": "Window", "type": "string", "format": "duration", "description": "",
                  "priority": 0}


class IncludeObjectError(ValueError):
    """`includeObject` is none of `Object`, `Metadata`, `None` or empty (upstream: 400)."""


def parse_include_object(value: str | None) -> str:
    """`Object`, `Metadata` or `None` from the `includeObject` parameter (absent: `Metadata`)."""
    if value is None:
        return "Metadata"
    try:
        return _INCLUDE_OBJECT[value]
    except KeyError:
        raise IncludeObjectError(
            "Unable to convert to Table as requested: includeObject: Invalid value: "
            f"{quote_go_string(value)}: must be 'Metadata', 'Object', 'None', or empty",
        ) from None


def _cell(resource: str, value: Decimal) -> str:
    # metrics-server's quantities: CPU a DecimalSI, memory a BinarySI; a sum keeps the format
    # (`Quantity.Add`), then prints canonically (`String`).
    return format_quantity(value, Format.DECIMAL_SI if resource == "cpu" else Format.BINARY_SI)


def _pod_usage(item: Mapping[str, Any]) -> dict[str, str]:
    totals: dict[str, Decimal] = {}
    for container in item.get("containers") or ():
        for resource, quantity in (container.get("usage") or {}).items():
            totals[resource] = totals.get(resource, Decimal(0)) + parse_quantity(quantity)
    return {resource: _cell(resource, total) for resource, total in totals.items()}


def _row_object(item: Mapping[str, Any], *, kind: str, version: str,
                include_object: str) -> dict[str, Any] | None:
    if include_object == "None":
        return None
    if include_object == "Object":
        return {"kind": kind, "apiVersion": API_VERSION,
                **{key: value for key, value in item.items()
                   if key not in ("kind", "apiVersion")}}
    return {"kind": "PartialObjectMetadata", "apiVersion": f"meta.k8s.io/{version}",
            "metadata": item.get("metadata") or {}}


def metrics_table(body: Mapping[str, Any], *, version: str,
                  include_object: str = "Metadata") -> dict[str, Any]:
    """The Table of a PodMetrics, NodeMetrics or a list of either (`version`: v1 or v1beta1).

    As upstream, an empty list has no columns (`null`) and no rows (`null`).
    """
    kind = str(body.get("kind", ""))
    items: Sequence[Mapping[str, Any]] = (body.get("items") or () if kind.endswith("List")
                                          else (body,))
    kind = kind.removesuffix("List")
    columns: list[dict[str, Any]] | None = None
    names: list[str] = []
    rows: list[dict[str, Any]] = []
    for item in items:
        usage = _pod_usage(item) if kind == "PodMetrics" else dict(item.get("usage") or {})
        if columns is None:
            names = sorted(usage)
            columns = [_NAME_COLUMN, *({"name": name, "type": "string", "format": "quantity",
                                        "description": "", "priority": 0} for name in names),
                       _WINDOW_COLUMN]
        metadata = item.get("metadata") or {}
        cells = [metadata.get("name", ""),
                 *(usage.get(name) or _cell(name, Decimal(0)) for name in names),
                 item.get("window", "")]
        rows.append({"cells": cells, "object": _row_object(
            item, kind=kind, version=version, include_object=include_object)})
    return {"kind": "Table", "apiVersion": f"meta.k8s.io/{version}", "metadata": {},
            "columnDefinitions": columns, "rows": rows or None}
