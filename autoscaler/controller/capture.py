"""`metricscale explain --live`: a decision snapshot captured from a cluster, with the history the
controller persisted, made of the same requests one reconcile makes.

The snapshot is what `metricscale explain FILE` reads (see snapshot.md): the autoscaler as the
API returns it, the target's Scale (or the error reading it), the pods its selector picks, one
metrics API answer per metric, and the stabilization history read back as a new leader would
read it. `explain` then decides exactly as the controller would.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from autoscaler.controller.leader import LeaderElectionConfig, default_lease_namespace
from autoscaler.controller.reconciler import MetricsAPI, fetch_metric, needs_metrics
from autoscaler.decision.handover import carried_history
from autoscaler.decision.persistence import restore_history
from autoscaler.decision.settings import (
    SETTINGS_ANNOTATION,
    Settings,
    SettingsError,
    given_settings,
    render_settings,
    resolve_settings,
)
from autoscaler.decision.shadow import SHADOW_NAME, describe_entry, entry_key, parse_entry
from autoscaler.decision.snapshot import SNAPSHOT_API_VERSION, SNAPSHOT_KIND, SnapshotError
from autoscaler.kube.metrics_api import MetricsClient, MetricsError
from autoscaler.kube.operations import (
    AUTOSCALER_GROUP,
    AUTOSCALER_PLURAL,
    AUTOSCALER_VERSION,
    ScaleTargetRef,
    open_kube_client,
)
from autoscaler.model.fields import ModelError
from autoscaler.model.history import History, render_history
from autoscaler.model.names import dns_label_problem, dns_subdomain_problem
from autoscaler.model.objects import HPA_KIND, parse_autoscaler
from autoscaler.model.pods import Scale
from autoscaler.model.spec import LABEL_SELECTOR, MetricSpec
from autoscaler.model.times import format_time_precise
from metricscale.kube.config import open_configuration, resolve_kubeconfig
from metricscale.kube.discovery import ResourceMapping
from metricscale.kube.errors import ErrorContext, KubeError

__all__ = ["CaptureAPI", "ShadowPublished", "capture_document", "capture_snapshot",
           "object_path", "read_shadow"]


class CaptureAPI(Protocol):
    """The reads a capture makes (autoscaler.kube.operations.KubeClient)."""

    async def get_json(self, path: str, *, query: Sequence[tuple[str, str]] = (),
                       operation: str, resource: str,
                       context: ErrorContext | None = None) -> Any: ...

    async def resolve_scale_target(self, ref: ScaleTargetRef) -> ResourceMapping: ...

    async def get_scale(self, target: ResourceMapping, *, namespace: str,
                        name: str) -> Scale: ...


def object_path(*, namespace: str, name: str, hpa: bool) -> str:
    if hpa:
        return f"/apis/autoscaling/v2/namespaces/{namespace}/horizontalpodautoscalers/{name}"
    return (f"/apis/{AUTOSCALER_GROUP}/{AUTOSCALER_VERSION}/namespaces/{namespace}/"
            f"{AUTOSCALER_PLURAL}/{name}")


async def capture_snapshot(kube: CaptureAPI, metrics: MetricsAPI, *, namespace: str, name: str,
                           hpa: bool, now: datetime, settings: Settings) -> dict[str, Any]:
    """The snapshot document of one autoscaler now; raises SnapshotError when the autoscaler
    itself cannot be read (everything else is recorded as the error it was)."""
    where = f"{'HorizontalPodAutoscaler' if hpa else 'Autoscaler'} {namespace}/{name}"
    try:
        raw = await kube.get_json(object_path(namespace=namespace, name=name, hpa=hpa),
                                  operation="explain", resource="autoscaler")
    except KubeError as err:
        raise SnapshotError("live", f"cannot read {where}: {err}") from None
    if not isinstance(raw, Mapping):
        raise SnapshotError("live", f"cannot read {where}: not an object")
    document: dict[str, Any] = dict(raw)
    document.setdefault("apiVersion", "autoscaling/v2" if hpa else
                        f"{AUTOSCALER_GROUP}/{AUTOSCALER_VERSION}")
    document.setdefault("kind", HPA_KIND if hpa else "Autoscaler")
    try:
        autoscaler = parse_autoscaler(document, "autoscaler")
    except ModelError as err:
        raise SnapshotError(err.path, err.message) from None

    ref = autoscaler.spec.scale_target_ref
    scale_document: dict[str, Any]
    scale: Scale | None = None
    try:
        mapping = await kube.resolve_scale_target(
            ScaleTargetRef(api_version=ref.api_version, kind=ref.kind, name=ref.name))
        scale = await kube.get_scale(mapping, namespace=namespace, name=ref.name)
        scale_document = dict(scale.raw) or {
            "spec": {"replicas": scale.spec_replicas},
            "status": {"replicas": scale.status_replicas, "selector": scale.selector}}
    except KubeError as err:
        scale_document = {"error": str(err)}

    pods: Any = []
    answers: list[Any] = [None] * len(autoscaler.spec.metrics)
    if scale is not None and scale.selector:
        try:
            pods = await kube.get_json(f"/api/v1/namespaces/{namespace}/pods",
                                       query=[("labelSelector", scale.selector)],
                                       operation="explain", resource="pods")
        except KubeError as err:
            raise SnapshotError("live", f"cannot list the pods of {where}: {err}") from None
        if needs_metrics(autoscaler, scale, settings=settings):
            answers = list(await asyncio.gather(*(
                _snapshot_metric(metrics, metric=spec, namespace=namespace,
                                 selector=scale.selector)
                for spec in autoscaler.spec.metrics)))

    snapshot: dict[str, Any] = {
        "apiVersion": SNAPSHOT_API_VERSION, "kind": SNAPSHOT_KIND,
        "now": format_time_precise(now), "settings": render_settings(settings),
        "autoscaler": document, "scale": scale_document, "pods": pods, "metrics": answers,
    }
    if autoscaler.spec.pod_selection_strategy != LABEL_SELECTOR:
        # KEP-5325: the decision picks the target's pods by the ReplicaSets that own them,
        # as the controller does with its ReplicaSet cache.
        replica_sets: Any = []
        if ref.kind == "Deployment":
            try:
                listed = await kube.get_json(f"/apis/apps/v1/namespaces/{namespace}/replicasets",
                                             operation="explain", resource="replicasets")
            except KubeError as err:
                raise SnapshotError("live", f"cannot list the ReplicaSets of {where}'s "
                                            f"namespace: {err}") from None
            replica_sets = [{"metadata": item.get("metadata") or {}}
                            for item in (listed.get("items") or [] if isinstance(listed, Mapping)
                                         else []) if isinstance(item, Mapping)]
        snapshot["replicaSets"] = replica_sets
    try:
        annotations = (document.get("metadata") or {}).get("annotations")
        persisted = carried_history(kind=HPA_KIND if hpa else "Autoscaler",
                                    status=document.get("status"),
                                    annotations=annotations).history
    except ModelError:
        persisted = None  # explained as a first sync, as the controller would start
    if persisted is not None:
        snapshot["history"] = render_history(restore_history(persisted, now=now))
    return snapshot


async def _snapshot_metric(metrics: MetricsAPI, *, metric: MetricSpec, namespace: str,
                           selector: str) -> Any:
    """A snapshot's `metrics[i]`: the API's answer, or what its failure stands for (a list
    without items, read as the list the metric's type asks for, or `{"error": ...}`)."""
    try:
        return await fetch_metric(metrics, metric=metric, namespace=namespace,
                                  selector=selector)
    except MetricsError as err:
        return {"items": []} if err.empty else {"error": err.detail}


@dataclass(frozen=True)
class ShadowPublished:
    """What shadow mode published for one HPA, as explain shows it: lines for the text output,
    the `shadow` object of the JSON output, and the history to decide with (None: a first
    sync, as the shadow itself starts)."""

    lines: tuple[str, ...]
    rendered: Mapping[str, Any]
    history: History | None = None


async def read_shadow(kube: CaptureAPI, *, lease_namespace: str, lease_name: str,
                      namespace: str, name: str) -> ShadowPublished:
    """The entry of HPA namespace/name in the shadow's ConfigMap (named as its Lease); what
    cannot be read is said, and explained as a first sync."""
    where = f"ConfigMap {lease_namespace}/{lease_name}"
    source: dict[str, Any] = {"configMap": f"{lease_namespace}/{lease_name}"}
    try:
        raw = await kube.get_json(f"/api/v1/namespaces/{lease_namespace}/configmaps/"
                                  f"{lease_name}", operation="explain", resource="configmaps")
    except KubeError as err:
        note = f"shadow: {where} cannot be read ({err}); explained as a first sync"
        return ShadowPublished(lines=(note,), rendered={**source, "error": str(err)})
    data = raw.get("data") if isinstance(raw, Mapping) else None
    key = entry_key(namespace, name)
    text = data.get(key) if isinstance(data, Mapping) else None
    if not isinstance(text, str):
        note = (f"shadow: {where} has no entry for {namespace}/{name} (not shadowed, not "
                "published yet: once per sync period, or left out); explained as a first sync")
        return ShadowPublished(lines=(note,), rendered={**source, "entry": None})
    try:
        entry = parse_entry(text, f"{where}.data[{key}]")
    except ModelError as err:
        note = f"shadow: {err}; explained as a first sync"
        return ShadowPublished(lines=(note,), rendered={**source, "error": str(err)})
    lines = (f"shadow: the history and the latest verdict of {where}",
             describe_entry(entry.decision))
    rendered = {**source, "decision": dict(entry.decision) if entry.decision else None}
    return ShadowPublished(lines=lines, rendered=rendered, history=entry.history)


def _split(target: str) -> tuple[str, str]:
    namespace, slash, name = target.partition("/")
    if not slash or not namespace or not name:
        raise SnapshotError("live", f"expected NAMESPACE/NAME, not {target!r}")
    problem = dns_label_problem(namespace)
    if problem is not None:
        raise SnapshotError("live", f"{namespace!r}: a namespace must be a DNS-1123 label: "
                                    f"{problem}")
    problem = dns_subdomain_problem(name)
    if problem is not None:
        raise SnapshotError("live", f"{name!r}: an autoscaler's name must be a DNS-1123 "
                                    f"subdomain: {problem}")
    return namespace, name


def _check_lease_flags(args: argparse.Namespace) -> None:
    """--lease-namespace and --lease-name name a Lease (checked before anything is asked)."""
    namespace = getattr(args, "lease_namespace", None)
    problem = dns_label_problem(namespace) if namespace else None
    if problem is not None:
        raise SnapshotError("lease-namespace", f"{namespace!r}: a namespace must be a DNS-1123 "
                                               f"label: {problem}")
    name = getattr(args, "lease_name", None)
    problem = dns_subdomain_problem(name) if name else None
    if problem is not None:
        raise SnapshotError("lease-name", f"{name!r}: a Lease's name must be a DNS-1123 "
                                          f"subdomain: {problem}")


def _lease_of(args: argparse.Namespace) -> tuple[str, str]:
    """The namespace and name of the controller's Lease (the shadow's with --shadow)."""
    namespace = (getattr(args, "lease_namespace", None)
                 or default_lease_namespace(fallback="metricscale"))
    default = SHADOW_NAME if getattr(args, "shadow", False) \
        else LeaderElectionConfig().resource_name
    return namespace, getattr(args, "lease_name", None) or default


async def _capture(args: argparse.Namespace) -> dict[str, Any]:
    namespace, name = _split(args.live)
    _check_lease_flags(args)
    shadow = bool(getattr(args, "shadow", False))
    # A KubeConfigError passes through: it is the user's configuration, not the snapshot, that
    # is wrong, and `explain` reports it as the other commands do.
    async with contextlib.AsyncExitStack() as stack:
        configuration = await stack.enter_async_context(open_configuration(
            kubeconfig=resolve_kubeconfig(getattr(args, "kubeconfig", None)),
            context=getattr(args, "context", None)))
        kube = await stack.enter_async_context(open_kube_client(
            configuration, registry=CollectorRegistry(),
            reporting_instance="metricscale-explain"))
        settings = await _controller_settings(kube, args)
        now = datetime.now(UTC)
        snapshot = await capture_snapshot(
            kube, MetricsClient(kube), namespace=namespace, name=name,
            hpa=shadow or bool(getattr(args, "hpa", False)), now=now, settings=settings)
        if shadow:
            # The shadow's history, not what the HPA may carry from an earlier native mode.
            lease_namespace, lease_name = _lease_of(args)
            published = await read_shadow(kube, lease_namespace=lease_namespace,
                                          lease_name=lease_name, namespace=namespace,
                                          name=name)
            snapshot.pop("history", None)
            if published.history is not None:
                snapshot["history"] = render_history(restore_history(published.history,
                                                                     now=now))
            args.shadow_published = published
        return snapshot


async def _controller_settings(kube: Any, args: argparse.Namespace) -> Settings:
    """The leader's published settings (the Lease annotation), with explain's own settings
    flags in their place where given; records where they came from in `args.settings_source`."""
    try:
        given = given_settings(args)
    except SettingsError as err:
        raise SnapshotError("settings", str(err)) from None
    lease_namespace, lease_name = _lease_of(args)
    try:
        lease = await kube.read_lease(namespace=lease_namespace, name=lease_name)
    except KubeError:
        lease = None  # e.g. not allowed to read it: the same as nothing published
    text = lease.annotations.get(SETTINGS_ANNOTATION) if lease is not None else None
    settings, args.settings_source = resolve_settings(published=text, given=given)
    return settings


def capture_document(args: argparse.Namespace) -> dict[str, Any]:
    """`explain --live NAMESPACE/NAME`: capture the snapshot (and write it to
    `--save-snapshot FILE` when asked); raises SnapshotError naming what failed, or
    KubeConfigError when there is no usable cluster configuration."""
    document = asyncio.run(_capture(args))
    save = getattr(args, "save_snapshot", None)
    if save:
        try:
            with open(save, "w", encoding="utf-8") as handle:
                json.dump(document, handle, indent=2)
                handle.write("\n")
        except OSError as err:
            raise SnapshotError("save-snapshot",
                                f"cannot write {save}: {err.strerror or err}") from None
    return document
