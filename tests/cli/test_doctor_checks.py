"""cli.doctor_checks: each check turns facts into OK/WARN/FAIL lines that name the object and
the fix; the report's text and JSON forms and its exit status."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from cli.doctor_checks import (
    FAIL,
    OK,
    WARN,
    Asked,
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
from metricscale import pki

NOW = datetime(2026, 11, 21, 10, 0, 0, tzinfo=UTC)
SERVER = "metricscale-adapter.metricscale.svc"


def apiservice(name: str, *, service: tuple[str, str] | None = ("metricscale",
                                                                "metricscale-adapter"),
               available: bool = True, priority: int = 100,
               message: str = "") -> dict[str, Any]:
    version, group = name.split(".", 1)
    spec: dict[str, Any] = {"group": group, "version": version, "versionPriority": priority,
                            "groupPriorityMinimum": 100}
    if service is not None:
        spec["service"] = {"namespace": service[0], "name": service[1], "port": 443}
    condition = {"type": "Available", "status": "True" if available else "False",
                 "reason": "Passed" if available else "FailedDiscoveryCheck",
                 "message": message}
    return {"metadata": {"name": name}, "spec": spec, "status": {"conditions": [condition]}}


OURS = [apiservice("v1beta1.custom.metrics.k8s.io"),
        apiservice("v1beta2.custom.metrics.k8s.io", priority=200),
        apiservice("v1beta1.external.metrics.k8s.io")]


def statuses(results: list[Result]) -> list[tuple[str, str]]:
    return [(r.status, r.object) for r in results]


# ---------------------------------------------------------------------------------- APIServices


def test_our_available_apiservices_are_ok_and_metrics_k8s_io_may_be_someone_elses() -> None:
    results = check_apiservices([*OURS, apiservice("v1beta1.metrics.k8s.io",
                                                   service=("kube-system", "metrics-server"))],
                                namespace="metricscale", service="metricscale-adapter",
                                serves_resource_metrics=False)
    assert [r.status for r in results] == [OK, OK, OK, OK]
    assert "metrics-server" in results[3].message


def test_a_missing_or_unavailable_apiservice_fails_with_the_aggregators_words() -> None:
    results = check_apiservices(
        [OURS[0], apiservice("v1beta1.external.metrics.k8s.io", available=False,
                             message="failing or missing response from https://10.0.0.1:443: "
                                     "x509: certificate has expired")],
        namespace="metricscale", service="metricscale-adapter", serves_resource_metrics=False)
    assert statuses(results) == [(OK, "APIService v1beta1.custom.metrics.k8s.io"),
                                 (FAIL, "APIService v1beta2.custom.metrics.k8s.io"),
                                 (FAIL, "APIService v1beta1.external.metrics.k8s.io")]
    assert "x509: certificate has expired" in results[2].message
    assert "not registered" in results[1].message and results[1].fix


def test_another_backend_claiming_a_group_version_is_named_with_which_one_the_hpa_reads() -> None:
    keda = ("keda", "keda-operator-metrics-apiserver")
    results = check_apiservices(
        [OURS[0], apiservice("v1beta2.custom.metrics.k8s.io", priority=200, service=keda),
         apiservice("v1beta1.external.metrics.k8s.io", service=keda)],
        namespace="metricscale", service="metricscale-adapter", serves_resource_metrics=True)
    claimed = [r for r in results if "claimed by" in r.message]
    assert [r.object for r in claimed] == ["APIService v1beta2.custom.metrics.k8s.io",
                                          "APIService v1beta1.external.metrics.k8s.io"]
    assert all(r.status == WARN and "--delegate-" in r.fix for r in claimed)
    (split,) = [r for r in results if r.object == "group custom.metrics.k8s.io"]
    assert "preferred version v1beta2" in split.message and "keda" in split.message
    assert any(r.object == "APIService v1beta1.metrics.k8s.io" and r.status == WARN
               for r in results)  # resourceRules, but nothing registered to serve them


# --------------------------------------------------------------------------------- certificates


def pair(*, ca_days: int = 3650, leaf_start: timedelta = timedelta(days=-1),
         leaf_days: int = 365, names: tuple[str, ...] = (SERVER,)) -> tuple[Any, Any]:
    ca = pki.generate_ca(common_name="test-ca", now=NOW - timedelta(days=1),
                         validity=timedelta(days=ca_days))
    leaf = pki.issue_serving_certificate(ca, common_name=names[0], dns_names=names,
                                         now=NOW + leaf_start,
                                         validity=timedelta(days=leaf_days))
    return ca.certificate, leaf.certificate


def certificate_results(ca: Any, leaf: Any, **kwargs: Any) -> list[Result]:
    options = {"apiservice": "v1beta1.custom.metrics.k8s.io", "ca_bundle": [ca],
               "insecure": False, "served": leaf, "source": "a TLS handshake",
               "server_name": SERVER, "now": NOW, "warn_within": timedelta(days=30)}
    options.update(kwargs)
    return check_certificate(**options)


def test_a_matching_certificate_is_ok_and_says_when_it_expires() -> None:
    ca, leaf = pair()
    (result,) = certificate_results(ca, leaf)
    assert result.status == OK and "expires on 2027-11-20T10:00:00Z" in result.message


def test_an_expired_serving_certificate_fails_saying_when() -> None:
    ca, leaf = pair(leaf_start=timedelta(days=-10), leaf_days=2)
    (result,) = certificate_results(ca, leaf)
    assert result.status == FAIL
    assert "expired on 2026-11-13T10:00:00Z, 8 days ago" in result.message
    assert "renew" in result.fix


def test_a_certificate_near_expiry_warns() -> None:
    ca, leaf = pair(leaf_days=20)
    (result,) = certificate_results(ca, leaf)
    assert result.status == WARN and "in 19 days" in result.message


def test_a_cabundle_of_another_ca_fails() -> None:
    _, leaf = pair()
    other, _ = pair()
    results = certificate_results(other, leaf)
    assert [r.status for r in results] == [FAIL]
    assert "caBundle does not match" in results[0].message


def test_a_certificate_for_another_name_fails() -> None:
    ca, leaf = pair(names=("something.else.svc",))
    assert any("not metricscale-adapter.metricscale.svc" in r.message
               for r in certificate_results(ca, leaf))


def test_no_cabundle_fails_and_skipping_verification_warns() -> None:
    ca, leaf = pair()
    assert next(r.status for r in certificate_results(ca, leaf, ca_bundle=[])) == FAIL
    assert certificate_results(ca, leaf, ca_bundle=[], insecure=True)[0].status == WARN


def test_an_unreadable_serving_certificate_is_said_not_guessed() -> None:
    ca, _ = pair()
    (result,) = certificate_results(ca, None, source="unreachable; Secret forbidden")
    assert result.status == WARN and "could not be read" in result.message


# ------------------------------------------------------------------------------------------ RBAC


def test_required_permissions_cover_the_three_subjects_and_each_scale_target() -> None:
    permissions = required_permissions(namespace="metricscale",
                                       adapter_sa="metricscale-adapter",
                                       autoscaler_sa="metricscale-autoscaler",
                                       self_managed_certs=True,
                                       scale_targets=[("apps", "deployments", "shop"),
                                                      ("example.com", "widgets", "shop")])
    subjects = {p.subject for p in permissions}
    assert subjects == {"ServiceAccount kube-system/horizontal-pod-autoscaler",
                        "ServiceAccount metricscale/metricscale-adapter",
                        "ServiceAccount metricscale/metricscale-autoscaler"}
    described = {p.describe() for p in permissions}
    assert "create tokenreviews.authentication.k8s.io" in described
    assert "create subjectaccessreviews.authorization.k8s.io" in described
    assert "update widgets/scale.example.com in shop" in described
    assert "get configmaps extension-apiserver-authentication in kube-system" in described


def test_a_refused_permission_fails_naming_what_grants_it() -> None:
    permissions = required_permissions(namespace="metricscale",
                                       adapter_sa="metricscale-adapter",
                                       autoscaler_sa="metricscale-autoscaler",
                                       self_managed_certs=False)
    answers = [(p, "configmaps" not in p.resource, "") for p in permissions]
    results = check_permissions(answers)
    failed = [r for r in results if r.status == FAIL]
    assert len(failed) == 1
    assert failed[0].object == "ServiceAccount metricscale/metricscale-adapter"
    assert "RoleBinding kube-system/metricscale-adapter-auth-reader" in failed[0].fix
    assert sorted(r.object for r in results if r.status == OK) == [
        "ServiceAccount kube-system/horizontal-pod-autoscaler",
        "ServiceAccount metricscale/metricscale-autoscaler"]


def test_the_hpa_allowed_only_as_the_manager_user_is_a_warning() -> None:
    (permission,) = [p for p in required_permissions(
        namespace="m", adapter_sa="a", autoscaler_sa="b", self_managed_certs=False)
        if p.subject.endswith("horizontal-pod-autoscaler")][:1]
    results = check_permissions([(permission, False, "")],
                                kcm_user_allowed={permission: True})
    assert [r.status for r in results] == [WARN]
    assert "--use-service-account-credentials" in results[0].message


def test_a_review_that_cannot_be_made_is_a_warning_not_a_verdict() -> None:
    (permission,) = required_permissions(namespace="m", adapter_sa="a", autoscaler_sa="b",
                                         self_managed_certs=False)[:1]
    (result,) = check_permissions([(permission, None, "403 Forbidden")])
    assert result.status == WARN and "cannot tell" in result.message


# ---------------------------------------------------------------------------- Prometheus, rules


def test_prometheus_reachability_and_scrape_freshness() -> None:
    common = {"backend": "default", "url": "http://p:9090", "via": "direct",
              "stale_after": timedelta(minutes=5)}
    assert check_prometheus(error=None, up_targets=3, total_targets=4, newest_scrape_age=2.0,
                            **common).status == OK
    assert check_prometheus(error=None, up_targets=3, total_targets=4, newest_scrape_age=900,
                            **common).status == FAIL
    unreachable = check_prometheus(error="connection refused", up_targets=None,
                                   total_targets=None, newest_scrape_age=None, **common)
    assert unreachable.status == FAIL and "--prometheus-url" in unreachable.fix
    assert "cannot be told" in check_prometheus(error=None, up_targets=None, total_targets=None,
                                                newest_scrape_age=None, **common).message


def test_a_rule_matching_nothing_is_named_with_its_series_query() -> None:
    results = check_rules([
        RuleSeries("rules[0]", "up", "default", {"up": ("up",)}, ("up",)),
        RuleSeries("rules[1]", 'nothing_total{namespace!=""}', "default"),
        RuleSeries("rules[2]", "x", "default", {}, ("x_total",)),
        RuleSeries("externalRules[0]", "q", "thanos", error="backend thanos unreachable")],
        lookback=timedelta(minutes=1))
    assert [r.status for r in results] == [OK, WARN, WARN, WARN]
    assert "'nothing_total{namespace!=\"\"}' matches no series" in results[1].message


def test_a_rules_window_is_its_longest_range_else_the_lookback() -> None:
    assert rule_window("sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (pod)") == \
        timedelta(minutes=2)
    assert rule_window("max_over_time(x[1h30m:1m]) + rate(y[90s])") == timedelta(minutes=90)
    assert rule_window("sum(<<.Series>>{<<.LabelMatchers>>})") == timedelta(minutes=5)


def test_an_unserved_metric_fails_with_the_nearest_served_names_and_their_rules() -> None:
    asked = [Asked("Autoscaler shop/web", 0, "Pods", "http_request_per_second", False),
             Asked("HorizontalPodAutoscaler shop/api", 1, "External", "queue_depth", True,
                   values=1),
             Asked("Autoscaler shop/web", 1, "Pods", "jobs", True, error="no metrics returned")]
    results = check_asked_metrics(
        asked, served={"custom": ["http_requests_per_second", "jobs"],
                       "external": ["queue_depth"]},
        rules_of={"http_requests_per_second": ["rules[4]"]})
    assert [r.status for r in results] == [FAIL, OK, FAIL]
    assert "nearest served: http_requests_per_second (rules[4])" in results[0].message
    assert "no metrics returned" in results[2].message


def test_stale_values_beyond_the_window_warn() -> None:
    common = {"autoscaler": "Autoscaler shop/web", "index": 0, "metric": "jobs",
              "rule": "rules[3]", "series": "jobs", "window": timedelta(minutes=2)}
    assert check_staleness(age=30.0, **common) is None
    stale = check_staleness(age=600.0, **common)
    assert stale is not None and stale.status == WARN and "600 s old" in stale.message
    gone = check_staleness(age=None, **common)
    assert gone is not None and "no sample" in gone.message


# ------------------------------------------------------------------------------------ workloads


def pod(name: str, *, cpu: str | None, phase: str = "Running",
        pod_level: str | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "app"}
    if cpu:
        container["resources"] = {"requests": {"cpu": cpu}}
    spec: dict[str, Any] = {"containers": [container]}
    if pod_level:
        spec["resources"] = {"requests": {"cpu": pod_level}}
    return {"metadata": {"name": name}, "spec": spec, "status": {"phase": phase}}


def test_pods_without_the_request_of_a_utilization_target_fail() -> None:
    result = check_requests(autoscaler="Autoscaler shop/web", index=0, resource="cpu",
                            container=None, target="Deployment shop/web",
                            pods=[pod("a", cpu="100m"), pod("b", cpu=None),
                                  pod("c", cpu=None, phase="Failed"),
                                  pod("d", cpu=None, pod_level="1")])
    assert result is not None and result.status == FAIL
    assert "1 of 4 pods (b) have no cpu request" in result.message
    assert "resources.requests.cpu in Deployment shop/web" in result.fix
    assert check_requests(autoscaler="x", index=0, resource="cpu", container="app",
                          target="t", pods=[pod("a", cpu="1")]) is None


def test_two_autoscalers_on_one_target_fail() -> None:
    (result,) = check_twins({"Deployment.apps shop/web": ["HorizontalPodAutoscaler shop/web",
                                                          "Autoscaler shop/web"],
                             "Deployment.apps shop/api": ["Autoscaler shop/api"]})
    assert result.status == FAIL and "HorizontalPodAutoscaler shop/web and Autoscaler" in \
        result.message
    assert "migrate hpa" in result.fix


def test_another_writer_of_the_replicas_is_reported_from_the_conflict_memory() -> None:
    history = {"scaleWatch": {"replicas": 3, "externalChanges": ["2026-11-21T09:58:00Z"]}}
    (warned,) = check_conflicts(autoscaler="Autoscaler shop/web", target="Deployment shop/web",
                                history=history, conditions={}, managed_fields=[],
                                last_applied=None, now=NOW)
    assert warned.status == WARN and "2 minutes ago" in warned.message
    conflicting = check_conflicts(
        autoscaler="Autoscaler shop/web", target="Deployment shop/web",
        history={"scaleWatch": {**history["scaleWatch"], "conflicting": True}},
        conditions={"ScalingConflict": {"status": "True"}},
        managed_fields=[{"manager": "argocd-controller", "operation": "Apply",
                         "fieldsV1": {"f:spec": {"f:replicas": {}}}},
                        {"manager": "kube-controller-manager", "operation": "Update",
                         "subresource": "scale", "fieldsV1": {"f:spec": {"f:replicas": {}}}}],
        last_applied=json.dumps({"spec": {"replicas": 3}}), now=NOW)
    assert [r.status for r in conflicting] == [FAIL, WARN, WARN]
    assert "argocd-controller" in conflicting[1].message
    assert "kubectl apply" in conflicting[2].message


def test_a_target_long_at_its_maximum_warns_with_what_its_metrics_asked() -> None:
    limited = {"ScalingLimited": {"status": "True", "reason": "TooManyReplicas",
                                  "lastTransitionTime": "2026-11-21T08:00:00Z"}}
    status = {"history": {"recommendations": [{"replicas": 14, "timestamp": "x"}]}}
    result = check_at_max(autoscaler="Autoscaler shop/web", status=status, max_replicas=10,
                          conditions=limited, now=NOW, longer_than=timedelta(minutes=30))
    assert result is not None and result.status == WARN
    assert "for 2 hours" in result.message and "up to 14" in result.message
    assert check_at_max(autoscaler="a", status={}, max_replicas=10, conditions=limited,
                        now=NOW, longer_than=timedelta(hours=3)) is None


# ----------------------------------------------------------------------------------- the report


def test_text_is_one_line_per_result_with_the_fix_and_json_carries_the_same() -> None:
    results = [Result("rbac", OK, "ServiceAccount a/b", "may do it"),
               Result("rules", FAIL, "rule rules[1]", "broken", "fix it")]
    text = render_text(results)
    assert text.splitlines() == ["OK   rbac        ServiceAccount a/b: may do it",
                                 "FAIL rules       rule rules[1]: broken Fix: fix it",
                                 "1 OK, 0 WARN, 1 FAIL"]
    document = json.loads(render_json(results))
    assert document["summary"] == {"OK": 1, "WARN": 0, "FAIL": 1}
    assert document["results"][1] == {"check": "rules", "status": "FAIL",
                                      "object": "rule rules[1]", "message": "broken",
                                      "fix": "fix it"}
    assert exit_status(results) == 1 and exit_status(results[:1]) == 0


def test_a_cabundle_in_an_apiservice_is_base64_pem() -> None:
    """What cli.doctor decodes: the API's caBundle is base64 of PEM, possibly several CAs."""
    ca, _ = pair()
    other, _ = pair()
    encoded = base64.b64encode(pki.certificate_pem(ca) + pki.certificate_pem(other)).decode()
    from cli.doctor import _bundle

    assert _bundle({"spec": {"caBundle": encoded}}) == [ca, other]


def test_a_cluster_service_url_is_reached_through_the_api_servers_service_proxy() -> None:
    from cli.doctor import _proxy_path

    assert _proxy_path("http://prometheus.monitoring.svc:9090/prom") == \
        "/api/v1/namespaces/monitoring/services/http:prometheus:9090/proxy/prom"
    assert _proxy_path("https://thanos.obs.svc.cluster.local") == \
        "/api/v1/namespaces/obs/services/https:thanos:443/proxy"
    assert _proxy_path("http://127.0.0.1:9090") is None
