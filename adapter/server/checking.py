"""`metricscale adapter --check-config FILE`: the rule file checked as the adapter would load
it (exit 0 or 1), and with --prometheus-url each rule's discovered metrics and a sample query."""

from __future__ import annotations

import asyncio
import sys
import time
from datetime import UTC, datetime
from typing import TextIO

import yaml
from prometheus_client import CollectorRegistry
from yarl import URL

from adapter.http.reloading import read_config_bytes
from adapter.kube.catalog import ClusterCatalog
from adapter.kube.objects import USER_AGENT
from adapter.prometheus.backends import BackendClients
from adapter.prometheus.relisting import RelistFailed, relist_once
from adapter.prometheus.tenancy import MAX_NAMESPACE_TENANTS
from adapter.rules.config import (
    DEFAULT_BACKEND,
    AdapterConfig,
    BackendConfig,
    ConfigError,
    parse_config,
)
from adapter.rules.query import QueryError, build_custom_query, build_external_query
from adapter.rules.registry import MetricRegistry, merge_registries
from adapter.rules.resources import ResourceCatalog, builtin_catalog
from adapter.rules.tenants import backend_tenants, follows_namespaces
from adapter.settings import (
    AdapterSettings,
)
from metricscale.core.selectors import Selector
from metricscale.files import FileError
from metricscale.kube.errors import KubeError
from metricscale.kube.http import connect

__all__ = ["check_config"]

_SAMPLE_NAMESPACE = "<namespace>"
_SAMPLE_NAME = "<name>"


async def _catalog(settings: AdapterSettings, out: TextIO) -> ResourceCatalog:
    if not settings.kubeconfig:
        return builtin_catalog()
    try:
        async with connect(kubeconfig=settings.kubeconfig, context=settings.context,
                           user_agent=USER_AGENT) as http:
            return (await ClusterCatalog(http).refresh()).catalog
    except KubeError as error:
        print(f"cannot discover the cluster's resources ({error}); using the built-in list",
              file=out)
        return builtin_catalog()


def _sample_queries(registry: MetricRegistry, config: AdapterConfig) -> dict[str, list[str]]:
    """Per rule path: its discovered metrics, each with a sample query for placeholder names."""
    lines: dict[str, list[str]] = {rule.path: [] for rule in
                                   (*config.rules, *config.external_rules)}
    for key in registry.custom_metrics():
        entry = registry.custom[key]
        scope = "namespaced" if key.namespaced else "cluster-scoped"
        try:
            built = build_custom_query(
                rule=entry.rule, mapper=entry.mapper, series=entry.series,
                resource=key.resource,
                namespace=_SAMPLE_NAMESPACE if key.namespaced else None,
                names=[_SAMPLE_NAME], metric_selector=Selector())
            query = built.promql
        except QueryError as error:
            query = f"(cannot build a query: {error})"
        lines[entry.rule.path].append(
            f"  {key.api_name} ({scope}, series {entry.series})\n      {query}")
    for name in sorted(registry.external):
        external = registry.external[name]
        try:
            query = build_external_query(
                rule=external.rule, mapper=external.mapper, series=external.series,
                namespace=_SAMPLE_NAMESPACE, metric_selector=Selector())
        except QueryError as error:
            query = f"(cannot build a query: {error})"
        lines[external.rule.path].append(
            f"  {external.metric} (external, series {external.series})\n      {query}")
    return lines


def _empty_yaml(text: str) -> bool:
    try:
        return yaml.safe_load(text) is None
    except (yaml.YAMLError, RecursionError):
        return False  # parse_config reports the problem with its position


def _rules_text_of(text: str, *, path: str, out: TextIO) -> str | None:
    """The rule file inside `text`: itself, or a ConfigMap's `data.config.yaml` (said so).

    None (after printing why) for a ConfigMap without that key: people pass the manifest's
    ConfigMap, and "field apiVersion not found" would not tell them what to do.
    """
    try:
        document = yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError):
        return text  # parse_config reports what is wrong with it, field and line
    if not (isinstance(document, dict) and document.get("kind") == "ConfigMap"):
        return text
    name = (document.get("metadata") or {}).get("name", "")
    data = document.get("data") or {}
    rules = data.get("config.yaml") if isinstance(data, dict) else None
    if not isinstance(rules, str):
        print(f"{path}: error: this is a ConfigMap ({name}) without data.config.yaml: pass the "
              "rule file itself, or a ConfigMap that holds it under data.config.yaml", file=out)
        return None
    print(f"{path}: ConfigMap {name}: checking its data.config.yaml (the file the adapter "
          "reads from the mounted ConfigMap)", file=out)
    return rules


def check_config(settings: AdapterSettings, *, out: TextIO | None = None) -> int:
    """Validate the file of --check-config; with --prometheus-url also run one discovery pass.

    Prints to `out` (stdout); returns the exit code: 0 valid (and discovered), 1 otherwise.
    """
    out = out or sys.stdout
    path = settings.check_config or ""
    try:
        raw = read_config_bytes(path)
        text = raw.decode("utf-8")
        config_text = _rules_text_of(text, path=path, out=out)
        if config_text is None:
            return 1
        if _empty_yaml(config_text):
            print(f"{path}: warning: the file is empty: the adapter would serve no metrics",
                  file=out)
            return 0
        config = parse_config(config_text)
    except FileError as error:
        print(f"{path}: cannot read: {error.strerror}", file=out)
        return 1
    except UnicodeDecodeError as error:
        print(f"{path}: error: not UTF-8 text (byte {error.start})", file=out)
        print(f"{path}: invalid (1 problem(s))", file=out)
        return 1
    except ConfigError as error:
        for issue in error.issues:
            print(f"{path}: error: {issue}", file=out)
        print(f"{path}: invalid ({len(error.issues)} problem(s))", file=out)
        return 1
    for warning in config.warnings:
        print(f"{path}: warning: {warning}", file=out)
    resource_rules = "yes" if config.resource_rules is not None else "no"
    print(f"{path}: valid: {len(config.rules)} rules, {len(config.external_rules)} "
          f"externalRules, resourceRules: {resource_rules}", file=out)
    if config.backends:
        for line in _backend_lines(config):
            print(line, file=out)
    if settings.prometheus is None:
        return 0
    return asyncio.run(_check_discovery(settings, config=config, out=out))


def _backend_lines(config: AdapterConfig) -> list[str]:
    """`backend NAME (URL): rules[0], externalRules[1]`, one per backend, `default` first."""
    urls = {backend.name: _shown_url(backend.url) for backend in config.backends}
    configs = {backend.name: backend for backend in config.backends}
    lines = []
    for name, rules in config.rules_by_backend().items():
        where = urls.get(name, "--prometheus-url")
        used = ", ".join(rules) if rules else "no rule"
        backend = configs.get(name)
        tenants = "" if backend is None else _tenant_text(backend)
        lines.append(f"backend {name} ({where}): {used}{tenants}")
    return lines


def _tenant_text(backend: BackendConfig) -> str:
    """`; tenants: ...` of a tenant backend: what its discovery lists."""
    if not backend.per_namespace:
        return ""
    fixed = backend_tenants(backend)
    if follows_namespaces(backend):
        more = f" and {', '.join(fixed)}" if fixed else ""
        return (f"; tenants: one per namespace the adapter sees (at most "
                f"{MAX_NAMESPACE_TENANTS}){more}")
    return f"; tenants: {', '.join(fixed) if fixed else 'none'}"


def _shown_url(url: str) -> str:
    """The Prometheus URL for output: a password written into it stays out of logs."""
    return str(URL(url).with_password(None))


async def _check_discovery(settings: AdapterSettings, *, config: AdapterConfig,
                           out: TextIO) -> int:
    assert settings.prometheus is not None
    shown_url = _shown_url(settings.prometheus.url)
    catalog = await _catalog(settings, out)
    now = datetime.fromtimestamp(time.time(), tz=UTC)
    parts = []
    async with BackendClients(config=config, flags=settings.prometheus,
                              registry=CollectorRegistry()) as backends:
        for backend in backends.namespace_backends():
            if config.rules_by_backend().get(backend.name):
                print(f"backend {backend.name}: its namespaces' tenants are discovered by the "
                      "running adapter; this check discovers only its default tenant", file=out)
        for target in backends.relist_targets():
            if target.backend != DEFAULT_BACKEND and not config.rules_by_backend().get(
                    target.backend):
                continue
            try:
                parts.append(await relist_once(
                    now, config=config, lister=target.client, catalog=catalog,
                    max_age=settings.max_age, request_timeout=target.client.settings.timeout,
                    backend=target.backend if config.backends else None, tenant=target.tenant))
            except RelistFailed as error:
                cause = error.__cause__
                detail = getattr(cause, "detail", "") or ""
                where = shown_url if target.backend == DEFAULT_BACKEND else (
                    f"backend {target.backend} ({_shown_url(target.client.settings.url)})")
                if target.tenant is not None:
                    where += f" tenant {target.tenant}"
                print(f"discovery against {where} failed: {error} {detail}", file=out)
                return 1
    registry = merge_registries(parts, catalog=catalog)
    for problem in registry.stats.override_problems:
        print(f"warning: {problem}", file=out)
    per_rule = _sample_queries(registry, config)
    stats = {rule.rule: rule for rule in registry.stats.rules}
    for rule in (*config.rules, *config.external_rules):
        rule_stats = stats.get(rule.path)
        seen = rule_stats.series_names if rule_stats else 0
        found = per_rule[rule.path]
        print(f"{rule.path}: seriesQuery {rule.series_query!r}: {seen} series names, "
              f"{len(found)} metrics", file=out)
        for line in found:
            print(line, file=out)
    print(f"discovered {registry.stats.custom_metrics} custom and "
          f"{registry.stats.external_metrics} external metrics from "
          f"{shown_url}", file=out)
    return 0
