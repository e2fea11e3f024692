"""`metricscale doctor`: check an installation against a live cluster, one line per finding.

It reads what a user could read (kubectl's kubeconfig rule): the APIServices and their
conditions; the certificate the adapter serves, by a TLS handshake to its Service (as the
aggregator makes one) and, where that address cannot be reached from here, from the Secret
that holds it; SubjectAccessReviews for the HPA controller's, the autoscaler's and the
adapter's service accounts; the adapter's rules (its ConfigMap, or --config) asked of each
Prometheus backend; and every HPA and Autoscaler with its target, pods and metrics, read as the
HPA reads them. The checks themselves are cli.doctor_checks (pure).

Exit status: 1 when any line is FAIL, 2 for a kubeconfig named with --kubeconfig that cannot be
used, 0 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import shlex
import ssl
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import PurePosixPath
from typing import Any

import yaml
from cryptography import x509

from cli.doctor_checks import (
    FAIL,
    OK,
    WARN,
    Asked,
    Permission,
    Result,
    RuleSeries,
    check_apiservices,
    check_asked_metrics,
    check_at_max,
    check_certificate,
    check_conflicts,
    check_permissions,
    check_prometheus,
    check_requests,
    check_rules,
    check_staleness,
    check_twins,
    exit_status,
    render_json,
    render_text,
    required_permissions,
    rule_window,
)
from metricscale.kube.config import add_kubeconfig_arguments, resolve_kubeconfig
from metricscale.kube.errors import KubeConfigError, KubeError, NotFound

__all__ = ["DoctorOptions", "add_arguments", "diagnose", "run"]

USER_AGENT = "metricscale-doctor"
_ORDER = ("apiservice", "certificate", "rbac", "prometheus", "rules", "metrics", "workloads")
_HANDSHAKE_SECONDS = 3.0


@dataclass(frozen=True)
class DoctorOptions:
    """What to check, and where metricscale is installed."""

    namespace: str = "metricscale"
    adapter: str = "metricscale-adapter"  # the Deployment and the Service
    autoscaler: str = "metricscale-autoscaler"  # the Deployment
    prometheus_url: str | None = None  # instead of the adapter's --prometheus-url
    config_file: str | None = None  # instead of the adapter's ConfigMap
    expiry_warning: timedelta = timedelta(days=30)
    at_max_for: timedelta = timedelta(minutes=30)
    stale_scrape: timedelta = timedelta(minutes=5)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Check a metricscale installation against the cluster: APIServices and certificates, "
        "RBAC (SubjectAccessReviews), the adapter's rules against Prometheus, and every HPA and "
        "Autoscaler with its target, pods and metrics. One line per finding (OK, WARN or FAIL, "
        "the object, the fix); exit 1 on any FAIL.")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
    parser.add_argument("--namespace", default="metricscale",
                        help="where metricscale is installed (default metricscale)")
    parser.add_argument("--prometheus-url", default=None, metavar="URL",
                        help="the default backend's URL, instead of the adapter's "
                             "--prometheus-url (e.g. a port-forward)")
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="the adapter's rules (a rule file or its ConfigMap), instead of "
                             "the ConfigMap its Deployment mounts")
    parser.add_argument("--expiry-warning-days", type=int, default=30, metavar="DAYS",
                        help="warn of certificates expiring within DAYS (default 30)")
    parser.add_argument("--at-max-minutes", type=int, default=30, metavar="MINUTES",
                        help="warn of targets at maxReplicas for longer (default 30)")
    add_kubeconfig_arguments(parser)


def options_from(args: argparse.Namespace) -> DoctorOptions:
    return DoctorOptions(namespace=args.namespace, prometheus_url=args.prometheus_url,
                         config_file=args.config,
                         expiry_warning=timedelta(days=args.expiry_warning_days),
                         at_max_for=timedelta(minutes=args.at_max_minutes))


# --------------------------------------------------------------------------------------------
# Reading the cluster


class Reader:
    """GETs and POSTs through the shared request path; errors come back as KubeError."""

    def __init__(self, requests: Any, kube: Any) -> None:
        self.requests = requests  # metricscale.kube.requests.KubeRequests
        self.kube = kube  # autoscaler.kube.operations.KubeClient

    async def get(self, path: str, **options: Any) -> Any:
        return await self.requests.call("GET", path, operation="doctor", resource=path,
                                        **options)

    async def get_or_none(self, path: str, **options: Any) -> Any:
        try:
            return await self.get(path, **options)
        except NotFound:
            return None

    async def items(self, path: str, **options: Any) -> list[Mapping[str, Any]]:
        listed = await self.get_or_none(path, **options)
        items = listed.get("items") if isinstance(listed, Mapping) else None
        return [i for i in items or [] if isinstance(i, Mapping)]

    async def allowed(self, permission: Permission, *, user: str | None = None
                      ) -> tuple[bool | None, str]:
        if user is None:
            _, _, who = permission.subject.partition(" ")
            namespace, _, name = who.partition("/")
            user = f"system:serviceaccount:{namespace}:{name}"
            groups = ["system:serviceaccounts", f"system:serviceaccounts:{namespace}",
                      "system:authenticated"]
        else:
            groups = ["system:authenticated"]
        review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                  "spec": {"user": user, "groups": groups,
                           "resourceAttributes": permission.attributes()}}
        try:
            answer = await self.requests.call(
                "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body=review,
                operation="doctor", resource="subjectaccessreviews")
        except KubeError as error:
            return None, str(error)
        status = answer.get("status") or {} if isinstance(answer, Mapping) else {}
        return bool(status.get("allowed")), str(status.get("reason") or "")


@contextlib.asynccontextmanager
async def open_reader(*, kubeconfig: str | None, context: str | None) -> AsyncIterator[Reader]:
    from prometheus_client import CollectorRegistry

    from autoscaler.kube.operations import KubeClient
    from metricscale.kube.http import connect
    from metricscale.kube.requests import KubeRequests
    from metricscale.kube.retry import RetryPolicy

    async with connect(kubeconfig=kubeconfig, context=context, user_agent=USER_AGENT) as http:
        yield Reader(KubeRequests(http, retry=RetryPolicy()),
                     KubeClient(http, registry=CollectorRegistry(),
                                reporting_instance=USER_AGENT))


@dataclass
class Installed:
    """What the Deployments say about how the programs run."""

    adapter_args: list[str] = field(default_factory=list)
    adapter_sa: str = "metricscale-adapter"
    autoscaler_sa: str = "metricscale-autoscaler"
    config_map: str = "metricscale-adapter-config"
    config_key: str = "config.yaml"
    secret_volumes: list[str] = field(default_factory=list)
    found: bool = False

    def flag(self, name: str) -> str | None:
        value: str | None = None
        for index, arg in enumerate(self.adapter_args):
            if arg == name and index + 1 < len(self.adapter_args):
                value = self.adapter_args[index + 1]
            elif arg.startswith(f"{name}="):
                value = arg.split("=", 1)[1]
        return value


def _container_args(deployment: Mapping[str, Any]) -> tuple[list[str], Mapping[str, Any]]:
    spec = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    containers = spec.get("containers") or [{}]
    first = containers[0] if isinstance(containers[0], Mapping) else {}
    return [str(a) for a in (first.get("command") or [])[1:] + (first.get("args") or [])], spec


async def read_installation(reader: Reader, options: DoctorOptions) -> Installed:
    installed = Installed()
    base = f"/apis/apps/v1/namespaces/{options.namespace}/deployments"
    adapter = await reader.get_or_none(f"{base}/{options.adapter}")
    if isinstance(adapter, Mapping):
        installed.found = True
        installed.adapter_args, pod = _container_args(adapter)
        installed.adapter_sa = str(pod.get("serviceAccountName") or installed.adapter_sa)
        config = installed.flag("--config")
        mounts = {}
        for container in pod.get("containers") or []:
            for mount in container.get("volumeMounts") or []:
                mounts[str(mount.get("name"))] = str(mount.get("mountPath"))
        for volume in pod.get("volumes") or []:
            if (volume.get("secret") or {}).get("secretName"):
                installed.secret_volumes.append(str(volume["secret"]["secretName"]))
            configmap = (volume.get("configMap") or {}).get("name")
            mount = mounts.get(str(volume.get("name")))
            if configmap and config and mount and config.startswith(mount.rstrip("/") + "/"):
                installed.config_map = str(configmap)
                installed.config_key = PurePosixPath(config).name
    autoscaler = await reader.get_or_none(f"{base}/{options.autoscaler}")
    if isinstance(autoscaler, Mapping):
        _, pod = _container_args(autoscaler)
        installed.autoscaler_sa = str(pod.get("serviceAccountName") or installed.autoscaler_sa)
    return installed


# --------------------------------------------------------------------------------------------
# APIServices and certificates


def _bundle(apiservice: Mapping[str, Any]) -> list[x509.Certificate]:
    raw = (apiservice.get("spec") or {}).get("caBundle")
    if not raw:
        return []
    try:
        return x509.load_pem_x509_certificates(base64.b64decode(raw))
    except ValueError:
        return []


async def _handshake(host: str, port: int, server_name: str) -> x509.Certificate:
    """The leaf certificate the server at host:port presents for `server_name` (unverified:
    the check compares it with the caBundle itself)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    _, writer = await asyncio.wait_for(asyncio.open_connection(
        host, port, ssl=context, server_hostname=server_name), _HANDSHAKE_SECONDS)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()
    return x509.load_der_x509_certificate(der)


async def served_certificate(reader: Reader, apiservice: Mapping[str, Any], *,
                             installed: Installed, namespace: str,
                             cache: dict[tuple[str, int], tuple[x509.Certificate | None, str]],
                             ) -> tuple[x509.Certificate | None, str, str]:
    """(certificate, where it was read, the name the aggregator checks)."""
    service = (apiservice.get("spec") or {}).get("service") or {}
    svc_ns, svc_name = str(service.get("namespace")), str(service.get("name"))
    port = int(service.get("port") or 443)
    server_name = f"{svc_name}.{svc_ns}.svc"
    svc = await reader.get_or_none(f"/api/v1/namespaces/{svc_ns}/services/{svc_name}")
    spec = svc.get("spec") or {} if isinstance(svc, Mapping) else {}
    host = str(spec.get("externalName")) if spec.get("type") == "ExternalName" else server_name
    key = (host, port)
    if key not in cache:
        try:
            cache[key] = (await _handshake(host, port, server_name),
                          f"a TLS handshake with {host}:{port}")
        except (OSError, ssl.SSLError, TimeoutError, ValueError) as error:
            unreachable = f"{host}:{port} unreachable from here ({type(error).__name__})"
            cache[key] = await _certificate_from_secret(reader, installed=installed,
                                                        namespace=namespace,
                                                        unreachable=unreachable)
    certificate, source = cache[key]
    return certificate, source, server_name


async def _certificate_from_secret(reader: Reader, *, installed: Installed, namespace: str,
                                   unreachable: str) -> tuple[x509.Certificate | None, str]:
    names = installed.secret_volumes or [installed.flag("--certs-secret-name")
                                         or "metricscale-adapter-certs"]
    problems = []
    for name in names:
        try:
            secret = await reader.get(f"/api/v1/namespaces/{namespace}/secrets/{name}")
        except KubeError as error:
            problems.append(f"Secret {namespace}/{name}: {error}")
            continue
        data = secret.get("data") or {}
        for key in ("tls.crt", "serving.crt"):
            if data.get(key):
                try:
                    return (x509.load_pem_x509_certificates(base64.b64decode(data[key]))[0],
                            f"the Secret {namespace}/{name}, {unreachable}")
                except ValueError as error:
                    problems.append(f"Secret {namespace}/{name}: {key}: {error}")
    return None, f"{unreachable}; " + "; ".join(problems or ["no Secret holds it"])


# --------------------------------------------------------------------------------------------
# Prometheus


class Probe:
    """Prometheus' HTTP API of one backend: directly, or through the API server's service
    proxy when the URL names a cluster Service this machine cannot reach."""

    def __init__(self, *, name: str, url: str, client: Any, reader: Reader,
                 proxy_path: str | None) -> None:
        self.name, self.url = name, url
        self._client = client  # adapter.prometheus.client.PrometheusClient
        self._reader = reader
        self._proxy_path = proxy_path
        self.via = "direct"

    async def _proxy(self, endpoint: str, params: list[tuple[str, str]]) -> Any:
        assert self._proxy_path is not None
        return await self._reader.get(f"{self._proxy_path}/api/v1/{endpoint}", query=params)

    async def query(self, promql: str, *, at: float) -> list[tuple[dict[str, str], float]]:
        from adapter.prometheus.client import (
            PrometheusUnavailable,
            Scalar,
            parse_query_response,
        )

        if self.via == "direct":
            try:
                result = await self._client.query(promql, at=at)
            except PrometheusUnavailable:
                if self._proxy_path is None:
                    raise
                self.via = "through the API server's service proxy"
                return await self.query(promql, at=at)
        else:
            body = json.dumps(await self._proxy("query", [("query", promql),
                                                          ("time", f"{at:.3f}")])).encode()
            result = parse_query_response(200, body)
        if isinstance(result, Scalar):
            return [({}, float(result.value))]
        return [(dict(s.labels), float(s.value)) for s in result.samples]

    async def series(self, match: str, *, start: float) -> list[Mapping[str, str]]:
        if self.via == "direct":
            return [labels async for labels in self._client.series([match], start=start)]
        answer = await self._proxy("series", [("match[]", match), ("start", f"{start:.3f}")])
        return [s for s in (answer or {}).get("data") or [] if isinstance(s, Mapping)]


def _proxy_path(url: str) -> str | None:
    """/api/v1/namespaces/NS/services/SCHEME:NAME:PORT/proxy[/path] for a Service URL."""
    from yarl import URL

    parsed = URL(url)
    parts = (parsed.host or "").split(".")
    if len(parts) < 3 or parts[2] != "svc":
        return None
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    path = parsed.path.rstrip("/")
    return (f"/api/v1/namespaces/{parts[1]}/services/{parsed.scheme}:{parts[0]}:{port}/proxy"
            f"{path}")


# --------------------------------------------------------------------------------------------
# The whole diagnosis


@dataclass
class Facts:
    results: list[Result] = field(default_factory=list)

    def add(self, *results: Result | None) -> None:
        self.results.extend(r for r in results if r is not None)


def _config_text(text: str) -> str:
    """A rule file's text; given a ConfigMap, its config.yaml."""
    with contextlib.suppress(yaml.YAMLError):
        doc = yaml.safe_load(text)
        if isinstance(doc, Mapping) and doc.get("kind") == "ConfigMap":
            data = doc.get("data") or {}
            return str(data.get("config.yaml") or next(iter(data.values()), ""))
    return text


async def _load_rules(reader: Reader, options: DoctorOptions, installed: Installed,
                      facts: Facts) -> Any:
    from adapter.rules.config import ConfigError, parse_config
    from metricscale.files import FileError, read_text

    if options.config_file:
        where = options.config_file
        try:
            text = _config_text(read_text(options.config_file))
        except FileError as error:
            facts.add(Result("rules", FAIL, where, str(error), "give a readable --config"))
            return None
    else:
        where = f"ConfigMap {options.namespace}/{installed.config_map}"
        configmap = await reader.get_or_none(
            f"/api/v1/namespaces/{options.namespace}/configmaps/{installed.config_map}")
        if not isinstance(configmap, Mapping):
            facts.add(Result("rules", FAIL, where, "not found: the adapter has no rules",
                             APPLY_RULES))
            return None
        text = str((configmap.get("data") or {}).get(installed.config_key) or "")
    try:
        config = parse_config(text)
    except ConfigError as error:
        for issue in error.issues:
            facts.add(Result("rules", FAIL, where, str(issue),
                             "fix the rule file (metricscale adapter --check-config FILE)"))
        return None
    for warning in config.warnings:
        facts.add(Result("rules", WARN, where, str(warning)))
    return config


APPLY_RULES = "kubectl apply -k manifests, or put your rules in that ConfigMap"


async def _probes(reader: Reader, config: Any, options: DoctorOptions, installed: Installed,
                  stack: contextlib.AsyncExitStack, facts: Facts, now: float
                  ) -> dict[str, Probe | None]:
    from adapter.prometheus.client import PrometheusClient, PrometheusError
    from adapter.settings import PrometheusSettings

    urls: dict[str, tuple[str, dict[str, Any]]] = {}
    default = options.prometheus_url or installed.flag("--prometheus-url")
    if default:
        urls["default"] = (default, {})
    for backend in config.backends:
        headers = tuple((h.name, h.default if h.per_namespace else h.value)
                        for h in backend.headers if not h.per_namespace or h.default)
        urls[backend.name] = (backend.url, {
            "headers": headers, "ca_file": backend.ca_file,
            "insecure_skip_verify": backend.insecure_skip_verify})
    probes: dict[str, Probe | None] = {}
    if "default" not in urls:
        facts.add(Result("prometheus", FAIL, "Prometheus backend default",
                         "no URL: the adapter's Deployment has no --prometheus-url",
                         "give doctor --prometheus-url"))
        probes["default"] = None
    for name, (url, extra) in urls.items():
        try:
            settings = PrometheusSettings(url=url, timeout=10.0, method="GET",
                                          **{k: v for k, v in extra.items() if v})
            client = await stack.enter_async_context(PrometheusClient(settings, backend=name))
        except (PrometheusError, ValueError, OSError) as error:
            facts.add(check_prometheus(backend=name, url=url, via="direct", error=str(error),
                                       up_targets=None, total_targets=None,
                                       newest_scrape_age=None,
                                       stale_after=options.stale_scrape))
            probes[name] = None
            continue
        probe = Probe(name=name, url=url, client=client, reader=reader,
                      proxy_path=_proxy_path(url))
        try:
            up = await probe.query("count(up)", at=now)
            ready = await probe.query("count(up == 1)", at=now)
            newest = await probe.query("time() - max(timestamp(up))", at=now)
        except (PrometheusError, KubeError) as error:
            facts.add(check_prometheus(backend=name, url=url, via=probe.via, error=str(error),
                                       up_targets=None, total_targets=None,
                                       newest_scrape_age=None,
                                       stale_after=options.stale_scrape))
            probes[name] = None
            continue
        facts.add(check_prometheus(
            backend=name, url=url, via=probe.via, error=None,
            up_targets=int(ready[0][1]) if ready else 0,
            total_targets=int(up[0][1]) if up else 0,
            newest_scrape_age=newest[0][1] if newest else None,
            stale_after=options.stale_scrape))
        probes[name] = probe
    return probes


async def _rule_series(config: Any, probes: Mapping[str, Probe | None], *, start: float
                       ) -> list[RuleSeries]:
    from adapter.prometheus.client import PrometheusError
    from adapter.rules.naming import passes_filters

    found = []
    answers: dict[tuple[str, str], list[Mapping[str, str]] | str] = {}
    for rule in (*config.rules, *config.external_rules):
        probe = probes.get(rule.backend)
        if probe is None:
            found.append(RuleSeries(rule.path, rule.series_query, rule.backend,
                                    error=f"backend {rule.backend} cannot be reached"))
            continue
        key = (rule.backend, rule.series_query)
        if key not in answers:
            try:
                answers[key] = await probe.series(rule.series_query, start=start)
            except (PrometheusError, KubeError) as error:
                answers[key] = str(error)
        answer = answers[key]
        if isinstance(answer, str):
            found.append(RuleSeries(rule.path, rule.series_query, rule.backend, error=answer))
            continue
        names = sorted({s.get("__name__", "") for s in answer} - {""})
        metrics: dict[str, list[str]] = {}
        for name in names:
            if passes_filters(rule.filters, name):
                metric = rule.name.api_name(name)
                if metric:
                    metrics.setdefault(metric, []).append(name)
        found.append(RuleSeries(rule.path, rule.series_query, rule.backend,
                                {m: tuple(s) for m, s in metrics.items()}, tuple(names)))
    return found


async def _discovered(reader: Reader) -> tuple[dict[str, list[str]], bool, bool]:
    """Metric names the custom and external APIs list (and whether each could be asked)."""
    served: dict[str, list[str]] = {"custom": [], "external": []}
    known = {"custom": False, "external": False}
    for api, paths in (("custom", ("/apis/custom.metrics.k8s.io/v1beta2",
                                   "/apis/custom.metrics.k8s.io/v1beta1")),
                       ("external", ("/apis/external.metrics.k8s.io/v1beta1",))):
        for path in paths:
            try:
                listed = await reader.get(path)
            except KubeError:
                continue
            for resource in listed.get("resources") or []:
                name = str(resource.get("name") or "")
                served[api].append(name.split("/", 1)[1] if api == "custom" and "/" in name
                                   else name)
            known[api] = True
            break
    return served, known["custom"], known["external"]


@dataclass
class Scaler:
    kind: str  # HorizontalPodAutoscaler or Autoscaler
    raw: Mapping[str, Any]
    parsed: Any  # autoscaler.model.objects.Autoscaler

    @property
    def label(self) -> str:
        meta = self.raw.get("metadata") or {}
        return f"{self.kind} {meta.get('namespace')}/{meta.get('name')}"


async def _scalers(reader: Reader, facts: Facts) -> list[Scaler]:
    from autoscaler.model.fields import ModelError
    from autoscaler.model.objects import parse_autoscaler

    scalers = []
    for kind, api_version, path in (
            ("HorizontalPodAutoscaler", "autoscaling/v2",
             "/apis/autoscaling/v2/horizontalpodautoscalers"),
            ("Autoscaler", "metricscale.dev/v1alpha1",
             "/apis/metricscale.dev/v1alpha1/autoscalers")):
        for item in await reader.items(path):
            raw = {"apiVersion": api_version, "kind": kind, **item}
            try:
                scalers.append(Scaler(kind, raw, parse_autoscaler(raw)))
            except ModelError as error:
                meta = item.get("metadata") or {}
                facts.add(Result("workloads", WARN, f"{kind} {meta.get('namespace')}/"
                                 f"{meta.get('name')}", f"cannot be read: {error}"))
    return scalers


def _history_of(scaler: Scaler) -> Mapping[str, Any] | None:
    if scaler.kind == "Autoscaler":
        history = (scaler.raw.get("status") or {}).get("history")
        return history if isinstance(history, Mapping) else None
    text = ((scaler.raw.get("metadata") or {}).get("annotations") or {}).get(
        "metricscale.dev/history")
    with contextlib.suppress(ValueError, TypeError):
        parsed = json.loads(str(text))
        return parsed if isinstance(parsed, Mapping) else None
    return None


async def _check_scalers(reader: Reader, scalers: Sequence[Scaler], *, rules: Sequence[RuleSeries],
                         config: Any, probes: Mapping[str, Probe | None], options: DoctorOptions,
                         now: datetime, facts: Facts) -> list[tuple[str, str, str]]:
    """The metrics, pods and targets of every autoscaler; the scale targets of the
    Autoscalers (for the RBAC check)."""
    from adapter.prometheus.client import PrometheusError
    from autoscaler.controller.reconciler import fetch_metric
    from autoscaler.kube.metrics_api import MetricsClient, MetricsError
    from autoscaler.kube.operations import ScaleTargetRef

    served, custom_known, external_known = await _discovered(reader)
    lowered_external = {n.lower() for n in served["external"]}
    rules_of: dict[str, list[str]] = {}
    series_of: dict[tuple[str, str], list[tuple[Any, str]]] = {}
    by_path = {r.path: r for r in (*config.rules, *config.external_rules)} if config else {}
    for found in rules:
        for metric, series in found.metrics.items():
            rules_of.setdefault(metric, []).append(found.path)
            api = "external" if found.path.startswith("externalRules") else "custom"
            for name in series:
                series_of.setdefault((api, metric), []).append((by_path[found.path], name))
    metrics_client = MetricsClient(reader.kube)
    asked: list[Asked] = []
    targets: dict[str, list[str]] = {}
    scale_targets: list[tuple[str, str, str]] = []
    staleness: list[Result | None] = []
    for scaler in scalers:
        spec = scaler.parsed.spec
        namespace = scaler.parsed.metadata.namespace
        ref = spec.scale_target_ref
        group = ref.api_version.split("/")[0] if "/" in ref.api_version else ""
        target = f"{ref.kind} {namespace}/{ref.name}"
        targets.setdefault(f"{ref.kind}.{group} {namespace}/{ref.name}".replace(". ", " "),
                           []).append(scaler.label)
        try:
            mapping = await reader.kube.resolve_scale_target(ScaleTargetRef(
                api_version=ref.api_version, kind=ref.kind, name=ref.name))
            if scaler.kind == "Autoscaler":
                scale_targets.append((mapping.group, mapping.resource, namespace))
            scale = await reader.kube.get_scale(mapping, namespace=namespace, name=ref.name)
            target_object = await reader.get_or_none(mapping.path(namespace=namespace,
                                                                  name=ref.name))
        except KubeError as unscalable:
            facts.add(Result("workloads", FAIL, scaler.label, f"its target {target} cannot be "
                             f"scaled: {unscalable}", "fix scaleTargetRef, or create the target"))
            continue
        pods = await reader.items(f"/api/v1/namespaces/{namespace}/pods",
                                  query=[("labelSelector", scale.selector)]) \
            if scale.selector else []
        status = scaler.raw.get("status") or {}
        conditions = {str(c.get("type")): c for c in status.get("conditions") or []
                      if isinstance(c, Mapping)}
        for index, metric in enumerate(spec.metrics):
            source = metric.resource or metric.container_resource
            if source is not None and source.target.average_utilization is not None:
                facts.add(check_requests(
                    autoscaler=scaler.label, index=index, resource=source.name,
                    container=getattr(source, "container", None), target=target, pods=pods))
            name, listed = _asked_name(metric, served=served, custom_known=custom_known,
                                       external_known=external_known,
                                       lowered_external=lowered_external)
            values: int | None = None
            problem: str | None = None
            if scale.selector and listed is not False:
                try:
                    answer = await fetch_metric(metrics_client, metric=metric,
                                                namespace=namespace, selector=scale.selector)
                    values = len((answer or {}).get("items") or [])
                except MetricsError as failure:
                    problem = failure.detail
            asked.append(Asked(scaler.label, index, metric.type, name, listed, values, problem))
            api = "external" if metric.type == "External" else "custom"
            for rule, series_name in series_of.get((api, name), [])[:1]:
                probe = probes.get(rule.backend)
                if probe is None:
                    continue
                with contextlib.suppress(PrometheusError, KubeError):
                    ages = await probe.query(
                        f'time() - max(timestamp({{__name__="{series_name}"}}))',
                        at=now.timestamp())
                    staleness.append(check_staleness(
                        autoscaler=scaler.label, index=index, metric=name, rule=rule.path,
                        series=series_name, age=ages[0][1] if ages else None,
                        window=rule_window(rule.metrics_query)))
        meta = (target_object or {}).get("metadata") or {}
        facts.add(*check_conflicts(
            autoscaler=scaler.label, target=target, history=_history_of(scaler),
            conditions=conditions, managed_fields=meta.get("managedFields") or [],
            last_applied=(meta.get("annotations") or {}).get(
                "kubectl.kubernetes.io/last-applied-configuration"), now=now))
        facts.add(check_at_max(autoscaler=scaler.label, status=status,
                               max_replicas=spec.max_replicas, conditions=conditions, now=now,
                               longer_than=options.at_max_for))
        active = conditions.get("ScalingActive") or {}
        if active.get("status") == "False" and active.get("reason") != "ScalingDisabled":
            facts.add(Result("workloads", WARN, scaler.label, f"ScalingActive is False "
                             f"({active.get('reason')}): {active.get('message')}",
                             "see the metrics lines above, and kubectl describe"))
    facts.add(*check_asked_metrics(asked, served=served, rules_of=rules_of))
    facts.add(*staleness)
    facts.add(*check_twins(targets))
    return scale_targets


def _asked_name(metric: Any, *, served: Mapping[str, Sequence[str]], custom_known: bool,
                external_known: bool, lowered_external: set[str]) -> tuple[str, bool | None]:
    if metric.pods is not None:
        name = metric.pods.metric.name
        return name, (name in served["custom"]) if custom_known else None
    if metric.object is not None:
        name = metric.object.metric.name
        return name, (name in served["custom"]) if custom_known else None
    if metric.external is not None:
        name = metric.external.metric.name
        return name, (name.lower() in lowered_external) if external_known else None
    source = metric.resource or metric.container_resource
    return (source.name if source is not None else metric.type), None


async def diagnose(reader: Reader, options: DoctorOptions, *, now: datetime) -> list[Result]:
    """Every check, in report order."""
    facts = Facts()
    installed = await read_installation(reader, options)
    if not installed.found:
        facts.add(Result("apiservice", WARN, f"Deployment {options.namespace}/{options.adapter}",
                         "not found: checking with the manifests' defaults",
                         "--namespace names where metricscale is installed"))
    config = await _load_rules(reader, options, installed, facts)
    apiservices = await reader.items("/apis/apiregistration.k8s.io/v1/apiservices")
    facts.add(*check_apiservices(apiservices, namespace=options.namespace,
                                 service=options.adapter,
                                 serves_resource_metrics=bool(config and config.resource_rules)))
    cache: dict[tuple[str, int], tuple[x509.Certificate | None, str]] = {}
    for apiservice in apiservices:
        service = (apiservice.get("spec") or {}).get("service") or {}
        if (service.get("namespace"), service.get("name")) != (options.namespace,
                                                               options.adapter):
            continue
        certificate, source, server_name = await served_certificate(
            reader, apiservice, installed=installed, namespace=options.namespace, cache=cache)
        facts.add(*check_certificate(
            apiservice=str(apiservice["metadata"]["name"]), ca_bundle=_bundle(apiservice),
            insecure=bool((apiservice.get("spec") or {}).get("insecureSkipTLSVerify")),
            served=certificate, source=source, server_name=server_name, now=now,
            warn_within=options.expiry_warning))
    scalers = await _scalers(reader, facts)
    async with contextlib.AsyncExitStack() as stack:
        probes: dict[str, Probe | None] = {}
        rules: list[RuleSeries] = []
        if config is not None:
            probes = await _probes(reader, config, options, installed, stack, facts,
                                   now.timestamp())
            lookback = _lookback(installed)
            rules = await _rule_series(config, probes,
                                       start=(now - lookback).timestamp())
            facts.add(*check_rules(rules, lookback=lookback))
        scale_targets = await _check_scalers(reader, scalers, rules=rules, config=config,
                                             probes=probes, options=options, now=now,
                                             facts=facts)
    permissions = required_permissions(
        namespace=options.namespace, adapter_sa=installed.adapter_sa,
        autoscaler_sa=installed.autoscaler_sa,
        self_managed_certs=installed.flag("--tls-cert-file") is None,
        scale_targets=scale_targets)
    answers = []
    for permission in permissions:
        allowed, why = await reader.allowed(permission)
        answers.append((permission, allowed, why))
    kcm: dict[Permission, bool] = {}
    for permission, allowed, _ in answers:
        if allowed is False and permission.subject.endswith("/horizontal-pod-autoscaler"):
            kcm[permission] = bool((await reader.allowed(
                permission, user="system:kube-controller-manager"))[0])
    facts.add(*check_permissions(answers, kcm_user_allowed=kcm))
    return sorted(facts.results, key=lambda r: _ORDER.index(r.check)
                  if r.check in _ORDER else len(_ORDER))


def _lookback(installed: Installed) -> timedelta:
    """How far back the adapter's discovery looks (--metrics-max-age, else the relist
    interval, else its default 1m)."""
    from adapter.rules.config import parse_prometheus_duration

    for flag in ("--metrics-max-age", "--metrics-relist-interval"):
        value = installed.flag(flag)
        if value:
            with contextlib.suppress(ValueError):
                return timedelta(milliseconds=parse_prometheus_duration(value))
    return timedelta(minutes=1)


async def run_doctor(options: DoctorOptions, *, kubeconfig: str | None,
                     context: str | None = None) -> list[Result]:
    """The whole report against the cluster of `kubeconfig` (for callers such as the demo)."""
    async with open_reader(kubeconfig=kubeconfig, context=context) as reader:
        return await diagnose(reader, options, now=datetime.now(UTC))


def doctor_text(options: DoctorOptions, *, kubeconfig: str | None,
                context: str | None = None) -> tuple[int, str]:
    """What `metricscale doctor` prints for these options, and its exit status (for callers
    such as the demo, which run no event loop of their own)."""
    results = asyncio.run(run_doctor(options, kubeconfig=kubeconfig, context=context))
    return exit_status(results), render_text(results)


def run(args: argparse.Namespace) -> int:
    try:
        results = asyncio.run(run_doctor(options_from(args),
                                         kubeconfig=resolve_kubeconfig(args.kubeconfig),
                                         context=args.context))
    except KubeConfigError as error:
        print(f"metricscale doctor: {error}", file=sys.stderr)
        return 2 if args.kubeconfig else 1
    except KubeError as error:
        print(f"metricscale doctor: cannot read the cluster: {error}", file=sys.stderr)
        return 1
    sys.stdout.write(render_json(results) if args.output == "json" else render_text(results))
    return exit_status(results)


def command_line(options: DoctorOptions, *, kubeconfig: str) -> str:
    """The command a user types for these options (the demo prints it)."""
    words = ["metricscale", "doctor", f"--kubeconfig={kubeconfig}"]
    if options.prometheus_url:
        words.append(f"--prometheus-url={options.prometheus_url}")
    if options.config_file:
        words.append(f"--config={options.config_file}")
    return shlex.join(words)


__all__ += ["FAIL", "OK", "WARN", "command_line", "doctor_text", "run_doctor"]
