"""Tenants of a backend whose headers are templates over the request's namespace.

A backend may have several templated headers: each is rendered over the request's namespace
(`<<.Namespace>>`), or takes its own `default` for a cluster-scoped request, and the tenant of
a request is the tuple of those values. A tenant is named by a string (its key): the value
itself with one templated header, a JSON array of the values in header order with several.
A backend has one set of headers per tenant: each templated header carries its own value, the
others their fixed value. Discovery lists each of the backend's `tenants` (or, without that
field, the tenant of every namespace the adapter sees: `follows_namespaces`), plus the tenant
of the headers' defaults, and a metric is served in a namespace only if the namespace's tenant
found it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from adapter.rules.config import BackendConfig, BackendHeader
from adapter.rules.templating import GoStruct, TemplateExecutionError

__all__ = [
    "backend_tenants",
    "follows_namespaces",
    "namespace_tenants",
    "tenant_headers",
    "tenant_of",
]


def _templated(backend: BackendConfig) -> list[BackendHeader]:
    return [header for header in backend.headers if header.template is not None]


def _key(values: list[str]) -> str:
    return values[0] if len(values) == 1 else json.dumps(values, ensure_ascii=False)


def _values(backend: BackendConfig, key: str) -> list[str]:
    if len(_templated(backend)) == 1:
        return [key]
    values = json.loads(key)
    assert isinstance(values, list) and all(isinstance(v, str) for v in values), key
    return values


def tenant_of(backend: BackendConfig, namespace: str | None) -> str | None:
    """The tenant a request in `namespace` (None: cluster-scoped) reads; None: no tenant.

    None for a backend without a templated header, for a cluster-scoped request when a
    templated header has no `default`, and when a template fails or renders nothing.
    """
    templated = _templated(backend)
    if not templated:
        return None
    values: list[str] = []
    for header in templated:
        if namespace is None:
            value = header.default or ""
        else:
            assert header.template is not None
            try:
                value = header.template.render(GoStruct("tenant", {"Namespace": namespace}))
            except TemplateExecutionError:
                return None
        if not value:
            return None
        values.append(value)
    return _key(values)


def backend_tenants(backend: BackendConfig) -> tuple[str, ...]:
    """The tenants discovery always lists: the `tenants` field, then the headers' defaults
    (one tenant, if every templated header has one; a backend that `follows_namespaces` adds
    its namespaces' tenants to these)."""
    tenants = dict.fromkeys(backend.tenants or ())
    default = tenant_of(backend, None)
    if default is not None:
        tenants.setdefault(default)
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
    """The headers of a request for `tenant` (None: only the fixed headers): each templated
    header with its own value of the tenant."""
    values = iter(_values(backend, tenant) if tenant is not None else ())
    headers = []
    for header in backend.headers:
        if header.template is None:
            headers.append((header.name, header.value))
        elif tenant is not None:
            headers.append((header.name, next(values)))
    return tuple(headers)
