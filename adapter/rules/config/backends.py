"""The configuration's `backends:` and each rule's `backend:`: names, URLs, credentials,
headers (templated over the namespace for tenants) and the references between them; and the
builder's shared state, which adapter.rules.config.sections builds on."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

import yaml
from yarl import URL

from adapter.rules.config.nodes import _child_path, _Decoder, _is_null, _mapping_value
from adapter.rules.config.values import (
    DEFAULT_BACKEND,
    BackendConfig,
    BackendHeader,
    ConfigIssue,
)
from adapter.rules.templating import Template, TemplateSyntaxError, parse_template
from metricscale.core.durations import parse_prometheus_duration
from metricscale.core.selectors import quote_go_string

_BACKEND_FIELDS = ("name", "url", "headers", "bearerTokenFile", "basicAuth", "caFile",
                   "clientCertFile", "clientKeyFile", "insecureSkipVerify", "timeout", "verb",
                   "acceptEncoding", "tenants")
_BACKEND_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


class _Credentials(NamedTuple):
    username: str
    password_file: str
    token_file: str
    cert: str
    key: str


class _BackendSections:
    """The issues and warnings found so far, and the backend sections."""

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
        name = self.backend_name(fields, path, node)
        url = string(fields.get("url"), f"{path}.url")
        self.check_url(url, f"{path}.url", fields.get("url") or node)
        headers = self.backend_headers(fields.get("headers"), f"{path}.headers")
        credentials = self.backend_credentials(fields, path, node)
        insecure = self.decoder.boolean(fields.get("insecureSkipVerify"),
                                        f"{path}.insecureSkipVerify")
        timeout = self.backend_timeout(fields, path)
        verb = string(fields.get("verb"), f"{path}.verb").upper() or None
        if verb not in (None, "GET", "POST"):
            self.decoder.issue(f"{path}.verb", "must be GET or POST", fields.get("verb"))
        encoding = string(fields.get("acceptEncoding"), f"{path}.acceptEncoding").lower() or None
        if encoding not in (None, "identity", "gzip"):
            self.decoder.issue(f"{path}.acceptEncoding", "must be identity or gzip",
                               fields.get("acceptEncoding"))
        tenants = self.backend_tenants(fields, path, node, headers)
        if len(self.issues) > before:
            return None
        return BackendConfig(
            name=name, url=url, index=index, headers=headers,
            bearer_token_file=credentials.token_file or None,
            basic_auth_username=credentials.username or None,
            basic_auth_password_file=credentials.password_file or None,
            ca_file=string(fields.get("caFile"), f"{path}.caFile") or None,
            client_cert_file=credentials.cert or None, client_key_file=credentials.key or None,
            insecure_skip_verify=bool(insecure), timeout_seconds=timeout, verb=verb,
            accept_encoding=encoding, tenants=tenants)

    def backend_name(self, fields: dict[str, yaml.Node], path: str, node: yaml.Node) -> str:
        name = self.decoder.string(fields.get("name"), f"{path}.name")
        if not name:
            self.decoder.issue(f"{path}.name", "required: the name rules use in `backend:`",
                               fields.get("name") or node)
        elif name == DEFAULT_BACKEND:
            self.decoder.issue(f"{path}.name", "\"default\" is the backend of --prometheus-url "
                               "and its flags; choose another name", fields["name"])
        elif not _BACKEND_NAME.fullmatch(name):
            self.decoder.issue(f"{path}.name", "must be lowercase letters, digits and '-'",
                               fields["name"])
        return name

    def backend_credentials(self, fields: dict[str, yaml.Node], path: str,
                            node: yaml.Node) -> _Credentials:
        string = self.decoder.string
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
        return _Credentials(username, password_file, token_file, cert, key)

    def backend_timeout(self, fields: dict[str, yaml.Node], path: str) -> float | None:
        timeout: float | None = None
        timeout_text = self.decoder.string(fields.get("timeout"), f"{path}.timeout")
        if timeout_text:
            try:
                timeout = parse_prometheus_duration(timeout_text) / 1000
            except ValueError as error:
                self.decoder.issue(f"{path}.timeout", str(error), fields.get("timeout"))
            else:
                if timeout <= 0:
                    self.decoder.issue(f"{path}.timeout", "must be a positive duration",
                                       fields.get("timeout"))
        return timeout

    def backend_tenants(self, fields: dict[str, yaml.Node], path: str, node: yaml.Node,
                        headers: tuple[BackendHeader, ...]) -> tuple[str, ...] | None:
        # Absent (or null): the tenant of every namespace the adapter sees; given (even empty):
        # only those (adapter.rules.tenants).
        tenants: tuple[str, ...] | None = None
        if not _is_null(fields.get("tenants")):
            tenants = tuple(self.decoder.string(item, f"{path}.tenants[{i}]")
                            for i, item in enumerate(self.decoder.sequence(
                                fields.get("tenants"), f"{path}.tenants", "[]string")))
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
        return tenants

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
