"""The controller's caches: autoscalers (our CRD, and native HPAs on request) and pods, fed by
list+watch, with pods indexed by namespace and label so a reconcile finds its pods in
microseconds, and the selectors of all autoscalers indexed for upstream's ambiguity check.

One pods informer watches all namespaces (or the one namespace the controller is limited to):
at 10,000 autoscalers one watch connection is cheap where one per namespace or per selector
would be thousands, and a pod is parsed once per change, not once per reconcile.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from autoscaler.decision.pod_selection import ReplicaSetOwner, parse_replica_set
from autoscaler.model.fields import ModelError
from autoscaler.model.objects import (
    AUTOSCALER_API_VERSION,
    AUTOSCALER_KIND,
    HPA_API_VERSION,
    HPA_KIND,
    Autoscaler,
    parse_autoscaler,
)
from autoscaler.model.pods import Pod, parse_pod
from metricscale.core.selectors import Operator, Selector, SelectorError, parse_selector
from metricscale.kube.informer import (
    Informer,
    InformerEvent,
    InformerOptions,
    ListWatchSource,
    collection_path,
)

__all__ = [
    "AUTOSCALER_RESOURCE",
    "HPA_RESOURCE",
    "AutoscalerEntry",
    "AutoscalerKey",
    "PodIndex",
    "SelectorCache",
    "SelectorRegistry",
    "Watching",
    "project_autoscaler",
    "project_pod",
]

logger = logging.getLogger(__name__)

AUTOSCALER_RESOURCE = ("metricscale.dev", "v1alpha1", "autoscalers")
HPA_RESOURCE = ("autoscaling", "v2", "horizontalpodautoscalers")
# Operators whose matching pods all carry one of a few known label pairs.
_EQUALITY = frozenset({Operator.EQUALS, Operator.DOUBLE_EQUALS, Operator.IN})


class AutoscalerKey(NamedTuple):
    """One autoscaler: an Autoscaler or a native HorizontalPodAutoscaler, namespace and name."""

    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class AutoscalerEntry:
    """An autoscaler as cached: the raw object, and its parsed form (or why it did not parse)."""

    key: AutoscalerKey
    raw: Mapping[str, Any] = field(repr=False)
    autoscaler: Autoscaler | None
    error: str | None
    generation: int | None
    annotations: Mapping[str, str]

    @property
    def status(self) -> Mapping[str, Any]:
        status = self.raw.get("status")
        return status if isinstance(status, Mapping) else {}


def project_autoscaler(raw: Mapping[str, Any], *, kind: str = "") -> AutoscalerEntry:
    """The cache entry of an Autoscaler or HPA; never raises (a bad object is kept, with why).

    `kind` is the collection's kind, for list items that do not carry their own."""
    metadata = raw.get("metadata") if isinstance(raw.get("metadata"), Mapping) else {}
    assert isinstance(metadata, Mapping)
    kind = str(raw.get("kind") or kind or AUTOSCALER_KIND)
    if kind not in (HPA_KIND, AUTOSCALER_KIND):
        kind = AUTOSCALER_KIND
    raw = dict(raw)
    # Lists and watch events of a typed collection may leave apiVersion/kind to the list.
    raw.setdefault("apiVersion", HPA_API_VERSION if kind == HPA_KIND else AUTOSCALER_API_VERSION)
    raw.setdefault("kind", kind)
    key = AutoscalerKey(kind, str(metadata.get("namespace") or ""),
                        str(metadata.get("name") or ""))
    annotations = metadata.get("annotations")
    generation = metadata.get("generation")
    try:
        parsed: Autoscaler | None = parse_autoscaler(raw)
        error = None
    except ModelError as err:
        parsed, error = None, str(err)
    return AutoscalerEntry(
        key=key, raw=raw, autoscaler=parsed, error=error,
        generation=generation if isinstance(generation, int) else None,
        annotations={str(k): str(v) for k, v in annotations.items()}
        if isinstance(annotations, Mapping) else {})


def project_pod(raw: Mapping[str, Any]) -> Pod:
    """A pod as the HPA reads it, parsed once per change; never raises (the informer must not
    die on one odd pod: such a pod keeps its labels and counts as one without requests)."""
    try:
        return parse_pod(raw, "pod")
    except ModelError as err:
        metadata = raw.get("metadata") if isinstance(raw.get("metadata"), Mapping) else {}
        assert isinstance(metadata, Mapping)
        labels = metadata.get("labels")
        logger.warning("pod %s/%s cannot be read (%s); it counts as a pod without requests",
                       metadata.get("namespace"), metadata.get("name"), err)
        return Pod(name=str(metadata.get("name") or ""),
                   namespace=str(metadata.get("namespace") or ""),
                   labels={str(k): str(v) for k, v in labels.items()}
                   if isinstance(labels, Mapping) else {})


def project_replica_set(raw: Mapping[str, Any]) -> ReplicaSetOwner:
    """A ReplicaSet's owner and revision; never raises (an odd one owns no pods we count)."""
    try:
        return parse_replica_set(raw)
    except ModelError as err:
        metadata = raw.get("metadata") if isinstance(raw.get("metadata"), Mapping) else {}
        assert isinstance(metadata, Mapping)
        logger.warning("replicaset %s/%s cannot be read: %s", metadata.get("namespace"),
                       metadata.get("name"), err)
        return ReplicaSetOwner(name=str(metadata.get("name") or ""),
                               namespace=str(metadata.get("namespace") or ""))


def _project_hpa(raw: Mapping[str, Any]) -> AutoscalerEntry:
    return project_autoscaler(raw, kind=HPA_KIND)


# --------------------------------------------------------------------------------------------
# Pods by namespace and label


class SelectorCache:
    """Parsed selector strings (a Scale's status.selector), shared by every reconcile."""

    def __init__(self, limit: int = 50_000) -> None:
        self._parsed: dict[str, Selector | SelectorError] = {}
        self._limit = limit

    def parse(self, text: str) -> Selector:
        """labels.Parse(text); raises SelectorError (also from the cache)."""
        found = self._parsed.get(text)
        if found is None:
            try:
                found = parse_selector(text)
            except SelectorError as err:
                found = err
            if len(self._parsed) >= self._limit:
                self._parsed.clear()  # selectors rarely change; a full cache is a leak signal
            self._parsed[text] = found
        if isinstance(found, SelectorError):
            raise found
        return found


def _equality_pairs(selector: Selector) -> list[list[tuple[str, str]]]:
    """For each equality-like requirement, the label pairs one of which a match must carry."""
    groups = []
    for requirement in selector.requirements:
        if requirement.operator in _EQUALITY:
            groups.append([(requirement.key, value) for value in requirement.values])
    return groups


class PodIndex:
    """Pods by namespace, and by (label, value) within each namespace; fed by informer events."""

    def __init__(self) -> None:
        self._pods: dict[str, dict[str, Pod]] = {}
        self._postings: dict[str, dict[tuple[str, str], set[str]]] = {}

    def __len__(self) -> int:
        return sum(len(pods) for pods in self._pods.values())

    def on_event(self, event: InformerEvent[Pod]) -> None:
        """Informer callback: keep the index in step with the cache."""
        if event.old is not None:
            self.remove(event.old)
        if event.new is not None:
            self.add(event.new)

    def add(self, pod: Pod) -> None:
        namespace = pod.namespace
        pods = self._pods.setdefault(namespace, {})
        previous = pods.get(pod.name)
        if previous is not None:
            self.remove(previous)
            pods = self._pods.setdefault(namespace, {})
        pods[pod.name] = pod
        postings = self._postings.setdefault(namespace, {})
        for pair in pod.labels.items():
            postings.setdefault(pair, set()).add(pod.name)

    def remove(self, pod: Pod) -> None:
        namespace = pod.namespace
        pods = self._pods.get(namespace)
        if pods is None or pods.get(pod.name) is None:
            return
        stored = pods.pop(pod.name)
        postings = self._postings.get(namespace, {})
        for pair in stored.labels.items():
            names = postings.get(pair)
            if names is not None:
                names.discard(pod.name)
                if not names:
                    del postings[pair]
        if not pods:
            del self._pods[namespace]
            self._postings.pop(namespace, None)

    def count(self, namespace: str, pair: tuple[str, str]) -> int:
        return len(self._postings.get(namespace, {}).get(pair, ()))

    def select(self, namespace: str, selector: Selector) -> list[Pod]:
        """The pods a lister returns for this namespace and selector (order: by name)."""
        if selector.nothing:
            return []
        pods = self._pods.get(namespace)
        if not pods:
            return []
        postings = self._postings.get(namespace, {})
        candidates: Iterable[str] | None = None
        smallest = -1
        for pairs in _equality_pairs(selector):
            names: set[str] = set()
            for pair in pairs:
                names |= postings.get(pair, set())
            if candidates is None or len(names) < smallest:
                candidates, smallest = names, len(names)
            if not names:
                return []
        chosen = pods.keys() if candidates is None else candidates
        return sorted((pods[name] for name in chosen if selector.matches(pods[name].labels)),
                      key=lambda pod: pod.name)


# --------------------------------------------------------------------------------------------
# The selectors of all autoscalers, for the AmbiguousSelector check


class SelectorRegistry:
    """Which autoscaler targets which selector, indexed so that the autoscalers that may share
    pods with a given set of pods are found without testing every selector in the namespace.

    Each selector is filed under one label pair every pod it selects must carry (the rarest
    among its equality requirements), or under "any pod" when it has none; the candidates for
    some pods are those filed under a pair the pods carry, plus the "any pod" ones. The pure
    decision then checks each candidate exactly, as upstream does.
    """

    def __init__(self, pods: PodIndex, selectors: SelectorCache) -> None:
        self._pods = pods
        self._selectors = selectors
        self._by_key: dict[AutoscalerKey, tuple[str, tuple[str, str] | None]] = {}
        self._by_pair: dict[str, dict[tuple[str, str], set[AutoscalerKey]]] = {}
        self._unindexed: dict[str, set[AutoscalerKey]] = {}

    def __len__(self) -> int:
        return len(self._by_key)

    def selector_of(self, key: AutoscalerKey) -> str | None:
        found = self._by_key.get(key)
        return found[0] if found is not None else None

    def update(self, key: AutoscalerKey, selector: str) -> None:
        """Remember the selector of key's scale target (as last read from its scale)."""
        found = self._by_key.get(key)
        if found is not None and found[0] == selector:
            return
        self.remove(key)
        pair: tuple[str, str] | None = None
        try:
            parsed = self._selectors.parse(selector)
        except SelectorError:
            return  # an unusable selector selects nothing, and so shares nothing
        groups = [pairs[0] for pairs in _equality_pairs(parsed) if len(pairs) == 1]
        if groups:
            pair = min(groups, key=lambda p: self._pods.count(key.namespace, p))
            self._by_pair.setdefault(key.namespace, {}).setdefault(pair, set()).add(key)
        else:
            self._unindexed.setdefault(key.namespace, set()).add(key)
        self._by_key[key] = (selector, pair)

    def remove(self, key: AutoscalerKey) -> None:
        found = self._by_key.pop(key, None)
        if found is None:
            return
        _, pair = found
        if pair is None:
            self._unindexed.get(key.namespace, set()).discard(key)
        else:
            keys = self._by_pair.get(key.namespace, {}).get(pair)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_pair[key.namespace][pair]

    def others_for(self, key: AutoscalerKey, pods: Sequence[Pod]) -> dict[str, str]:
        """name -> selector of every other autoscaler in the namespace that may select one of
        `pods` (a superset of those that do; the decision checks each)."""
        namespace = key.namespace
        found: set[AutoscalerKey] = set(self._unindexed.get(namespace, ()))
        by_pair = self._by_pair.get(namespace)
        if by_pair:
            seen: set[tuple[str, str]] = set()
            for pod in pods:
                for pair in pod.labels.items():
                    if pair in seen:
                        continue
                    seen.add(pair)
                    keys = by_pair.get(pair)
                    if keys:
                        found |= keys
        found.discard(key)
        return {other.name: self._by_key[other][0] for other in found}


# --------------------------------------------------------------------------------------------
# The informers


class Watching:
    """The informers of one controller and the indexes fed by them.

    `sources` builds a ListWatchSource for a collection path (PathSource over an ApiClient in
    the program; anything in tests).
    """

    def __init__(self, sources: Callable[[str], ListWatchSource], *, native_hpa: bool = False,
                 namespace: str | None = None,
                 informer_options: InformerOptions | None = None,
                 autoscalers: bool = True, hpa_selector: str | None = None) -> None:
        """`autoscalers=False` leaves Autoscalers unwatched (shadow mode reads HPAs only);
        `hpa_selector`, a label selector, limits the HPAs to those it selects."""
        options = informer_options or InformerOptions()
        self.pods = PodIndex()
        self.selectors = SelectorCache()
        self.registry = SelectorRegistry(self.pods, self.selectors)
        self._autoscalers: Informer[AutoscalerEntry] | None = None
        if autoscalers:
            group, version, plural = AUTOSCALER_RESOURCE
            self._autoscalers = Informer(
                sources(collection_path(group=group, version=version, plural=plural,
                                        namespace=namespace)),
                project=project_autoscaler, name="autoscalers", **options)
        self.hpas: Informer[AutoscalerEntry] | None = None
        if native_hpa:
            group, version, plural = HPA_RESOURCE
            self.hpas = Informer(
                sources(collection_path(group=group, version=version, plural=plural,
                                        namespace=namespace)),
                project=_project_hpa, name="horizontalpodautoscalers",
                label_selector=hpa_selector or None, **options)
        self.pod_informer: Informer[Pod] = Informer(
            sources(collection_path(group="", version="v1", plural="pods", namespace=namespace)),
            project=project_pod, name="pods", **options)
        self.pod_informer.subscribe(self.pods.on_event)
        # KEP-5325's OwnerReferences strategy: which Deployment owns a pod's ReplicaSet.
        self.replica_set_informer: Informer[ReplicaSetOwner] = Informer(
            sources(collection_path(group="apps", version="v1", plural="replicasets",
                                    namespace=namespace)),
            project=project_replica_set, name="replicasets", **options)

    @property
    def autoscalers(self) -> Informer[AutoscalerEntry]:
        """The Autoscalers' cache (LookupError when they are not watched: shadow mode)."""
        if self._autoscalers is None:
            raise LookupError("Autoscalers are not watched here")
        return self._autoscalers

    @property
    def informers(self) -> list[Informer[Any]]:
        return [*self.autoscaler_informers(), self.pod_informer, self.replica_set_informer]

    def autoscaler_informers(self) -> list[Informer[AutoscalerEntry]]:
        return [informer for informer in (self._autoscalers, self.hpas) if informer is not None]

    def get(self, key: AutoscalerKey) -> AutoscalerEntry | None:
        informer = self.hpas if key.kind == HPA_KIND else self._autoscalers
        if informer is None:
            return None
        return informer.get(key.namespace, key.name)

    def keys(self) -> list[AutoscalerKey]:
        return [entry.key for informer in self.autoscaler_informers()
                for _, entry in informer.items()]

    def subscribe(self, callback: Callable[[InformerEvent[AutoscalerEntry]], None]) -> None:
        """Autoscaler changes (both kinds), for the work queue."""
        for informer in self.autoscaler_informers():
            informer.subscribe(callback)

    def start(self, *, on_failure: Callable[[BaseException], None] | None = None) -> None:
        for informer in self.informers:
            informer.start(on_failure=on_failure)

    async def stop(self) -> None:
        for informer in self.informers:
            await informer.stop()

    async def wait_synced(self, timeout: float) -> bool:  # noqa: ASYNC109 - a bounded wait
        for informer in self.informers:
            if not await informer.wait_synced(timeout):
                return False
        return True

    @property
    def synced(self) -> bool:
        return all(informer.has_synced for informer in self.informers)

    def replica_sets(self, namespace: str) -> dict[str, ReplicaSetOwner]:
        """The cached ReplicaSets of a namespace, by name."""
        return {rs.name: rs for rs in self.replica_set_informer.values(namespace)}

    def select_pods(self, namespace: str, selector: str) -> list[Pod]:
        """The cached pods a selector string picks; [] for an unusable selector."""
        try:
            parsed = self.selectors.parse(selector)
        except SelectorError:
            return []
        return self.pods.select(namespace, parsed)
