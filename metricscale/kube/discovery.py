"""The one API discovery client: which groups, versions, resources and kinds the cluster serves.

A pass reads `/api` and `/apis` as aggregated discovery (`APIGroupDiscoveryList` v2, then
v2beta1), which answers everything in two requests; a server that only speaks the legacy form
gets one GET per group version (at most eight at a time). The result is an immutable
`DiscoverySnapshot`, swapped whole; concurrent callers of `refresh` share one pass.

One group version that fails (a 503 from an unavailable APIService, a timeout, a version
aggregated discovery marks `Stale`) does not fail the pass: as client-go's partial
`ErrGroupDiscoveryFailed`, the rest is used. Its resources are kept from the last good pass if
that pass had them (a flapping APIService does not drop them for a while), else it is left out
until a pass reads it. Only the core `v1` is required.

The snapshot also answers as a RESTMapper does (`kind_mappings`): the resources of a kind in a
group, preferred version first, and whether each serves a `scale` subresource.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import aiohttp

from metricscale.kube.errors import (
    InvalidGroupVersion,
    KubeError,
    KubeUnavailable,
    NotFound,
    UnexpectedResponse,
)
from metricscale.kube.requests import KubeRequests

__all__ = [
    "AGGREGATED_DISCOVERY_ACCEPT",
    "DiscoverySnapshot",
    "ResourceDiscovery",
    "ResourceMapping",
    "parse_aggregated_discovery",
    "parse_group_version",
]

logger = logging.getLogger(__name__)

# kubectl's Accept for /api and /apis: aggregated discovery (v2, then v2beta1), else legacy.
AGGREGATED_DISCOVERY_ACCEPT = (
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,"
    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,"
    "application/json")
_CONCURRENCY = 8
# The core group: a pass that cannot read it (nor keep it from the last pass) fails whole.
_CORE_GROUP_VERSION = "v1"


def _mapping(value: object) -> Mapping[str, Any]:
    return cast(Mapping[str, Any], value) if isinstance(value, Mapping) else {}


def parse_group_version(api_version: str) -> tuple[str, str]:
    """schema.ParseGroupVersion: "apps/v1" -> ("apps", "v1"), "v1" -> ("", "v1")."""
    if not api_version or api_version == "/":
        return "", ""
    parts = api_version.split("/")
    if len(parts) == 1:
        return "", parts[0]
    if len(parts) == 2:
        return parts[0], parts[1]
    raise InvalidGroupVersion(f"unexpected GroupVersion string: {api_version}")


def _split_group_version(group_version: str) -> tuple[str, str]:
    group, _, version = group_version.rpartition("/")
    return group, version


@dataclass(frozen=True)
class ResourceMapping:
    """What a RESTMapper answers for a kind: the resource, its version and its scope."""

    group: str
    version: str
    resource: str
    kind: str
    namespaced: bool
    has_scale: bool = False

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> str:
        """`deployments.apps`, or `pods` in the core group (schema.GroupResource.String())."""
        return f"{self.resource}.{self.group}" if self.group else self.resource

    @property
    def gvr_string(self) -> str:
        """schema.GroupVersionResource.String(), as upstream quotes it in errors."""
        return f"{self.group}/{self.version}, Resource={self.resource}"

    def path(self, *, namespace: str | None, name: str | None = None,
             subresource: str | None = None) -> str:
        prefix = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        parts = [prefix]
        if self.namespaced and namespace:
            parts.append(f"namespaces/{namespace}")
        parts.append(self.resource)
        if name is not None:
            parts.append(name)
        if subresource is not None:
            parts.append(subresource)
        return "/".join(parts)


@dataclass(frozen=True)
class DiscoverySnapshot:
    """One discovery pass: `APIResourceList` documents, core group first, then each group's
    versions in the server's preference order; and the group versions it could not read."""

    resource_lists: tuple[Mapping[str, Any], ...]
    failed: tuple[str, ...] = ()
    _kinds: dict[tuple[str, str], list[ResourceMapping]] = field(
        default_factory=dict, compare=False, repr=False)

    def versions(self, group: str) -> list[str]:
        """The versions of `group` this snapshot has, preferred first."""
        return [_split_group_version(str(document.get("groupVersion", "")))[1]
                for document in self.resource_lists
                if _split_group_version(str(document.get("groupVersion", "")))[0] == group]

    def kind_mappings(self, group: str, kind: str) -> list[ResourceMapping]:
        """Every version's resource of `kind` in `group`, preferred version first (a
        RESTMapper's `RESTMappings`); subresources are not kinds of their own."""
        key = (group, kind)
        known = self._kinds.get(key)
        if known is not None:
            return known  # every reconcile asks; a snapshot never changes
        mappings: list[ResourceMapping] = []
        for document in self.resource_lists:
            document_group, version = _split_group_version(str(document.get("groupVersion", "")))
            if document_group != group:
                continue
            listed = [_mapping(r) for r in document.get("resources") or ()]
            names = {str(r.get("name") or "") for r in listed}
            for entry in listed:
                name = str(entry.get("name") or "")
                if "/" in name or entry.get("kind") != kind:
                    continue
                mappings.append(ResourceMapping(
                    group=group, version=version, resource=name, kind=kind,
                    namespaced=bool(entry.get("namespaced")),
                    has_scale=f"{name}/scale" in names))
                break
        self._kinds[key] = mappings
        return mappings


def _preferred_first(group: Mapping[str, Any]) -> list[str]:
    versions = [str(v.get("groupVersion", "")) for v in group.get("versions") or ()
                if isinstance(v, Mapping)]
    preferred = group.get("preferredVersion")
    first = str(preferred.get("groupVersion", "")) if isinstance(preferred, Mapping) else ""
    if first in versions:
        versions.remove(first)
        versions.insert(0, first)
    return [v for v in versions if v]


def parse_aggregated_discovery(documents: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """`APIGroupDiscoveryList` documents (v2/v2beta1) as legacy `APIResourceList` dicts.

    Versions come in the server's preference order (first is preferred); resources without a
    kind are kept with an empty one, and each subresource becomes `<resource>/<subresource>`, as
    in legacy discovery. A version marked `Stale` (its aggregated server did not answer the
    aggregator) is left out too, as client-go does.
    """
    return [document for _, document in _aggregated_versions(documents) if document is not None]


def _aggregated_versions(documents: Iterable[Mapping[str, Any]],
                         ) -> list[tuple[str, dict[str, Any] | None]]:
    """(group version, its APIResourceList, or None when the aggregator marks it Stale)."""
    out: list[tuple[str, dict[str, Any] | None]] = []
    for document in documents:
        for group in document.get("items") or ():
            group_name = str((group.get("metadata") or {}).get("name", ""))
            for version in group.get("versions") or ():
                version_name = str(version.get("version", ""))
                group_version = f"{group_name}/{version_name}" if group_name else version_name
                if version.get("freshness") == "Stale":
                    out.append((group_version, None))
                    continue
                resources = []
                for resource in version.get("resources") or ():
                    name = str(resource.get("resource", ""))
                    kind = (resource.get("responseKind") or {}).get("kind", "")
                    namespaced = resource.get("scope") == "Namespaced"
                    resources.append({
                        "name": name,
                        "singularName": resource.get("singularResource", ""),
                        "kind": kind,
                        "namespaced": namespaced,
                        "verbs": list(resource.get("verbs") or ()),
                    })
                    for sub in resource.get("subresources") or ():
                        resources.append({
                            "name": f"{name}/{sub.get('subresource', '')}",
                            "singularName": "",
                            "kind": (sub.get("responseKind") or {}).get("kind", ""),
                            "namespaced": namespaced,
                            "verbs": list(sub.get("verbs") or ()),
                        })
                out.append((group_version,
                            {"groupVersion": group_version, "resources": resources}))
    return out


class ResourceDiscovery:
    """Discovery passes over the one request path, and the last good snapshot.

    `refresh` makes a pass now (shared with one already running; a caller that gives up does
    not abort it for the others); `snapshot_within` answers from the last pass when it is young
    enough. A failed pass raises and keeps the last good snapshot. The clock is injected.
    """

    def __init__(self, requests: KubeRequests, *, request_timeout: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._requests = requests
        self._timeout = aiohttp.ClientTimeout(total=request_timeout)
        self._clock = clock
        self.snapshot: DiscoverySnapshot | None = None
        self.generation = 0  # successful passes so far
        self.passes = 0      # attempted passes so far
        self.last_attempt: float | None = None
        self.last_success: float | None = None
        self._documents: dict[str, Mapping[str, Any]] = {}  # last good, by group version
        self._refreshing: asyncio.Task[DiscoverySnapshot] | None = None

    def age(self) -> float | None:
        """Seconds since the last successful pass (by the injected clock), or None."""
        return None if self.last_success is None else self._clock() - self.last_success

    async def snapshot_within(self, max_age: float) -> DiscoverySnapshot:
        """The last snapshot if it is younger than `max_age` seconds, else a new pass."""
        age = self.age()
        if self.snapshot is not None and age is not None and age < max_age:
            return self.snapshot
        return await self.refresh()

    async def refresh(self) -> DiscoverySnapshot:
        """One discovery pass now (shared with a pass already running). Raises KubeError."""
        task = self._refreshing
        if task is None or task.done():
            task = self._refreshing = asyncio.create_task(self._pass(), name="kube discovery")
            task.add_done_callback(self._refreshed)
        # shield: a request that gives up must not abort the pass others wait for.
        return await asyncio.shield(task)

    def _refreshed(self, task: asyncio.Task[DiscoverySnapshot]) -> None:
        if self._refreshing is task:
            self._refreshing = None
        if not task.cancelled():
            task.exception()  # retrieved: a pass nobody awaited any more is not a lost error

    async def close(self) -> None:
        """Cancel a pass in flight."""
        task, self._refreshing = self._refreshing, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    async def _pass(self) -> DiscoverySnapshot:
        self.last_attempt = self._clock()
        self.passes += 1
        fetched = await self._fetch()
        documents: dict[str, Mapping[str, Any]] = {}  # in preference order
        failed: list[str] = []
        for group_version, document in fetched:
            if document is None:
                failed.append(group_version)
                document = self._documents.get(group_version)
            if document is not None:
                documents.setdefault(group_version, document)
        if _CORE_GROUP_VERSION not in documents:
            raise KubeUnavailable("the core group version v1 could not be discovered")
        kept = [gv for gv in failed if gv in documents]
        if failed:
            logger.warning("discovery could not read %d group versions (%s); the rest is used%s",
                           len(failed), ", ".join(failed),
                           f", and {', '.join(kept)} kept from the last pass" if kept else "")
        self._documents = documents
        snapshot = DiscoverySnapshot(tuple(documents.values()), tuple(failed))
        self.snapshot = snapshot
        self.generation += 1
        self.last_success = self._clock()
        return snapshot

    async def _get(self, path: str, *, accept: str | None = None) -> Mapping[str, Any]:
        options: dict[str, Any] = {"client_timeout": self._timeout}
        if accept is not None:
            options["accept"] = accept
        data = await self._requests.call("GET", path, operation="discovery",
                                         resource="apis" if path.startswith("/apis") else "api",
                                         **options)
        if not isinstance(data, Mapping):
            raise UnexpectedResponse(f"the Kubernetes API sent a non-object for {path}")
        return cast(Mapping[str, Any], data)

    async def fetch_group_list(self) -> list[Mapping[str, Any]]:
        """GET /apis as a legacy APIGroupList: its groups, with `preferredVersion` and
        `versions` (not cached; callers cache what they need)."""
        groups = (await self._get("/apis")).get("groups")
        return [_mapping(g) for g in groups] if isinstance(groups, list) else []

    async def _fetch(self) -> list[tuple[str, Mapping[str, Any] | None]]:
        """(group version, its APIResourceList or None when it could not be read), in
        preference order; group versions that are gone (404) are left out."""
        core = await self._get("/api", accept=AGGREGATED_DISCOVERY_ACCEPT)
        groups = await self._get("/apis", accept=AGGREGATED_DISCOVERY_ACCEPT)
        aggregated = [d.get("kind") == "APIGroupDiscoveryList" for d in (core, groups)]
        if all(aggregated):
            return list(_aggregated_versions([core, groups]))
        if any(aggregated):  # a proxy that mixes the two: ask both in the legacy form
            core = await self._get("/api")
            groups = await self._get("/apis")
        group_versions = [v for v in core.get("versions") or () if isinstance(v, str)]
        for group in groups.get("groups") or ():
            if isinstance(group, Mapping):
                group_versions += _preferred_first(group)
        limit = asyncio.Semaphore(_CONCURRENCY)

        async def one(group_version: str) -> tuple[str, Mapping[str, Any] | None] | None:
            path = f"/apis/{group_version}" if "/" in group_version else f"/api/{group_version}"
            async with limit:
                try:
                    return group_version, await self._get(path)
                except NotFound:  # a group version that went away mid-pass
                    return None
                except KubeError as error:
                    logger.debug("discovery of %s failed: %s", group_version, error)
                    return group_version, None

        fetched = await asyncio.gather(*(one(gv) for gv in group_versions))
        return [entry for entry in fetched if entry is not None]
