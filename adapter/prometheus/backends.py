"""Every backend's Prometheus clients: one per backend, or one per tenant of a tenant backend.

`default` is built from the `--prometheus-*` flags, the others from the rule file's
`backends:`. A backend whose headers are templates over the namespace gets one client per tenant
(its `tenants` and its headers' defaults), each sending that tenant's headers: answers, the
single-flight and the cache never mix tenants. A backend without `tenants` follows the
namespaces: `add_tenant` / `remove_tenant` (adapter.prometheus.tenancy) open and retire the
clients of its namespaces' tenants as they come and go; a retired client is closed once the
requests that took it have had their timeout to finish. A request picks its client with
`client_for`: a dictionary lookup, plus one template rendering for a tenant backend.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from prometheus_client import CollectorRegistry

from adapter.prometheus.client import PrometheusClient, PrometheusMetrics
from adapter.rules.config import DEFAULT_BACKEND, AdapterConfig, BackendConfig
from adapter.rules.tenants import backend_tenants, follows_namespaces, tenant_of
from adapter.settings import PrometheusSettings, backend_prometheus_settings

__all__ = ["RETIRE_GRACE_SECONDS", "BackendClients", "RelistTarget"]

# A retired tenant's client is closed this long after its request timeout, so that a request
# that took it just before finishes first.
RETIRE_GRACE_SECONDS = 1.0


class RelistTarget:
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
        self._flags = flags
        self._metrics = metrics
        self._retiring: dict[PrometheusClient, asyncio.Task[None]] = {}
        self._opened: list[PrometheusClient] = []  # by __aenter__ (its stack closes them)
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

    def namespace_backends(self) -> list[BackendConfig]:
        """The tenant backends whose tenants follow the namespaces (no `tenants` field)."""
        return [backend for backend, _ in self._tenanted.values()
                if follows_namespaces(backend)]

    def tenants(self, backend: str) -> frozenset[str]:
        """The tenants of a tenant backend that have a client now."""
        return frozenset(self._tenanted[backend][1])

    async def add_tenant(self, backend: str, tenant: str) -> RelistTarget:
        """Open a client for a new tenant of a tenant backend (its requests can use it at
        once, and a relister of the returned target can discover on it). Raises
        PrometheusConfigError when the backend's TLS files have become unusable."""
        backend_config, clients = self._tenanted[backend]
        existing = clients.get(tenant)
        if existing is not None:
            return RelistTarget(backend, tenant, existing)
        client = PrometheusClient(
            backend_prometheus_settings(backend_config, flags=self._flags, tenant=tenant),
            metrics=self._metrics, backend=backend)
        await client.start()
        clients[tenant] = client
        return RelistTarget(backend, tenant, client)

    def remove_tenant(self, backend: str, tenant: str) -> None:
        """Take a tenant's client out of use now (its requests get no client, as for a tenant
        never discovered) and close it after its timeout (requests that took it finish)."""
        client = self._tenanted[backend][1].pop(tenant, None)
        if client is None:
            return
        task = asyncio.get_running_loop().create_task(
            self._retire(client), name=f"close the client of tenant {tenant!r} of {backend!r}")
        self._retiring[client] = task
        task.add_done_callback(lambda _: self._retiring.pop(client, None))

    @staticmethod
    async def _retire(client: PrometheusClient) -> None:
        await asyncio.sleep(client.settings.timeout + RETIRE_GRACE_SECONDS)
        await client.close()

    @property
    def retiring(self) -> int:
        """Retired tenant clients not closed yet."""
        return len(self._retiring)

    def relist_targets(self) -> list[RelistTarget]:
        """One per backend, one per tenant of a tenant backend; `default` first."""
        targets = [RelistTarget(name, None, client) for name, client in self._fixed.items()]
        for name, (_, clients) in self._tenanted.items():
            targets.extend(RelistTarget(name, tenant, client)
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
            self._opened = list(self.clients())
            for client in self._opened:
                await stack.enter_async_context(client)
            self._stack = stack.pop_all()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Close every client: those opened here, the tenants added since, the retiring."""
        for client, task in list(self._retiring.items()):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await client.close()
            self._retiring.pop(client, None)
        opened = set(map(id, self._opened))
        for client in list(self.clients()):
            if id(client) not in opened:
                await client.close()
        await self._stack.aclose()
