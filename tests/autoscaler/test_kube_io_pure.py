"""The pure parts of Kubernetes access: errors, retries, MicroTime, merge patches, event and lease
bodies."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest
from multidict import CIMultiDict, CIMultiDictProxy

from autoscaler.decision.leadership import LeaseSpec
from autoscaler.kube.operations import (
    ObjectReference,
    format_micro_time,
    merge_patch,
    parse_lease,
    parse_micro_time,
    render_event,
    render_lease_spec,
)
from metricscale.kube import errors
from metricscale.kube.discovery import ResourceMapping, parse_group_version
from metricscale.kube.errors import ErrorContext, error_from_response
from metricscale.kube.retry import RetryPolicy


def mapped(status: int, body: str | None, *, verb: str, context: ErrorContext | None = None,
           **headers: str) -> errors.KubeError:
    """The error for one failed answer, mapped as every request's is."""
    return error_from_response(status, headers=CIMultiDictProxy(CIMultiDict(headers)), body=body,
                               verb=verb, context=context)


def status_body(code: int, reason: str, message: str, **details: object) -> str:
    body: dict[str, object] = {"kind": "Status", "apiVersion": "v1", "metadata": {},
                               "status": "Failure", "message": message, "reason": reason,
                               "code": code}
    if details:
        body["details"] = details
    return json.dumps(body)


# --- error mapping -------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "reason", "verb", "cls"), [
    (400, "BadRequest", "GET", errors.BadRequest),
    (401, "Unauthorized", "GET", errors.Unauthorized),
    (403, "Forbidden", "GET", errors.Forbidden),
    (404, "NotFound", "GET", errors.NotFound),
    (405, "MethodNotAllowed", "PATCH", errors.MethodNotAllowed),
    (409, "Conflict", "PUT", errors.Conflict),
    (409, "AlreadyExists", "POST", errors.AlreadyExists),
    (410, "Expired", "GET", errors.Gone),
    (422, "Invalid", "POST", errors.Invalid),
    (429, "TooManyRequests", "GET", errors.TooManyRequests),
    (500, "InternalError", "GET", errors.ServerError),
    (503, "ServiceUnavailable", "GET", errors.ServerError),
])
def test_status_bodies_map_to_one_typed_error_keeping_the_server_message(
        status: int, reason: str, verb: str, cls: type[errors.KubeError]) -> None:
    err = mapped(status, status_body(status, reason, "it broke"),
                                   verb=verb)
    assert type(err) is cls
    assert (str(err), err.status, err.reason) == ("it broke", status, reason)


def test_conflict_on_update_is_not_already_exists() -> None:
    err = mapped(409, status_body(
        409, "Conflict", 'Operation cannot be fulfilled on leases.coordination.k8s.io "x": '
        "the object has been modified; please apply your changes to the latest version and "
        "try again"), verb="PUT")
    assert type(err) is errors.Conflict


def test_retry_after_comes_from_the_header() -> None:
    err = mapped(
        429, status_body(429, "TooManyRequests", "Too many requests, please try again later."),
        **{"Retry-After": "3"}, verb="GET")
    assert isinstance(err, errors.TooManyRequests)
    assert err.retry_after == 3.0


def test_retry_after_comes_from_status_details_without_a_header() -> None:
    err = mapped(
        503, status_body(503, "ServiceUnavailable", "not ready", retryAfterSeconds=2),
        verb="GET")
    assert isinstance(err, errors.ServerError)
    assert err.retry_after == 2.0


@pytest.mark.parametrize(("status", "content_type", "body", "context", "message"), [
    (404, "text/plain", "404 page not found", ErrorContext("custom.metrics.k8s.io", "pods", "*"),
     "the server could not find the requested resource (get pods.custom.metrics.k8s.io *)"),
    (404, "application/json", "{}", ErrorContext("external.metrics.k8s.io", "qps"),
     "the server could not find the requested resource (get qps.external.metrics.k8s.io)"),
    (500, "text/plain", "backend exploded", None,
     'an error on the server ("backend exploded") has prevented the request from succeeding'),
    (502, "application/octet-stream", "\x00", None,
     'an error on the server ("unknown") has prevented the request from succeeding'),
    (418, "text/plain", "teapot", None,
     "the server responded with the status code 418 but did not return more information"),
])
def test_bodies_that_are_not_status_get_client_go_generic_messages(
        status: int, content_type: str, body: str, context: ErrorContext | None,
        message: str) -> None:
    err = mapped(status, body, **{"Content-Type": content_type},
                                   verb="GET", context=context)
    assert str(err) == message


def test_an_answer_without_body_still_maps() -> None:
    err = mapped(403, None, verb="GET")
    assert type(err) is errors.Forbidden


# --- retry policy --------------------------------------------------------------------------


def test_backoff_is_exponential_capped_and_jittered() -> None:
    policy = RetryPolicy(attempts=10, initial=0.1, factor=2.0, cap=0.5)
    err = errors.ServerError("x", status=500)
    assert policy.delay(err, failures=1, jitter=0.0) == pytest.approx(0.05)
    assert policy.delay(err, failures=1, jitter=1.0) == pytest.approx(0.1)
    assert policy.delay(err, failures=3, jitter=0.0) == pytest.approx(0.2)
    assert policy.delay(err, failures=6, jitter=1.0) == pytest.approx(0.5)


def test_retry_after_is_honoured_exactly() -> None:
    err = errors.TooManyRequests("slow down", retry_after=4.0)
    assert RetryPolicy().delay(err, failures=1, jitter=0.9) == 4.0


def test_retry_after_beyond_the_cap_goes_back_to_the_caller() -> None:
    err = errors.TooManyRequests("slow down", retry_after=60.0)
    assert RetryPolicy(max_retry_after=10.0).delay(err, failures=1, jitter=0.0) is None


@pytest.mark.parametrize("err", [
    errors.NotFound("gone", status=404), errors.Conflict("stale", status=409),
    errors.Forbidden("no", status=403), errors.BadRequest("bad", status=400),
], ids=lambda e: type(e).__name__)
def test_only_transient_errors_are_retried(err: errors.KubeError) -> None:
    assert RetryPolicy().delay(err, failures=1, jitter=0.0) is None


def test_attempts_bound_the_retries() -> None:
    err = errors.ConnectionFailed("refused")
    policy = RetryPolicy(attempts=3)
    assert policy.delay(err, failures=2, jitter=0.0) is not None
    assert policy.delay(err, failures=3, jitter=0.0) is None


# --- MicroTime -----------------------------------------------------------------------------


@pytest.mark.parametrize(("moment", "text"), [
    (datetime(2024, 5, 1, 12, 0, 21, tzinfo=UTC), "2024-05-01T12:00:21.000000Z"),
    (datetime(2024, 5, 1, 12, 0, 21, 5, tzinfo=UTC), "2024-05-01T12:00:21.000005Z"),
    (datetime(2024, 5, 1, 14, 0, 21, 123456, tzinfo=timezone(timedelta(hours=2))),
     "2024-05-01T12:00:21.123456Z"),
])
def test_micro_time_has_six_fractional_digits_in_utc(moment: datetime, text: str) -> None:
    assert format_micro_time(moment) == text
    assert parse_micro_time(text) == moment


def test_micro_time_refuses_naive_datetimes() -> None:
    with pytest.raises(ValueError):
        format_micro_time(datetime(2024, 5, 1, 12, 0, 0))


@pytest.mark.parametrize("text", ["2024-05-01T12:00:21Z", "2024-05-01T12:00:21.5Z",
                                  "2024-05-01T14:00:21.500000+02:00"])
def test_parse_accepts_what_servers_send(text: str) -> None:
    assert parse_micro_time(text).replace(microsecond=0) == datetime(
        2024, 5, 1, 12, 0, 21, tzinfo=UTC)


# --- merge patch ---------------------------------------------------------------------------


def test_merge_patch_nulls_removed_fields_and_replaces_lists() -> None:
    old = {"currentReplicas": 3, "lastScaleTime": "t", "conditions": [{"type": "A"}],
           "history": {"recommendations": [1], "scaleUp": [2]}}
    new = {"currentReplicas": 4, "conditions": [{"type": "B"}],
           "history": {"recommendations": [1]}}
    assert merge_patch(old, new) == {
        "lastScaleTime": None, "currentReplicas": 4, "conditions": [{"type": "B"}],
        "history": {"scaleUp": None}}


def test_merge_patch_of_equal_documents_is_empty() -> None:
    assert merge_patch({"a": {"b": [1]}}, {"a": {"b": [1]}}) == {}


# --- bodies --------------------------------------------------------------------------------


def test_event_body_is_events_v1_with_microtime_and_a_note_within_one_kib() -> None:
    now = datetime(2024, 5, 1, 12, 0, 21, tzinfo=UTC)
    body = render_event(
        regarding=ObjectReference(api_version="metricscale.dev/v1alpha1", kind="Autoscaler",
                                  namespace="shop", name="web", uid="u-1"),
        event_type="Warning", reason="FailedGetScale", note="é" * 600, action="Scale", now=now,
        reporting_instance="pod-a")
    assert body["eventTime"] == "2024-05-01T12:00:21.000000Z"
    assert body["metadata"] == {"name": f"web.{int(now.timestamp()) * 10**9:x}",
                                "namespace": "shop"}
    assert body["reportingController"] == "metricscale.dev/autoscaler"
    assert body["regarding"] == {"apiVersion": "metricscale.dev/v1alpha1", "kind": "Autoscaler",
                                 "namespace": "shop", "name": "web", "uid": "u-1"}
    assert len(body["note"].encode()) <= 1024
    assert body["note"] == "é" * 512


def test_lease_spec_round_trips_through_the_wire_format() -> None:
    spec = LeaseSpec(holder_identity="a", lease_duration_seconds=15,
                     acquire_time=datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC),
                     renew_time=datetime(2024, 5, 1, 12, 0, 2, 500, tzinfo=UTC),
                     lease_transitions=2)
    wire = render_lease_spec(spec)
    assert wire["acquireTime"] == "2024-05-01T12:00:00.000000Z"
    assert wire["renewTime"] == "2024-05-01T12:00:02.000500Z"
    lease = parse_lease({"metadata": {"resourceVersion": "7"}, "spec": wire})
    assert (lease.spec, lease.resource_version) == (spec, "7")


def test_released_lease_renders_an_empty_holder() -> None:
    wire = render_lease_spec(LeaseSpec("", 1, None, None, 0))
    assert wire == {"holderIdentity": "", "leaseDurationSeconds": 1, "leaseTransitions": 0}


# --- mapping helpers -------------------------------------------------------------------------


@pytest.mark.parametrize(("api_version", "parsed"), [
    ("apps/v1", ("apps", "v1")), ("v1", ("", "v1")), ("", ("", "")),
    ("example.com/v1beta1", ("example.com", "v1beta1")),
])
def test_parse_group_version(api_version: str, parsed: tuple[str, str]) -> None:
    assert parse_group_version(api_version) == parsed


def test_bad_group_version_has_upstreams_message() -> None:
    with pytest.raises(errors.InvalidGroupVersion,
                       match="unexpected GroupVersion string: a/b/c"):
        parse_group_version("a/b/c")


def test_resource_paths_for_core_and_named_groups() -> None:
    deployments = ResourceMapping("apps", "v1", "deployments", "Deployment", namespaced=True)
    rcs = ResourceMapping("", "v1", "replicationcontrollers", "ReplicationController",
                          namespaced=True)
    assert deployments.path(namespace="shop", name="web", subresource="scale") == \
        "/apis/apps/v1/namespaces/shop/deployments/web/scale"
    assert rcs.path(namespace="shop", name="web", subresource="scale") == \
        "/api/v1/namespaces/shop/replicationcontrollers/web/scale"
    assert (deployments.group_resource, rcs.group_resource) == ("deployments.apps",
                                                                 "replicationcontrollers")
    assert rcs.gvr_string == "/v1, Resource=replicationcontrollers"


def test_reference_to_an_hpa_list_item_without_type_meta() -> None:
    item = {"metadata": {"name": "web", "namespace": "shop", "uid": "u", "resourceVersion": "9"}}
    ref = ObjectReference.from_object(item, api_version="autoscaling/v2",
                                      kind="HorizontalPodAutoscaler")
    assert ref.render() == {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                            "namespace": "shop", "name": "web", "uid": "u",
                            "resourceVersion": "9"}
    assert ObjectReference.from_object(item).kind == "Autoscaler"
