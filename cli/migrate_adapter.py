"""`metricscale migrate prometheus-adapter`: a prometheus-adapter configuration (its ConfigMap,
its rule file, or the prometheus-community chart's values) made into metricscale's, with what
cannot be carried and the documented differences that apply to it.

Pure: text in, text and report out. metricscale reads prometheus-adapter's rule format
unchanged, so what is carried is the rules themselves; the work is finding them, refusing what
the stricter parser refuses (each rule left out is reported with why), turning chart values
into rules and flags, and naming the differences of docs/differences-prometheus-adapter.md
that this file meets.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

from adapter.rules.config import AdapterConfig, ConfigError, ConfigIssue, parse_config
from adapter.rules.defaults import CONFIG_GEN_DEFAULTS_YAML, DEFAULT_CONFIG_YAML
from adapter.rules.resources import BUILTIN_RESOURCES

__all__ = [
    "CONFIGMAP_KEY",
    "CONFIGMAP_NAME",
    "DIFFERENCES_DOC",
    "AdapterMigration",
    "MigrationError",
    "configmap_manifest",
    "dump_yaml",
    "migrate_adapter_config",
]

CONFIGMAP_NAME = "metricscale-adapter-config"
CONFIGMAP_KEY = "config.yaml"
DIFFERENCES_DOC = "docs/differences-prometheus-adapter.md"
_SECTIONS = ("rules", "externalRules")
_HELM_RULE_KEYS = {"default", "custom", "existing", "external", "resource"}
# Differences that every configuration meets (they are about requests and answers, not rules).
GENERAL_DIFFERENCES = ("post-queries", "regex-escaping", "exact-values", "non-finite-values",
                       "empty-answers-404", "warnings-say-why", "error-messages-say-more",
                       "names-checked-first", "bad-selectors-400", "custom-versions")


class MigrationError(ValueError):
    """The file holds no prometheus-adapter configuration this command can read."""


@dataclass(frozen=True)
class Difference:
    """A row of docs/differences-prometheus-adapter.md that this file meets, and where."""

    id: str
    where: str


@dataclass
class AdapterMigration:
    """The carried configuration (`config_text`, a rule file) and the report."""

    config_text: str
    source: str  # "configmap", "rules file" or "helm values"
    dropped: list[str] = field(default_factory=list)  # what could not be carried, and why
    notes: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)  # metricscale adapter flags to set
    differences: list[Difference] = field(default_factory=list)
    config: AdapterConfig | None = None


# --------------------------------------------------------------------------------------------
# Finding the configuration


def _documents(text: str) -> list[Any]:
    try:
        return [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as error:
        raise MigrationError(f"not YAML: {error}") from None


def _is_rule_file(doc: Any) -> bool:
    return isinstance(doc, Mapping) and any(
        key in doc for key in ("rules", "externalRules", "resourceRules")) and not _is_helm(doc)


def _is_helm(doc: Any) -> bool:
    rules = doc.get("rules") if isinstance(doc, Mapping) else None
    return isinstance(rules, Mapping) and bool(set(rules) & _HELM_RULE_KEYS) and \
        set(rules) <= _HELM_RULE_KEYS


def _configmaps(docs: Iterable[Any]) -> Iterable[Mapping[str, Any]]:
    for doc in docs:
        if not isinstance(doc, Mapping):
            continue
        if doc.get("kind") == "ConfigMap":
            yield doc
        elif doc.get("kind") == "List" and isinstance(doc.get("items"), list):
            yield from _configmaps(doc["items"])


def _from_configmap(configmap: Mapping[str, Any]) -> tuple[str, str]:
    data = configmap.get("data") if isinstance(configmap.get("data"), Mapping) else {}
    assert isinstance(data, Mapping)
    name = (configmap.get("metadata") or {}).get("name", "?")
    for key in (CONFIGMAP_KEY, *sorted(k for k in data if k != CONFIGMAP_KEY)):
        text = data.get(key)
        if isinstance(text, str):
            try:
                parsed = yaml.safe_load(text)
            except yaml.YAMLError:
                continue
            if _is_rule_file(parsed) or parsed is None:
                return text, f"ConfigMap {name}, key {key}"
    raise MigrationError(f"ConfigMap {name} holds no prometheus-adapter rules (a key such as "
                         f"{CONFIGMAP_KEY} with rules, externalRules or resourceRules)")


def _first_rules(configmaps: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """The rules of the first ConfigMap that holds some (a bundle holds other ConfigMaps)."""
    first: MigrationError | None = None
    for configmap in configmaps:
        try:
            return _from_configmap(configmap)
        except MigrationError as error:
            first = first or error
    assert first is not None
    raise first


def _helm_values(doc: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The chart's values: the document itself, or one level down (an umbrella chart's
    `prometheus-adapter:` key)."""
    if _is_helm(doc):
        return doc
    for value in doc.values():
        if isinstance(value, Mapping) and _is_helm(value):
            return value
    return None


# --------------------------------------------------------------------------------------------
# Chart values → rules and flags

# prometheus-adapter flags (the chart's extraArguments) and what metricscale calls them.
_FLAG_NAMES = {
    "--metrics-relist-interval": "--metrics-relist-interval",
    "--metrics-max-age": "--metrics-max-age",
    "--prometheus-url": "--prometheus-url",
    "--prometheus-header": "--prometheus-header",
    "--prometheus-token-file": "--prometheus-token-file",
    "--prometheus-ca-file": "--prometheus-ca-file",
    "--prometheus-client-tls-cert-file": "--prometheus-client-tls-cert-file",
    "--prometheus-client-tls-key-file": "--prometheus-client-tls-key-file",
    "--prometheus-verb": "--prometheus-verb",
    "--prometheus-auth-insecure-skip-verify": "--prometheus-insecure-skip-tls-verify",
    "--tls-cert-file": "--tls-cert-file",
    "--tls-private-key-file": "--tls-private-key-file",
    "--cert-dir": "--cert-dir",
    "--secure-port": "--secure-port",
}
_FLAGS_NOT_CARRIED = {
    "--prometheus-auth-config": "a kubeconfig-style file for Prometheus' credentials: use "
                                "--prometheus-token-file, --prometheus-username with "
                                "--prometheus-password-file, or the client certificate flags",
    "--v": "klog verbosity: use --log-level",
    "--logtostderr": "klog's; metricscale always logs to stderr",
    "--config": "the rule file: metricscale reads it from its own ConfigMap",
}


def _extra_arguments(values: Mapping[str, Any], migration: AdapterMigration) -> None:
    for raw in values.get("extraArguments") or []:
        text = str(raw)
        name, _, value = text.partition("=")
        if name in _FLAG_NAMES:
            migration.flags.append(f"{_FLAG_NAMES[name]}={value}" if value else _FLAG_NAMES[name])
        elif name in _FLAGS_NOT_CARRIED:
            migration.dropped.append(f"extraArguments {text}: {_FLAGS_NOT_CARRIED[name]}")
        else:
            migration.dropped.append(f"extraArguments {text}: no metricscale flag of that name "
                                     "(see `metricscale adapter --help`)")


def _prometheus_url(values: Mapping[str, Any]) -> str | None:
    prometheus = values.get("prometheus")
    if not isinstance(prometheus, Mapping) or not prometheus.get("url"):
        return None
    url = str(prometheus["url"]).rstrip("/")
    if prometheus.get("port"):
        url += f":{prometheus['port']}"
    path = str(prometheus.get("path") or "")
    return url + (path if not path or path.startswith("/") else f"/{path}")


def _rules_from_helm(values: Mapping[str, Any], migration: AdapterMigration, *,
                     our_defaults: bool) -> dict[str, Any]:
    rules = values["rules"]
    config: dict[str, Any] = {}
    if rules.get("existing"):
        migration.dropped.append(
            f"rules.existing: {rules['existing']}: the chart mounts that ConfigMap instead of "
            "its rules; run `metricscale migrate prometheus-adapter` on the ConfigMap itself "
            f"(kubectl get configmap {rules['existing']} -o yaml)")
    discovery: list[Any] = []
    if rules.get("default", True):
        if our_defaults:
            discovery += yaml.safe_load(DEFAULT_CONFIG_YAML)["rules"]
            migration.notes.append(
                "rules.default: true: replaced by metricscale's default rules (config-gen's, "
                "with explicit overrides: a `job` label no longer becomes jobs.batch)")
        else:
            discovery += yaml.safe_load(CONFIG_GEN_DEFAULTS_YAML)["rules"]
            migration.notes.append(
                "rules.default: true: the chart's built-in rules (prometheus-adapter's "
                "config-gen rules) are carried as they are; they map labels with template "
                "<<.Resource>>, so a Prometheus `job` label also becomes a jobs.batch metric "
                "(prometheus-adapter #185): --our-default-rules uses metricscale's defaults, "
                "which list the same labels as overrides and leave `job` out")
    discovery += list(rules.get("custom") or [])
    if discovery:
        config["rules"] = discovery
    if rules.get("external"):
        config["externalRules"] = list(rules["external"])
    if rules.get("resource"):
        config["resourceRules"] = dict(rules["resource"])
        migration.notes.append(
            "rules.resource is set: metricscale serves metrics.k8s.io with the "
            "resource-metrics component (kustomize: components/resource-metrics; Helm: "
            "resourceMetrics.enabled: true)")
    url = _prometheus_url(values)
    if url:
        migration.flags.append(f"--prometheus-url={url}")
    if values.get("metricsRelistInterval"):
        migration.flags.append(f"--metrics-relist-interval={values['metricsRelistInterval']}")
    _extra_arguments(values, migration)
    tls = values.get("tls")
    if isinstance(tls, Mapping) and tls.get("enable"):
        migration.notes.append(
            "tls.enable: the chart's own serving certificate is not carried: metricscale makes "
            "and renews its own (or use `metricscale certs`, or cert-manager)")
    return config


# --------------------------------------------------------------------------------------------
# Parsing, leaving out the rules the stricter parser refuses

_RULE_PATH = re.compile(r"^(rules|externalRules)\[(\d+)\]")


def _rule_of(issue: ConfigIssue) -> tuple[str, int] | None:
    match = _RULE_PATH.match(issue.path)
    return (match[1], int(match[2])) if match else None


def _parse_carrying(raw: dict[str, Any], text: str | None,
                    migration: AdapterMigration) -> tuple[str, AdapterConfig]:
    """Parse the configuration; each rule with an error is left out (and reported) and the rest
    parsed again. Raises MigrationError when what is wrong is not one rule's."""
    current_text = text if text is not None else yaml.safe_dump(raw, sort_keys=False)
    removed: dict[str, list[int]] = {section: [] for section in _SECTIONS}
    for attempt in range(len(raw.get("rules") or []) + len(raw.get("externalRules") or []) + 1):
        # Line numbers point into the source only on a first pass over its own text.
        lines_true = attempt == 0 and text is not None
        try:
            return current_text, parse_config(current_text)
        except ConfigError as error:
            failing: dict[tuple[str, int], list[ConfigIssue]] = {}
            for issue in error.issues:
                rule = _rule_of(issue)
                if rule is None:
                    raise MigrationError(f"{issue}: not carried, and not one rule's to leave "
                                         "out; fix it in the source") from None
                failing.setdefault(rule, []).append(issue)
            for (section, index), issues in sorted(failing.items(), key=lambda kv: (
                    kv[0][0], -kv[0][1])):
                original = _original_index(index, removed[section])
                lines = [_renumber(str(issue if lines_true else replace(issue, line=None)),
                                   section, index, original) for issue in issues]
                migration.dropped.append(f"{section}[{original}] left out: " + "; ".join(lines))
                for issue in issues:
                    refusal = _refusal_difference(issue)
                    if refusal is not None:
                        migration.differences.append(Difference(
                            refusal, f"{section}[{original}]: refused, as documented"))
                del raw[section][index]
                removed[section].append(original)
            current_text = yaml.safe_dump(raw, sort_keys=False)
    raise MigrationError("the configuration keeps failing to parse")  # pragma: no cover


def _original_index(index: int, removed: Sequence[int]) -> int:
    """The index a rule had in the source, given the source indices already removed."""
    original = index
    for gone in sorted(removed):
        if gone <= original:
            original += 1
    return original


def _renumber(line: str, section: str, index: int, original: int) -> str:
    return line.replace(f"{section}[{index}]", f"{section}[{original}]", 1)


# --------------------------------------------------------------------------------------------
# The differences this file meets

# `$1_per_second`: Go reads the group named `1_per_second`, which does not exist.
_GLUED_GROUP = re.compile(r"\$(\d+[A-Za-z_]\w*)")
# Upstream registers these three as cluster-scoped too; the rest of the cluster-scoped kinds
# it takes for namespaced ones.
_CLUSTER_SCOPED = {name for info in BUILTIN_RESOURCES if not info.namespaced
                   and info.resource not in {"namespaces", "nodes", "persistentvolumes"}
                   for name in (info.resource, info.kind.lower())}
_KNOWN = {info.resource for info in BUILTIN_RESOURCES} | {
    info.kind.lower() for info in BUILTIN_RESOURCES}


def _differences(config: AdapterConfig) -> list[Difference]:
    found: list[Difference] = []
    for rule in (*config.rules, *config.external_rules):
        glued = _GLUED_GROUP.search(rule.name_as)
        if glued:
            digits = re.match(r"\d+", glued[1])
            assert digits is not None
            found.append(Difference("unnamed-metrics", (
                f"{rule.path}.name.as {rule.name_as!r}: Go reads the group named {glued[1]!r}, "
                f"which does not exist, so the names come out empty and are skipped (write "
                f"${{{digits[0]}}}{glued[1][len(digits[0]):]})")))
        by_resource: dict[str, list[str]] = {}
        for label, resource in rule.resources.overrides:
            by_resource.setdefault(str(resource), []).append(label)
            if resource.resource in _CLUSTER_SCOPED or (
                    resource.group and resource.resource not in _KNOWN
                    and f"{resource.resource}s" not in _KNOWN):
                found.append(Difference("real-scope", f"{rule.path}.resources.overrides.{label}"
                                        f": {resource} is served where the API puts it "
                                        "(cluster-scoped if the cluster says so)"))
            if resource.resource not in _KNOWN and f"{resource.resource}s" not in _KNOWN:
                found.append(Difference("missing-resources", f"{rule.path}.resources.overrides."
                                        f"{label}: {resource} is no built-in resource; until "
                                        "its CRD is installed it is skipped, not fatal"))
        for named, labels in by_resource.items():
            if len(labels) > 1:
                found.append(Difference("deterministic-labels", f"{rule.path}: labels "
                                        f"{', '.join(sorted(labels))} all name {named}; "
                                        f"{min(labels)} is the one queried"))
        if rule.section == "externalRules":
            if any(c.isupper() for c in rule.series_query + rule.name_as):
                found.append(Difference("external-names-ignore-case", f"{rule.path}: capitals "
                                        "in the name; the HPA asks in lower case, and is "
                                        "answered"))
            if "scalar(" in rule.metrics_query:
                found.append(Difference("external-labels-never-null", f"{rule.path}: scalar() "
                                        "answers carry metricLabels: {}"))
    if not config.rules:
        found.append(Difference("groups-always-served", "no rules: custom.metrics.k8s.io is "
                                "served anyway, with a placeholder entry"))
    if not config.external_rules:
        found.append(Difference("groups-always-served", "no externalRules: "
                                "external.metrics.k8s.io is served anyway, with a placeholder "
                                "entry"))
    return found


def _refusal_difference(issue: ConfigIssue) -> str | None:
    """The documented difference a refused rule's problem is an instance of, if any."""
    if issue.path.endswith(("seriesQuery", "metricsQuery")) and \
            issue.message.startswith("required"):
        return "rules-that-cannot-work"
    if ".overrides[" in issue.path and "not a valid Prometheus label name" in issue.message:
        return "rules-that-cannot-work"
    if "not supported by metricscale" in issue.message:
        return "template-actions" if "template" in issue.message else "regex-features"
    return None


# --------------------------------------------------------------------------------------------
# The whole migration


def migrate_adapter_config(text: str, *, our_defaults: bool = False) -> AdapterMigration:
    """Carry the prometheus-adapter configuration in `text` (see the module docstring)."""
    docs = _documents(text)
    if not docs:
        raise MigrationError("the file is empty")
    configmaps = list(_configmaps(docs))
    helm = next((values for doc in docs if isinstance(doc, Mapping)
                 if (values := _helm_values(doc)) is not None), None)
    migration: AdapterMigration
    if configmaps:
        source_text, where = _first_rules(configmaps)
        migration = AdapterMigration(config_text=source_text, source="configmap")
        migration.notes.append(f"rules read from {where}")
        raw = yaml.safe_load(source_text) or {}
        config_text, config = _parse_carrying(dict(raw), source_text, migration)
    elif helm is not None:
        migration = AdapterMigration(config_text="", source="helm values")
        raw = _rules_from_helm(helm, migration, our_defaults=our_defaults)
        config_text, config = _parse_carrying(raw, None, migration)
    elif _is_rule_file(docs[0]):
        migration = AdapterMigration(config_text=text, source="rules file")
        config_text, config = _parse_carrying(dict(docs[0]), text, migration)
    else:
        raise MigrationError("no prometheus-adapter configuration found: expected a ConfigMap "
                             "holding config.yaml, a rule file (rules, externalRules, "
                             "resourceRules) or the prometheus-community chart's values "
                             "(rules.default, rules.custom, ...)")
    migration.config_text = config_text
    migration.config = config
    migration.notes.extend(f"warning: {warning}" for warning in config.warnings)
    migration.differences[:0] = _differences(config)
    return migration


class _BlockDumper(yaml.SafeDumper):
    """YAML with multi-line strings as literal blocks (a ConfigMap's rules stay readable)."""


def _text(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
    style = "|" if "\n" in text and not any(line != line.rstrip() for line in
                                            text.splitlines()) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


_BlockDumper.add_representer(str, _text)


def dump_yaml(document: Any) -> str:
    """`document` as YAML, keys in their order, rule text as literal blocks."""
    return yaml.dump(document, Dumper=_BlockDumper, sort_keys=False, width=1000)


def configmap_manifest(migration: AdapterMigration, *, namespace: str,
                       name: str = CONFIGMAP_NAME) -> dict[str, Any]:
    """metricscale's ConfigMap holding the carried rules (what its manifests mount)."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/name": "metricscale-adapter",
                                    "app.kubernetes.io/part-of": "metricscale"}},
            "data": {CONFIGMAP_KEY: migration.config_text}}
