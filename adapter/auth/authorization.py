"""Authorization decisions: privileged groups and always-allowed paths, then the
SubjectAccessReview to ask and how to read its answer, as the generic apiserver decides."""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from adapter.auth.attributes import RequestAttributes
from adapter.auth.configuration import AuthConfigError
from adapter.auth.reviews import (
    AUTHORIZED_TTL_SECONDS,
    MAX_CACHED_ATTRIBUTES_BYTES,
    UNAUTHORIZED_TTL_SECONDS,
    ReviewResponseError,
)
from adapter.auth.users import MASTERS_GROUP, UserInfo

DEFAULT_ALWAYS_ALLOW_PATHS = ("/healthz", "/readyz", "/livez")
DEFAULT_PRIVILEGED_GROUPS = (MASTERS_GROUP,)


class Decision(enum.Enum):
    ALLOW = "allow"
    DENY = "deny"
    NO_OPINION = "no-opinion"


@dataclass(frozen=True)
class AuthorizationDecision:
    """A decision with the reviewer's reason; ``error`` set means "answer 500"."""

    decision: Decision
    reason: str = ""
    error: str = ""


@dataclass(frozen=True)
class AlwaysAllowPaths:
    """``--authorization-always-allow-paths``: exact paths, or prefixes ending in ``*``."""

    exact: frozenset[str]
    prefixes: tuple[str, ...]

    def allows(self, attributes: RequestAttributes) -> bool:
        if attributes.is_resource_request:
            return False
        path = attributes.path.removeprefix("/")
        return path in self.exact or any(path.startswith(prefix) for prefix in self.prefixes)


def parse_always_allow_paths(paths: Sequence[str]) -> AlwaysAllowPaths:
    exact: set[str] = set()
    prefixes: list[str] = []
    for raw in paths:
        path = raw.removeprefix("/")
        if not path:
            exact.add(path)
            continue
        if "*" in path[:-1]:
            raise AuthConfigError(f"only trailing * allowed in {path!r}")
        if path.endswith("*"):
            prefixes.append(path[:-1])
        else:
            exact.add(path)
    return AlwaysAllowPaths(frozenset(exact), tuple(prefixes))


def authorize_without_review(
    *,
    user: UserInfo,
    attributes: RequestAttributes,
    always_allow_paths: AlwaysAllowPaths,
    privileged_groups: Sequence[str] = DEFAULT_PRIVILEGED_GROUPS,
) -> AuthorizationDecision:
    """The local part of the union: privileged groups, then always-allowed paths.

    NO_OPINION means a SubjectAccessReview decides.
    """
    if any(group in privileged_groups for group in user.groups):
        return AuthorizationDecision(Decision.ALLOW)
    if always_allow_paths.allows(attributes):
        return AuthorizationDecision(Decision.ALLOW)
    return AuthorizationDecision(Decision.NO_OPINION)


def subject_access_review_spec(user: UserInfo, attributes: RequestAttributes) -> dict[str, Any]:
    """The review ``spec``, keys in upstream's order, empty fields omitted as ``omitempty`` does."""
    spec: dict[str, Any] = {}
    if attributes.is_resource_request:
        resource_attributes = {
            "namespace": attributes.namespace,
            "verb": attributes.verb,
            "group": attributes.api_group,
            "version": attributes.api_version,
            "resource": attributes.resource,
            "subresource": attributes.subresource,
            "name": attributes.name,
        }
        spec["resourceAttributes"] = {k: v for k, v in resource_attributes.items() if v}
    else:
        non_resource = {"path": attributes.path, "verb": attributes.verb}
        spec["nonResourceAttributes"] = {k: v for k, v in non_resource.items() if v}
    if user.name:
        spec["user"] = user.name
    if user.groups:
        spec["groups"] = list(user.groups)
    if user.extra:
        # Go marshals maps with sorted keys; the cache key relies on the same stable order.
        spec["extra"] = {key: list(user.extra[key]) for key in sorted(user.extra)}
    if user.uid:
        spec["uid"] = user.uid
    return spec


def subject_access_review_body(user: UserInfo, attributes: RequestAttributes) -> dict[str, Any]:
    """The whole SubjectAccessReview object as the Go server posts it."""
    return {
        "kind": "SubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": None},
        "spec": subject_access_review_spec(user, attributes),
        "status": {"allowed": False},
    }


def review_cache_key(spec: Mapping[str, Any]) -> str:
    """The decision cache key: the JSON of the whole spec (user, groups, extra and attributes)."""
    return json.dumps(spec, separators=(",", ":"), ensure_ascii=False)


def should_cache_review(attributes: RequestAttributes) -> bool:
    size = sum(len(value.encode()) for value in (
        attributes.namespace, attributes.verb, attributes.api_group, attributes.api_version,
        attributes.resource, attributes.subresource, attributes.name, attributes.path))
    return size < MAX_CACHED_ATTRIBUTES_BYTES


@dataclass(frozen=True)
class ReviewStatus:
    """The ``status`` of an answered SubjectAccessReview."""

    allowed: bool
    denied: bool = False
    reason: str = ""
    evaluation_error: str = ""


def read_subject_access_review(body: Mapping[str, Any]) -> ReviewStatus:
    status = body.get("status")
    if status is None:
        status = {}
    if not isinstance(status, Mapping):
        raise ReviewResponseError("SubjectAccessReview status is not an object")
    allowed = status.get("allowed", False)
    denied = status.get("denied", False)
    reason = status.get("reason") or ""
    evaluation_error = status.get("evaluationError") or ""
    if not isinstance(allowed, bool) or not isinstance(denied, bool):
        raise ReviewResponseError("SubjectAccessReview status.allowed/denied are not booleans")
    if not isinstance(reason, str) or not isinstance(evaluation_error, str):
        raise ReviewResponseError("SubjectAccessReview status.reason is not a string")
    return ReviewStatus(allowed=allowed, denied=denied, reason=reason,
                        evaluation_error=evaluation_error)


def decide_from_review(status: ReviewStatus) -> AuthorizationDecision:
    """allowed ⇒ Allow, denied ⇒ Deny, neither ⇒ no opinion (403); both is an error (500)."""
    if status.allowed and status.denied:
        return AuthorizationDecision(
            Decision.DENY, status.reason,
            "webhook subject access review returned both allow and deny response")
    if status.denied:
        return AuthorizationDecision(Decision.DENY, status.reason)
    if status.allowed:
        return AuthorizationDecision(Decision.ALLOW, status.reason)
    return AuthorizationDecision(Decision.NO_OPINION, status.reason)


def review_ttl(
    status: ReviewStatus,
    *,
    authorized_ttl: float = AUTHORIZED_TTL_SECONDS,
    unauthorized_ttl: float = UNAUTHORIZED_TTL_SECONDS,
) -> float:
    return authorized_ttl if status.allowed else unauthorized_ttl
