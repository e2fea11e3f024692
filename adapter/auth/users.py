"""Who is asking: the user a request is authenticated as, and the groups Kubernetes gives."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["ANONYMOUS", "ANONYMOUS_USER", "AUTHENTICATED_GROUP", "MASTERS_GROUP",
           "UNAUTHENTICATED_GROUP", "UserInfo"]

ANONYMOUS_USER = "system:anonymous"
UNAUTHENTICATED_GROUP = "system:unauthenticated"
AUTHENTICATED_GROUP = "system:authenticated"
MASTERS_GROUP = "system:masters"


@dataclass(frozen=True)
class UserInfo:
    """Who is asking. ``extra`` maps a key to its values; it makes instances unhashable."""

    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


ANONYMOUS = UserInfo(name=ANONYMOUS_USER, groups=(UNAUTHENTICATED_GROUP,))
