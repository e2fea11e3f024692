"""`metricscale autoscale`: create an Autoscaler for a workload, as `kubectl autoscale` does an HPA.

The object is built by pure functions (`parse_target`, `build_autoscaler`) over the flags; only
`run` reads a kubeconfig and talks to the API server. Validation and kubectl's error texts come
first, so `--dry-run=client` never needs a cluster (kubectl's does, to look the target up).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml

from metricscale.core.quantity import format_quantity, parse_quantity
from metricscale.kube.config import add_kubeconfig_arguments, read_kubeconfig, resolve_kubeconfig
from metricscale.kube.errors import AlreadyExists, KubeConfigError, KubeError, error_from_response

GROUP, VERSION, KIND, PLURAL = "metricscale.dev", "v1alpha1", "Autoscaler", "autoscalers"
# kubectl autoscale without --cpu-percent leaves `metrics` empty and the API server defaults
# it to this; the CRD has no such defaulting, so the CLI writes it out.
DEFAULT_CPU_PERCENT = 80
FIELD_MANAGER = "metricscale-autoscale"

# kubectl's set: (apiVersion, Kind) by every name kubectl accepts for it.
_SCALABLE: dict[str, tuple[str, str]] = {}
for _names, _target in (
    (("deployment", "deployments", "deploy"), ("apps/v1", "Deployment")),
    (("replicaset", "replicasets", "rs"), ("apps/v1", "ReplicaSet")),
    (("statefulset", "statefulsets", "sts"), ("apps/v1", "StatefulSet")),
    (("replicationcontroller", "replicationcontrollers", "rc"), ("v1", "ReplicationController")),
):
    for _name in _names:
        _SCALABLE[_name] = _target
# Kinds kubectl knows but cannot autoscale: its "cannot autoscale a <Kind>" message.
_NOT_SCALABLE = {"pod": "Pod", "pods": "Pod", "po": "Pod", "service": "Service",
                 "services": "Service", "svc": "Service", "daemonset": "DaemonSet",
                 "daemonsets": "DaemonSet", "ds": "DaemonSet", "job": "Job", "jobs": "Job",
                 "cronjob": "CronJob", "cronjobs": "CronJob", "cj": "CronJob"}


class AutoscaleError(Exception):
    """A flag or argument the user must fix; the message is kubectl's where kubectl has one."""


@dataclass(frozen=True)
class Target:
    api_version: str
    kind: str
    name: str


@dataclass(frozen=True)
class PodsMetric:
    name: str
    average: str  # the quantity, canonically formatted


def parse_target(arguments: Sequence[str]) -> Target:
    """`TYPE/NAME` or `TYPE NAME` as kubectl reads them, for kubectl's scalable kinds."""
    if not arguments:
        raise AutoscaleError("You must provide one or more resources by argument or filename.")
    if len(arguments) == 1:
        if "/" not in arguments[0]:
            raise AutoscaleError(f'there is no need to specify a resource type as a separate '
                                 f'argument when passing arguments in resource/name form (e.g. '
                                 f"'metricscale autoscale deployment/NAME'): missing name for "
                                 f'"{arguments[0]}"')
        kind_text, _, name = arguments[0].partition("/")
    elif len(arguments) == 2:
        if "/" in arguments[0] or "/" in arguments[1]:
            raise AutoscaleError("arguments in resource/name form may not have more than one "
                                 "slash")
        kind_text, name = arguments
    else:
        raise AutoscaleError("autoscale takes one resource: TYPE NAME or TYPE/NAME, got "
                             f"{len(arguments)} arguments")
    resource = kind_text.lower()
    if resource in _NOT_SCALABLE:
        kind = _NOT_SCALABLE[resource]
        raise AutoscaleError(f"cannot autoscale a {kind}: it has no scale subresource")
    if resource not in _SCALABLE:
        raise AutoscaleError(f'the server doesn\'t have a resource type "{kind_text}"')
    if not name:
        raise AutoscaleError("resource name may not be empty")
    api_version, kind = _SCALABLE[resource]
    return Target(api_version=api_version, kind=kind, name=name)


def parse_metric(text: str) -> PodsMetric:
    """`NAME=AVERAGE`: a Pods metric whose per-pod average should be AVERAGE (a quantity)."""
    name, separator, average = text.partition("=")
    if not separator or not name.strip() or not average.strip():
        raise AutoscaleError(f"--metric={text}: want NAME=AVERAGE, e.g. "
                             "http_requests_per_second=100")
    try:
        quantity = parse_quantity(average.strip())
    except ValueError:
        raise AutoscaleError(f"--metric={text}: {average.strip()!r} is not a quantity "
                             "(e.g. 100, 500m, 2k)") from None
    if quantity <= 0:
        raise AutoscaleError(f"--metric={text}: the average must be greater than 0")
    return PodsMetric(name=name.strip(), average=format_quantity(quantity))


def build_autoscaler(*, target: Target, name: str | None, namespace: str, min_replicas: int,
                     max_replicas: int | None, cpu_percent: int,
                     metrics: Sequence[PodsMetric] = ()) -> dict[str, Any]:
    """The Autoscaler object, validated the way kubectl validates an HPA's flags.

    `min_replicas` and `cpu_percent` below 0 mean unset (kubectl's -1); without any metric
    flag the object gets kubectl's default policy, 80% CPU, written out.
    """
    if max_replicas is None:
        raise AutoscaleError('required flag(s) "max" not set')
    if max_replicas < 1:
        raise AutoscaleError(f"--max=MAXPODS is required and must be at least 1, "
                             f"max: {max_replicas}")
    if max_replicas < min_replicas:
        raise AutoscaleError(f"--max=MAXPODS must be larger or equal to --min=MINPODS, "
                             f"max: {max_replicas}, min: {min_replicas}")
    if min_replicas == 0:
        raise AutoscaleError("--min=MINPODS must be at least 1: scaling to zero needs an Object "
                             "or External metric, which this command does not write")
    spec: dict[str, Any] = {
        "scaleTargetRef": {"apiVersion": target.api_version, "kind": target.kind,
                           "name": target.name},
        "maxReplicas": max_replicas,
    }
    if min_replicas > 0:
        spec["minReplicas"] = min_replicas
    rendered: list[dict[str, Any]] = []
    if cpu_percent >= 0 or not metrics:
        utilization = cpu_percent if cpu_percent >= 0 else DEFAULT_CPU_PERCENT
        rendered.append({"type": "Resource", "resource": {"name": "cpu", "target": {
            "type": "Utilization", "averageUtilization": utilization}}})
    for metric in metrics:
        rendered.append({"type": "Pods", "pods": {
            "metric": {"name": metric.name},
            "target": {"type": "AverageValue", "averageValue": metric.average}}})
    spec["metrics"] = rendered
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
            "metadata": {"name": name or target.name, "namespace": namespace},
            "spec": spec}


# --------------------------------------------------------------------------------------------
# Kubeconfig: which file, which namespace


def kubeconfig_path(*, flag: str | None, environ: Mapping[str, str], home: Path) -> str | None:
    """The shared rule (`resolve_kubeconfig`): --kubeconfig, else $KUBECONFIG (a list, merged),
    else ~/.kube/config, else None (the in-cluster service account)."""
    return resolve_kubeconfig(flag, environ=environ, home=home)


def context_namespace(kubeconfig: str | None, context: str | None) -> str:
    """The namespace of the chosen (or current) context, else `default`.

    An unreadable file gives `default` here; connecting reports what is wrong with it.
    """
    if kubeconfig is None:
        return "default"
    try:
        document = read_kubeconfig(kubeconfig)
    except KubeConfigError:
        return "default"
    wanted = context or document.get("current-context")
    for entry in document.get("contexts") or []:
        if isinstance(entry, dict) and entry.get("name") == wanted:
            body = entry.get("context")
            if isinstance(body, dict) and body.get("namespace"):
                return str(body["namespace"])
    return "default"


# --------------------------------------------------------------------------------------------
# The shell


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Create an Autoscaler for a deployment, replica set, stateful set or replication "
        "controller, as 'kubectl autoscale' creates a HorizontalPodAutoscaler. Without "
        f"--cpu-percent or --metric it writes kubectl's default policy explicitly: "
        f"{DEFAULT_CPU_PERCENT}% average CPU utilization (kubectl leaves that to the API "
        "server's HPA defaulting, which custom resources do not get).")
    parser.epilog = ("examples:\n"
                     "  metricscale autoscale deployment/web --min 2 --max 10 --cpu-percent 50\n"
                     "  metricscale autoscale sts db --max 5 --metric "
                     "http_requests_per_second=100 --dry-run=client -o yaml")
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("resource", nargs="*", metavar="TYPE/NAME",
                        help="the workload: TYPE/NAME or TYPE NAME (deployment/deploy, "
                             "replicaset/rs, statefulset/sts, replicationcontroller/rc)")
    parser.add_argument("--min", type=int, default=1, dest="min_replicas", metavar="MINPODS",
                        help="the fewest pods (default 1; negative leaves it unset)")
    parser.add_argument("--max", type=int, default=None, dest="max_replicas",
                        metavar="MAXPODS", help="the most pods; required")
    parser.add_argument("--cpu-percent", type=int, default=-1, metavar="CPU",
                        help="target average CPU utilization, percent of requests (default: "
                             f"{DEFAULT_CPU_PERCENT} when no --metric is given)")
    parser.add_argument("--metric", action="append", default=[], metavar="NAME=AVERAGE",
                        help="a Pods metric with an AverageValue target; repeatable")
    parser.add_argument("--name", default=None,
                        help="name of the Autoscaler (default: the target's name)")
    parser.add_argument("-n", "--namespace", default=None,
                        help="namespace (default: the kubeconfig context's, else 'default')")
    parser.add_argument("--dry-run", default="none", choices=("none", "client", "server"),
                        help="client: only print the object; server: submit with dryRun=All, "
                             "persisting nothing")
    parser.add_argument("-o", "--output", default=None, choices=("yaml", "json", "name"),
                        help="print the object (yaml, json) or its name")
    add_kubeconfig_arguments(parser)


def render(obj: Mapping[str, Any], *, output: str | None, dry_run: str) -> str:
    """What the command prints for `obj`, in kubectl's words."""
    if output == "yaml":
        return yaml.safe_dump(dict(obj), sort_keys=True).rstrip("\n")
    if output == "json":
        return json.dumps(obj, indent=4, sort_keys=True)
    qualified = f"autoscaler.{GROUP}/{obj['metadata']['name']}"
    if output == "name":
        return qualified
    suffix = {"client": " (dry run)", "server": " (server dry run)"}.get(dry_run, "")
    return f"{qualified} autoscaled{suffix}"


async def create(obj: Mapping[str, Any], *, kubeconfig: str | None, context: str | None,
                 server_dry_run: bool) -> dict[str, Any]:
    """POST the Autoscaler; the server's object back, or the typed KubeError."""
    import aiohttp

    from metricscale.kube.errors import ConnectionFailed
    from metricscale.kube.http import connect

    namespace = str(obj["metadata"]["namespace"])
    path = f"/apis/{GROUP}/{VERSION}/namespaces/{quote(namespace, safe='')}/{PLURAL}"
    query = [("fieldManager", FIELD_MANAGER)]
    if server_dry_run:
        query.append(("dryRun", "All"))
    async with connect(kubeconfig=kubeconfig, context=context,
                       user_agent="metricscale-autoscale") as http:
        try:
            response = await http.request("POST", path, query=query, body=obj,
                                          content_type="application/json")
        except (aiohttp.ClientError, TimeoutError, OSError) as error:
            raise ConnectionFailed(f"cannot reach the API server at {http.host}: "
                                   f"{error or type(error).__name__}") from None
    if response.status >= 300:
        raise error_from_response(response.status, headers=response.headers,
                                  body=response.body, verb="POST")
    created = json.loads(response.body)
    return created if isinstance(created, dict) else dict(obj)


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 1


def run(args: argparse.Namespace) -> int:
    kubeconfig = kubeconfig_path(flag=args.kubeconfig, environ=os.environ, home=Path.home())
    try:
        target = parse_target(args.resource)
        metrics = [parse_metric(text) for text in args.metric]
        namespace = args.namespace or context_namespace(kubeconfig, args.context)
        obj = build_autoscaler(target=target, name=args.name, namespace=namespace,
                               min_replicas=args.min_replicas, max_replicas=args.max_replicas,
                               cpu_percent=args.cpu_percent, metrics=metrics)
    except AutoscaleError as error:
        return _fail(str(error))
    if args.dry_run == "client":
        print(render(obj, output=args.output, dry_run="client"))
        return 0
    try:
        created = asyncio.run(create(obj, kubeconfig=kubeconfig, context=args.context,
                                     server_dry_run=args.dry_run == "server"))
    except AlreadyExists as error:
        print(f"Error from server (AlreadyExists): {error}", file=sys.stderr)
        return 1
    except KubeError as error:
        if error.reason and error.status:
            print(f"Error from server ({error.reason}): {error}", file=sys.stderr)
            return 1
        return _fail(str(error))
    print(render(created, output=args.output, dry_run=args.dry_run))
    return 0
