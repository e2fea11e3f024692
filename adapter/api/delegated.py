"""Discovery lists merged with a delegate adapter's, and its unreachable-answer (no I/O).

With `--delegate-external-to` / `--delegate-custom-to`, `GET /apis/<group>/<version>` lists our
resources first and then the delegate's that we do not list already (by `name`): our own
metrics win a name clash, in discovery as in requests.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from adapter.api.wire import service_unavailable

__all__ = [
    "DelegateListError",
    "delegate_unavailable",
    "merge_resource_lists",
    "read_resource_list",
]

# What a 503 for a delegated metric asks the client to wait before retrying.
DELEGATE_RETRY_AFTER_SECONDS = 5


class DelegateListError(ValueError):
    """The delegate's discovery answer is not a usable APIResourceList."""


def read_resource_list(body: bytes, *, group_version: str) -> tuple[dict[str, Any], ...]:
    """The `resources` of a delegate's APIResourceList for `group_version`, checked: each an
    object with a non-empty string `name`. Raises DelegateListError."""
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise DelegateListError("the answer is not JSON") from None
    if not isinstance(document, Mapping) or document.get("kind") != "APIResourceList":
        raise DelegateListError("the answer is not an APIResourceList")
    if document.get("groupVersion") != group_version:
        raise DelegateListError(f"the list is for {document.get('groupVersion')!r}, "
                                f"not {group_version!r}")
    resources = document.get("resources") or []
    if not isinstance(resources, list):
        raise DelegateListError("resources is not a list")
    checked = []
    for resource in resources:
        if not isinstance(resource, Mapping) or not isinstance(resource.get("name"), str) \
                or not resource["name"]:
            raise DelegateListError("a resource has no name")
        checked.append(dict(resource))
    return tuple(checked)


def merge_resource_lists(ours: Mapping[str, Any], theirs: Sequence[Mapping[str, Any]], *,
                         fold_case: bool = False) -> dict[str, Any]:
    """Our APIResourceList with the delegate's resources appended, ours winning by name
    (compared without regard to case with `fold_case`: external metric names are)."""
    def key(resource: Mapping[str, Any]) -> str:
        name = str(resource.get("name", ""))
        return name.lower() if fold_case else name

    resources = [dict(resource) for resource in ours.get("resources") or []]
    seen = {key(resource) for resource in resources}
    for resource in theirs:
        if key(resource) in seen:
            continue
        seen.add(key(resource))
        resources.append(dict(resource))
    return {**ours, "resources": resources}


def delegate_unavailable(*, group: str, metric: str, why: str) -> dict[str, Any]:
    """503 for a delegated metric whose adapter did not answer; `why` is a short cause
    (`timed out`, `connection refused`), never the delegate's address or its certificate."""
    return service_unavailable(
        message=f"unable to fetch metrics: the adapter that serves {metric} ({group}) did not "
                f"answer: {why}",
        retry_after_seconds=DELEGATE_RETRY_AFTER_SECONDS)
