"""Fake kube-apiserver: paginated LISTs read one snapshot, an expired continue gets a replacement
token, and ListOptions mistakes are 422 with upstream's messages.

Pins apiserver/pkg/storage/etcd3/store.go (GetList at the continue token's revision;
handleCompactedErrorForPaging) and apimachinery/pkg/apis/meta/internalversion/validation
(ValidateListOptions).
"""

from __future__ import annotations

import base64
import json

from testbed.fakes.kube_api import FakeKubeAPI
from testbed.fakes.kube_http import KubeHTTPClient

CONFIGMAPS = "/api/v1/namespaces/demo/configmaps"


async def _configmaps(kube_http: KubeHTTPClient, *names: str) -> None:
    for name in names:
        await kube_http.post(CONFIGMAPS, {"metadata": {"name": name}, "data": {"v": "1"}})


async def test_later_pages_read_the_snapshot_of_the_first(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    await _configmaps(kube_http, "a", "b", "c", "d")
    first = (await kube_http.get(CONFIGMAPS, params={"limit": "2"})).json
    assert [i["metadata"]["name"] for i in first["items"]] == ["a", "b"]
    # After the first page: one object changes, one goes, one is added.
    await kube_http.patch(f"{CONFIGMAPS}/c", {"data": {"v": "2"}},
                          content_type="application/merge-patch+json")
    await kube_http.delete(f"{CONFIGMAPS}/d")
    await _configmaps(kube_http, "e")
    rest = (await kube_http.get(CONFIGMAPS, params={
        "limit": "10", "continue": first["metadata"]["continue"]})).json
    assert [(i["metadata"]["name"], i["data"]["v"]) for i in rest["items"]] == [
        ("c", "1"), ("d", "1")]
    assert rest["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]


async def test_an_expired_continue_is_410_with_a_token_to_go_on_inconsistently(
        fake_kube: FakeKubeAPI, kube_http: KubeHTTPClient) -> None:
    await _configmaps(kube_http, "a", "b", "c")
    first = (await kube_http.get(CONFIGMAPS, params={"limit": "1"})).json
    await _configmaps(kube_http, "d")
    fake_kube.compact()
    reply = await kube_http.get(CONFIGMAPS, params={"limit": "10",
                                                    "continue": first["metadata"]["continue"]})
    assert (reply.status, reply.json["reason"]) == (410, "Expired")
    assert reply.json["message"].startswith("The provided continue parameter is too old to "
                                            "display a consistent list result.")
    token = reply.json["metadata"]["continue"]
    decoded = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    assert decoded["rv"] == -1  # continue at the newest revision
    rest = (await kube_http.get(CONFIGMAPS, params={"limit": "10", "continue": token})).json
    assert [i["metadata"]["name"] for i in rest["items"]] == ["b", "c", "d"]


async def test_list_options_mistakes_are_invalid(kube_http: KubeHTTPClient) -> None:
    reply = await kube_http.get(CONFIGMAPS, params={"resourceVersionMatch": "NotOlderThan"})
    assert reply.status == 422
    assert reply.json["message"] == (
        'ListOptions.meta.k8s.io "" is invalid: resourceVersionMatch: Forbidden: '
        "resourceVersionMatch is forbidden unless resourceVersion is provided")
    exact_zero = await kube_http.get(CONFIGMAPS, params={"resourceVersion": "0",
                                                         "resourceVersionMatch": "Exact"})
    assert exact_zero.json["details"]["causes"] == [{
        "reason": "FieldValueForbidden", "field": "resourceVersionMatch",
        "message": 'Forbidden: resourceVersionMatch "exact" is forbidden for resourceVersion '
                   '"0"'}]
    unknown = await kube_http.get(CONFIGMAPS, params={"resourceVersion": "1",
                                                      "resourceVersionMatch": "Newest"})
    assert unknown.json["details"]["causes"][0]["message"] == (
        'Unsupported value: "Newest": supported values: "Exact", "NotOlderThan", ""')
    initial = await kube_http.get(CONFIGMAPS, params={"sendInitialEvents": "true"})
    assert initial.status == 422
