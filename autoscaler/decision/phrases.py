"""How the decision's own words say a count of replicas ("1 replica", "3 replicas")."""

from __future__ import annotations

__all__ = ["phrase_replicas"]


def phrase_replicas(count: int) -> str:
    """`count` replicas, in the singular for exactly one."""
    return f"{count} replica" if count == 1 else f"{count} replicas"
