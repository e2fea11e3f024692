"""prometheus-adapter's configuration file, parsed strictly into immutable, compiled rules.

Strict like go-yaml v2's `UnmarshalStrict`: unknown keys, duplicate keys and wrong types are
errors, each reported with its field path (`rules[2].name.as`) and line. Then the checks
prometheus-adapter makes at startup (filters, regexes, `as`, templates) run on every rule, and
all problems are reported together. Scalars go into string fields as their source text, as
go-yaml does (`as: 123` is the string "123"). Things upstream accepts but that cannot work
(a rule without `seriesQuery` or `metricsQuery`) are errors too; things that are merely
suspicious are returned as warnings.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import yaml
from yarl import URL

from adapter.rules.naming import (
    NameMatcher,
    NamingError,
    SeriesFilter,
    make_series_filter,
    rule_filters,
)
from adapter.rules.resources import (
    NAMESPACES,
    NODES,
    PODS,
    GroupResource,
    LabelTemplate,
    LabelTemplateError,
    NoLabelForResourceError,
    ResourceMapper,
    builtin_catalog,
    compile_label_template,
    is_promql_label_name,
)
from adapter.rules.templating import Template, TemplateSyntaxError, parse_template
from metricscale.core import errors
from metricscale.core.durations import parse_prometheus_duration
from metricscale.core.selectors import quote_go_string

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
    "parse_config",
    "parse_prometheus_duration",
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


# --- YAML nodes → checked values ---------------------------------------------------------------

_TAG_PREFIX = "tag:yaml.org,2002:"
_MERGE = _TAG_PREFIX + "merge"
_NULL = _TAG_PREFIX + "null"
_TRUE = frozenset({"y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"})
_FALSE = frozenset({"n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"})


def _short_tag(node: yaml.Node) -> str:
    tag = str(node.tag)
    return "!!" + tag[len(_TAG_PREFIX):] if tag.startswith(_TAG_PREFIX) else tag


def _child_path(path: str, key: str) -> str:
    """`a.b` for plain keys, `a["x.y"]` for keys a dot would make ambiguous."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        return f"{path}[{quote_go_string(key)}]"
    return f"{path}.{key}" if path else key


def _mapping_value(node: yaml.Node, key: str) -> yaml.Node | None:
    """The value of a plain key of a mapping node, without checks (for cross-references)."""
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
                return value_node  # type: ignore[no-any-return]
    return None


def _is_null(node: yaml.Node | None) -> bool:
    return node is None or (isinstance(node, yaml.ScalarNode) and node.tag == _NULL)


class _Decoder:
    def __init__(self) -> None:
        self.issues: list[ConfigIssue] = []

    def issue(self, path: str, message: str, node: yaml.Node | None) -> None:
        line = None if node is None else node.start_mark.line + 1
        self.issues.append(ConfigIssue(path, message, line))

    def type_error(self, path: str, node: yaml.Node, go_type: str) -> None:
        shown = _short_tag(node)
        if isinstance(node, yaml.ScalarNode):
            shown += f" `{node.value}`"
        self.issue(path, f"cannot unmarshal {shown} into {go_type}", node)

    def mapping(self, node: yaml.Node | None, path: str, go_type: str,
                fields: Sequence[str] | None) -> dict[str, yaml.Node] | None:
        """Keys → value nodes; `fields=None` accepts any key (a Go map)."""
        if _is_null(node):
            return {}
        assert node is not None
        if not isinstance(node, yaml.MappingNode):
            self.type_error(path, node, go_type)
            return None
        result: dict[str, yaml.Node] = {}
        seen: set[str] = set()
        for key_node, value_node in self._pairs(node):
            if not isinstance(key_node, yaml.ScalarNode):
                self.type_error(path, key_node, "string")
                continue
            key = "" if key_node.tag == _NULL else str(key_node.value)
            child = _child_path(path, key)
            if key in seen:
                self.issue(child, f"key {quote_go_string(key)} already set in map", key_node)
                continue
            seen.add(key)
            if fields is not None and key not in fields:
                self.issue(child, f"field {key} not found in type {go_type}", key_node)
                continue
            result[key] = value_node
        return result

    def _pairs(self, node: yaml.MappingNode) -> Iterator[tuple[yaml.Node, yaml.Node]]:
        """Key/value pairs with YAML merge keys (`<<: *base`) applied underneath."""
        explicit = [(k, v) for k, v in node.value if k.tag != _MERGE]
        merged: list[tuple[yaml.Node, yaml.Node]] = []
        for key_node, value_node in node.value:
            if key_node.tag != _MERGE:
                continue
            sources = value_node.value if isinstance(value_node, yaml.SequenceNode) \
                else [value_node]
            for source in sources:
                if isinstance(source, yaml.MappingNode):
                    merged.extend(self._pairs(source))
        explicit_keys = {k.value for k, _ in explicit if isinstance(k, yaml.ScalarNode)}
        seen: set[str] = set()
        for key_node, value_node in merged:
            if isinstance(key_node, yaml.ScalarNode) and key_node.value not in explicit_keys \
                    and key_node.value not in seen:
                seen.add(key_node.value)
                yield key_node, value_node
        yield from explicit

    def sequence(self, node: yaml.Node | None, path: str, go_type: str) -> list[yaml.Node]:
        if _is_null(node):
            return []
        assert node is not None
        if not isinstance(node, yaml.SequenceNode):
            self.type_error(path, node, go_type)
            return []
        return list(node.value)

    def string(self, node: yaml.Node | None, path: str) -> str:
        if _is_null(node):
            return ""
        assert node is not None
        if not isinstance(node, yaml.ScalarNode):
            self.type_error(path, node, "string")
            return ""
        return str(node.value)

    def boolean(self, node: yaml.Node | None, path: str) -> bool | None:
        if _is_null(node):
            return None
        assert node is not None
        if isinstance(node, yaml.ScalarNode) and node.tag in (_TAG_PREFIX + "bool",
                                                                _TAG_PREFIX + "str"):
            if node.value in _TRUE and (node.tag.endswith("bool") or node.style is None):
                return True
            if node.value in _FALSE and (node.tag.endswith("bool") or node.style is None):
                return False
        self.type_error(path, node, "bool")
        return None


# --- sections ----------------------------------------------------------------------------------

_RULE_FIELDS = ("seriesQuery", "seriesFilters", "resources", "name", "metricsQuery", "backend")
_RESOURCE_FIELDS = ("template", "overrides", "namespaced")
_RESOURCE_RULE_FIELDS = ("containerQuery", "nodeQuery", "resources", "containerLabel",
                         "backend")
_BACKEND_FIELDS = ("name", "url", "headers", "bearerTokenFile", "basicAuth", "caFile",
                   "clientCertFile", "clientKeyFile", "insecureSkipVerify", "timeout", "verb",
                   "acceptEncoding", "tenants")
_BACKEND_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_EQUALITY_WITH_REGEX = re.compile(r'__name__\s*!?=\s*"[^"]*[\^$*+?()\[\]|\\]')


class _ConfigBuilder:
    def __init__(self) -> None:
        self.decoder = _Decoder()
        self.warnings: list[ConfigIssue] = []
        # (field path, backend name, node) of every rule's `backend:`, checked at the end.
        self.backend_uses: list[tuple[str, str, yaml.Node]] = []
        self.backend_names: set[str] = set()

    @property
    def issues(self) -> list[ConfigIssue]:
        return self.decoder.issues

    def warn(self, path: str, message: str, node: yaml.Node | None) -> None:
        line = None if node is None else node.start_mark.line + 1
        self.warnings.append(ConfigIssue(path, message, line))

    def config(self, root: yaml.Node | None) -> AdapterConfig:
        top = self.decoder.mapping(root, "", "config.MetricsDiscoveryConfig",
                                   ("rules", "externalRules", "resourceRules", "backends"))
        if top is None:
            return AdapterConfig()
        backends = self.backends(top.get("backends"))
        rules = self.rules(top.get("rules"), "rules")
        external = self.rules(top.get("externalRules"), "externalRules")
        resource_rules = None
        if not _is_null(top.get("resourceRules")):
            resource_rules = self.resource_rules(top["resourceRules"])
        self.check_backend_uses(backends, top.get("backends"))
        return AdapterConfig(rules, external, resource_rules, tuple(self.warnings),
                             tuple(b for b in backends if b is not None))

    def rule_backend(self, fields: dict[str, yaml.Node], path: str) -> str:
        node = fields.get("backend")
        name = self.decoder.string(node, f"{path}.backend")
        if node is None or not name:
            return DEFAULT_BACKEND
        self.backend_uses.append((f"{path}.backend", name, node))
        return name

    def check_backend_uses(self, backends: Sequence[BackendConfig | None],
                           node: yaml.Node | None) -> None:
        # Names of backends that failed their own checks count too: one problem, one issue.
        names = {DEFAULT_BACKEND, *self.backend_names}
        by_name = {b.name: b for b in backends if b is not None}
        for path, name, use in self.backend_uses:
            if name not in names:
                known = ", ".join(sorted(names))
                self.decoder.issue(path, f"unknown backend {quote_go_string(name)} "
                                   f"(known: {known})", use)
                continue
            backend = by_name.get(name)
            if path.startswith("resourceRules.") and backend is not None and any(
                    h.per_namespace and h.default is None for h in backend.headers):
                # `kubectl top nodes` asks cluster-scoped: its tenant is the header's default.
                self.decoder.issue(path, f"backend {quote_go_string(name)} has a header "
                                   "templated over the namespace without a default; node "
                                   "metrics are cluster-scoped and need one", use)

    def backends(self, node: yaml.Node | None) -> list[BackendConfig | None]:
        built: list[BackendConfig | None] = []
        seen: dict[str, int] = {}
        for index, item in enumerate(self.decoder.sequence(node, "backends", "[]Backend")):
            built.append(self.backend(item, index))
            name_node = _mapping_value(item, "name")
            if not isinstance(name_node, yaml.ScalarNode) or not name_node.value:
                continue
            name = str(name_node.value)
            self.backend_names.add(name)
            if name in seen:
                self.decoder.issue(f"backends[{index}].name", f"duplicate backend name "
                                   f"{quote_go_string(name)} (also backends[{seen[name]}])",
                                   name_node)
            seen.setdefault(name, index)
        return built

    def backend(self, node: yaml.Node, index: int) -> BackendConfig | None:
        path = f"backends[{index}]"
        before = len(self.issues)
        fields = self.decoder.mapping(node, path, "Backend", _BACKEND_FIELDS)
        if fields is None:
            return None
        string = self.decoder.string
        name = string(fields.get("name"), f"{path}.name")
        if not name:
            self.decoder.issue(f"{path}.name", "required: the name rules use in `backend:`",
                               fields.get("name") or node)
        elif name == DEFAULT_BACKEND:
            self.decoder.issue(f"{path}.name", "\"default\" is the backend of --prometheus-url "
                               "and its flags; choose another name", fields["name"])
        elif not _BACKEND_NAME.fullmatch(name):
            self.decoder.issue(f"{path}.name", "must be lowercase letters, digits and '-'",
                               fields["name"])
        url = string(fields.get("url"), f"{path}.url")
        self.check_url(url, f"{path}.url", fields.get("url") or node)
        headers = self.backend_headers(fields.get("headers"), f"{path}.headers")
        basic = self.decoder.mapping(fields.get("basicAuth"), f"{path}.basicAuth", "BasicAuth",
                                     ("username", "passwordFile")) or {}
        username = string(basic.get("username"), f"{path}.basicAuth.username")
        password_file = string(basic.get("passwordFile"), f"{path}.basicAuth.passwordFile")
        if bool(username) != bool(password_file):
            self.decoder.issue(f"{path}.basicAuth", "needs both username and passwordFile",
                               fields.get("basicAuth"))
        if username and ":" in username:
            self.decoder.issue(f"{path}.basicAuth.username", "cannot contain ':'",
                               basic.get("username"))
        token_file = string(fields.get("bearerTokenFile"), f"{path}.bearerTokenFile")
        if token_file and username:
            self.decoder.issue(path, "use either bearerTokenFile or basicAuth, not both",
                               fields.get("bearerTokenFile"))
        cert = string(fields.get("clientCertFile"), f"{path}.clientCertFile")
        key = string(fields.get("clientKeyFile"), f"{path}.clientKeyFile")
        if bool(cert) != bool(key):
            self.decoder.issue(path, "clientCertFile and clientKeyFile go together", node)
        insecure = self.decoder.boolean(fields.get("insecureSkipVerify"),
                                        f"{path}.insecureSkipVerify")
        timeout: float | None = None
        timeout_text = string(fields.get("timeout"), f"{path}.timeout")
        if timeout_text:
            try:
                timeout = parse_prometheus_duration(timeout_text) / 1000
            except ValueError as error:
                self.decoder.issue(f"{path}.timeout", str(error), fields.get("timeout"))
            else:
                if timeout <= 0:
                    self.decoder.issue(f"{path}.timeout", "must be a positive duration",
                                       fields.get("timeout"))
        verb = string(fields.get("verb"), f"{path}.verb").upper() or None
        if verb not in (None, "GET", "POST"):
            self.decoder.issue(f"{path}.verb", "must be GET or POST", fields.get("verb"))
        encoding = string(fields.get("acceptEncoding"), f"{path}.acceptEncoding").lower() or None
        if encoding not in (None, "identity", "gzip"):
            self.decoder.issue(f"{path}.acceptEncoding", "must be identity or gzip",
                               fields.get("acceptEncoding"))
        # Absent (or null): the tenant of every namespace the adapter sees; given (even empty):
        # only those (adapter.rules.tenants).
        tenants: tuple[str, ...] | None = None
        if not _is_null(fields.get("tenants")):
            tenants = tuple(string(item, f"{path}.tenants[{i}]") for i, item in enumerate(
                self.decoder.sequence(fields.get("tenants"), f"{path}.tenants", "[]string")))
        per_namespace = any(header.per_namespace for header in headers)
        if tenants is not None and not per_namespace:
            self.decoder.issue(f"{path}.tenants", "needs a header whose value is a template "
                               "over <<.Namespace>>", fields.get("tenants"))
        elif tenants and sum(header.per_namespace for header in headers) > 1:
            # A tenant is then the tuple of the headers' values: it follows the namespaces.
            self.decoder.issue(f"{path}.tenants", "cannot list tenants with several headers "
                               "templated over <<.Namespace>>: leave it out to follow every "
                               "namespace", fields.get("tenants"))
        elif per_namespace and tenants == ():
            self.warn(f"{path}.tenants", "empty: discovery lists no tenant but the header's "
                      "default, so this backend serves no namespace (leave the field out to "
                      "follow every namespace)", fields.get("tenants") or node)
        if len(self.issues) > before:
            return None
        return BackendConfig(
            name=name, url=url, index=index, headers=headers,
            bearer_token_file=token_file or None, basic_auth_username=username or None,
            basic_auth_password_file=password_file or None,
            ca_file=string(fields.get("caFile"), f"{path}.caFile") or None,
            client_cert_file=cert or None, client_key_file=key or None,
            insecure_skip_verify=bool(insecure), timeout_seconds=timeout, verb=verb,
            accept_encoding=encoding, tenants=tenants)

    def check_url(self, url: str, path: str, node: yaml.Node) -> None:
        if not url:
            self.decoder.issue(path, "required: the Prometheus base URL", node)
            return
        control = next((c for c in url if c < " " or c == "\x7f"), None)
        if control is not None:
            # yarl would drop it silently (and the URL may carry a password: not quoted).
            self.decoder.issue(path, f"contains a control character (U+{ord(control):04X})",
                               node)
            return
        try:
            parsed = URL(url)
        except ValueError as error:
            # yarl's reason, not the URL: it may carry a password.
            self.decoder.issue(path, f"not a valid URL: {error}", node)
            return
        if parsed.scheme not in ("http", "https") or not parsed.host:
            self.decoder.issue(path, "must be an http:// or https:// URL", node)

    def backend_headers(self, node: yaml.Node | None, path: str) -> tuple[BackendHeader, ...]:
        headers: list[BackendHeader] = []
        entries = self.decoder.mapping(node, path, "map[string]string", None) or {}
        for name, value in entries.items():
            item_path = _child_path(path, name)
            if not _HEADER_NAME.fullmatch(name):
                self.decoder.issue(item_path, f"{quote_go_string(name)} is not a header name",
                                   value)
                continue
            default: str | None = None
            if isinstance(value, yaml.MappingNode):
                fields = self.decoder.mapping(value, item_path, "HeaderValue",
                                              ("value", "default")) or {}
                text = self.decoder.string(fields.get("value"), f"{item_path}.value")
                default_node = fields.get("default")
                if default_node is not None:
                    default = self.decoder.string(default_node, f"{item_path}.default")
            else:
                text = self.decoder.string(value, item_path)
            if any(c in text or c in (default or "") for c in "\r\n"):
                self.decoder.issue(item_path, "the value has a line break", value)
                continue
            template: Template | None = None
            if "<<" in text:
                try:
                    template = parse_template(text, name="header")
                except TemplateSyntaxError as error:
                    self.decoder.issue(item_path, f"unable to parse header template: {error}",
                                       value)
                    continue
            elif default is not None:
                self.decoder.issue(f"{item_path}.default", "only a templated value "
                                   "(<<.Namespace>>) needs a default", value)
            headers.append(BackendHeader(name, text, template, default))
        return tuple(headers)

    def rules(self, node: yaml.Node | None, section: str) -> tuple[DiscoveryRule, ...]:
        built: list[DiscoveryRule] = []
        for index, item in enumerate(self.decoder.sequence(node, section,
                                                           "[]config.DiscoveryRule")):
            rule = self.rule(item, section, index)
            if rule is not None:
                built.append(rule)
        return tuple(built)

    def rule(self, node: yaml.Node, section: str, index: int) -> DiscoveryRule | None:
        path = f"{section}[{index}]"
        before = len(self.issues)
        fields = self.decoder.mapping(node, path, "config.DiscoveryRule", _RULE_FIELDS)
        if fields is None:
            return None
        string = self.decoder.string
        series_query = string(fields.get("seriesQuery"), f"{path}.seriesQuery")
        if not series_query.strip() and "seriesQuery" not in fields:
            self.decoder.issue(f"{path}.seriesQuery", "required: the series selector that "
                               "discovery sends to /api/v1/series", node)
        elif not series_query.strip():
            self.decoder.issue(f"{path}.seriesQuery", "must not be empty", fields["seriesQuery"])
        elif _EQUALITY_WITH_REGEX.search(series_query):
            self.warn(f"{path}.seriesQuery", "__name__ is compared with = or != against a "
                      "value that looks like a regex; use =~ or !~", fields["seriesQuery"])
        filters = self.series_filters(fields.get("seriesFilters"), f"{path}.seriesFilters")
        resources = self.resources(fields.get("resources"), f"{path}.resources")
        name_fields = self.decoder.mapping(fields.get("name"), f"{path}.name",
                                           "config.NameMapping", ("matches", "as")) or {}
        matches = string(name_fields.get("matches"), f"{path}.name.matches")
        as_ = string(name_fields.get("as"), f"{path}.name.as")
        metrics_query = string(fields.get("metricsQuery"), f"{path}.metricsQuery")
        backend = self.rule_backend(fields, path)
        name = self.name_matcher(matches, as_, series_query, path, name_fields)
        template = self.metrics_template(metrics_query, f"{path}.metricsQuery",
                                         fields.get("metricsQuery") or node)
        if name is None or template is None or filters is None or resources is None \
                or len(self.issues) > before:
            return None
        rule = DiscoveryRule(section, index, series_query, filters, resources, matches, as_,
                             name, metrics_query, template, backend)
        self.rule_warnings(rule, fields, node)
        return rule

    def rule_warnings(self, rule: DiscoveryRule, fields: dict[str, yaml.Node],
                      node: yaml.Node) -> None:
        path = rule.path
        if rule.section == "rules":
            if rule.resources.is_empty:
                self.warn(f"{path}.resources", "maps no label to a resource (no template, no "
                          "overrides), so this rule never lists a metric", node)
            if rule.resources.namespaced is not None:
                self.warn(f"{path}.resources.namespaced", "has no effect on rules; it only "
                          "applies to externalRules", fields.get("resources"))
        elif rule.namespaced and rule.resources.label_template is None and not any(
                resource.resource.lower() in ("namespace", "namespaces")
                and not resource.group for _, resource in rule.resources.overrides):
            self.warn(f"{path}.resources", "no label maps to namespaces, so every request of "
                      "this external rule fails; add an override such as "
                      "`namespace: {resource: namespace}` or set `namespaced: false`",
                      fields.get("resources") or node)

    def series_filters(self, node: yaml.Node | None,
                       path: str) -> tuple[SeriesFilter, ...] | None:
        filters: list[SeriesFilter] = []
        ok = True
        for index, item in enumerate(self.decoder.sequence(node, path, "[]config.RegexFilter")):
            item_path = f"{path}[{index}]"
            before = len(self.issues)
            fields = self.decoder.mapping(item, item_path, "config.RegexFilter", ("is", "isNot"))
            if fields is None or len(self.issues) > before:
                ok = False
                continue
            is_ = self.decoder.string(fields.get("is"), f"{item_path}.is")
            is_not = self.decoder.string(fields.get("isNot"), f"{item_path}.isNot")
            try:
                filters.append(make_series_filter(is_=is_, is_not=is_not))
            except NamingError as error:
                self.decoder.issue(item_path, str(error), item)
                ok = False
        return tuple(filters) if ok else None

    def resources(self, node: yaml.Node | None, path: str) -> ResourceMappingConfig | None:
        before = len(self.issues)
        fields = self.decoder.mapping(node, path, "config.ResourceMapping", _RESOURCE_FIELDS)
        if fields is None:
            return None
        template = self.decoder.string(fields.get("template"), f"{path}.template")
        namespaced = self.decoder.boolean(fields.get("namespaced"), f"{path}.namespaced")
        overrides: list[tuple[str, GroupResource]] = []
        override_map = self.decoder.mapping(fields.get("overrides"), f"{path}.overrides",
                                            "map[string]config.GroupResource", None) or {}
        for label, value in override_map.items():
            item_path = _child_path(f"{path}.overrides", label)
            entry = self.decoder.mapping(value, item_path, "config.GroupResource",
                                         ("group", "resource"))
            if entry is None:
                continue
            group = self.decoder.string(entry.get("group"), f"{item_path}.group")
            resource = self.decoder.string(entry.get("resource"), f"{item_path}.resource")
            if not is_promql_label_name(label):
                self.decoder.issue(item_path, f"{quote_go_string(label)} is not a valid "
                                   "Prometheus label name", value)
            if not resource:
                self.decoder.issue(f"{item_path}.resource", "required: the resource this label "
                                   "names (e.g. pod, deployment)", value)
            overrides.append((label, GroupResource(resource, group)))
        label_template = None
        if template:
            try:
                label_template = compile_label_template(template)
            except LabelTemplateError as error:
                self.decoder.issue(f"{path}.template", str(error), fields.get("template"))
        if len(self.issues) > before:
            return None
        return ResourceMappingConfig(template, label_template, tuple(overrides), namespaced)

    def name_matcher(self, matches: str, as_: str, series_query: str, path: str,
                     fields: dict[str, yaml.Node]) -> NameMatcher | None:
        try:
            return NameMatcher.from_config(matches=matches, as_=as_, series_query=series_query)
        except NamingError as error:
            where = "as" if str(error).startswith("must specify") else "matches"
            self.decoder.issue(f"{path}.name.{where}", str(error),
                               fields.get(where) or fields.get("matches"))
            return None

    def metrics_template(self, source: str, path: str, node: yaml.Node | None,
                         *, required: bool = True) -> Template | None:
        if not source and required:
            self.decoder.issue(path, "required: the PromQL template each request renders "
                               "(prometheus-adapter has no default and fails every request)",
                               node)
            return None
        try:
            return parse_template(source, name="metrics-query")
        except TemplateSyntaxError as error:
            self.decoder.issue(path, f"unable to parse metrics query template "
                               f"{quote_go_string(source)}: {error}", node)
            return None

    def resource_rules(self, node: yaml.Node) -> ResourceRules | None:
        path = "resourceRules"
        fields = self.decoder.mapping(node, path, "config.ResourceRules",
                                      ("cpu", "memory", "window"))
        if fields is None:
            return None
        rules: list[ResourceRule | None] = []
        for key in ("cpu", "memory"):
            if _is_null(fields.get(key)):
                self.decoder.issue(f"{path}.{key}", "required: containerQuery, nodeQuery, "
                                   "resources and containerLabel", fields.get(key) or node)
                rules.append(None)
            else:
                rules.append(self.resource_rule(fields[key], f"{path}.{key}", node))
        cpu, memory = rules
        window = self.decoder.string(fields.get("window"), f"{path}.window")
        milliseconds = 0
        try:
            milliseconds = parse_prometheus_duration(window) if window else 0
        except ValueError as error:
            self.decoder.issue(f"{path}.window", str(error), fields.get("window"))
            return None
        if cpu is None or memory is None:
            return None
        return ResourceRules(cpu, memory, window, milliseconds)

    def resource_rule(self, node: yaml.Node | None, path: str,
                      parent: yaml.Node) -> ResourceRule | None:
        before = len(self.issues)
        fields = self.decoder.mapping(node, path, "config.ResourceRule", _RESOURCE_RULE_FIELDS)
        if fields is None:
            return None
        string = self.decoder.string
        container_query = string(fields.get("containerQuery"), f"{path}.containerQuery")
        node_query = string(fields.get("nodeQuery"), f"{path}.nodeQuery")
        container_label = string(fields.get("containerLabel"), f"{path}.containerLabel")
        backend = self.rule_backend(fields, path)
        resources = self.resources(fields.get("resources"), f"{path}.resources")
        container_template = self.metrics_template(
            container_query, f"{path}.containerQuery", fields.get("containerQuery") or parent)
        node_template = self.metrics_template(node_query, f"{path}.nodeQuery",
                                              fields.get("nodeQuery") or parent)
        if resources is not None and resources.is_empty:
            self.decoder.issue(f"{path}.resources", "required: map the pods, nodes and "
                               "namespaces resources to labels (overrides or a template)",
                               fields.get("resources") or parent)
        if not container_label:
            self.warn(f"{path}.containerLabel", "empty: pod metrics cannot be split into "
                      "containers", fields.get("containerLabel") or parent)
        if resources is not None and not resources.is_empty:
            mapper = ResourceMapper.build(template=resources.label_template,
                                          overrides=resources.overrides,
                                          catalog=builtin_catalog())
            for resource in (PODS, NODES, NAMESPACES):
                try:
                    label = mapper.label_for_resource(resource)
                except NoLabelForResourceError as error:
                    self.decoder.issue(f"{path}.resources", str(error),
                                       fields.get("resources") or parent)
                    continue
                if not is_promql_label_name(label):
                    self.decoder.issue(f"{path}.resources", f"{resource} maps to "
                                       f"{quote_go_string(label)}, which is not a valid "
                                       "Prometheus label name", fields.get("resources") or parent)
        if container_label and not is_promql_label_name(container_label):
            self.decoder.issue(f"{path}.containerLabel", f"{quote_go_string(container_label)} "
                               "is not a valid Prometheus label name",
                               fields.get("containerLabel") or parent)
        if len(self.issues) > before or resources is None or container_template is None \
                or node_template is None:
            return None
        return ResourceRule(container_query, container_template, node_query, node_template,
                            resources, container_label, backend)


def parse_config(text: str) -> AdapterConfig:
    """Parse and check a whole configuration; raise ConfigError listing every problem."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line = None if mark is None else mark.line + 1
        problem = " ".join(p for p in (error.context, error.problem) if p)
        raise ConfigError([ConfigIssue("", f"yaml: {problem}", line)]) from None
    except yaml.YAMLError as error:
        raise ConfigError([ConfigIssue("", f"yaml: {error}")]) from None
    except RecursionError:
        raise ConfigError([ConfigIssue("", "yaml: nested too deeply")]) from None
    unencodable = _surrogate_issues(root)
    if unencodable:
        # Reported alone: the other checks would quote these strings, which cannot be printed.
        raise ConfigError(unencodable)
    builder = _ConfigBuilder()
    config = builder.config(root)
    if builder.issues:
        raise ConfigError(sorted(builder.issues, key=_issue_order))
    return config


_SURROGATE = re.compile("[\ud800-\udfff]")


def _surrogate_issues(root: yaml.Node | None) -> list[ConfigIssue]:
    """Every key or value holding a UTF-16 surrogate escape (`"\\ud800"`): YAML decodes it to a
    lone surrogate, which is not a character and cannot be encoded to send, log or print."""
    issues: list[ConfigIssue] = []
    seen: set[int] = set()  # anchors and aliases share nodes, and may loop
    pending: list[tuple[yaml.Node, str]] = [] if root is None else [(root, "")]
    while pending:
        node, path = pending.pop()
        if isinstance(node, yaml.ScalarNode):
            found = _SURROGATE.search(str(node.value))
            if found is not None:
                issues.append(ConfigIssue(
                    path, f"\\u{ord(found.group()):04x} is a UTF-16 surrogate escape, not a "
                    "character: write the character itself", node.start_mark.line + 1))
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            pending.extend((item, f"{path}[{index}]") for index, item in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
                # quote_go_string shows a surrogate as U+FFFD, so the path itself prints.
                child = _child_path(path, key)
                pending.extend([(value_node, child), (key_node, child)])
    return sorted(issues, key=_issue_order)


def _issue_order(issue: ConfigIssue) -> tuple[int, str]:
    return (issue.line or 0, issue.path)
