"""`metricscale doctor`'s checks as plain functions: facts read from the cluster and Prometheus
in, one result per line out (OK, WARN or FAIL, the object concerned, and the fix).

Nothing here does I/O or reads a clock: cli.doctor gathers the facts and passes `now`.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature

__all__ = [
    "FAIL",
    "OK",
    "WARN",
    "Asked",
    "Permission",
    "Result",
    "RuleSeries",
    "check_apiservices",
    "check_asked_metrics",
    "check_at_max",
    "check_certificate",
    "check_conflicts",
    "check_permissions",
    "check_prometheus",
    "check_requests",
    "check_rules",
    "check_staleness",
    "check_twins",
    "exit_status",
    "nearest",
    "render_json",
    "render_text",
    "required_permissions",
    "rule_window",
]

OK, WARN, FAIL = "OK", "WARN", "FAIL"
SERVED = (("custom.metrics.k8s.io", "v1beta1"), ("custom.metrics.k8s.io", "v1beta2"),
          ("external.metrics.k8s.io", "v1beta1"), ("metrics.k8s.io", "v1beta1"))
OPTIONAL = {("metrics.k8s.io", "v1beta1")}  # the resource-metrics component
APPLY = "kubectl apply -k manifests (or helm upgrade)"


@dataclass(frozen=True)
class Result:
    """One line of the report."""

    check: str
    status: str
    object: str
    message: str
    fix: str = ""


def render_text(results: Sequence[Result]) -> str:
    lines = []
    for r in results:
        fix = f" Fix: {r.fix}" if r.fix and r.status != OK else ""
        lines.append(f"{r.status:<4} {r.check:<11} {r.object}: {r.message}{fix}")
    counts = {s: sum(1 for r in results if r.status == s) for s in (OK, WARN, FAIL)}
    lines.append(f"{counts[OK]} OK, {counts[WARN]} WARN, {counts[FAIL]} FAIL")
    return "\n".join(lines) + "\n"


def render_json(results: Sequence[Result]) -> str:
    counts = {s: sum(1 for r in results if r.status == s) for s in (OK, WARN, FAIL)}
    return json.dumps({"results": [asdict(r) for r in results], "summary": counts},
                      indent=2) + "\n"


def exit_status(results: Sequence[Result]) -> int:
    return 1 if any(r.status == FAIL for r in results) else 0


def _ago(delta: timedelta) -> str:
    seconds = int(abs(delta.total_seconds()))
    if seconds >= 2 * 86400:
        return f"{seconds // 86400} days"
    if seconds >= 7200:
        return f"{seconds // 3600} hours"
    if seconds >= 120:
        return f"{seconds // 60} minutes"
    return f"{seconds} s"


def _stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(text: Any) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


# --------------------------------------------------------------------------------------------
# APIServices


def _version_key(version: str) -> tuple[int, int, int]:
    """kube-aware version order (v1 > v1beta2 > v1beta1 > v1alpha1)."""
    match = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if match is None:
        return (-1, 0, 0)
    stage = {"alpha": 1, "beta": 2, None: 3}[match[2]]
    return (stage, int(match[1]), int(match[3] or 0))


def _backend(apiservice: Mapping[str, Any]) -> str:
    service = (apiservice.get("spec") or {}).get("service")
    if not isinstance(service, Mapping):
        return "kube-apiserver itself (Local)"
    return f"Service {service.get('namespace')}/{service.get('name')}"


def check_apiservices(apiservices: Sequence[Mapping[str, Any]], *, namespace: str,
                      service: str, serves_resource_metrics: bool) -> list[Result]:
    """Each group version we serve: registered for our Service, and Available; another backend
    claiming it is named, with which one the HPA then reads."""
    by_name = {str((a.get("metadata") or {}).get("name")): a for a in apiservices}
    ours = f"Service {namespace}/{service}"
    results: list[Result] = []
    for group, version in SERVED:
        name = f"{version}.{group}"
        obj = f"APIService {name}"
        found = by_name.get(name)
        if found is None:
            if (group, version) in OPTIONAL:
                if serves_resource_metrics:
                    results.append(Result("apiservice", WARN, obj, "not registered: the rules' "
                                          "resourceRules serve nobody (no kubectl top, no "
                                          "resource-metric HPAs)",
                                          "add components/resource-metrics (Helm: "
                                          "resourceMetrics.enabled: true)"))
                continue
            results.append(Result("apiservice", FAIL, obj, "not registered: requests for "
                                  f"{group}/{version} are 404s", APPLY))
            continue
        backend = _backend(found)
        if backend != ours:
            if (group, version) in OPTIONAL:
                results.append(Result("apiservice", OK if not serves_resource_metrics else WARN,
                                      obj, f"served by {backend}, not metricscale"
                                      + ("; the rules' resourceRules are unused"
                                         if serves_resource_metrics else ""),
                                      "to serve kubectl top from Prometheus, add "
                                      "components/resource-metrics"))
            else:
                results.append(Result("apiservice", WARN, obj, f"claimed by {backend}: it wins, "
                                      f"every {group}/{version} request goes there and "
                                      "metricscale's rules for it are never asked",
                                      f"if that is KEDA, keep it and run the adapter with "
                                      f"--delegate-{group.split('.')[0]}-to; otherwise {APPLY} "
                                      "points it back at metricscale"))
            continue
        conditions = {c.get("type"): c for c in (found.get("status") or {}).get("conditions")
                      or [] if isinstance(c, Mapping)}
        available = conditions.get("Available") or {}
        if available.get("status") == "True":
            results.append(Result("apiservice", OK, obj, f"Available, served by {ours}"))
        else:
            reason = available.get("reason") or "no Available condition"
            message = available.get("message") or ""
            results.append(Result(
                "apiservice", FAIL, obj,
                f"not Available ({reason}{': ' + message if message else ''})",
                "see the certificate lines below for x509 errors; otherwise check that the "
                "adapter runs and is Ready (kubectl -n "
                f"{namespace} get pods,endpointslices)"))
    custom = [(v, a) for (g, v) in SERVED if g == "custom.metrics.k8s.io"
              if (a := by_name.get(f"{v}.custom.metrics.k8s.io")) is not None]
    backends = {_backend(a) for _, a in custom}
    if len(backends) > 1:
        preferred, chosen = max(custom, key=lambda item: (
            int((item[1].get("spec") or {}).get("versionPriority") or 0),
            _version_key(item[0])))
        results.append(Result(
            "apiservice", WARN, "group custom.metrics.k8s.io",
            f"its versions are served by different backends; the HPA reads the preferred "
            f"version {preferred} (versionPriority "
            f"{(chosen.get('spec') or {}).get('versionPriority')}), served by {_backend(chosen)}",
            "serve every version of the group from one adapter"))
    return results


# --------------------------------------------------------------------------------------------
# Certificates


def _dns_names(certificate: x509.Certificate) -> list[str]:
    try:
        extension = certificate.extensions.get_extension_for_class(
            x509.SubjectAlternativeName)
    except x509.ExtensionNotFound:
        return []
    return list(extension.value.get_values_for_type(x509.DNSName))


def _issued_by(leaf: x509.Certificate, ca: x509.Certificate) -> bool:
    if leaf == ca:
        return True
    try:
        leaf.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def check_certificate(*, apiservice: str, ca_bundle: Sequence[x509.Certificate],
                      insecure: bool, served: x509.Certificate | None, source: str,
                      server_name: str, now: datetime, warn_within: timedelta) -> list[Result]:
    """The APIService's caBundle against the certificate the adapter serves (read from
    `source`: a TLS handshake, or the Secret holding it), and when each expires."""
    obj = f"APIService {apiservice}"
    results: list[Result] = []
    if insecure:
        results.append(Result("certificate", WARN, obj, "insecureSkipTLSVerify: the aggregator "
                              "does not check who answers for this group",
                              "remove insecureSkipTLSVerify and set caBundle (the adapter's "
                              "self-managed certificates do)"))
    elif not ca_bundle:
        results.append(Result("certificate", FAIL, obj, "no caBundle: the aggregator cannot "
                              "verify the adapter", "let the adapter write it (self-managed "
                              "certificates, the default), or run `metricscale certs`"))
    for ca in ca_bundle:
        expires = ca.not_valid_after_utc
        if expires <= now:
            results.append(Result("certificate", FAIL, obj, f"the caBundle's CA "
                                  f"{ca.subject.rfc4514_string()} expired on {_stamp(expires)}",
                                  "make a new CA: self-managed, delete the Secret "
                                  "metricscale-adapter-certs and restart the adapter (it makes "
                                  "one and sets the caBundles); certs-files, run `metricscale "
                                  "certs` with a new --dir"))
    if served is None:
        results.append(Result("certificate", WARN, obj, f"the serving certificate could not be "
                              f"read ({source})", "run doctor where the adapter's Service is "
                              "reachable (in the cluster), or with read access to its Secret"))
        return results
    expires = served.not_valid_after_utc
    if ca_bundle and not insecure and not any(_issued_by(served, ca) for ca in ca_bundle):
        results.append(Result("certificate", FAIL, obj, f"caBundle does not match the serving "
                              f"certificate ({source}): it was not issued by any CA in the "
                              "bundle, so the aggregator refuses the adapter",
                              "set caBundle to the CA that signed the serving certificate "
                              "(self-managed: the adapter does it at start; restart it)"))
    names = _dns_names(served)
    if names and server_name not in names:
        results.append(Result("certificate", FAIL, obj, f"the serving certificate ({source}) "
                              f"is for {', '.join(names)}, not {server_name}, the name the "
                              "aggregator checks", "issue it for the Service's DNS name"))
    if expires <= now:
        results.append(Result("certificate", FAIL, obj, f"the serving certificate ({source}) "
                              f"expired on {_stamp(expires)}, {_ago(now - expires)} ago",
                              "renew it: self-managed certificates renew themselves while the "
                              "adapter runs (is it running?); certs-files: rerun `metricscale "
                              "certs` and apply; cert-manager: check its Certificate"))
    elif expires - now < warn_within:
        results.append(Result("certificate", WARN, obj, f"the serving certificate ({source}) "
                              f"expires on {_stamp(expires)}, in {_ago(expires - now)}",
                              "renew it before then"))
    elif not any(r.status == FAIL for r in results):
        results.append(Result("certificate", OK, obj, f"caBundle matches the serving "
                              f"certificate ({source}); it expires on {_stamp(expires)}, in "
                              f"{_ago(expires - now)}"))
    return results


# --------------------------------------------------------------------------------------------
# RBAC


@dataclass(frozen=True)
class Permission:
    """One thing a subject must be allowed, and the object of the manifests that grants it."""

    subject: str  # "ServiceAccount ns/name" or "User name"
    verb: str
    resource: str
    group: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    granted_by: str = ""

    def describe(self) -> str:
        what = self.resource + (f"/{self.subresource}" if self.subresource else "")
        if self.group:
            what += f".{self.group}"
        if self.name:
            what += f" {self.name}"
        where = f" in {self.namespace}" if self.namespace else ""
        return f"{self.verb} {what}{where}"

    def attributes(self) -> dict[str, str]:
        out = {"verb": self.verb, "resource": self.resource, "group": self.group}
        for key, value in (("subresource", self.subresource), ("namespace", self.namespace),
                           ("name", self.name)):
            if value:
                out[key] = value
        return out


def service_account(namespace: str, name: str) -> str:
    return f"ServiceAccount {namespace}/{name}"


def required_permissions(*, namespace: str, adapter_sa: str, autoscaler_sa: str,
                         self_managed_certs: bool,
                         scale_targets: Iterable[tuple[str, str, str]] = ()) -> list[Permission]:
    """What the HPA controller, our autoscaler and our adapter need; `scale_targets` are the
    (group, resource, namespace) of the Autoscalers' targets."""
    hpa = service_account("kube-system", "horizontal-pod-autoscaler")
    adapter = service_account(namespace, adapter_sa)
    ours = service_account(namespace, autoscaler_sa)
    readers = "ClusterRoleBinding metricscale-metrics-reader:"
    perms = [
        Permission(hpa, "get", "pods", "custom.metrics.k8s.io", "any-metric", "default", "*",
                   readers + "horizontal-pod-autoscaler"),
        Permission(hpa, "list", "any-metric", "external.metrics.k8s.io", namespace="default",
                   granted_by=readers + "horizontal-pod-autoscaler"),
        Permission(hpa, "list", "pods", "metrics.k8s.io", namespace="default",
                   granted_by=readers + "horizontal-pod-autoscaler"),
        Permission(adapter, "create", "tokenreviews", "authentication.k8s.io",
                   granted_by="ClusterRoleBinding metricscale-adapter:system:auth-delegator"),
        Permission(adapter, "create", "subjectaccessreviews", "authorization.k8s.io",
                   granted_by="ClusterRoleBinding metricscale-adapter:system:auth-delegator"),
        Permission(adapter, "get", "configmaps", namespace="kube-system",
                   name="extension-apiserver-authentication",
                   granted_by="RoleBinding kube-system/metricscale-adapter-auth-reader"),
        Permission(adapter, "list", "pods",
                   granted_by="ClusterRoleBinding metricscale-adapter-resource-reader"),
        Permission(adapter, "watch", "namespaces",
                   granted_by="ClusterRoleBinding metricscale-adapter-resource-reader"),
        Permission(ours, "watch", "autoscalers", "metricscale.dev",
                   granted_by="ClusterRoleBinding metricscale-autoscaler"),
        Permission(ours, "patch", "autoscalers", "metricscale.dev", "status",
                   granted_by="ClusterRoleBinding metricscale-autoscaler"),
        Permission(ours, "watch", "pods", granted_by="ClusterRoleBinding metricscale-autoscaler"),
        Permission(ours, "create", "events", "events.k8s.io",
                   granted_by="ClusterRoleBinding metricscale-autoscaler"),
        Permission(ours, "update", "leases", "coordination.k8s.io", namespace=namespace,
                   name="metricscale-autoscaler",
                   granted_by=f"RoleBinding {namespace}/metricscale-autoscaler-leader-election"),
        Permission(ours, "get", "pods", "custom.metrics.k8s.io", "any-metric", "default", "*",
                   readers + "autoscaler"),
        Permission(ours, "list", "any-metric", "external.metrics.k8s.io", namespace="default",
                   granted_by=readers + "autoscaler"),
    ]
    if self_managed_certs:
        perms.append(Permission(adapter, "update", "secrets", namespace=namespace,
                                name="metricscale-adapter-certs",
                                granted_by=f"RoleBinding {namespace}/metricscale-adapter-certs"))
    for group, resource, target_namespace in sorted(set(scale_targets)):
        for verb in ("get", "update"):
            perms.append(Permission(
                ours, verb, resource, group, "scale", target_namespace,
                granted_by="ClusterRoleBinding metricscale-autoscaler-scale-targets (an "
                           "aggregated ClusterRole: label yours with metricscale.dev/"
                           "aggregate-to-autoscaler-scale: \"true\")"))
    return perms


def check_permissions(answers: Sequence[tuple[Permission, bool | None, str]], *,
                      kcm_user_allowed: Mapping[Permission, bool] | None = None) -> list[Result]:
    """One FAIL per permission refused (naming what grants it), one OK per subject otherwise.
    `answers` are (permission, allowed, why); allowed None: the review itself failed.
    `kcm_user_allowed`: for the HPA's permissions refused to its service account, whether
    system:kube-controller-manager has them (a manager without service-account credentials)."""
    results: list[Result] = []
    subjects: dict[str, list[Permission]] = {}
    for permission, allowed, why in answers:
        subjects.setdefault(permission.subject, []).append(permission)
        if allowed is None:
            results.append(Result("rbac", WARN, permission.subject, f"cannot tell whether it "
                                  f"may {permission.describe()}: {why}",
                                  "run doctor as a user allowed to create "
                                  "SubjectAccessReviews"))
        elif not allowed:
            if kcm_user_allowed and kcm_user_allowed.get(permission):
                results.append(Result("rbac", WARN, permission.subject, f"may not "
                                      f"{permission.describe()}; only the User "
                                      "system:kube-controller-manager may, which the HPA "
                                      "controller is only without "
                                      "--use-service-account-credentials",
                                      f"{APPLY} ({permission.granted_by} names both)"))
                continue
            results.append(Result("rbac", FAIL, permission.subject,
                                  f"may not {permission.describe()}",
                                  f"{APPLY}: {permission.granted_by} grants it"))
    for subject, permissions in subjects.items():
        if not any(r.object == subject and r.status != OK for r in results):
            results.append(Result("rbac", OK, subject, "may " + "; ".join(
                p.describe() for p in permissions)))
    return results


# --------------------------------------------------------------------------------------------
# Prometheus and the rules


def check_prometheus(*, backend: str, url: str, via: str, error: str | None,
                     up_targets: int | None, total_targets: int | None,
                     newest_scrape_age: float | None, stale_after: timedelta) -> Result:
    obj = f"Prometheus backend {backend} ({url})"
    if error is not None:
        return Result("prometheus", FAIL, obj, f"unreachable: {error}",
                      "check the URL (--prometheus-url of the adapter, or the backends: of its "
                      "rules), the network and the credentials; run doctor with "
                      "--prometheus-url to use another address")
    if newest_scrape_age is None:
        return Result("prometheus", OK, obj, f"reachable ({via}); no `up` series, so scrape "
                      "freshness cannot be told (Thanos or Mimir without them?)")
    freshness = (f"{up_targets} of {total_targets} targets up, newest scrape "
                 f"{newest_scrape_age:.0f} s ago")
    if newest_scrape_age > stale_after.total_seconds():
        return Result("prometheus", FAIL, obj, f"reachable ({via}) but not scraping: "
                      f"{freshness}", "check Prometheus' targets page and its logs")
    return Result("prometheus", OK, obj, f"reachable ({via}); {freshness}")


@dataclass(frozen=True)
class RuleSeries:
    """What one rule's seriesQuery found on its backend: series names and the metrics they
    name, or why it could not be asked."""

    path: str
    series_query: str
    backend: str
    metrics: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # metric -> series
    series_names: tuple[str, ...] = ()
    error: str | None = None


def check_rules(found: Sequence[RuleSeries], *, lookback: timedelta) -> list[Result]:
    results = []
    for rule in found:
        obj = f"rule {rule.path}"
        if rule.error is not None:
            results.append(Result("rules", WARN, obj, f"cannot be checked: {rule.error}"))
        elif not rule.series_names:
            results.append(Result("rules", WARN, obj, f"seriesQuery {rule.series_query!r} "
                                  f"matches no series on backend {rule.backend} in the last "
                                  f"{_ago(lookback)}: it serves nothing",
                                  "check the metric name and labels in Prometheus (is the "
                                  "target scraped?), or remove the rule"))
        elif not rule.metrics:
            results.append(Result("rules", WARN, obj, f"{len(rule.series_names)} series names "
                                  "match seriesQuery, but seriesFilters and name.matches let "
                                  "none through (or name.as makes them empty)",
                                  "check seriesFilters, name.matches and name.as"))
        else:
            shown = ", ".join(sorted(rule.metrics)[:5])
            more = f" and {len(rule.metrics) - 5} more" if len(rule.metrics) > 5 else ""
            results.append(Result("rules", OK, obj, f"{len(rule.series_names)} series names, "
                                  f"{len(rule.metrics)} metrics: {shown}{more}"))
    return results


def rule_window(metrics_query: str, *, default: timedelta = timedelta(minutes=5)) -> timedelta:
    """The longest range (`[2m]`) a rule's metricsQuery reads; without one, Prometheus'
    lookback delta (5m by default) is how old a sample may be."""
    longest = timedelta(0)
    for text in re.findall(r"\[([0-9smhdwy]+)(?::[0-9smhdwy]*)?\]", metrics_query):
        seconds = 0.0
        for amount, unit in re.findall(r"(\d+)(ms|s|m|h|d|w|y)", text):
            seconds += int(amount) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400,
                                      "w": 604800, "y": 31536000}[unit]
        longest = max(longest, timedelta(seconds=seconds))
    return longest or default


# --------------------------------------------------------------------------------------------
# What the autoscalers ask for


@dataclass(frozen=True)
class Asked:
    """One metric of one HPA or Autoscaler, and what reading it as the HPA does gave."""

    autoscaler: str  # "HorizontalPodAutoscaler ns/name" or "Autoscaler ns/name"
    index: int
    type: str  # Resource, ContainerResource, Pods, Object, External
    name: str  # the metric's name (the resource's, for Resource metrics)
    listed: bool | None  # in the API's discovery list (None: not asked or not known)
    values: int | None = None  # items the read returned
    error: str | None = None  # why the read failed


def nearest(name: str, served: Iterable[str], *, count: int = 3) -> list[str]:
    return difflib.get_close_matches(name, sorted(set(served)), n=count, cutoff=0.5)


def check_asked_metrics(asked: Sequence[Asked], *, served: Mapping[str, Sequence[str]],
                        rules_of: Mapping[str, Sequence[str]]) -> list[Result]:
    """FAIL for each metric no one serves (with the nearest served names and their rules) or
    that cannot be read; OK with the number of values otherwise. `served` maps the API
    ("custom", "external") to the metric names it lists; `rules_of` a metric to our rules."""
    results = []
    for metric in asked:
        where = f"{metric.autoscaler} metric[{metric.index}]"
        api = "external" if metric.type == "External" else "custom"
        if metric.type in {"Pods", "Object", "External"} and metric.listed is False:
            close = nearest(metric.name, served.get(api, ()))
            hint = ", ".join(f"{n} ({', '.join(rules_of.get(n, ())) or 'not our rules'})"
                             for n in close) or "none close"
            results.append(Result("metrics", FAIL, where, f"asks for {api} metric "
                                  f"{metric.name!r}, which no rule serves; nearest served: "
                                  f"{hint}", "fix the metric name in the autoscaler, or add a "
                                  "rule that serves it (metricscale adapter --check-config "
                                  "FILE --prometheus-url URL lists what each rule serves)"))
        elif metric.error is not None:
            results.append(Result("metrics", FAIL, where, f"{metric.type} metric "
                                  f"{metric.name!r} cannot be read as the HPA reads it: "
                                  f"{metric.error}", "see the rules and staleness lines; "
                                  "metricscale explain --live shows the decision"))
        elif metric.values is not None:
            results.append(Result("metrics", OK, where, f"{metric.type} metric "
                                  f"{metric.name!r} is served: {metric.values} value(s)"))
    return results


def check_staleness(*, autoscaler: str, index: int, metric: str, rule: str, series: str,
                    age: float | None, window: timedelta) -> Result | None:
    """A metric whose newest sample is older than its rule's window gives the HPA nothing."""
    where = f"{autoscaler} metric[{index}]"
    if age is None:
        return Result("workloads", WARN, where, f"{metric}: series {series} ({rule}) has no "
                      "sample Prometheus can still see", "check that its target is scraped")
    if age > window.total_seconds():
        return Result("workloads", WARN, where, f"{metric}: the newest sample of {series} is "
                      f"{age:.0f} s old, beyond {rule}'s {_ago(window)} window: the HPA gets "
                      "no value", "check the scrape of that series, or widen the rule's range")
    return None


# --------------------------------------------------------------------------------------------
# Workloads


def _containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = pod.get("spec") or {}
    return [c for c in spec.get("containers") or [] if isinstance(c, Mapping)]


def _request(owner: Mapping[str, Any], resource: str) -> Any:
    return ((owner.get("resources") or {}).get("requests") or {}).get(resource)


def check_requests(*, autoscaler: str, index: int, resource: str, container: str | None,
                   target: str, pods: Sequence[Mapping[str, Any]]) -> Result | None:
    """A Utilization target needs every pod's request for that resource (upstream: "missing
    request for cpu"); pod-level requests count."""
    missing = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        if meta.get("deletionTimestamp") or status.get("phase") in {"Succeeded", "Failed"}:
            continue
        if _request(pod.get("spec") or {}, resource) is not None:
            continue
        containers = _containers(pod)
        if container is not None:
            containers = [c for c in containers if c.get("name") == container]
        if not containers or any(_request(c, resource) is None for c in containers):
            missing.append(str(meta.get("name")))
    if not missing:
        return None
    where = f" in container {container}" if container else ""
    shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3
                                      else "")
    return Result("workloads", FAIL, f"{autoscaler} metric[{index}]",
                  f"{resource} Utilization target, but {len(missing)} of {len(pods)} pods "
                  f"({shown}) have no {resource} request{where}: utilization cannot be "
                  f"computed (missing request for {resource})",
                  f"set resources.requests.{resource} in {target}'s pod template (every "
                  "container), or use an AverageValue target")


def check_twins(targets: Mapping[str, Sequence[str]]) -> list[Result]:
    """`targets` maps a scale target to the autoscalers pointed at it."""
    results = []
    for target, scalers in sorted(targets.items()):
        if len(scalers) > 1:
            results.append(Result("workloads", FAIL, target, "scaled by " + " and ".join(
                scalers) + ": each writes the replicas from its own memory, so neither window "
                "nor policy holds", "keep one: `metricscale migrate hpa NAMESPACE/NAME "
                "--apply` hands an HPA's target to its Autoscaler; or delete one"))
    return results


def check_conflicts(*, autoscaler: str, target: str, history: Mapping[str, Any] | None,
                    conditions: Mapping[str, Mapping[str, Any]],
                    managed_fields: Sequence[Mapping[str, Any]],
                    last_applied: str | None, now: datetime) -> list[Result]:
    """Another writer of the target's spec.replicas: the conflict detection's memory
    (status.history.scaleWatch, the ScalingConflict condition), server-side appliers owning
    spec.replicas, and a last-applied manifest that sets it."""
    results = []
    watch = (history or {}).get("scaleWatch") or {}
    changes = [t for t in (_parse_time(x) for x in watch.get("externalChanges") or [])
               if t is not None]
    conflict = conditions.get("ScalingConflict") or {}
    fix = (f"remove spec.replicas from {target}'s manifest (GitOps: from the repository), or "
           "hand the field over with server-side apply")
    if conflict.get("status") == "True" or watch.get("conflicting"):
        results.append(Result("workloads", FAIL, autoscaler, f"ScalingConflict: {target}'s "
                              f"replicas were changed by another writer {len(changes)} time(s) "
                              f"in the last 10 minutes (the last {_ago(now - max(changes))} "
                              "ago)" if changes else f"ScalingConflict: {target}'s replicas "
                              "keep being changed by another writer", fix))
    elif changes:
        results.append(Result("workloads", WARN, autoscaler, f"{target}'s replicas were changed "
                              f"by another writer {_ago(now - max(changes))} ago "
                              "(ExternalScaleChange)", fix))
    appliers = sorted({str(entry.get("manager")) for entry in managed_fields
                       if entry.get("operation") == "Apply" and not entry.get("subresource")
                       and "f:replicas" in ((entry.get("fieldsV1") or {}).get("f:spec") or {})})
    if appliers:
        results.append(Result("workloads", WARN, autoscaler, f"spec.replicas of {target} is "
                              f"owned by server-side apply of {', '.join(appliers)}: each of "
                              "its syncs resets the size", fix))
    if last_applied:
        try:
            applied = json.loads(last_applied)
        except ValueError:
            applied = {}
        if isinstance(applied, Mapping) and "replicas" in (applied.get("spec") or {}):
            results.append(Result("workloads", WARN, autoscaler, f"{target} was last `kubectl "
                                  "apply`-ed with spec.replicas: the next apply of that "
                                  "manifest (or a GitOps sync) resets the size", fix))
    return results


def check_at_max(*, autoscaler: str, status: Mapping[str, Any], max_replicas: int,
                 conditions: Mapping[str, Mapping[str, Any]], now: datetime,
                 longer_than: timedelta) -> Result | None:
    limited = conditions.get("ScalingLimited") or {}
    if limited.get("status") != "True" or limited.get("reason") != "TooManyReplicas":
        return None
    since = _parse_time(limited.get("lastTransitionTime"))
    if since is None or now - since < longer_than:
        return None
    asked = [int(r.get("replicas", 0)) for r in ((status.get("history") or {})
                                                  .get("recommendations") or [])
             if isinstance(r, Mapping)]
    wanted = (f"; its metrics asked for up to {max(asked)} (status.history)"
              if asked and max(asked) > max_replicas else "")
    return Result("workloads", WARN, autoscaler, f"at maxReplicas ({max_replicas}) for "
                  f"{_ago(now - since)}, since {_stamp(since)}{wanted}",
                  "raise maxReplicas, or look at why the load or the metric is this high")
