"""What tests/autoscaler/test_server.py and test_watching.py share on the session's real control
plane: the shipped Autoscaler CRD applied (as every module applies it, and left installed), and
a test's namespace fenced off from the other controllers that would write to its objects.

The session's cluster runs kube-controller-manager's HPA controller and, when another module
started it, metricscale installed from its manifests (testbed.install), whose autoscaler
watches every namespace and has no flag or label that would make it leave some Autoscalers
alone. Both would write the status (and, the installed autoscaler, the scale) of a test's
objects, which a test that counts requests, decisions or watch events cannot tell from the
writes of the code under test. A ValidatingAdmissionPolicy of the test's own denies every write
they send to the test's namespace; their reads go on as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import yaml

from testbed.binaries import CHECKOUT
from testbed.controlplane import ControlPlane, KubeError
from testbed.processes import wait_until
from tests.adapter.cluster import Names

__all__ = ["HPA_CONTROLLER", "INSTALLED_AUTOSCALER", "fenced_from", "install_crd"]

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
