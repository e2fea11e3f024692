"""`metricscale doctor` against a real control plane with metricscale installed from its
manifests (a control plane of this module's own: the faults planted here are cluster-wide),
run as a user runs it: the command, the admin's kubeconfig, Prometheus' address.

A sound installation has no FAIL; each planted fault is found, named and given its fix: a
missing RoleBinding, a rule matching nothing, pods without requests under a Utilization target,
a twin HPA beside an Autoscaler, a metric no rule serves (with the nearest served names), and
an expired serving certificate (the adapter restarted on one).
"""

from __future__ import annotations

import base64
import json
import socket
import ssl
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from adapter.security.selfcerts import serving_dns_names
from cli.doctor import DoctorOptions, command_line, doctor_text
from metricscale import pki
from testbed.binaries import CHECKOUT
from testbed.controlplane import ControlPlane, Kubelet
from testbed.fakes.exporter import Exporter
from testbed.fakes.prometheus import PrometheusServer
from testbed.install import APISERVICES, NAMESPACE, Installation
from testbed.load import Load
from testbed.processes import Child, wait_until
from testbed.pytest_plugin import require_peers

NS = "doctor"


@pytest.fixture(scope="module")
def doctored(prometheus: PrometheusServer) -> Iterator[Installation]:
    require_peers("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                  "kubectl")
    with tempfile.TemporaryDirectory(prefix="metricscale-doctor-") as workdir, \
            ControlPlane(hpa_sync_period="5s") as cluster:
        kubelet = cluster.start_kubelet(("doctor-a",))
        prometheus.add_target(kubelet.address, job="kubelet-doctor")
        installed = Installation(cluster=cluster, workdir=Path(workdir),
                                 prometheus_url=prometheus.url)
        try:
            installed.install()
            installed.kubelet = kubelet
            cluster.apply({"apiVersion": "v1", "kind": "Namespace",
                           "metadata": {"name": NS}})
            yield installed
        finally:
            installed.stop()
            prometheus.remove_target(kubelet.address)


def doctor(installed: Installation, *extra: str) -> tuple[int, list[dict[str, Any]], str]:
    """`metricscale doctor -o json` and the text form, as a user types them."""
    base = [sys.executable, "-m", "metricscale", "doctor",
            f"--kubeconfig={installed.cluster.kubeconfig}",
            f"--prometheus-url={installed.prometheus_url}", *extra]
    as_json = subprocess.run([*base, "-o", "json"], capture_output=True, text=True,
                             cwd=CHECKOUT, timeout=300, check=False)
    assert as_json.returncode in (0, 1), as_json.stderr
    text = subprocess.run(base, capture_output=True, text=True, cwd=CHECKOUT, timeout=300,
                          check=False)
    assert text.returncode == as_json.returncode, text.stderr
    lines = text.stdout.splitlines()
    assert all(line.split(" ", 1)[0] in {"OK", "WARN", "FAIL"} for line in lines[:-1]), lines
    results = json.loads(as_json.stdout)["results"]
    assert len(lines) == len(results) + 1  # one line each, then the summary
    return as_json.returncode, results, text.stdout


def found(results: list[dict[str, Any]], status: str, check: str,
          where: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    matching = [r for r in results if r["status"] == status and r["check"] == check
                and where(r)]
    assert matching, json.dumps(results, indent=1)
    return matching[0]


def sar_allows(cluster: ControlPlane, *, user: str, attributes: dict[str, str]) -> bool:
    namespace = user.split(":")[2]
    answer = cluster.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": ["system:serviceaccounts",
                                          f"system:serviceaccounts:{namespace}",
                                          "system:authenticated"],
                 "resourceAttributes": attributes}})
    return bool(answer["status"].get("allowed"))


def test_a_sound_installation_has_no_failure(doctored: Installation) -> None:
    code, results, text = doctor(doctored)
    assert code == 0, text
    assert not [r for r in results if r["status"] == "FAIL"], text
    for group, version in APISERVICES:
        found(results, "OK", "apiservice", lambda r, n=f"{version}.{group}":  # type: ignore[misc]
              r["object"] == f"APIService {n}")
        found(results, "OK", "certificate", lambda r, n=f"{version}.{group}":  # type: ignore[misc]
              r["object"] == f"APIService {n}" and "TLS handshake" in r["message"])
    for subject in ("kube-system/horizontal-pod-autoscaler", "metricscale/metricscale-adapter",
                    "metricscale/metricscale-autoscaler"):
        found(results, "OK", "rbac", lambda r, s=subject:  # type: ignore[misc]
              r["object"] == f"ServiceAccount {s}")
    found(results, "OK", "prometheus", lambda r: "reachable (direct)" in r["message"])
    # What the demo calls prints what the command prints.
    options = DoctorOptions(prometheus_url=doctored.prometheus_url)
    status, report = doctor_text(options, kubeconfig=str(doctored.cluster.kubeconfig))
    assert status == 0 and len(report.splitlines()) == len(text.splitlines())
    assert command_line(options, kubeconfig="k") == \
        f"metricscale doctor --kubeconfig=k --prometheus-url={doctored.prometheus_url}"


def test_a_missing_rolebinding_fails_naming_what_grants_it(doctored: Installation) -> None:
    cluster = doctored.cluster
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "metricscale-adapter-auth-reader",
                            "namespace": "kube-system"}}
    adapter = f"system:serviceaccount:{NAMESPACE}:metricscale-adapter"
    reading = {"verb": "get", "resource": "configmaps", "namespace": "kube-system",
               "name": "extension-apiserver-authentication"}
    cluster.delete(binding)
    try:
        wait_until(lambda: not sar_allows(cluster, user=adapter, attributes=reading),
                   what="the RoleBinding's permission gone", timeout=60)
        code, results, text = doctor(doctored)
        assert code == 1, text
        failure = found(results, "FAIL", "rbac", lambda r: r["object"] ==
                        f"ServiceAccount {NAMESPACE}/metricscale-adapter")
        assert "get configmaps extension-apiserver-authentication in kube-system" in \
            failure["message"]
        assert "RoleBinding kube-system/metricscale-adapter-auth-reader" in failure["fix"]
    finally:
        doctored.install_manifests()
    wait_until(lambda: sar_allows(cluster, user=adapter, attributes=reading),
               what="the RoleBinding back", timeout=60)


def test_a_rule_matching_nothing_is_named_with_its_series_query(
        doctored: Installation) -> None:
    cluster = doctored.cluster
    path = f"/api/v1/namespaces/{NAMESPACE}/configmaps/metricscale-adapter-config"
    original = cluster.get(path)["data"]["config.yaml"]
    config = yaml.safe_load(original)
    config["rules"].append({
        "seriesQuery": 'doctor_nothing_here_total{namespace!=""}',
        "resources": {"overrides": {"namespace": {"resource": "namespace"}}},
        "metricsQuery": "sum(rate(<<.Series>>{<<.LabelMatchers>>}[1m])) by (namespace)"})
    index = len(config["rules"]) - 1
    cluster.request("PATCH", path, {"data": {"config.yaml": yaml.safe_dump(config)}},
                    content_type="application/merge-patch+json")
    try:
        _, results, _ = doctor(doctored)
        warning = found(results, "WARN", "rules",
                        lambda r: r["object"] == f"rule rules[{index}]")
        assert "doctor_nothing_here_total" in warning["message"]
        assert "matches no series" in warning["message"] and warning["fix"]
    finally:
        cluster.request("PATCH", path, {"data": {"config.yaml": original}},
                        content_type="application/merge-patch+json")


def deployment(name: str, *, cpu: str | None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "app", "image": "registry.invalid/app:1"}
    if cpu is not None:
        container["resources"] = {"requests": {"cpu": cpu}}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [container]}}}}


def scaler(kind: str, name: str, target: str, metrics: list[dict[str, Any]]) -> dict[str, Any]:
    api_version = "autoscaling/v2" if kind == "HorizontalPodAutoscaler" \
        else "metricscale.dev/v1alpha1"
    return {"apiVersion": api_version, "kind": kind,
            "metadata": {"name": name, "namespace": NS},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                        "name": target},
                     "minReplicas": 2, "maxReplicas": 2, "metrics": metrics}}


JOBS = {"type": "Pods", "pods": {"metric": {"name": "jobs_in_flight"},
                                 "target": {"type": "AverageValue", "averageValue": "10"}}}
TYPO = {"type": "Pods", "pods": {"metric": {"name": "job_in_flight"},
                                 "target": {"type": "AverageValue", "averageValue": "10"}}}
CPU = {"type": "Resource", "resource": {"name": "cpu", "target": {
    "type": "Utilization", "averageUtilization": 50}}}


def test_workload_faults_are_named_with_their_fix(doctored: Installation,
                                                  exporter: Exporter) -> None:
    """Pods without requests under a Utilization target, an HPA and an Autoscaler on one
    Deployment, and an Autoscaler asking for a metric no rule serves."""
    cluster = doctored.cluster
    kubelet = doctored.kubelet
    assert isinstance(kubelet, Kubelet)
    cluster.apply(deployment("web", cpu="500m"))
    cluster.apply(deployment("plain", cpu=None))
    with Load(cluster, kubelet, namespace=NS, selector={"app": "web"}, exporter=exporter,
              metric="jobs_in_flight", metric_total=20):
        served = (f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{NS}/pods/*/"
                  "jobs_in_flight?labelSelector=app%3Dweb")

        def two_values() -> bool:
            answer = cluster.kubectl("get", "--raw", served, check=False)
            return answer.returncode == 0 and len(json.loads(answer.stdout)["items"]) == 2

        wait_until(two_values, what="jobs_in_flight served for web's two pods", timeout=120)
        cluster.apply(scaler("HorizontalPodAutoscaler", "web", "web", [JOBS]))
        cluster.apply(scaler("Autoscaler", "web-twin", "web", [JOBS]))
        cluster.apply(scaler("Autoscaler", "plain", "plain", [CPU, TYPO]))
        try:
            code, results, text = doctor(doctored)
        finally:
            for kind, name in (("HorizontalPodAutoscaler", "web"), ("Autoscaler", "web-twin"),
                               ("Autoscaler", "plain")):
                cluster.delete(scaler(kind, name, name, []))
    assert code == 1, text
    requests = found(results, "FAIL", "workloads", lambda r: r["object"] ==
                     f"Autoscaler {NS}/plain metric[0]")
    assert "have no cpu request" in requests["message"]
    assert f"resources.requests.cpu in Deployment {NS}/plain" in requests["fix"]
    twins = found(results, "FAIL", "workloads", lambda r: r["object"] ==
                  f"Deployment.apps {NS}/web")
    assert f"HorizontalPodAutoscaler {NS}/web and Autoscaler {NS}/web-twin" in \
        twins["message"]
    assert "migrate hpa" in twins["fix"]
    unserved = found(results, "FAIL", "metrics", lambda r: r["object"] ==
                     f"Autoscaler {NS}/plain metric[1]")
    assert "'job_in_flight', which no rule serves" in unserved["message"]
    assert "nearest served: jobs_in_flight (rules[" in unserved["message"]
    found(results, "OK", "metrics", lambda r: r["object"] ==
          f"HorizontalPodAutoscaler {NS}/web metric[0]" and "2 value(s)" in r["message"])


def _served_certificate(port: int) -> bytes | None:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, \
                context.wrap_socket(raw, server_hostname="metricscale-adapter.metricscale.svc"
                                    ) as tls:
            return tls.getpeercert(binary_form=True)
    except OSError:
        return None


def test_an_expired_serving_certificate_fails_saying_when(doctored: Installation) -> None:
    """The adapter restarted on a certificate that expired (certs-files or cert-manager gone
    wrong), its CA in the caBundles: the certificate lines FAIL with the date."""
    cluster = doctored.cluster
    assert doctored.adapter is not None
    doctored.adapter.stop()
    now = datetime.now(UTC)
    ca = pki.generate_ca(common_name="doctor-test-ca", now=now - timedelta(days=30),
                         validity=timedelta(days=3650))
    leaf = pki.issue_serving_certificate(
        ca, common_name="metricscale-adapter.metricscale.svc",
        dns_names=serving_dns_names("metricscale-adapter", NAMESPACE),
        now=now - timedelta(days=10), validity=timedelta(days=2))
    expired = leaf.certificate.not_valid_after_utc
    certs = doctored.workdir / "expired"
    certs.mkdir(exist_ok=True)
    cert_file = certs / "tls.crt"
    cert_file.write_bytes(pki.certificate_pem(leaf.certificate) + pki.certificate_pem(
        ca.certificate))
    key_file = pki.write_private_key(certs / "tls.key", leaf.private_key)
    for group, version in APISERVICES:
        cluster.request("PATCH", f"/apis/apiregistration.k8s.io/v1/apiservices/"
                                 f"{version}.{group}",
                        {"spec": {"caBundle": base64.b64encode(
                            pki.certificate_pem(ca.certificate)).decode()}},
                        content_type="application/merge-patch+json")
    stale = Child("metricscale-adapter-expired", [
        sys.executable, "-m", "metricscale", "adapter",
        f"--secure-port={doctored.adapter_port}", "--bind-address=127.0.0.1",
        f"--kubeconfig={doctored.kubeconfig_of('metricscale-adapter')}",
        f"--config={doctored.workdir / 'adapter-config.yaml'}",
        f"--prometheus-url={doctored.prometheus_url}", "--self-managed-certs=off",
        f"--tls-cert-file={cert_file}", f"--tls-private-key-file={key_file}"],
        log=doctored.workdir / "adapter-expired.log", cwd=CHECKOUT)
    try:
        wait_until(lambda: _served_der_matches(doctored.adapter_port, leaf.certificate),
                   what="the adapter serving the expired certificate", timeout=120,
                   children=[stale])
        code, results, text = doctor(doctored)
    finally:
        stale.stop()
        doctored.start_adapter()  # self-managed again: its own CA back in the caBundles
    assert code == 1, text
    for group, version in APISERVICES:
        failure = found(results, "FAIL", "certificate",
                        lambda r, n=f"{version}.{group}":  # type: ignore[misc]
                        r["object"] == f"APIService {n}" and "expired" in r["message"])
        assert f"expired on {expired.strftime('%Y-%m-%dT%H:%M:%SZ')}" in failure["message"]
        assert "renew" in failure["fix"]


def _served_der_matches(port: int, certificate: Any) -> bool:
    from cryptography.hazmat.primitives.serialization import Encoding

    return _served_certificate(port) == certificate.public_bytes(Encoding.DER)
