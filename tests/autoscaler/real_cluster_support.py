"""What the autoscaler's tests share on the session's real control plane: the shipped
Autoscaler CRD applied (as every module applies it, and left installed), a test's namespace
fenced off from the other controllers that would write to its objects, and a metrics API of the
test's own behind the real aggregator (its TLS, the APIServices given back, the waits).

The session's cluster runs kube-controller-manager's HPA controller and, when another module
started it, metricscale installed from its manifests (testbed.install), whose autoscaler
watches every namespace and has no flag or label that would make it leave some Autoscalers
alone. Both would write the status (and, the installed autoscaler, the scale) of a test's
objects, which a test that counts requests, decisions or watch events cannot tell from the
writes of the code under test. A ValidatingAdmissionPolicy of the test's own denies every write
they send to the test's namespace; their reads go on as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml

from metricscale import pki
from testbed.aggregated import apiservice_given_back
from testbed.binaries import CHECKOUT
from testbed.controlplane import ControlPlane, KubeError
from testbed.processes import wait_until
from tests.adapter.cluster import Names

__all__ = ["HPA_CONTROLLER", "INSTALLED_AUTOSCALER", "METRIC_APISERVICES", "WITHIN", "condition",
           "discovered", "fenced_from", "install_crd", "metric_apiservices_given_back",
           "routed", "serving_context", "until"]

# testbed.install runs the autoscaler as this service account; kube-controller-manager runs
# with --use-service-account-credentials, so its HPA controller writes as the second.
INSTALLED_AUTOSCALER = "system:serviceaccount:metricscale:metricscale-autoscaler"
HPA_CONTROLLER = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"
CRD_NAME = "autoscalers.metricscale.dev"
ADMISSION = "admissionregistration.k8s.io/v1"


def install_crd(cluster: ControlPlane) -> None:
    """The shipped Autoscaler CRD, once Established."""
    crd = yaml.safe_load((CHECKOUT / "manifests/autoscaler/crd.yaml").read_text())
    cluster.apply(crd)

    def established() -> bool:
        found = cluster.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                            f"{crd['metadata']['name']}")
        return any(c.get("type") == "Established" and c.get("status") == "True"
                   for c in (found.get("status") or {}).get("conditions") or [])

    wait_until(established, what="the Autoscaler CRD established", timeout=120)


def _denied_to(cluster: ControlPlane, namespace: str, user: str, policy: str) -> bool:
    """A server-side dry run of a write as `user` (in system:masters, so RBAC lets it pass
    whatever the user's own roles) is refused by `policy`."""
    result = cluster.kubectl(
        "create", "configmap", "fence-probe", f"--namespace={namespace}", "--dry-run=server",
        f"--as={user}", "--as-group=system:masters", "--as-group=system:authenticated",
        check=False)
    return result.returncode != 0 and policy in result.stderr


@contextlib.contextmanager
def fenced_from(cluster: ControlPlane, namespace: str,
                users: Sequence[str] = (INSTALLED_AUTOSCALER, HPA_CONTROLLER)) -> Iterator[None]:
    """Inside, kube-apiserver refuses every write of `users` to `namespace` (admission: their
    reads, and everything of every other user, go on); in effect on entry."""
    name = Names.unique("fence").cluster(namespace)[:63]
    matched = " || ".join(f"request.userInfo.username == '{user}'" for user in users)
    policy = {"apiVersion": ADMISSION, "kind": "ValidatingAdmissionPolicy",
              "metadata": {"name": name},
              "spec": {"failurePolicy": "Fail",
                       "matchConstraints": {"resourceRules": [{
                           "apiGroups": ["*"], "apiVersions": ["*"],
                           "operations": ["CREATE", "UPDATE", "DELETE"],
                           "resources": ["*/*"]}]},  # with subresources
                       "matchConditions": [{"name": "other-controllers", "expression": matched}],
                       "validations": [{"expression": "false",
                                        "message": f"{name}: the test's namespace is fenced "
                                                   "off from this controller"}]}}
    binding = {"apiVersion": ADMISSION, "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": name},
               "spec": {"policyName": name, "validationActions": ["Deny"],
                        "matchResources": {"namespaceSelector": {"matchLabels": {
                            "kubernetes.io/metadata.name": namespace}}}}}
    cluster.apply(policy)
    cluster.apply(binding)
    try:
        wait_until(lambda: all(_denied_to(cluster, namespace, user, name) for user in users),
                   what=f"writes to {namespace} refused to {', '.join(users)}", timeout=120,
                   interval=0.2)
        yield
    finally:
        for obj in (binding, policy):
            with contextlib.suppress(KubeError):
                cluster.delete(obj)


# --------------------------------------------------------------------------------------------
# A metrics API of the test's own behind the real aggregator

METRIC_APISERVICES = [("custom.metrics.k8s.io", "v1beta2"), ("custom.metrics.k8s.io", "v1beta1"),
                      ("external.metrics.k8s.io", "v1beta1"), ("metrics.k8s.io", "v1beta1")]
WITHIN = 240.0  # a guard against a hang, not a measure: a busy machine decides how long


async def until(check: Callable[[], object], *, what: str, within: float = WITHIN) -> None:
    """Poll `check`, a blocking call (run in a thread: a backend of the test answers the
    aggregator on this event loop), until it holds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while not await asyncio.to_thread(check):
        if loop.time() > deadline:
            raise AssertionError(f"not within {within:.0f} s: {what}")
        await asyncio.sleep(0.05)


@contextlib.contextmanager
def metric_apiservices_given_back(cluster: ControlPlane) -> Iterator[None]:
    """Every metric APIService as it was before (other modules of the session may own them)."""
    with contextlib.ExitStack() as stack:
        for group, version in METRIC_APISERVICES:
            stack.enter_context(apiservice_given_back(cluster, f"{version}.{group}"))
        yield


def serving_context(workdir: Path, *, service: str, namespace: str) -> tuple[ssl.SSLContext, bytes]:
    """A TLS server context for Service `service` in `namespace` (the name the aggregator
    checks), and the PEM of the CA that signed it (the APIService's caBundle)."""
    now = datetime.now(UTC) - timedelta(minutes=1)
    ca = pki.generate_ca(common_name=f"{service}-ca", now=now, validity=timedelta(days=1))
    serving = pki.issue_serving_certificate(
        ca, common_name=service, dns_names=[f"{service}.{namespace}.svc"], now=now,
        validity=timedelta(days=1))
    cert = pki.write_certificate(workdir / "tls.crt", serving.certificate)
    key = pki.write_private_key(workdir / "tls.key", serving.private_key)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context, pki.certificate_pem(ca.certificate)


def routed(cluster: ControlPlane, group: str, version: str, marker: str) -> bool:
    """The aggregator answers group/version's discovery from the backend listing `marker`."""
    try:
        found = cluster.get(f"/apis/{group}/{version}")
    except (KubeError, OSError):
        return False
    return any(r.get("name") == marker for r in found.get("resources") or [])


def discovered(cluster: ControlPlane, group: str, version: str) -> bool:
    groups = cluster.get("/apis").get("groups") or []
    return any(g.get("name") == group and any(v.get("version") == version
                                              for v in g.get("versions") or [])
               for g in groups)


def condition(cluster: ControlPlane, namespace: str, name: str,
              kind: str) -> tuple[str, str, str] | None:
    """Autoscaler namespace/name's condition `kind`: (status, reason, message), or None."""
    found = cluster.get(f"/apis/metricscale.dev/v1alpha1/namespaces/{namespace}/autoscalers/"
                        f"{name}")
    for item in (found.get("status") or {}).get("conditions") or []:
        if item.get("type") == kind:
            return item.get("status", ""), item.get("reason", ""), item.get("message", "")
    return None
