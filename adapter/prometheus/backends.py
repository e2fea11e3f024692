"""Every backend's Prometheus clients: one per backend, or one per tenant of a tenant backend.

`default` is built from the `--prometheus-*` flags, the others from the rule file's
`backends:`. A backend whose headers are templates over the namespace gets one client per tenant
(its `tenants` and its headers' defaults), each sending that tenant's headers: answers, the
single-flight and the cache never mix tenants. A request picks its client with `client_for`: a
dictionary lookup, plus one template rendering for a tenant backend.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from prometheus_client import CollectorRegistry

from adapter.prometheus.client import PrometheusClient, PrometheusMetrics
from adapter.rules.config import DEFAULT_BACKEND, AdapterConfig, BackendConfig
from adapter.rules.tenants import backend_tenants, tenant_of
from adapter.settings import PrometheusSettings, backend_prometheus_settings

__all__ = ["BackendClients", "DiscoveryTarget"]


class DiscoveryTarget:
    """What one relister lists: a backend (a tenant of it) and the client to ask."""

    def __init__(self, backend: str, tenant: str | None, client: PrometheusClient) -> None:
        self.backend = backend
        self.tenant = tenant
        self.client = client


class BackendClients:
    """The clients of every backend; open them with `async with` inside the running loop."""

    def __init__(self, *, config: AdapterConfig, flags: PrometheusSettings,
                 registry: CollectorRegistry | None = None,
                 metrics: PrometheusMetrics | None = None) -> None:
        """`metrics` already registered (a reloaded configuration's clients share them), or
        registered here on `registry`."""
        if metrics is None:
            if registry is None:
                raise TypeError("BackendClients needs a registry or metrics")
            metrics = PrometheusMetrics.register(registry)
        self._stack = contextlib.AsyncExitStack()
        self.default = PrometheusClient(flags, metrics=metrics, backend=DEFAULT_BACKEND)
        self._fixed: dict[str, PrometheusClient] = {DEFAULT_BACKEND: self.default}
        self._tenanted: dict[str, tuple[BackendConfig, dict[str, PrometheusClient]]] = {}
        for backend in config.backends:
            if backend.per_namespace:
                clients = {tenant: PrometheusClient(
                    backend_prometheus_settings(backend, flags=flags, tenant=tenant),
                    metrics=metrics, backend=backend.name)
                    for tenant in backend_tenants(backend)}
                self._tenanted[backend.name] = (backend, clients)
            else:
                self._fixed[backend.name] = PrometheusClient(
                    backend_prometheus_settings(backend, flags=flags), metrics=metrics,
                    backend=backend.name)

    def clients(self) -> Iterator[PrometheusClient]:
        yield from self._fixed.values()
        for _, clients in self._tenanted.values():
            yield from clients.values()

    def discovery_targets(self) -> list[DiscoveryTarget]:
        """One per backend, one per tenant of a tenant backend; `default` first."""
        targets = [DiscoveryTarget(name, None, client) for name, client in self._fixed.items()]
        for name, (_, clients) in self._tenanted.items():
            targets.extend(DiscoveryTarget(name, tenant, client)
                           for tenant, client in clients.items())
        return targets

    def client_for(self, backend: str, *, namespace: str | None,
                   tenants: frozenset[str] | None) -> PrometheusClient | None:
        """The client of a request in `namespace` (None: cluster-scoped) for a rule of
        `backend`, whose metric the `tenants` found (None: no tenants). None: the request's
        tenant does not have the metric (or has no tenant)."""
        client = self._fixed.get(backend)
        if client is not None:
            return client
        backend_config, clients = self._tenanted[backend]
        tenant = tenant_of(backend_config, namespace)
        if tenant is None or (tenants is not None and tenant not in tenants):
            return None
        return clients.get(tenant)

    async def __aenter__(self) -> BackendClients:
        async with contextlib.AsyncExitStack() as stack:
            for client in self.clients():
                await stack.enter_async_context(client)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self._stack.aclose()
