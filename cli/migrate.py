"""`metricscale migrate`: HPAs to Autoscalers (and the target handed over without a replica
jump), Autoscalers back to HPAs, and a prometheus-adapter configuration to metricscale's.

    metricscale migrate hpa [NAMESPACE/NAME | NAME -n NAMESPACE | -A] [--apply]
    metricscale migrate autoscaler [NAMESPACE/NAME | NAME -n NAMESPACE | -A]
    metricscale migrate prometheus-adapter FILE [-o configmap|rules]

The conversions are pure (autoscaler.model.migration, cli.migrate_adapter); this module reads
the cluster, prints, and runs the hand-over of `--apply`:

1. the Autoscaler is created **paused** (`metricscale.dev/paused`), carrying the history it is to
   continue in `metricscale.dev/history` (autoscaler.decision.handover): the HPA's own, when
   metricscale ran it in native-HPA mode, else kube-controller-manager's restart rule (the
   current size recommended now) and the rescales the HPA's Events record;
2. once the controller has reconciled it (its status has the generation and the history), the
   HPA is deleted (its uid as precondition) and the pause lifted: the Autoscaler decides from
   the same memory at its next sync, which follows at once;
3. if the controller does not reconcile it within `--timeout`, the Autoscaler is deleted again
   and the HPA stays in charge.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TextIO
from urllib.parse import quote

import yaml

from autoscaler.model.migration import (
    Conversion,
    ConversionError,
    autoscaler_from_hpa,
    hpa_from_autoscaler,
)
from cli.autoscale import context_namespace
from cli.migrate_adapter import (
    MigrationError,
    configmap_manifest,
    dump_yaml,
    migrate_adapter_config,
)
from metricscale.files import FileError, read_text
from metricscale.kube.config import add_kubeconfig_arguments, resolve_kubeconfig
from metricscale.kube.errors import KubeConfigError, KubeError, NotFound

__all__ = ["MigrateError", "add_arguments", "hand_over", "run"]

GROUP, VERSION, PLURAL = "metricscale.dev", "v1alpha1", "autoscalers"
PAUSED = "metricscale.dev/paused"  # autoscaler.decision.pause.PAUSED
HISTORY = "metricscale.dev/history"  # autoscaler.decision.persistence.HISTORY_ANNOTATION
FIELD_MANAGER = "metricscale-migrate"
USER_AGENT = "metricscale-migrate"
# Recommendations older than the longest window the API allows decide nothing.
_HORIZON = timedelta(hours=1)
_MERGE_PATCH = "application/merge-patch+json"


class MigrateError(Exception):
    """Something the user must fix or know; the message says what, and about which object."""


# --------------------------------------------------------------------------------------------
# Arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Convert HPAs to Autoscalers (and hand their targets over), "
                          "Autoscalers back to HPAs, or a prometheus-adapter configuration to "
                          "metricscale's. Manifests go to standard output, with what could not "
                          "be carried as comments; progress and problems to standard error.")
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = ("what:\n"
                     "  hpa [NAMESPACE/NAME | NAME -n NAMESPACE | -A] [--apply]\n"
                     "      print Autoscalers equivalent to HPAs; --apply creates them and hands\n"
                     "      each target over (the HPA is deleted once the Autoscaler has taken\n"
                     "      over with its stabilization history)\n"
                     "  autoscaler [NAMESPACE/NAME | NAME -n NAMESPACE | -A]\n"
                     "      print HPAs equivalent to Autoscalers; what an HPA cannot say is\n"
                     "      reported, never dropped in silence\n"
                     "  prometheus-adapter FILE\n"
                     "      convert prometheus-adapter's ConfigMap, rule file, or the\n"
                     "      prometheus-community chart's values.yaml (- reads standard input)\n"
                     "\nexamples:\n"
                     "  metricscale migrate hpa shop/web > web-autoscaler.yaml\n"
                     "  metricscale migrate hpa shop/web --apply\n"
                     "  metricscale migrate autoscaler -A > hpas.yaml\n"
                     "  metricscale migrate prometheus-adapter values.yaml > adapter-config.yaml")
    parser.add_argument("what", choices=("hpa", "autoscaler", "prometheus-adapter"),
                        metavar="WHAT", help="hpa, autoscaler or prometheus-adapter")
    parser.add_argument("target", nargs="?", metavar="NAMESPACE/NAME|FILE",
                        help="one object (NAME alone: in --namespace), or the file to convert")
    parser.add_argument("-n", "--namespace", default=None,
                        help="namespace of NAME (default: the kubeconfig context's, else "
                             "'default'); of the ConfigMap made by prometheus-adapter "
                             "(default metricscale)")
    parser.add_argument("-A", "--all-namespaces", action="store_true",
                        help="every object of the kind in the cluster")
    parser.add_argument("-o", "--output", default=None,
                        choices=("yaml", "json", "configmap", "rules"),
                        help="yaml (default) or json for objects; configmap (default) or rules "
                             "for prometheus-adapter")
    parser.add_argument("--apply", action="store_true",
                        help="hpa: create each Autoscaler and hand its target over")
    parser.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                        help="hpa --apply: how long to wait for the controller to reconcile the "
                             "new Autoscaler before giving up and leaving the HPA in charge "
                             "(default 120)")
    parser.add_argument("--our-default-rules", action="store_true",
                        help="prometheus-adapter: with the chart's rules.default: true, use "
                             "metricscale's default rules instead of the chart's")
    add_kubeconfig_arguments(parser)


def check_arguments(args: argparse.Namespace) -> None:
    """What argparse cannot say: which flags go with which WHAT."""
    objects = args.what != "prometheus-adapter"
    if objects and args.output in {"configmap", "rules"}:
        raise MigrateError(f"-o {args.output} is for prometheus-adapter; use yaml or json")
    if not objects and args.output in {"yaml", "json"}:
        raise MigrateError(f"-o {args.output} is for hpa and autoscaler; use configmap or rules")
    if args.apply and args.what != "hpa":
        raise MigrateError("--apply is for `migrate hpa` only: print the HPAs and apply them "
                           "yourself (see docs/doctor-and-migrate.md)")
    if args.our_default_rules and objects:
        raise MigrateError("--our-default-rules is for prometheus-adapter")
    if not objects and (args.all_namespaces or not args.target):
        raise MigrateError("prometheus-adapter takes one FILE")


# --------------------------------------------------------------------------------------------
# Output


def _comment(lines: Sequence[str]) -> str:
    return "".join(f"# {line}\n" for line in lines)


def render_documents(conversions: Sequence[Conversion], *, output: str) -> str:
    """The manifests, each preceded by what it could not carry and what is worth knowing."""
    if output == "json":
        items = [c.manifest for c in conversions]
        body: Any = items[0] if len(items) == 1 else {"apiVersion": "v1", "kind": "List",
                                                       "items": items}
        return json.dumps(body, indent=2) + "\n"
    parts = []
    for conversion in conversions:
        head = [f"{conversion.manifest['kind']} {conversion.key}"]
        head += [f"not carried: {line}" for line in conversion.dropped]
        head += [f"note: {line}" for line in conversion.notes]
        parts.append(_comment(head) + yaml.safe_dump(conversion.manifest, sort_keys=False))
    return "---\n".join(parts)


# --------------------------------------------------------------------------------------------
# Reading the cluster


@dataclass
class Target:
    namespace: str | None  # None: every namespace
    name: str | None  # None: every object


def parse_target(args: argparse.Namespace, *, default_namespace: Callable[[], str]) -> Target:
    if args.all_namespaces:
        if args.target:
            raise MigrateError("give NAMESPACE/NAME or -A, not both")
        return Target(None, None)
    if not args.target:
        raise MigrateError("give NAMESPACE/NAME, NAME with -n NAMESPACE, or -A")
    namespace, slash, name = str(args.target).partition("/")
    if slash:
        if not namespace or not name or "/" in name:
            raise MigrateError(f"expected NAMESPACE/NAME, not {args.target!r}")
        return Target(namespace, name)
    return Target(args.namespace or default_namespace(), str(args.target))


def _collection(kind: str, namespace: str | None) -> str:
    base = ("/apis/autoscaling/v2" if kind == "hpa" else f"/apis/{GROUP}/{VERSION}")
    plural = "horizontalpodautoscalers" if kind == "hpa" else PLURAL
    if namespace is None:
        return f"{base}/{plural}"
    return f"{base}/namespaces/{quote(namespace, safe='')}/{plural}"


class Cluster:
    """The few requests migrate makes, over the shared request path."""

    def __init__(self, requests: Any, kube: Any) -> None:
        self.requests = requests  # metricscale.kube.requests.KubeRequests
        self.kube = kube  # autoscaler.kube.operations.KubeClient (scale targets)

    async def call(self, verb: str, path: str, **options: Any) -> Any:
        return await self.requests.call(verb, path, operation="migrate", resource=path,
                                        **options)

    async def objects(self, kind: str, target: Target) -> list[dict[str, Any]]:
        if target.name is not None:
            path = f"{_collection(kind, target.namespace)}/{quote(target.name, safe='')}"
            found = await self.call("GET", path)
            return [dict(found)] if isinstance(found, Mapping) else []
        listed = await self.call("GET", _collection(kind, target.namespace))
        items = listed.get("items") if isinstance(listed, Mapping) else None
        return [dict(item) for item in items or [] if isinstance(item, Mapping)]


@contextlib.asynccontextmanager
async def open_cluster(*, kubeconfig: str | None, context: str | None) -> AsyncIterator[Cluster]:
    """A Cluster over one session (aiohttp is imported only when a cluster is asked)."""
    from prometheus_client import CollectorRegistry

    from autoscaler.kube.operations import KubeClient
    from metricscale.kube.http import connect
    from metricscale.kube.requests import KubeRequests
    from metricscale.kube.retry import RetryPolicy

    async with connect(kubeconfig=kubeconfig, context=context, user_agent=USER_AGENT) as http:
        yield Cluster(KubeRequests(http, retry=RetryPolicy()),
                      KubeClient(http, registry=CollectorRegistry(),
                                 reporting_instance=USER_AGENT))


# --------------------------------------------------------------------------------------------
# The hand-over


@dataclass
class HandoverReport:
    key: str
    lines: list[str] = field(default_factory=list)


async def _wait(check: Callable[[], Awaitable[bool]], *, within: float,
                poll: float) -> bool:
    """Ask `check` until it says yes, or `within` seconds pass (the command's --timeout)."""
    deadline = time.monotonic() + within
    while True:
        if await check():
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(poll)


def _delete_options(uid: Any) -> dict[str, Any]:
    """DeleteOptions that delete only the object of this uid (not one made since)."""
    return {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}


def _conditions(obj: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    status = obj.get("status") if isinstance(obj.get("status"), Mapping) else {}
    assert isinstance(status, Mapping)
    return {str(c.get("type")): c for c in status.get("conditions") or []
            if isinstance(c, Mapping)}


async def hand_over(cluster: Cluster, hpa: Mapping[str, Any], conversion: Conversion, *,
                    within: float, poll: float = 0.5,
                    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                    say: Callable[[str], None] = lambda line: None) -> HandoverReport:
    """Create the Autoscaler and hand the HPA's target over to it (see the module docstring);
    raises MigrateError (the HPA left in charge) when that cannot be done."""
    from autoscaler.decision.handover import handover_history, rescales_from_events
    from autoscaler.decision.persistence import (
        history_from_annotations,
        render_history_annotation,
    )
    from autoscaler.kube.operations import ScaleTargetRef
    from autoscaler.model.fields import ModelError
    from autoscaler.model.spec import parse_spec

    meta = hpa.get("metadata") or {}
    namespace, name, uid = str(meta.get("namespace")), str(meta.get("name")), meta.get("uid")
    report = HandoverReport(f"{namespace}/{name}")

    def tell(line: str) -> None:
        report.lines.append(line)
        say(f"{report.key}: {line}")

    autoscalers = _collection("autoscaler", namespace)
    try:
        await cluster.call("GET", f"{autoscalers}/{quote(name, safe='')}")
    except NotFound:
        pass
    else:
        raise MigrateError(f"{report.key}: an Autoscaler of that name exists already; the HPA "
                           "is left in charge")
    manifest = json.loads(json.dumps(conversion.manifest))
    spec = parse_spec(manifest["spec"], "spec")
    ref = spec.scale_target_ref
    mapping = await cluster.kube.resolve_scale_target(
        ScaleTargetRef(api_version=ref.api_version, kind=ref.kind, name=ref.name))
    scale = await cluster.kube.get_scale(mapping, namespace=namespace, name=ref.name)
    try:
        annotated = history_from_annotations(meta.get("annotations"))
    except ModelError as err:
        tell(f"the HPA's history annotation cannot be read ({err}): not carried")
        annotated = None
    rescales: tuple[Any, ...] = ()
    if annotated is None:
        selector = f"involvedObject.uid={uid},reason=SuccessfulRescale"
        events = await cluster.call(
            "GET", f"/api/v1/namespaces/{quote(namespace, safe='')}/events",
            query=[("fieldSelector", selector)])
        rescales = rescales_from_events([e for e in (events or {}).get("items") or []
                                         if isinstance(e, Mapping)])
    now = clock()
    handover = handover_history(annotated=annotated, current_replicas=scale.spec_replicas,
                                rescales=rescales, spec=spec, now=now)
    for note in handover.notes:
        tell(f"note: {note}")
    annotations = manifest["metadata"].setdefault("annotations", {})
    we_paused = PAUSED not in annotations
    annotations[PAUSED] = annotations.get(PAUSED, "true")
    annotations[HISTORY] = render_history_annotation(handover.history, now=now,
                                                     horizon=_HORIZON)
    created = await cluster.call("POST", autoscalers, body=manifest,
                                 query=[("fieldManager", FIELD_MANAGER)])
    generation = (created.get("metadata") or {}).get("generation") or 1
    own_uid = (created.get("metadata") or {}).get("uid")
    path = f"{autoscalers}/{quote(name, safe='')}"
    source = ("the HPA's own history (metricscale ran it)" if handover.source == "annotation"
              else "the history rebuilt from the HPA")
    tell(f"Autoscaler created paused at {scale.spec_replicas} replicas, carrying {source}")

    seen: dict[str, Any] = {}

    async def reconciled() -> bool:
        current = await cluster.call("GET", path)
        status = current.get("status") or {}
        seen["object"] = current
        return bool(status.get("history")) and (status.get("observedGeneration") or 0) >= \
            generation

    if not await _wait(reconciled, within=within, poll=poll):
        await cluster.call("DELETE", path, body=_delete_options(own_uid))
        raise MigrateError(f"{report.key}: the metricscale autoscaler controller did not "
                           f"reconcile the new Autoscaler within {within:g}s (is it running, "
                           "and the leader?); the Autoscaler was deleted again and the HPA is "
                           "left in charge")
    status = seen["object"].get("status") or {}
    tell(f"the controller has taken it over with that history (it would set "
         f"{status.get('desiredReplicas')} replicas)")
    await cluster.call("DELETE", f"/apis/autoscaling/v2/namespaces/{quote(namespace, safe='')}/"
                                 f"horizontalpodautoscalers/{quote(name, safe='')}",
                       body=_delete_options(uid))
    tell("HPA deleted")
    lifted: dict[str, Any] = {HISTORY: None}
    if we_paused:
        lifted[PAUSED] = None
    await cluster.call("PATCH", path, body={"metadata": {"annotations": lifted}},
                       content_type=_MERGE_PATCH)

    async def resumed() -> bool:
        current = await cluster.call("GET", path)
        seen["object"] = current
        return "Paused" not in _conditions(current)

    if not we_paused:
        tell("left paused, as the HPA was")
    elif await _wait(resumed, within=within, poll=poll):
        status = seen["object"].get("status") or {}
        tell(f"resumed: the Autoscaler is in charge at {status.get('currentReplicas')} "
             "replicas")
    else:
        tell(f"the pause is lifted, but the controller has not reported an unpaused decision "
             f"within {within:g}s")
    return report


# --------------------------------------------------------------------------------------------
# The commands


def _convert_all(objects: Sequence[Mapping[str, Any]], convert: Callable[[Mapping[str, Any]],
                                                                          Conversion],
                 err: TextIO) -> tuple[list[Conversion], list[tuple[Mapping[str, Any], Conversion]],
                                       int]:
    conversions: list[Conversion] = []
    pairs: list[tuple[Mapping[str, Any], Conversion]] = []
    failures = 0
    for obj in objects:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        owners = [f"{o.get('kind')} {o.get('name')}" for o in meta.get("ownerReferences") or []
                  if isinstance(o, Mapping)]
        if owners:
            print(f"metricscale migrate: {key}: skipped: owned by {', '.join(owners)} (KEDA, a "
                  "GitOps tool...), which would recreate it", file=err)
            continue
        try:
            conversion = convert(obj)
        except ConversionError as error:
            print(f"metricscale migrate: {key}: {error}", file=err)
            failures += 1
            continue
        conversions.append(conversion)
        pairs.append((obj, conversion))
    return conversions, pairs, failures


async def _run_cluster(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    kubeconfig = resolve_kubeconfig(args.kubeconfig)
    target = parse_target(args, default_namespace=lambda: context_namespace(kubeconfig,
                                                                            args.context))
    kind = "hpa" if args.what == "hpa" else "autoscaler"
    convert = autoscaler_from_hpa if kind == "hpa" else hpa_from_autoscaler
    async with open_cluster(kubeconfig=kubeconfig, context=args.context) as cluster:
        try:
            objects = await cluster.objects(kind, target)
        except NotFound:
            what = "HorizontalPodAutoscaler" if kind == "hpa" else "Autoscaler"
            raise MigrateError(f"{what} {target.namespace}/{target.name} not found") from None
        conversions, pairs, failures = _convert_all(objects, convert, err)
        if not args.apply:
            if conversions:
                out.write(render_documents(conversions, output=args.output or "yaml"))
            dropped = sum(len(c.dropped) for c in conversions)
            if dropped:
                print(f"metricscale migrate: {dropped} thing(s) an HPA cannot say were left out;"
                      " each is a comment above its manifest", file=err)
            return 1 if failures else 0
        for hpa, conversion in pairs:
            try:
                await hand_over(cluster, hpa, conversion, within=args.timeout,
                                say=lambda line: print(f"metricscale migrate: {line}",
                                                       file=err))
            except (MigrateError, KubeError) as error:
                print(f"metricscale migrate: {error}", file=err)
                failures += 1
                continue
            print(f"autoscaler.{GROUP}/{conversion.manifest['metadata']['name']} handed over",
                  file=out)
        return 1 if failures else 0


def _run_adapter(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    path = str(args.target)
    try:
        text = read_text(path, stream=sys.stdin if path == "-" else None)
    except FileError as error:
        raise MigrateError(str(error)) from None
    try:
        migration = migrate_adapter_config(text, our_defaults=args.our_default_rules)
    except MigrationError as error:
        raise MigrateError(f"{path}: {error}") from None
    head = [f"from {path} ({migration.source})"]
    head += [f"not carried: {line}" for line in migration.dropped]
    head += [f"note: {line}" for line in migration.notes]
    if migration.flags:
        head.append("metricscale adapter flags: " + " ".join(migration.flags))
    head += [f"differs from prometheus-adapter ({d.id}): {d.where}"
             for d in migration.differences]
    head.append("every configuration also meets the differences in requests and answers: see "
                "docs/differences-prometheus-adapter.md")
    if args.output == "rules":
        out.write(_comment(head) + migration.config_text)
    else:
        out.write(_comment(head) + dump_yaml(
            configmap_manifest(migration, namespace=args.namespace or "metricscale")))
    for line in migration.dropped:
        print(f"metricscale migrate: not carried: {line}", file=err)
    return 1 if migration.dropped else 0


def run(args: argparse.Namespace) -> int:
    """0 when everything was carried (or handed over), 1 when something was not, or failed."""
    out, err = sys.stdout, sys.stderr
    try:
        check_arguments(args)
        if args.what == "prometheus-adapter":
            return _run_adapter(args, out, err)
        return asyncio.run(_run_cluster(args, out, err))
    except MigrateError as error:
        print(f"metricscale migrate: {error}", file=err)
        return 1
    except KubeConfigError as error:
        print(f"metricscale migrate: {error}", file=err)
        return 2 if getattr(args, "kubeconfig", None) else 1
    except KubeError as error:
        print(f"metricscale migrate: {error}", file=err)
        return 1

