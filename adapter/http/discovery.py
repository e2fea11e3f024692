"""Discovery documents: `/apis` (aggregated discovery or an APIGroupList), `/apis/<group>`
(an APIGroup) and `/apis/<group>/<version>` (an APIResourceList, merged with the delegate's
when the group is delegated)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from adapter.api.delegated import merge_resource_lists
from adapter.api.groups import EXTERNAL_METRICS_GROUP, RESOURCE_METRICS_GROUP
from adapter.api.usage import render_resource_metrics_resource_list
from adapter.api.wire import (
    AGGREGATED_DISCOVERY_CONTENT_TYPES,
    render_aggregated_discovery,
    render_api_group,
    render_api_group_list,
    render_custom_resource_list,
    render_external_resource_list,
)
from adapter.http.keys import DELEGATE_KEY, ROUTE_LABEL_KEY, SNAPSHOT_KEY, USER_KEY
from adapter.http.responses import aggregated_discovery_version, json_response, require_json
from adapter.http.snapshots import ConfigSnapshot

__all__ = ["group_answer", "group_list_answer", "resource_list", "resource_list_answer"]

Groups = Mapping[str, tuple[str, ...]]


def _own_resource_list(snapshot: ConfigSnapshot, *, group: str,
                       version: str) -> dict[str, Any]:
    if group == RESOURCE_METRICS_GROUP:
        return render_resource_metrics_resource_list()
    registry = snapshot.discovery.registry
    if group == EXTERNAL_METRICS_GROUP:
        return render_external_resource_list(metrics=registry.external_metrics())
    return render_custom_resource_list(version=version, metrics=registry.custom_metrics())


async def resource_list(request: web.Request, *, group: str, version: str) -> dict[str, Any]:
    """Our APIResourceList, merged with the delegate's when this group is delegated (ours
    first; a delegate that does not answer leaves ours alone)."""
    ours = _own_resource_list(request[SNAPSHOT_KEY], group=group, version=version)
    delegate = request.app.get(DELEGATE_KEY)
    if delegate is None or not delegate.delegates(group):
        return ours
    theirs = await delegate.resource_list(group, version, user=request[USER_KEY])
    return merge_resource_lists(ours, theirs, fold_case=group == EXTERNAL_METRICS_GROUP)


async def group_list_answer(request: web.Request, *, groups: Groups,
                            accept: str | None) -> web.StreamResponse:
    """`/apis`: aggregated discovery when `Accept` asks for it first, else an APIGroupList."""
    request[ROUTE_LABEL_KEY] = "discovery"
    aggregated = aggregated_discovery_version(accept)
    if aggregated is None:
        require_json(accept)
        return json_response(render_api_group_list(tuple(groups.items())),
                             headers={"Vary": "Accept"})
    pairs = [(group, version) for group, versions in groups.items() for version in versions]
    lists = dict(zip(pairs, await asyncio.gather(
        *(resource_list(request, group=group, version=version) for group, version in pairs)),
        strict=True))
    document = render_aggregated_discovery(
        [(group, [(version, lists[group, version]) for version in versions])
         for group, versions in groups.items()],
        version=aggregated)
    return json_response(document, headers={"Vary": "Accept"},
                         content_type=AGGREGATED_DISCOVERY_CONTENT_TYPES[aggregated])


def group_answer(request: web.Request, *, group: str, groups: Groups) -> web.StreamResponse:
    request[ROUTE_LABEL_KEY] = "discovery"
    return json_response(render_api_group(group=group, versions=groups[group]))


async def resource_list_answer(request: web.Request, *, group: str,
                               version: str) -> web.StreamResponse:
    request[ROUTE_LABEL_KEY] = "discovery"
    return json_response(await resource_list(request, group=group, version=version))
