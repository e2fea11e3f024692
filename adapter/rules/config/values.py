"""The configuration's values: rules, resource mappings, backends, and the problems found."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from adapter.rules.naming import NameMatcher, SeriesFilter, rule_filters
from adapter.rules.resources import GroupResource, LabelTemplate
from adapter.rules.templating import Template
from metricscale.core import errors

__all__ = [
    "DEFAULT_BACKEND",
    "AdapterConfig",
    "BackendConfig",
    "BackendHeader",
    "ConfigError",
    "ConfigIssue",
    "DiscoveryRule",
    "ResourceMappingConfig",
    "ResourceRule",
    "ResourceRules",
]


@dataclass(frozen=True)
class ConfigIssue:
    """One problem: where (field path, line) and what."""

    path: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.path}: " if self.path else ""
        line = f" (line {self.line})" if self.line is not None else ""
        return f"{where}{self.message}{line}"


class ConfigError(errors.ConfigError):
    """The configuration is not usable; `issues` lists every problem found."""

    def __init__(self, issues: Sequence[ConfigIssue]) -> None:
        self.issues = tuple(issues)
        super().__init__("\n".join(str(issue) for issue in self.issues))


DEFAULT_BACKEND = "default"


@dataclass(frozen=True)
class BackendHeader:
    """One header of a backend; `value` may be a template over `.Namespace` (a tenant)."""

    name: str
    value: str
    template: Template | None = None
    default: str | None = None  # the value for cluster-scoped requests of a template header

    @property
    def per_namespace(self) -> bool:
        return self.template is not None


@dataclass(frozen=True)
class BackendConfig:
    """One entry of `backends:` (our extension): a Prometheus and how to reach it."""

    name: str
    url: str
    index: int
    headers: tuple[BackendHeader, ...] = ()
    bearer_token_file: str | None = None
    basic_auth_username: str | None = None
    basic_auth_password_file: str | None = None
    ca_file: str | None = None
    client_cert_file: str | None = None
    client_key_file: str | None = None
    insecure_skip_verify: bool = False
    timeout_seconds: float | None = None
    verb: str | None = None
    accept_encoding: str | None = None  # identity or gzip; None: the flag's
    # None: the tenant of every namespace the adapter sees (adapter.rules.tenants).
    tenants: tuple[str, ...] | None = None

    @property
    def path(self) -> str:
        return f"backends[{self.index}]"

    @property
    def per_namespace(self) -> bool:
        """Whether requests carry a tenant taken from their namespace."""
        return any(header.per_namespace for header in self.headers)


@dataclass(frozen=True)
class ResourceMappingConfig:
    """`resources:` of a rule."""

    template: str = ""
    label_template: LabelTemplate | None = None
    overrides: tuple[tuple[str, GroupResource], ...] = ()
    namespaced: bool | None = None

    @property
    def is_empty(self) -> bool:
        return self.label_template is None and not self.overrides


@dataclass(frozen=True)
class DiscoveryRule:
    """One entry of `rules:` or `externalRules:`, compiled."""

    section: str  # "rules" or "externalRules"
    index: int
    series_query: str
    series_filters: tuple[SeriesFilter, ...]
    resources: ResourceMappingConfig
    name_matches: str
    name_as: str
    name: NameMatcher
    metrics_query: str
    metrics_template: Template
    backend: str = DEFAULT_BACKEND

    @property
    def path(self) -> str:
        return f"{self.section}[{self.index}]"

    @property
    def filters(self) -> tuple[SeriesFilter, ...]:
        """What a series name must pass: `seriesFilters`, then the implicit `is: <matches>`."""
        return rule_filters(self.series_filters, self.name,
                            explicit_matches=bool(self.name_matches))

    @property
    def namespaced(self) -> bool:
        """For external rules: add the namespace matcher (`resources.namespaced`, default true)."""
        return self.resources.namespaced is not False


@dataclass(frozen=True)
class ResourceRule:
    """`resourceRules.cpu` / `resourceRules.memory` (kept for `metrics.k8s.io`)."""

    container_query: str
    container_template: Template
    node_query: str
    node_template: Template
    resources: ResourceMappingConfig
    container_label: str
    backend: str = DEFAULT_BACKEND


@dataclass(frozen=True)
class ResourceRules:
    cpu: ResourceRule
    memory: ResourceRule
    window: str
    window_milliseconds: int


@dataclass(frozen=True)
class AdapterConfig:
    rules: tuple[DiscoveryRule, ...] = ()
    external_rules: tuple[DiscoveryRule, ...] = ()
    resource_rules: ResourceRules | None = None
    warnings: tuple[ConfigIssue, ...] = ()
    backends: tuple[BackendConfig, ...] = ()

    @property
    def has_rules(self) -> bool:
        """Whether any section has a rule (an empty file, or only `backends:`, has none)."""
        return bool(self.rules or self.external_rules or self.resource_rules is not None)

    def backend_names(self) -> tuple[str, ...]:
        """`default` (the --prometheus-* flags) then the file's backends, in file order."""
        return (DEFAULT_BACKEND, *(backend.name for backend in self.backends))

    def rules_by_backend(self) -> dict[str, tuple[str, ...]]:
        """Backend name → field paths of the rules that read from it."""
        used: dict[str, list[str]] = {name: [] for name in self.backend_names()}
        for rule in (*self.rules, *self.external_rules):
            used.setdefault(rule.backend, []).append(rule.path)
        if self.resource_rules is not None:
            used.setdefault(self.resource_rules.cpu.backend, []).append("resourceRules.cpu")
            used.setdefault(self.resource_rules.memory.backend, []).append(
                "resourceRules.memory")
        return {name: tuple(paths) for name, paths in used.items()}

    def series_queries(self) -> tuple[str, ...]:
        """Distinct `seriesQuery` strings of all rules, in rule order: one series call each."""
        return tuple(dict.fromkeys(r.series_query for r in (*self.rules, *self.external_rules)))

    def series_queries_for(self, backend: str) -> tuple[str, ...]:
        """Like `series_queries`, for the rules bound to one backend."""
        return tuple(dict.fromkeys(r.series_query for r in (*self.rules, *self.external_rules)
                                   if r.backend == backend))
