"""Tenants of a backend whose headers are templates over the request's namespace.

The tenant of a request is its backend's templated header rendered over the request's
namespace (`<<.Namespace>>`), or that header's `default` for a cluster-scoped request. A backend
has one set of headers per tenant: every templated header carries the tenant, the others
their fixed value. Discovery lists each of the backend's `tenants` (or, without that field, the
tenant of every namespace the adapter sees: `follows_namespaces`), plus each templated header's
`default`, and a metric is served in a namespace only if the namespace's tenant found it.
"""

from __future__ import annotations

from collections.abc import Iterable

from adapter.rules.config import BackendConfig
from adapter.rules.templating import GoStruct, TemplateExecutionError

__all__ = [
    "backend_tenants",
    "follows_namespaces",
    "namespace_tenants",
    "tenant_headers",
    "tenant_of",
]


def tenant_of(backend: BackendConfig, namespace: str | None) -> str | None:
    """The tenant a request in `namespace` (None: cluster-scoped) reads; None: no tenant.

    None for a backend without a templated header, for a cluster-scoped request when the
    header has no `default`, and when the template fails or renders nothing.
    """
    for header in backend.headers:
        if header.template is None:
            continue
        if namespace is None:
            return header.default or None
        try:
            rendered = header.template.render(GoStruct("tenant", {"Namespace": namespace}))
        except TemplateExecutionError:
            return None
        return rendered or None
    return None


def backend_tenants(backend: BackendConfig) -> tuple[str, ...]:
    """The tenants discovery always lists: the `tenants` field, then each templated header's
    default (a backend that `follows_namespaces` adds its namespaces' tenants to these)."""
    tenants = dict.fromkeys(backend.tenants or ())
    for header in backend.headers:
        if header.template is not None and header.default:
            tenants.setdefault(header.default)
    return tuple(tenants)


def follows_namespaces(backend: BackendConfig) -> bool:
    """Whether discovery lists the tenant of every namespace (a templated header and no
    `tenants` field) rather than only the tenants it is given."""
    return backend.per_namespace and backend.tenants is None


def namespace_tenants(backend: BackendConfig, namespaces: Iterable[str]) -> list[str]:
    """The tenants of `namespaces`, each once, in the order of their first namespace (a
    namespace whose template fails or renders nothing has none)."""
    tenants: dict[str, None] = {}
    for namespace in namespaces:
        tenant = tenant_of(backend, namespace)
        if tenant is not None:
            tenants[tenant] = None
    return list(tenants)


def tenant_headers(backend: BackendConfig, tenant: str | None) -> tuple[tuple[str, str], ...]:
    """The headers of a request for `tenant` (None: only the fixed headers)."""
    headers = []
    for header in backend.headers:
        if header.template is None:
            headers.append((header.name, header.value))
        elif tenant is not None:
            headers.append((header.name, tenant))
    return tuple(headers)
