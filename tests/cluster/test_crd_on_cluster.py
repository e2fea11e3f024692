"""The Autoscaler CRD as the real kube-apiserver serves it: its structural schema and CEL rules
refuse what explain refuses (the same tables drive both), the status subresource keeps spec
and status apart, and `kubectl get msa` prints the CRD's columns."""

from __future__ import annotations

import json
from typing import Any

import pytest

from testbed.controlplane import ControlPlane, KubeError
from testbed.install import Installation
from tests.autoscaler.test_explain_refuses_what_the_crd_refuses import (
    CASES,
    CRD_RULES,
    EVERY_FIELD,
    ROWS,
    SPEC_CONSTRAINTS,
    broken,
)

Obj = dict[str, Any]


def autoscaler(name: str, namespace: str, spec: Obj) -> Obj:
    return {"apiVersion": "metricscale.dev/v1alpha1", "kind": "Autoscaler",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def dry_create(cluster: ControlPlane, namespace: str, spec: Obj) -> KubeError | None:
    """Creates the Autoscaler with dryRun=All (validated, never stored); the refusal if any."""
    try:
        cluster.request("POST", f"/apis/metricscale.dev/v1alpha1/namespaces/{namespace}/"
                                "autoscalers?dryRun=All&fieldValidation=Strict",
                        autoscaler("web", namespace, spec))
    except KubeError as error:
        return error
    return None


def test_a_spec_with_every_field_is_accepted(installation: Installation,
                                            namespace: str) -> None:
    assert dry_create(installation.cluster, namespace, EVERY_FIELD) is None


@pytest.mark.parametrize(("key", "index"), CASES,
                         ids=[f"{key[0]} #{index}" for key, index in CASES])
def test_each_cel_rule_refuses_with_the_message_explain_prints(
        installation: Installation, namespace: str, key: tuple[str, str], index: int) -> None:
    rule = CRD_RULES[key]
    row = ROWS[key]
    refusal = dry_create(installation.cluster, namespace, row.specs[index])
    assert refusal is not None and refusal.status == 422, refusal
    field = row.node + (rule.get("fieldPath") or "")
    causes = [(c.get("field"), c.get("message")) for c in
              (refusal.body.get("details") or {}).get("causes", [])]
    # The server names the rule's field and message, as explain does.
    assert causes == [(field, f"Invalid value: {rule['message']}")], causes


@pytest.mark.parametrize("constraint", SPEC_CONSTRAINTS,
                         ids=[f"{c.path} {c.keyword}"[:100] for c in SPEC_CONSTRAINTS])
def test_each_schema_constraint_is_enforced_by_the_real_server(
        installation: Installation, namespace: str, constraint: Any) -> None:
    spec, field = broken(constraint)
    refusal = dry_create(installation.cluster, namespace, spec)
    assert refusal is not None and refusal.status == 422, f"accepted: {field}"
    causes = [c.get("field", "") for c in (refusal.body.get("details") or {}).get("causes", [])]
    assert any(cause.startswith(field) or field.startswith(cause) for cause in causes), \
        (field, causes)


def test_kubectl_get_msa_prints_the_crd_columns_and_status_is_a_subresource(
        installation: Installation, namespace: str) -> None:
    cluster = installation.cluster
    cluster.apply({"apiVersion": "apps/v1", "kind": "Deployment",
                   "metadata": {"name": "web", "namespace": namespace},
                   "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                            "template": {"metadata": {"labels": {"app": "web"}},
                                         "spec": {"containers": [{
                                             "name": "app", "image": "registry.invalid/a:1"}]}}}})
    created = cluster.request(
        "POST", f"/apis/metricscale.dev/v1alpha1/namespaces/{namespace}/autoscalers",
        {**autoscaler("web", namespace, {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
            "minReplicas": 1, "maxReplicas": 3}),
         "status": {"currentReplicas": 99, "desiredReplicas": 99}})
    # The status subresource: a create (or spec update) never writes the status.
    assert "currentReplicas" not in (created.get("status") or {})
    header = cluster.kubectl("get", "msa", "-n", namespace).stdout.splitlines()[0].split()
    assert header == ["NAME", "REFERENCE", "TARGETS", "MINPODS", "MAXPODS", "REPLICAS", "AGE"]
    wide = json.loads(cluster.kubectl("get", "msa", "web", "-n", namespace, "-o",
                                      "json").stdout)
    assert wide["spec"]["minReplicas"] == 1
