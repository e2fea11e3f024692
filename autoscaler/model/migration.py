"""HorizontalPodAutoscaler and Autoscaler manifests made from each other: the same spec, and
what one side says that the other cannot (reported, never dropped in silence)."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autoscaler.model.fields import ModelError
from autoscaler.model.objects import (
    AUTOSCALER_API_VERSION,
    AUTOSCALER_KIND,
    HPA_API_VERSION,
    HPA_KIND,
)
from autoscaler.model.spec import METRIC_SOURCE_KEYS, OWNER_REFERENCES, parse_spec
from autoscaler.model.validation import validate_spec

__all__ = [
    "Conversion",
    "ConversionError",
    "autoscaler_from_hpa",
    "hpa_from_autoscaler",
]

_OURS = "metricscale.dev/"
# The controller's memory of a native HPA (autoscaler.decision.persistence.HISTORY_ANNOTATION):
# not part of a manifest; a hand-over carries it separately.
_HISTORY = "metricscale.dev/history"
_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
# What autoscaling/v1 round trips leave on an HPA; nothing a manifest should carry.
_CONVERSION_PREFIX = "autoscaling.alpha.kubernetes.io/"


class ConversionError(ValueError):
    """The object cannot be converted; the message names the field and says why."""


@dataclass(frozen=True)
class Conversion:
    """A manifest made from another kind's object; `dropped` is what it could not carry
    (`path: why`), `notes` what it carried but is worth knowing."""

    manifest: dict[str, Any]
    dropped: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        meta = self.manifest["metadata"]
        return f"{meta.get('namespace', '')}/{meta['name']}"


def _metadata(source: Mapping[str, Any], *, keep: Any) -> dict[str, Any]:
    meta = source.get("metadata") if isinstance(source.get("metadata"), Mapping) else {}
    assert isinstance(meta, Mapping)
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise ConversionError("metadata.name: is required")
    out: dict[str, Any] = {"name": name}
    if meta.get("namespace"):
        out["namespace"] = str(meta["namespace"])
    labels = meta.get("labels")
    if isinstance(labels, Mapping) and labels:
        out["labels"] = {str(k): str(v) for k, v in labels.items()}
    annotations = meta.get("annotations")
    if isinstance(annotations, Mapping):
        kept = {str(k): str(v) for k, v in annotations.items() if keep(str(k))}
        if kept:
            out["annotations"] = kept
    return out


def _spec_of(source: Mapping[str, Any], kind: str) -> dict[str, Any]:
    spec = source.get("spec")
    if not isinstance(spec, Mapping):
        raise ConversionError(f"spec: the {kind} has no spec")
    return copy.deepcopy(dict(spec))


def autoscaler_from_hpa(hpa: Mapping[str, Any]) -> Conversion:
    """The Autoscaler equivalent to an autoscaling/v2 HPA: its spec field for field (the
    Autoscaler's spec is the HPA's), our own fields left out, so each keeps upstream's
    behaviour (no fallback, activation, idle size or own sync period; pods by label selector).

    Raises ConversionError when the HPA's spec holds what the Autoscaler CRD would refuse or
    prune (a field newer than this version of metricscale), naming the field.
    """
    if (hpa.get("apiVersion"), hpa.get("kind")) not in {(HPA_API_VERSION, HPA_KIND), (None, None)}:
        raise ConversionError(f"expected an {HPA_API_VERSION} {HPA_KIND}, not "
                              f"{hpa.get('apiVersion')} {hpa.get('kind')}")
    spec = _spec_of(hpa, HPA_KIND)
    try:
        # strict: a field the CRD does not know would be pruned without a word.
        validate_spec(spec, "spec", strict=True)
        parsed = parse_spec(spec, "spec")
    except ModelError as err:
        raise ConversionError(f"{err.path}: {err.message}: the Autoscaler cannot say this, so "
                              "the HPA is not converted") from None
    notes: list[str] = []
    behavior = spec.get("behavior") if isinstance(spec.get("behavior"), Mapping) else None
    scale_down = behavior.get("scaleDown") if behavior is not None else None
    if not isinstance(scale_down, Mapping) or scale_down.get(
            "stabilizationWindowSeconds") is None:
        notes.append(
            "spec.behavior.scaleDown.stabilizationWindowSeconds is not set: the scale-down "
            "window is the controller's flag --horizontal-pod-autoscaler-downscale-"
            "stabilization (kube-controller-manager's for the HPA, metricscale autoscaler's for "
            "the Autoscaler; both default to 5m): keep them equal, or write the window into the "
            "spec")
    if parsed.min_replicas == 0:
        notes.append("spec.minReplicas is 0: the Autoscaler scales to zero only when the "
                     "controller runs with --scale-to-zero")
    annotations = (hpa.get("metadata") or {}).get("annotations") or {}
    if any(str(k).startswith(_OURS) and k != _HISTORY for k in annotations):
        notes.append("the HPA's metricscale.dev/ annotations (pause, dry run) are carried over "
                     "and act on the Autoscaler")

    def keep(key: str) -> bool:
        return key not in {_LAST_APPLIED, _HISTORY} and not key.startswith(_CONVERSION_PREFIX)

    manifest = {"apiVersion": AUTOSCALER_API_VERSION, "kind": AUTOSCALER_KIND,
                "metadata": _metadata(hpa, keep=keep), "spec": spec}
    return Conversion(manifest=manifest, notes=tuple(notes))


def _fallback_words(fallback: Mapping[str, Any]) -> str:
    behavior = fallback.get("behavior") or "static"
    if behavior == "static":
        return f"proposes {fallback.get('replicas')} replicas"
    return f"proposes a size by its behavior {behavior}"


def hpa_from_autoscaler(autoscaler: Mapping[str, Any]) -> Conversion:
    """The autoscaling/v2 HPA closest to an Autoscaler: the same spec without our own fields;
    each field or annotation left out is in `dropped`, with what the HPA does instead."""
    if (autoscaler.get("apiVersion"), autoscaler.get("kind")) not in {
            (AUTOSCALER_API_VERSION, AUTOSCALER_KIND), (None, None)}:
        raise ConversionError(f"expected a {AUTOSCALER_API_VERSION} {AUTOSCALER_KIND}, not "
                              f"{autoscaler.get('apiVersion')} {autoscaler.get('kind')}")
    spec = _spec_of(autoscaler, AUTOSCALER_KIND)
    dropped: list[str] = []
    notes: list[str] = []
    for index, metric in enumerate(spec.get("metrics") or []):
        if not isinstance(metric, dict):
            continue
        key = METRIC_SOURCE_KEYS.get(str(metric.get("type")))
        source = metric.get(key) if key is not None else None
        if not isinstance(source, dict):
            continue
        where = f"spec.metrics[{index}].{key}"
        fallback = source.pop("fallback", None)
        if isinstance(fallback, Mapping):
            dropped.append(f"{where}.fallback: no HPA equivalent: while this metric cannot be "
                           "read the HPA refuses to scale down and keeps the size, where the "
                           f"Autoscaler {_fallback_words(fallback)}")
        threshold = source.pop("activationThreshold", None)
        if threshold is not None:
            dropped.append(f"{where}.activationThreshold: no HPA equivalent: the metric "
                           f"counts at any value (here it counted above {threshold})")
    idle = spec.pop("idle", None)
    if isinstance(idle, Mapping):
        dropped.append(
            f"spec.idle: no HPA equivalent: the HPA does not rest the target at "
            f"{idle.get('replicas', 0)} replicas while no metric is active; it stays within "
            f"minReplicas ({spec.get('minReplicas', 1)}) and maxReplicas")
    strategy = spec.pop("podSelectionStrategy", None)
    if strategy == OWNER_REFERENCES:
        dropped.append("spec.podSelectionStrategy: OwnerReferences has no HPA equivalent yet "
                       "(KEP-5325): the HPA counts every pod the target's selector matches, "
                       "other workloads' pods and a rollout's new pods included")
    behavior = spec.get("behavior")
    if isinstance(behavior, dict):
        period = behavior.pop("syncPeriodSeconds", None)
        if period is not None:
            dropped.append(f"spec.behavior.syncPeriodSeconds: no HPA equivalent: the HPA syncs "
                           f"every --horizontal-pod-autoscaler-sync-period of kube-controller-"
                           f"manager (default 15s), not every {period}s")
        if not behavior:
            spec.pop("behavior")
    if spec.get("minReplicas") == 0:
        notes.append("spec.minReplicas is 0: the API server accepts it only with the "
                     "HPAScaleToZero feature gate")

    annotations = (autoscaler.get("metadata") or {}).get("annotations") or {}
    for key in sorted(str(k) for k in annotations):
        if key.startswith(_OURS) and key != _HISTORY:
            dropped.append(f"metadata.annotations[{key}]: kube-controller-manager ignores it "
                           "(metricscale's native-HPA mode honours it)")
    status = autoscaler.get("status")
    if isinstance(status, Mapping) and status.get("history"):
        notes.append("status.history is not carried: kube-controller-manager starts the HPA as "
                     "after its own restart, holding the current size for its downscale window")

    def keep(key: str) -> bool:
        return key != _LAST_APPLIED and not key.startswith(_OURS)

    manifest = {"apiVersion": HPA_API_VERSION, "kind": HPA_KIND,
                "metadata": _metadata(autoscaler, keep=keep), "spec": spec}
    return Conversion(manifest=manifest, dropped=tuple(dropped), notes=tuple(notes))
