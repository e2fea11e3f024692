"""The tenants of the backends that follow the namespaces: one per namespace the adapter sees.

A tenant backend without a `tenants` field (adapter.rules.tenants.follows_namespaces) discovers
the tenant of every namespace: its templated headers rendered over each name the adapter's
namespace cache holds, plus the headers' `default` (which is always there). `NamespaceTenants`
is that list kept up to date: each pass (`Relisting` runs one before its relisters, at their
interval) reads the namespaces from memory, opens a client and makes a relister for each new
tenant, and takes the client of each tenant whose namespaces are all gone out of use (closed
after its timeout). The other tenants' clients and snapshots are not touched. Each tenant costs
one series request per rule of the backend per relist, so a backend follows at most
`MAX_NAMESPACE_TENANTS` tenants (the ones it has first, then by namespace name), with a warning
naming how many are left out.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection

from adapter.prometheus.backends import BackendClients, RelistTarget
from adapter.prometheus.relisting import Relister, TenantChanges
from adapter.rules.tenants import backend_tenants, namespace_tenants
from adapter.settings import PrometheusConfigError
from metricscale.kube.errors import KubeError

__all__ = ["MAX_NAMESPACE_TENANTS", "NamespaceTenants"]

logger = logging.getLogger(__name__)

# Per backend: each tenant is one series request per rule per relist, and one client.
MAX_NAMESPACE_TENANTS = 1000
_FIRST_RETRY_SECONDS = 1.0


class NamespaceTenants:
    """The tenants of `backends` (names of backends that follow the namespaces and have
    rules), kept in step with the namespaces `namespaces()` lists."""

    def __init__(self, *, clients: BackendClients, backends: Collection[str],
                 namespaces: Callable[[], Awaitable[Collection[str]]],
                 relister: Callable[[RelistTarget], Relister], interval: float,
                 limit: int = MAX_NAMESPACE_TENANTS) -> None:
        """`namespaces()` raises KubeError when they cannot be read; `relister` makes the
        relister of a new tenant's target."""
        self._clients = clients
        self._backends = {backend.name: backend for backend in clients.namespace_backends()
                          if backend.name in backends}
        self._namespaces = namespaces
        self._make_relister = relister
        self._interval = interval
        self._limit = limit
        self._relisters: dict[tuple[str, str], Relister] = {}
        self._left_out: dict[str, int] = {}
        self._failures = 0
        self.last_error: str | None = None
        self.passes = 0

    @property
    def name(self) -> str:
        return "tenants of the namespaces"

    @property
    def backends(self) -> tuple[str, ...]:
        return tuple(self._backends)

    def next_delay(self) -> float:
        """The interval, or a shorter backoff after failed passes."""
        if self._failures == 0:
            return self._interval
        return min(self._interval, _FIRST_RETRY_SECONDS * 2.0 ** (self._failures - 1))

    async def sync(self) -> TenantChanges | None:
        """One pass: new tenants' clients opened and relisters made (no pass run), gone
        tenants' clients retired; None (and nothing changed) when the namespaces could not
        be read."""
        self.passes += 1
        try:
            namespaces = sorted(await self._namespaces())
        except KubeError as error:
            self._failures += 1
            self.last_error = f"cannot list the namespaces: {error}"
            logger.warning("%s: %s (%d in a row); keeping the tenants there are",
                           self.name, self.last_error, self._failures)
            return None
        self._failures = 0
        self.last_error = None
        added: list[Relister] = []
        removed: list[Relister] = []
        for name, backend in self._backends.items():
            fixed = set(backend_tenants(backend))
            have = self._clients.tenants(name)
            wanted = self._wanted(name, namespace_tenants(backend, namespaces),
                                  have=have - fixed)
            for tenant in sorted(have - fixed - wanted):
                self._clients.remove_tenant(name, tenant)
                relister = self._relisters.pop((name, tenant), None)
                if relister is not None:
                    removed.append(relister)
                logger.info("backend %r: tenant %r is gone with its namespaces: no longer "
                            "discovered", name, tenant)
            for tenant in wanted - have:
                try:
                    target = await self._clients.add_tenant(name, tenant)
                except PrometheusConfigError as error:
                    logger.error("backend %r: cannot open a client for tenant %r: %s", name,
                                 tenant, error)
                    continue
                relister = self._make_relister(target)
                self._relisters[name, tenant] = relister
                added.append(relister)
                logger.info("backend %r: discovering the new tenant %r", name, tenant)
        return TenantChanges(tuple(added), tuple(removed))

    def _wanted(self, backend: str, tenants: list[str], *, have: frozenset[str] | set[str],
                ) -> set[str]:
        """At most `limit` of `tenants`: those `have` first, then in order."""
        if len(tenants) <= self._limit:
            self._left_out.pop(backend, None)
            return set(tenants)
        kept = [tenant for tenant in tenants if tenant in have][:self._limit]
        room = self._limit - len(kept)
        kept_set = set(kept)
        kept_set.update([tenant for tenant in tenants if tenant not in kept_set][:room])
        left_out = len(tenants) - len(kept_set)
        if self._left_out.get(backend) != left_out:
            logger.warning("backend %r: the namespaces have %d tenants; discovering %d of them "
                           "(at most %d per backend: one series request per rule per tenant "
                           "per relist), %d left out (list the ones to serve in `tenants`)",
                           backend, len(tenants), len(kept_set), self._limit, left_out)
        self._left_out[backend] = left_out
        return kept_set
