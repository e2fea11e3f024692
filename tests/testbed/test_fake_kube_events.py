"""Fake kube-apiserver: Events validated as kube-apiserver v1.32 validates them, in both groups.

Pins pkg/apis/core/validation/events.go (legacyValidateEvent for every Event, the strict rules
for creation through events.k8s.io/v1, the immutable fields of an events.k8s.io update) and the
events.k8s.io/v1 field selectors of pkg/apis/events/v1/conversion.go.
"""

from __future__ import annotations

from typing import Any

from testbed.fakes.kube_http import KubeHTTPClient

EVENTS_V1 = "/apis/events.k8s.io/v1/namespaces/demo/events"
CORE_EVENTS = "/api/v1/namespaces/demo/events"
MERGE = "application/merge-patch+json"
NOW = "2026-01-01T00:00:00.000000Z"


def event(name: str = "e", **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": name},
        "eventTime": NOW, "reportingController": "metricscale.dev/autoscaler",
        "reportingInstance": "replica-a", "action": "Scale", "reason": "SuccessfulRescale",
        "type": "Normal", "note": "New size: 4",
        "regarding": {"apiVersion": "metricscale.dev/v1alpha1", "kind": "Autoscaler",
                      "namespace": "demo", "name": "web"}}
    body.update(fields)
    return {k: v for k, v in body.items() if v is not None}


def causes(reply: Any) -> list[tuple[str, str, str]]:
    return [(c["reason"], c["field"], c["message"]) for c in reply.json["details"]["causes"]]


async def test_a_complete_events_v1_event_is_created(kube_http: KubeHTTPClient) -> None:
    assert (await kube_http.post(EVENTS_V1, event())).status == 201


async def test_missing_reporting_fields_and_action_are_required(
        kube_http: KubeHTTPClient) -> None:
    reply = await kube_http.post(EVENTS_V1, event(action=None, reportingController=None,
                                                  reportingInstance=None))
    assert reply.status == 422
    assert reply.json["message"].startswith('Event.events.k8s.io "e" is invalid: [')
    fields = {(reason, field) for reason, field, _ in causes(reply)}
    assert {("FieldValueRequired", "reportingController"),
            ("FieldValueRequired", "reportingInstance"),
            ("FieldValueRequired", "action")} <= fields


async def test_a_reason_over_128_characters_is_invalid(kube_http: KubeHTTPClient) -> None:
    reply = await kube_http.post(EVENTS_V1, event(reason="R" * 129))
    assert causes(reply) == [("FieldValueInvalid", "reason",
                              'Invalid value: "": can have at most 128 characters')]


async def test_a_note_over_1024_bytes_is_invalid_even_under_1024_characters(
        kube_http: KubeHTTPClient) -> None:
    assert (await kube_http.post(EVENTS_V1, event(note="é" * 512))).status == 201  # 1,024 bytes
    reply = await kube_http.post(EVENTS_V1, event("f", note="é" * 513))
    assert causes(reply) == [("FieldValueInvalid", "message",
                              'Invalid value: "": can have at most 1024 characters')]


async def test_a_core_event_with_an_event_time_needs_its_reporting_fields(
        kube_http: KubeHTTPClient) -> None:
    legacy = {"metadata": {"name": "old"}, "reason": "Started", "type": "Normal",
              "involvedObject": {"kind": "Pod", "namespace": "demo", "name": "p"}}
    assert (await kube_http.post(CORE_EVENTS, legacy)).status == 201  # no eventTime: legacy
    reply = await kube_http.post(CORE_EVENTS, {**legacy, "metadata": {"name": "new"},
                                               "eventTime": NOW})
    assert reply.status == 422
    fields = {(reason, field) for reason, field, _ in causes(reply)}
    assert ("FieldValueRequired", "reportingComponent") in fields  # core/v1's name for it
    assert ("FieldValueRequired", "action") in fields


async def test_an_events_v1_update_keeps_the_immutable_fields(kube_http: KubeHTTPClient) -> None:
    await kube_http.post(EVENTS_V1, event())
    reply = await kube_http.patch(f"{EVENTS_V1}/e", {"reason": "Other"}, content_type=MERGE)
    assert reply.status == 422
    assert causes(reply) == [("FieldValueInvalid", "reason",
                              'Invalid value: "Other": field is immutable')]
    note = await kube_http.patch(f"{EVENTS_V1}/e", {"note": "New size: 5"}, content_type=MERGE)
    assert note.status == 200


async def test_events_v1_selects_by_regarding_and_reporting_controller(
        kube_http: KubeHTTPClient) -> None:
    await kube_http.post(EVENTS_V1, event("a"))
    await kube_http.post(EVENTS_V1, event("b", regarding={
        "apiVersion": "apps/v1", "kind": "Deployment", "namespace": "demo", "name": "web"}))
    reply = await kube_http.get(EVENTS_V1, params={
        "fieldSelector": "regarding.kind=Autoscaler,regarding.name=web,"
                         "reportingController=metricscale.dev/autoscaler"})
    assert [item["metadata"]["name"] for item in reply.json["items"]] == ["a"]
    core = await kube_http.get(CORE_EVENTS, params={"fieldSelector": "regarding.kind=Pod"})
    assert core.status == 400  # core/v1 knows involvedObject.*, not regarding.*
