"""`metrics.k8s.io/v1beta1`: query samples to PodMetrics and NodeMetrics, and their JSON.

The assembly is prometheus-adapter's (prometheus-adapter.md §9): a pod missing from either the
CPU or the memory answer is left out; its samples are grouped into containers by the container
label; a container in only one answer gets 0 for the other resource; NaN, infinite and negative
values are 0; CPU is a DecimalSI and memory a BinarySI milli-quantity of `int64(v*1000)`; the
timestamp is the pod's earliest sample time; the window is `resourceRules.window`. Nodes are
the same without containers. The JSON is metrics-server's, so `kubectl top` and the HPA read
it: lists carry items without `kind`/`apiVersion`, a single object carries both, and an object
without metrics is `404 NotFound` for `podmetrics.metrics.k8s.io` / `nodemetrics.metrics.k8s.io`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from decimal import ROUND_DOWN, Decimal, InvalidOperation, localcontext
from typing import Any, NamedTuple, Protocol, TypeVar

from adapter.api.groups import RESOURCE_METRICS_GROUP
from adapter.api.wire import format_timestamp, milli_quantity, status_body
from metricscale.core.durations import format_duration

__all__ = [
    "AnswerTimes",
    "NodeRef",
    "NodeUsage",
    "PodLike",
    "PodRef",
    "PodUsage",
    "Sample",
    "assemble_node_usage",
    "assemble_pod_usage",
    "binary_milli_quantity",
    "encode_pod_items",
    "encode_pod_metrics_list",
    "go_duration",
    "object_not_found",
    "pod_usage_items",
    "render_node_metrics",
    "render_node_metrics_list",
    "render_pod_metrics",
    "render_pod_metrics_list",
    "render_resource_metrics_resource_list",
    "usage_milli",
    "usage_not_found",
]

API_VERSION = f"{RESOURCE_METRICS_GROUP}/v1beta1"
# (labels, Unix seconds as Prometheus wrote them, value as Prometheus wrote it)
Sample = tuple[Mapping[str, str], Decimal, str]
_LARGEST_MILLI = 2**63 - 1


class PodLike(Protocol):
    """What a pod list's items are made of (PodRef, or the adapter's cached pod metadata)."""

    @property
    def namespace(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def labels(self) -> Mapping[str, str]: ...

    @property
    def labels_json(self) -> str | None: ...


_P = TypeVar("_P", bound=PodLike)


class PodRef(NamedTuple):
    namespace: str
    name: str
    labels: Mapping[str, str]
    labels_json: str | None = None  # compact JSON of `labels`, when the caller keeps it


class NodeRef(NamedTuple):
    name: str
    labels: Mapping[str, str]


class ContainerUsage(NamedTuple):
    name: str
    cpu_milli: int
    memory_milli: int


class PodUsage(NamedTuple):
    pod: PodRef
    timestamp: Decimal
    containers: tuple[ContainerUsage, ...]


class NodeUsage(NamedTuple):
    node: NodeRef
    timestamp: Decimal
    cpu_milli: int
    memory_milli: int


def usage_milli(value: str) -> int:
    """`int64(v*1000)` for a sample value, with NaN, infinities and negatives as 0."""
    # str methods first, one int() at most: this runs for every sample of every answer.
    if value.isascii():
        whole, dot, fraction = value.partition(".")
        if whole.isdigit() and len(whole) <= 15:
            if not dot:
                return int(whole) * 1000
            if fraction.isdigit():  # the thousandths' digits written after the units'
                return int(whole + (fraction + "00")[:3])
    try:
        exact = Decimal(value.strip())
    except InvalidOperation:
        return 0
    if not exact.is_finite() or exact <= 0:
        return 0
    with localcontext() as context:
        context.prec = 60
        milli = int((exact * 1000).to_integral_value(rounding=ROUND_DOWN))
    return min(milli, _LARGEST_MILLI)


_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")


def binary_milli_quantity(milli: int) -> str:
    """`resource.NewMilliQuantity(milli, BinarySI).String()` for milli >= 0, with ints only:
    below 1024, or with a fraction of a unit, Go prints the decimal form; else the largest
    power of 1024 that divides the value."""
    units, rest = divmod(milli, 1000)
    if rest or units < 1024:
        return milli_quantity(milli)
    power = 0
    while power < 6 and units % 1024 == 0:
        units //= 1024
        power += 1
    return f"{units}{_BINARY_SUFFIXES[power]}"


def go_duration(milliseconds: int) -> str:
    """`time.Duration.String()` of whole milliseconds: `30s`, `5m0s`, `1h0m0s`, `1.5s`."""
    return format_duration(timedelta(milliseconds=milliseconds))


# --------------------------------------------------------------------------------------------
# Assembly


# A pod's samples of one answer: its one container's (name, milli, time), or, when it has
# several, name -> (milli, time). Most pods have one container, and a dict per pod per answer
# (with a tuple in it) was most of the assembly's allocations.
_Containers = tuple[str, int, Decimal] | dict[str, tuple[int, Decimal]]


def _by_pod(samples: Sequence[Sample], *, pod_label: str,
            container_label: str) -> dict[str, _Containers]:
    """pod -> its containers' samples; samples without the pod label are dropped (a later
    sample of the same container replaces the earlier one)."""
    found: dict[str, _Containers] = {}
    for labels, timestamp, value in samples:
        pod = labels.get(pod_label)
        if pod is None:
            continue
        container = labels.get(container_label, "") if container_label else ""
        milli = usage_milli(value)
        entry = found.get(pod)
        if entry is None:
            found[pod] = (container, milli, timestamp)
        elif type(entry) is tuple:
            if entry[0] == container:
                found[pod] = (container, milli, timestamp)
            else:
                found[pod] = {entry[0]: (entry[1], entry[2]), container: (milli, timestamp)}
        else:
            entry[container] = (milli, timestamp)  # type: ignore[index]
    return found


def _earliest(times: Sequence[Decimal]) -> Decimal:
    first = times[0]
    if all(t is first for t in times):
        return first  # the usual case: one instant query's evaluation time
    return min(times)


def _as_dict(entry: _Containers) -> dict[str, tuple[int, Decimal]]:
    if type(entry) is tuple:
        return {entry[0]: (entry[1], entry[2])}
    return entry  # type: ignore[return-value]


def _pod_containers(cpu: _Containers, memory: _Containers
                    ) -> tuple[Decimal, tuple[tuple[str, int, int], ...]]:
    """A pod's earliest sample time and its containers' (name, CPU milli, memory milli):
    prometheus-adapter's join (see the module's docstring)."""
    if type(cpu) is tuple and type(memory) is tuple and cpu[0] == memory[0]:
        cpu_time, memory_time = cpu[2], memory[2]
        earliest = cpu_time if cpu_time is memory_time else min(cpu_time, memory_time)
        return earliest, ((cpu[0], cpu[1], memory[1]),)
    cpu_containers, memory_containers = _as_dict(cpu), _as_dict(memory)
    if cpu_containers.keys() == memory_containers.keys():
        names = sorted(cpu_containers) if len(cpu_containers) > 1 else list(cpu_containers)
    else:
        names = sorted(cpu_containers.keys() | memory_containers.keys())
    nothing = (0, Decimal(0))
    return _earliest([t for _, t in (*cpu_containers.values(),
                                     *memory_containers.values())]), tuple(
        (name, cpu_containers.get(name, nothing)[0], memory_containers.get(name, nothing)[0])
        for name in names)


def _joined(pods: Sequence[_P], *, cpu: Sequence[Sample], memory: Sequence[Sample],
            pod_label: str, container_label: str, missing: list[_P],
            ) -> Iterator[tuple[_P, Decimal, tuple[tuple[str, int, int], ...]]]:
    """Each pod with CPU and memory samples, its earliest sample time and its containers'
    (name, CPU milli, memory milli); the others go to `missing`."""
    cpu_by_pod = _by_pod(cpu, pod_label=pod_label, container_label=container_label)
    memory_by_pod = _by_pod(memory, pod_label=pod_label, container_label=container_label)
    for pod in pods:
        cpu_containers = cpu_by_pod.get(pod.name)
        memory_containers = memory_by_pod.get(pod.name)
        if cpu_containers is None or memory_containers is None:
            missing.append(pod)
            continue
        yield pod, *_pod_containers(cpu_containers, memory_containers)


def assemble_pod_usage(pods: Sequence[PodRef], *, cpu: Sequence[Sample],
                       memory: Sequence[Sample], pod_label: str, container_label: str,
                       ) -> tuple[list[PodUsage], list[PodRef]]:
    """Pods of one namespace with their usage, and the pods left out (no CPU or no memory)."""
    missing: list[PodRef] = []
    usages = [PodUsage(pod, earliest, tuple(ContainerUsage(*c) for c in containers))
              for pod, earliest, containers in _joined(
                  pods, cpu=cpu, memory=memory, pod_label=pod_label,
                  container_label=container_label, missing=missing)]
    return usages, missing


def assemble_node_usage(nodes: Sequence[NodeRef], *, cpu: Sequence[Sample],
                        memory: Sequence[Sample], node_label: str,
                        ) -> tuple[list[NodeUsage], list[NodeRef]]:
    """Nodes with their usage, and the nodes left out (no CPU or no memory sample)."""
    cpu_by_node = {labels[node_label]: (usage_milli(value), timestamp)
                   for labels, timestamp, value in cpu if node_label in labels}
    memory_by_node = {labels[node_label]: (usage_milli(value), timestamp)
                      for labels, timestamp, value in memory if node_label in labels}
    usages: list[NodeUsage] = []
    missing: list[NodeRef] = []
    for node in nodes:
        cpu_sample = cpu_by_node.get(node.name)
        memory_sample = memory_by_node.get(node.name)
        if cpu_sample is None or memory_sample is None:
            missing.append(node)
            continue
        usages.append(NodeUsage(node, _earliest([cpu_sample[1], memory_sample[1]]),
                                cpu_sample[0], memory_sample[0]))
    return usages, missing


# --------------------------------------------------------------------------------------------
# JSON


def _usage(cpu_milli: int, memory_milli: int) -> dict[str, str]:
    return {"cpu": milli_quantity(cpu_milli), "memory": binary_milli_quantity(memory_milli)}


class AnswerTimes:
    """Timestamps of one answer as text: its samples share a few times, converted once."""

    def __init__(self, now: datetime) -> None:
        # metrics-server stamps each answer's objects with the time they were made.
        self.created = format_timestamp(now)
        self._last: Decimal | None = None
        self._last_text = ""

    def text(self, moment: Decimal) -> str:
        # An instant query's samples share one time object: compare by identity first
        # (hashing or comparing Decimals per item costs more than the rest of the item).
        if moment is not self._last and moment != self._last:
            self._last, self._last_text = moment, format_timestamp(moment)
        return self._last_text


def _metadata(name: str, namespace: str | None, labels: Mapping[str, str],
              times: AnswerTimes) -> dict[str, Any]:
    # ObjectMeta's field order, the order metrics-server's (Go's) encoder writes.
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    metadata["creationTimestamp"] = times.created
    if labels:
        metadata["labels"] = dict(labels)
    return metadata


def _pod_item(usage: PodUsage, *, window: str, times: AnswerTimes) -> dict[str, Any]:
    return {"metadata": _metadata(usage.pod.name, usage.pod.namespace, usage.pod.labels,
                                  times),
            "timestamp": times.text(usage.timestamp), "window": window,
            "containers": [{"name": c.name, "usage": _usage(c.cpu_milli, c.memory_milli)}
                           for c in usage.containers]}


def _node_item(usage: NodeUsage, *, window: str, times: AnswerTimes) -> dict[str, Any]:
    return {"metadata": _metadata(usage.node.name, None, usage.node.labels, times),
            "timestamp": times.text(usage.timestamp), "window": window,
            "usage": _usage(usage.cpu_milli, usage.memory_milli)}


def render_pod_metrics(usage: PodUsage, *, window: str, now: datetime) -> dict[str, Any]:
    return {"kind": "PodMetrics", "apiVersion": API_VERSION,
            **_pod_item(usage, window=window, times=AnswerTimes(now))}


def render_pod_metrics_list(usages: Sequence[PodUsage], *, window: str,
                            now: datetime) -> dict[str, Any]:
    """Items sorted by namespace, then name, as metrics-server sorts them."""
    ordered = sorted(usages, key=lambda u: (u.pod.namespace, u.pod.name))
    times = AnswerTimes(now)
    return {"kind": "PodMetricsList", "apiVersion": API_VERSION, "metadata": {},
            "items": [_pod_item(u, window=window, times=times) for u in ordered]}


# json.dumps' own string encoder (ASCII-only output, as json.dumps writes by default).
_json_string = json.encoder.encode_basestring_ascii


class _ItemParts(NamedTuple):
    """The parts of a pod item's JSON that one answer shares."""

    created: str  # ',"creationTimestamp":"..."' (the labels and the metadata's end follow)
    after_time: str  # ',"window":"...","containers":['


def _item_parts(times: AnswerTimes, window: str) -> _ItemParts:
    return _ItemParts(',"creationTimestamp":' + _json_string(times.created),
                      ',"window":' + _json_string(window) + ',"containers":[')


def _container_json(name: str, cpu_milli: int, memory_milli: int) -> str:
    return ('{"name":' + _json_string(name) + ',"usage":{"cpu":"' + milli_quantity(cpu_milli)
            + '","memory":"' + binary_milli_quantity(memory_milli) + '"}}')


def _pod_item_json(pod: PodLike, *, timestamp: str, containers: str, parts: _ItemParts) -> str:
    """One PodMetricsList item, as json.dumps(_pod_item(...), separators=(",", ":"))."""
    labels = ""
    if pod.labels:
        labels = ',"labels":' + (pod.labels_json if pod.labels_json is not None else
                                 json.dumps(dict(pod.labels), separators=(",", ":")))
    return ('{"metadata":{"name":' + _json_string(pod.name) + ',"namespace":'
            + _json_string(pod.namespace) + parts.created + labels + '},"timestamp":"'
            + timestamp + '"' + parts.after_time + containers + "]}")


def encode_pod_items(items: Sequence[str]) -> bytes:
    """A PodMetricsList of items already encoded (pod_usage_items), in the order given."""
    return ('{"kind":"PodMetricsList","apiVersion":"' + API_VERSION + '","metadata":{},'
            '"items":[' + ",".join(items) + "]}").encode()


def encode_pod_metrics_list(usages: Sequence[PodUsage], *, window: str,
                            now: datetime) -> bytes:
    """Compact JSON of `render_pod_metrics_list(...)`, byte for byte, written directly: a
    1,000-pod answer costs a third of building the dicts and encoding them."""
    times = AnswerTimes(now)
    parts = _item_parts(times, window)
    return encode_pod_items([
        _pod_item_json(usage.pod, timestamp=times.text(usage.timestamp), parts=parts,
                       containers=",".join(_container_json(c.name, c.cpu_milli, c.memory_milli)
                                           for c in usage.containers))
        for usage in sorted(usages, key=lambda u: (u.pod.namespace, u.pod.name))])


def pod_usage_items(pods: Sequence[PodLike], *, cpu: Sequence[Sample],
                    memory: Sequence[Sample], pod_label: str, container_label: str,
                    window: str, times: AnswerTimes) -> tuple[list[str], list[PodLike]]:
    """assemble_pod_usage and the list's encoding in one pass, for a pod list: the JSON item
    of each pod with metrics, in the order of `pods`, and the pods left out. The items are
    what encode_pod_metrics_list writes for assemble_pod_usage's usages (a test pins it).

    The loop writes each item's text straight from the samples (one string per pod, and no
    tuple, list or generator between): it runs for every pod of a `kubectl top pods -A`."""
    created, after_time = _item_parts(times, window)
    cpu_by_pod = _by_pod(cpu, pod_label=pod_label, container_label=container_label)
    memory_by_pod = _by_pod(memory, pod_label=pod_label, container_label=container_label)
    missing: list[PodLike] = []
    items: list[str] = []
    append = items.append
    text = times.text
    for pod in pods:
        cpu_entry = cpu_by_pod.get(pod.name)
        memory_entry = memory_by_pod.get(pod.name)
        if cpu_entry is None or memory_entry is None:
            missing.append(pod)
            continue
        if (type(cpu_entry) is tuple and type(memory_entry) is tuple
                and cpu_entry[0] == memory_entry[0]):
            cpu_time, memory_time = cpu_entry[2], memory_entry[2]
            earliest = cpu_time if cpu_time is memory_time else min(cpu_time, memory_time)
            containers = ('{"name":' + _json_string(cpu_entry[0]) + ',"usage":{"cpu":"'
                          + milli_quantity(cpu_entry[1]) + '","memory":"'
                          + binary_milli_quantity(memory_entry[1]) + '"}}')
        else:
            earliest, joined = _pod_containers(cpu_entry, memory_entry)
            containers = ",".join(_container_json(*c) for c in joined)
        labels = ""
        if pod.labels:
            labels = ',"labels":' + (pod.labels_json if pod.labels_json is not None else
                                     json.dumps(dict(pod.labels), separators=(",", ":")))
        append('{"metadata":{"name":' + _json_string(pod.name) + ',"namespace":'
               + _json_string(pod.namespace) + created + labels + '},"timestamp":"'
               + text(earliest) + '"' + after_time + containers + "]}")
    return items, missing


def render_node_metrics(usage: NodeUsage, *, window: str, now: datetime) -> dict[str, Any]:
    return {"kind": "NodeMetrics", "apiVersion": API_VERSION,
            **_node_item(usage, window=window, times=AnswerTimes(now))}


def render_node_metrics_list(usages: Sequence[NodeUsage], *, window: str,
                             now: datetime) -> dict[str, Any]:
    ordered = sorted(usages, key=lambda u: u.node.name)
    times = AnswerTimes(now)
    return {"kind": "NodeMetricsList", "apiVersion": API_VERSION, "metadata": {},
            "items": [_node_item(u, window=window, times=times) for u in ordered]}


def render_resource_metrics_resource_list() -> dict[str, Any]:
    """metrics-server's APIResourceList for metrics.k8s.io/v1beta1."""
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": API_VERSION,
            "resources": [
                {"name": "nodes", "singularName": "", "namespaced": False, "kind": "NodeMetrics",
                 "verbs": ["get", "list"]},
                {"name": "pods", "singularName": "", "namespaced": True, "kind": "PodMetrics",
                 "verbs": ["get", "list"]}]}


def _not_found(group: str, resource: str, name: str) -> dict[str, Any]:
    qualified = f"{resource}.{group}" if group else resource
    return status_body(code=404, reason="NotFound", message=f'{qualified} "{name}" not found',
                       details={"name": name, **({"group": group} if group else {}),
                                "kind": resource})


def object_not_found(kind: str, name: str) -> dict[str, Any]:
    """The pod or node is not (or not a running pod): `pods "web-1" not found`, `node "n-1"
    not found`. Both metrics-server and prometheus-adapter pass on their lister's NotFound, and
    client-go's node lister names the resource in the singular."""
    return _not_found("", "node" if kind == "nodes" else kind, name)


def usage_not_found(kind: str, *, namespace: str | None, name: str) -> dict[str, Any]:
    """The object exists but has no metrics: `podmetrics.metrics.k8s.io "ns/web-1" not found`,
    as metrics-server answers."""
    resource = "podmetrics" if kind == "pods" else "nodemetrics"
    shown = f"{namespace}/{name}" if namespace is not None else name
    return _not_found(RESOURCE_METRICS_GROUP, resource, shown)
