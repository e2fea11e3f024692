"""Fake kube-apiserver: custom resources validated as apiextensions-apiserver v1.32 does, on every
write path (create, update, patch, /status, /scale).

Each test names the upstream file whose behaviour it pins:
- CEL rules: apiextensions-apiserver/pkg/apiserver/schema/cel/validation.go
- list-type sets and maps: apiextensions-apiserver/pkg/apiserver/schema/listtype/validation.go
- defaults: apiextensions-apiserver/pkg/apiserver/schema/defaulting/algorithm.go
- unconditional updates: apiserver/pkg/registry/generic/registry/store.go (Update), with
  apiextensions-apiserver/pkg/registry/customresource/strategy.go (AllowUnconditionalUpdate)
- type errors and CEL skipped after blocking errors: apiextensions-apiserver/pkg/apiserver/
  validation/validation.go (kubeOpenAPIResultToFieldErrors) and customresource/strategy.go
  (hasBlockingErr)
- pattern and format: kube-openapi/pkg/validation/validate (type, format and string validators)
- ratcheting (CRDValidationRatcheting, on by default since v1.30):
  apiextensions-apiserver/pkg/registry/customresource/strategy.go (ValidateUpdate) with
  apiextensions-apiserver/pkg/apiserver/validation/ratcheting.go
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from testbed.fakes.kube_api import FakeKubeAPI
from testbed.fakes.kube_http import KubeHTTPClient

REPO = Path(__file__).resolve().parents[2]
AUTOSCALERS = "/apis/metricscale.dev/v1alpha1/namespaces/demo/autoscalers"
MERGE = "application/merge-patch+json"
THINGS = "/apis/example.com/v1/namespaces/demo/things"
STATUS = {"currentReplicas": 1, "desiredReplicas": 1}


def install_autoscaler_crd(fake: FakeKubeAPI) -> None:
    crd = yaml.safe_load((REPO / "manifests" / "autoscaler" / "crd.yaml").read_text())
    fake.create("apiextensions.k8s.io", "v1", "customresourcedefinitions", crd)


def autoscaler(name: str = "web", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "metricscale.dev/v1alpha1", "kind": "Autoscaler",
            "metadata": {"name": name},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                        "name": name}, "maxReplicas": 5, **spec}}


def pods_metric(average_value: Any) -> dict[str, Any]:
    return {"type": "Pods", "pods": {"metric": {"name": "qps"},
                                     "target": {"type": "AverageValue",
                                                "averageValue": average_value}}}


def causes(reply: Any) -> list[tuple[str, str, str]]:
    return [(c["reason"], c["field"], c["message"]) for c in reply.json["details"]["causes"]]


# --- CEL (schema/cel/validation.go) ------------------------------------------------------------


async def test_a_failed_cel_rule_is_invalid_at_its_node_with_its_message(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    install_autoscaler_crd(fake_kube)
    reply = await kube_http.post(AUTOSCALERS, autoscaler(minReplicas=6))
    assert reply.status == 422 and reply.json["reason"] == "Invalid"
    # The rule sits on spec, names .maxReplicas as its fieldPath, and spec is an object: the
    # message leaves the value out (field.OmitValueType).
    assert causes(reply) == [("FieldValueInvalid", "spec.maxReplicas",
                              "Invalid value: maxReplicas must be greater than or equal to "
                              "minReplicas")]
    assert reply.json["message"] == (
        'Autoscaler.metricscale.dev "web" is invalid: spec.maxReplicas: Invalid value: '
        "maxReplicas must be greater than or equal to minReplicas")


async def test_a_rule_without_a_message_reports_failed_rule(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    fake_kube.create_crd(group="example.com", kind="Thing", plural="things", schema={
        "type": "object", "properties": {"spec": {
            "type": "object", "properties": {"size": {"type": "integer"}},
            "x-kubernetes-validations": [{"rule": "self.size  < 10 "}]}}})
    reply = await kube_http.post(THINGS, {"metadata": {"name": "t"}, "spec": {"size": 12}})
    assert causes(reply) == [("FieldValueInvalid", "spec",
                              "Invalid value: failed rule: self.size  < 10")]


async def test_a_transition_rule_sees_old_self_only_on_update(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    fake_kube.create_crd(group="example.com", kind="Thing", plural="things", schema={
        "type": "object", "properties": {"spec": {"type": "object", "properties": {
            "mode": {"type": "string", "x-kubernetes-validations": [
                {"rule": "self == oldSelf", "message": "mode is immutable"}]}}}}})
    created = await kube_http.post(THINGS, {"metadata": {"name": "t"}, "spec": {"mode": "a"}})
    assert created.status == 201  # no old value on create: the transition rule is skipped
    same = await kube_http.patch(f"{THINGS}/t", {"spec": {"mode": "a"}}, content_type=MERGE)
    assert same.status == 200
    changed = await kube_http.patch(f"{THINGS}/t", {"spec": {"mode": "b"}}, content_type=MERGE)
    assert changed.status == 422
    assert causes(changed) == [("FieldValueInvalid", "spec.mode",
                                'Invalid value: "b": mode is immutable')]


async def test_rules_apply_on_status_writes_and_reasons_pick_the_error_type(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    fake_kube.create_crd(group="example.com", kind="Thing", plural="things", schema={
        "type": "object", "properties": {
            "spec": {"type": "object"},
            "status": {"type": "object", "properties": {"count": {"type": "integer"}},
                       "x-kubernetes-validations": [{
                           "rule": "!has(self.count) || self.count >= 0",
                           "messageExpression": "'count is ' + string(self.count)",
                           "reason": "FieldValueForbidden", "fieldPath": ".count"}]}}})
    await kube_http.post(THINGS, {"metadata": {"name": "t"}, "spec": {}})
    reply = await kube_http.patch(f"{THINGS}/t/status", {"status": {"count": -1}},
                                  content_type=MERGE)
    assert reply.status == 422
    assert causes(reply) == [("FieldValueForbidden", "status.count", "Forbidden: count is -1")]


async def test_a_crd_whose_rule_does_not_compile_is_refused(
        kube_http: KubeHTTPClient) -> None:
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
           "metadata": {"name": "things.example.com"},
           "spec": {"group": "example.com", "scope": "Namespaced",
                    "names": {"plural": "things", "singular": "thing", "kind": "Thing",
                              "listKind": "ThingList"},
                    "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
                        "openAPIV3Schema": {"type": "object", "x-kubernetes-validations": [
                            {"rule": "self.spec >"}]}}}]}}
    reply = await kube_http.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    assert reply.status == 422
    assert "x-kubernetes-validations[0].rule" in reply.json["message"]


# --- schema value validations (kube-openapi validate) -------------------------------------------


async def test_an_int_or_string_quantity_must_match_its_pattern(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    install_autoscaler_crd(fake_kube)
    reply = await kube_http.post(AUTOSCALERS, autoscaler(metrics=[pods_metric("banana")]))
    assert reply.status == 422
    (reason, field, message), = causes(reply)
    assert (reason, field) == ("FieldValueInvalid", "spec.metrics[0].pods.target.averageValue")
    assert message.startswith('Invalid value: "banana": spec.metrics[0].pods.target.averageValue '
                              "in body should match '")
    assert (await kube_http.post(AUTOSCALERS, autoscaler(metrics=[pods_metric(5)]))).status == 201


async def test_a_date_time_field_refuses_what_is_not_one(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    install_autoscaler_crd(fake_kube)
    await kube_http.post(AUTOSCALERS, autoscaler())
    reply = await kube_http.patch(f"{AUTOSCALERS}/web/status", {"status": {
        **STATUS, "lastScaleTime": "yesterday"}}, content_type=MERGE)
    assert reply.status == 422
    assert causes(reply) == [("FieldValueInvalid", "status.lastScaleTime",
                              'Invalid value: "yesterday": status.lastScaleTime in body must be '
                              'of type date-time: "yesterday"')]


# --- list types (schema/listtype/validation.go) ---------------------------------------------------


async def test_a_list_map_refuses_two_items_with_one_key(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    install_autoscaler_crd(fake_kube)
    await kube_http.post(AUTOSCALERS, autoscaler())
    condition = {"type": "AbleToScale", "status": "True", "reason": "R", "message": "m",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}
    reply = await kube_http.patch(f"{AUTOSCALERS}/web/status", {"status": {
        **STATUS, "conditions": [condition, {**condition, "status": "False"}]}},
        content_type=MERGE)
    assert reply.status == 422
    assert causes(reply) == [("FieldValueDuplicate", "status.conditions[1]",
                              'Duplicate value: map[string]interface {}{"type":"AbleToScale"}')]


async def test_a_list_set_refuses_a_repeated_item(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    fake_kube.create_crd(group="example.com", kind="Thing", plural="things", schema={
        "type": "object", "properties": {"spec": {"type": "object", "properties": {
            "tags": {"type": "array", "items": {"type": "string"},
                     "x-kubernetes-list-type": "set"}}}}})
    reply = await kube_http.post(THINGS, {"metadata": {"name": "t"},
                                          "spec": {"tags": ["a", "b", "a"]}})
    assert causes(reply) == [("FieldValueDuplicate", "spec.tags[2]", 'Duplicate value: "a"')]


# --- type errors and blocking errors (validation.go, strategy.go hasBlockingErr) ---------------


async def test_a_wrong_type_is_type_invalid_with_the_type_found_as_the_value(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    install_autoscaler_crd(fake_kube)
    obj = autoscaler()
    obj["spec"]["maxReplicas"] = "plenty"
    reply = await kube_http.post(AUTOSCALERS, obj)
    assert reply.status == 422
    assert causes(reply)[0] == (
        "FieldValueTypeInvalid", "spec.maxReplicas",
        'Invalid value: "string": spec.maxReplicas in body must be of type integer: "string"')


async def test_cel_rules_are_not_run_after_a_blocking_error(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    install_autoscaler_crd(fake_kube)
    # minReplicas > maxReplicas fails a rule, but the enum error blocks the rules.
    reply = await kube_http.post(AUTOSCALERS, autoscaler(
        minReplicas=9, metrics=[{"type": "Prometheus"}]))
    assert reply.status == 422
    found = causes(reply)
    assert ("FieldValueNotSupported", "spec.metrics[0].type") in [c[:2] for c in found]
    assert found[-1] == ("FieldValueInvalid", "<nil>",
                         'Invalid value: "null": some validation rules were not checked '
                         "because the object was invalid; correct the existing errors to "
                         "complete validation")
    assert "maxReplicas must be greater" not in reply.text


# --- ratcheting (registry/customresource/strategy.go, apiserver/validation/ratcheting.go) -------


def _stored_before_a_schema_change(fake: FakeKubeAPI) -> None:
    """An Autoscaler the current schema refuses (an unknown metric type), as storage holds
    objects written before a schema change."""
    obj = autoscaler(metrics=[{"type": "Prometheus"}])
    obj["metadata"]["namespace"] = "demo"
    fake.store.create("metricscale.dev", "v1alpha1", "autoscalers", obj)


async def test_an_unchanged_invalid_value_is_ratcheted_on_update(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    install_autoscaler_crd(fake_kube)
    _stored_before_a_schema_change(fake_kube)
    # A status write keeps the old spec: the enum error in it is not reported.
    status = await kube_http.patch(f"{AUTOSCALERS}/web/status", {"status": STATUS},
                                   content_type=MERGE)
    assert status.status == 200, status.text
    # So is a spec change elsewhere: metrics[0] is unchanged.
    other = await kube_http.patch(f"{AUTOSCALERS}/web", {"spec": {"maxReplicas": 6}},
                                  content_type=MERGE)
    assert other.status == 200, other.text
    # Changing the invalid value itself to another invalid one is validated.
    changed = await kube_http.patch(f"{AUTOSCALERS}/web", {"spec": {"metrics": [
        {"type": "Graphite"}]}}, content_type=MERGE)
    assert changed.status == 422
    assert causes(changed)[0][:2] == ("FieldValueNotSupported", "spec.metrics[0].type")


async def test_a_create_is_never_ratcheted(fake_kube: FakeKubeAPI,
                                           kube_http: KubeHTTPClient) -> None:
    install_autoscaler_crd(fake_kube)
    reply = await kube_http.post(AUTOSCALERS, autoscaler(metrics=[{"type": "Prometheus"}]))
    assert reply.status == 422
    assert ("FieldValueNotSupported", "spec.metrics[0].type") in [c[:2] for c in causes(reply)]


async def test_list_type_errors_count_only_when_the_old_object_had_none(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    install_autoscaler_crd(fake_kube)
    condition = {"type": "AbleToScale", "status": "True", "reason": "R", "message": "m",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}
    obj = autoscaler()
    obj["metadata"]["namespace"] = "demo"
    obj["status"] = {**STATUS, "conditions": [condition, {**condition, "status": "False"}]}
    fake_kube.store.create("metricscale.dev", "v1alpha1", "autoscalers", obj)
    again = await kube_http.patch(f"{AUTOSCALERS}/web/status", {"status": {
        "desiredReplicas": 2}}, content_type=MERGE)
    assert again.status == 200, again.text


# --- defaults (schema/defaulting/algorithm.go) ------------------------------------------------


async def test_defaults_apply_inside_a_defaulted_or_empty_object(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    rules = {"type": "object", "default": {}, "properties": {
        "selectPolicy": {"type": "string", "default": "Max"},
        "window": {"type": "integer", "default": 300}}}
    fake_kube.create_crd(group="example.com", kind="Thing", plural="things", schema={
        "type": "object", "properties": {"spec": {"type": "object", "default": {}, "properties": {
            "scaleUp": rules, "scaleDown": rules}}}})
    created = await kube_http.post(THINGS, {"metadata": {"name": "t"},
                                            "spec": {"scaleUp": {"window": 0}}})
    assert created.json["spec"] == {"scaleUp": {"selectPolicy": "Max", "window": 0},
                                    "scaleDown": {"selectPolicy": "Max", "window": 300}}
    bare = await kube_http.post(THINGS, {"metadata": {"name": "u"}})
    assert bare.json["spec"]["scaleDown"] == {"selectPolicy": "Max", "window": 300}


# --- /scale (customresource scale strategy: the object's schema applies) --------------------------


async def test_a_scale_write_beyond_the_schema_maximum_is_invalid(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    fake_kube.create_crd(group="example.com", kind="Thing", plural="things", schema={
        "type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "replicas": {"type": "integer", "minimum": 1, "maximum": 10}}},
            "status": {"type": "object", "properties": {"replicas": {"type": "integer"}}}}},
        scale={"specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"})
    await kube_http.post(THINGS, {"metadata": {"name": "t"}, "spec": {"replicas": 2}})
    scale = (await kube_http.get(f"{THINGS}/t/scale")).json
    reply = await kube_http.put(f"{THINGS}/t/scale", {**scale, "spec": {"replicas": 11}})
    assert reply.status == 422
    assert reply.json["message"] == (
        'Thing.example.com "t" is invalid: spec.replicas: Invalid value: 11: spec.replicas in '
        "body should be less than or equal to 10")
    ok = await kube_http.put(f"{THINGS}/t/scale", {**scale, "spec": {"replicas": 10}})
    assert ok.status == 200


# --- updates without a resourceVersion (generic store + customresource strategy) ----------------


async def test_a_custom_resource_update_needs_a_resource_version(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    install_autoscaler_crd(fake_kube)
    created = (await kube_http.post(AUTOSCALERS, autoscaler())).json
    created["metadata"].pop("resourceVersion")
    for path in (f"{AUTOSCALERS}/web", f"{AUTOSCALERS}/web/status"):
        reply = await kube_http.put(path, created)
        assert reply.status == 422, path
        assert reply.json["message"] == (
            'Autoscaler.metricscale.dev "web" is invalid: metadata.resourceVersion: Invalid '
            "value: 0x0: must be specified for an update")
