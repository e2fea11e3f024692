"""Authentication and authorization decisions, pinned rule by rule to the generic apiserver's."""

from __future__ import annotations

import json
from typing import Any

import pytest

from adapter.api.wire import internal_error, unauthorized
from adapter.auth.attributes import (
    RequestAttributes,
    RequestAttributesError,
    RequestPathError,
    decode_request_path,
    request_attributes,
)
from adapter.auth.authentication import (
    NO_CA,
    Authenticated,
    AuthenticationFailure,
    AuthMethod,
    ChainCheck,
    ChainVerdict,
    PeerCertificate,
    Unauthenticated,
    all_header_values,
    authenticate_certificate,
    authenticate_client_certificate,
    authenticate_front_proxy,
    extra_from_headers,
    extract_bearer_token,
    finish_authentication,
    first_header_value,
    read_token_review,
    strip_identity_headers,
    token_cache_key,
    token_review_body,
    unescape_extra_key,
    with_authenticated_group,
)
from adapter.auth.authorization import (
    Decision,
    ReviewStatus,
    authorize_without_review,
    decide_from_review,
    parse_always_allow_paths,
    read_subject_access_review,
    review_cache_key,
    review_ttl,
    should_cache_review,
    subject_access_review_body,
    subject_access_review_spec,
)
from adapter.auth.configuration import (
    AuthConfigError,
    AuthenticationConfig,
    RequestHeaderConfig,
    authentication_from_flags,
    merge_authentication_config,
    needs_cluster_lookup,
    parse_extension_apiserver_authentication,
)
from adapter.auth.reviews import (
    ReviewResponseError,
    TTLCache,
    should_retry_review,
)
from adapter.auth.status import (
    forbidden_message,
    forbidden_status,
)
from adapter.auth.users import (
    ANONYMOUS,
    UserInfo,
)
from metricscale.core.selectors import quote_go_string

CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
VERIFIED = ChainCheck(ChainVerdict.VERIFIED)
FAILED = ChainCheck(ChainVerdict.FAILED, "x509: certificate signed by unknown authority")
PROXY_CONFIG = RequestHeaderConfig(
    ca_pem=CA_PEM.encode(),
    allowed_names=("front-proxy-client",),
    username_headers=("X-Remote-User",),
    uid_headers=("X-Remote-Uid",),
    group_headers=("X-Remote-Group",),
    extra_headers_prefixes=("X-Remote-Extra-",),
)


def proxy_peer(*, cn: str = "front-proxy-client", request_header: ChainCheck = VERIFIED,
               client: ChainCheck = FAILED) -> PeerCertificate:
    return PeerCertificate(common_name=cn, organizations=(), request_header_ca=request_header,
                           client_ca=client, identifier="SN=1, SKID=, AKID=")


# ------------------------------------------------------------------------------- ConfigMap (§3.1)

FULL_CONFIGMAP = {
    "client-ca-file": CA_PEM,
    "requestheader-client-ca-file": CA_PEM,
    "requestheader-allowed-names": '["front-proxy-client"]',
    "requestheader-username-headers": '["X-Remote-User"]',
    "requestheader-group-headers": '["X-Remote-Group"]',
    "requestheader-extra-headers-prefix": '["X-Remote-Extra-"]',
    "requestheader-uid-headers": '["X-Remote-Uid"]',
}


def test_configmap_full_parses_every_key() -> None:
    config = parse_extension_apiserver_authentication(FULL_CONFIGMAP)
    assert config.client_ca_pem == CA_PEM.encode()
    assert config.request_header == PROXY_CONFIG


@pytest.mark.parametrize("value", [None, "", "null", "[]"])
def test_configmap_missing_empty_or_null_list_means_none(value: str | None) -> None:
    data = dict(FULL_CONFIGMAP)
    for key in ("requestheader-allowed-names", "requestheader-uid-headers",
                "requestheader-username-headers"):
        if value is None:
            del data[key]
        else:
            data[key] = value
    header = parse_extension_apiserver_authentication(data).request_header
    assert header is not None
    assert header.allowed_names == ()
    assert header.uid_headers == ()
    assert header.username_headers == ()


def test_configmap_without_requestheader_ca_ignores_the_header_keys() -> None:
    data = {k: v for k, v in FULL_CONFIGMAP.items() if k != "requestheader-client-ca-file"}
    config = parse_extension_apiserver_authentication(data)
    assert config.request_header is None
    assert config.client_ca_pem == CA_PEM.encode()


@pytest.mark.parametrize("ca", ["", "  \n"])
def test_configmap_blank_client_ca_means_no_client_ca(ca: str) -> None:
    config = parse_extension_apiserver_authentication({**FULL_CONFIGMAP, "client-ca-file": ca})
    assert config.client_ca_pem is None


def test_configmap_empty_data_configures_nothing() -> None:
    assert parse_extension_apiserver_authentication({}) == AuthenticationConfig()


@pytest.mark.parametrize("value", ["X-Remote-User", "{", '{"a": 1}', "[1]", '"x"', '["a", null]'])
def test_configmap_list_that_is_not_a_json_string_array_is_rejected(value: str) -> None:
    with pytest.raises(AuthConfigError, match="requestheader-username-headers"):
        parse_extension_apiserver_authentication(
            {**FULL_CONFIGMAP, "requestheader-username-headers": value})


@pytest.mark.parametrize("key", ["requestheader-extra-headers-prefix",
                                 "requestheader-group-headers"])
def test_configmap_empty_header_name_is_rejected_not_matched_against_everything(key: str) -> None:
    with pytest.raises(AuthConfigError, match="empty header name"):
        parse_extension_apiserver_authentication({**FULL_CONFIGMAP, key: '["  "]'})


def test_configmap_header_names_are_trimmed() -> None:
    config = parse_extension_apiserver_authentication(
        {**FULL_CONFIGMAP, "requestheader-group-headers": '[" X-Remote-Group "]'})
    assert config.request_header is not None
    assert config.request_header.group_headers == ("X-Remote-Group",)


def test_configmap_concatenated_ca_bundle_is_kept_whole() -> None:
    config = parse_extension_apiserver_authentication(
        {"requestheader-client-ca-file": CA_PEM + CA_PEM})
    assert config.request_header is not None
    assert config.request_header.ca_pem == (CA_PEM + CA_PEM).encode()


# ------------------------------------------------------------------------------------------ flags

def test_flags_default_header_names_are_the_generic_apiservers() -> None:
    config = authentication_from_flags(requestheader_client_ca_pem=b"pem")
    assert config.request_header == RequestHeaderConfig(
        ca_pem=b"pem", allowed_names=(), username_headers=("x-remote-user",), uid_headers=(),
        group_headers=("x-remote-group",), extra_headers_prefixes=("x-remote-extra-",))


def test_flags_header_names_without_a_requestheader_ca_configure_no_front_proxy() -> None:
    config = authentication_from_flags(requestheader_username_headers=("X-User",))
    assert config.request_header is None


def test_flags_override_the_cluster_configmap_part_by_part() -> None:
    cluster = parse_extension_apiserver_authentication(FULL_CONFIGMAP)
    flags = authentication_from_flags(client_ca_pem=b"flag-ca")
    merged = merge_authentication_config(flags, cluster)
    assert merged.client_ca_pem == b"flag-ca"
    assert merged.request_header == cluster.request_header
    assert merge_authentication_config(flags, None) == flags


@pytest.mark.parametrize(("flags", "skip", "expected"), [
    (AuthenticationConfig(), False, True),
    (AuthenticationConfig(client_ca_pem=b"x"), False, True),
    (AuthenticationConfig(client_ca_pem=b"x", request_header=PROXY_CONFIG), False, False),
    (AuthenticationConfig(), True, False),
])
def test_cluster_lookup_needed_only_when_a_ca_is_missing_and_not_skipped(
        flags: AuthenticationConfig, skip: bool, expected: bool) -> None:
    assert needs_cluster_lookup(flags, skip_lookup=skip) is expected


# ------------------------------------------------------------------------- headers (§3.2 1.3-1.5)

def test_groups_are_every_value_of_every_header_never_split_on_commas() -> None:
    headers = [("X-Remote-Group", "a, b"), ("x-remote-group", "c"), ("X-Remote-Group", "")]
    assert all_header_values(headers, ["X-Remote-Group"]) == ("a, b", "c")


def test_groups_follow_the_order_of_the_configured_headers() -> None:
    headers = [("X-G2", "two"), ("X-G1", "one")]
    assert all_header_values(headers, ["X-G1", "X-G2"]) == ("one", "two")


@pytest.mark.parametrize(("headers", "expected"), [
    ([("X-Remote-User", "alice")], "alice"),
    ([("x-remote-user", "alice")], "alice"),
    ([("X-Other-User", "bob")], "bob"),
    ([("X-Remote-User", ""), ("X-Other-User", "bob")], "bob"),
    ([("X-Other-User", "bob"), ("X-Remote-User", "alice")], "alice"),
    # Go's Header.Get looks at the first value only.
    ([("X-Remote-User", ""), ("X-Remote-User", "alice")], ""),
    ([], ""),
])
def test_username_is_the_first_non_empty_configured_header(
        headers: list[tuple[str, str]], expected: str) -> None:
    assert first_header_value(headers, ["X-Remote-User", "X-Other-User"]) == expected


def test_extra_key_is_lower_cased_then_percent_decoded() -> None:
    headers = [("X-Remote-Extra-Authentication.kubernetes.io%2fcredential-Id", "JTI=abc")]
    assert extra_from_headers(headers, ["X-Remote-Extra-"]) == {
        "authentication.kubernetes.io/credential-id": ("JTI=abc",)}


@pytest.mark.parametrize(("encoded", "decoded"), [
    ("scopes", "scopes"),
    ("a%2fb", "a/b"),
    ("%41", "A"),  # decoded after lower-casing, so an escaped capital survives
    ("a+b", "a+b"),  # path unescaping keeps '+'
    ("100%", "100%"),  # malformed: kept as is
    ("a%zzb", "a%zzb"),
    ("a%2", "a%2"),
    ("caf%c3%a9", "café"),
    ("%ff", "\ufffd"),  # invalid UTF-8 becomes U+FFFD, as Go's JSON encoder makes it
])
def test_extra_key_unescaping_matches_go_path_unescape(encoded: str, decoded: str) -> None:
    assert unescape_extra_key(encoded) == decoded


def test_extra_undecodable_key_is_kept_lower_cased() -> None:
    headers = [("X-Remote-Extra-Bad%ZZKey", "v")]
    assert extra_from_headers(headers, ["x-remote-extra-"]) == {"bad%zzkey": ("v",)}


def test_extra_collects_all_values_including_empty_ones() -> None:
    headers = [("X-Remote-Extra-Scopes", "a"), ("x-remote-extra-scopes", ""),
               ("X-Remote-Extra-Other", "o"), ("X-Remote-Extra-Scopes", "b")]
    assert extra_from_headers(headers, ["X-Remote-Extra-"]) == {
        "scopes": ("a", "", "b"), "other": ("o",)}


def test_identity_headers_are_stripped_and_others_kept() -> None:
    headers = [("X-Remote-User", "u"), ("x-remote-group", "g"), ("X-Remote-Uid", "1"),
               ("X-Remote-Extra-Foo", "f"), ("Accept", "application/json"), ("X-Remote", "k")]
    assert strip_identity_headers(headers, PROXY_CONFIG) == (
        ("Accept", "application/json"), ("X-Remote", "k"))


# --------------------------------------------------------------------------- front proxy (§3.2 1)

HPA_HEADERS = [
    ("X-Remote-User", "system:serviceaccount:kube-system:horizontal-pod-autoscaler"),
    ("X-Remote-Group", "system:serviceaccounts"),
    ("X-Remote-Group", "system:serviceaccounts:kube-system"),
    ("X-Remote-Group", "system:authenticated"),
    ("X-Remote-Extra-Authentication.kubernetes.io%2fcredential-Id", "JTI=abc"),
    ("X-Remote-Uid", "uid-1"),
]


def test_front_proxy_with_verified_allowed_cert_trusts_the_headers() -> None:
    result = authenticate_front_proxy(config=PROXY_CONFIG, peer=proxy_peer(), headers=HPA_HEADERS)
    assert result == Authenticated(
        UserInfo(
            name="system:serviceaccount:kube-system:horizontal-pod-autoscaler",
            uid="uid-1",
            groups=("system:serviceaccounts", "system:serviceaccounts:kube-system",
                    "system:authenticated"),
            extra={"authentication.kubernetes.io/credential-id": ("JTI=abc",)},
        ),
        AuthMethod.FRONT_PROXY,
    )


@pytest.mark.parametrize(("peer", "config", "expected"), [
    pytest.param(None, PROXY_CONFIG, Unauthenticated(), id="no-cert-headers-ignored"),
    pytest.param(proxy_peer(), None, Unauthenticated(), id="no-front-proxy-configured"),
    pytest.param(proxy_peer(request_header=NO_CA), PROXY_CONFIG, Unauthenticated(),
                 id="no-request-header-ca"),
    pytest.param(proxy_peer(request_header=FAILED), PROXY_CONFIG,
                 Unauthenticated(("x509: certificate signed by unknown authority",)),
                 id="cert-from-another-ca"),
    pytest.param(proxy_peer(cn="intruder"), PROXY_CONFIG,
                 Unauthenticated(("x509: subject with cn=intruder is not in the allowed list",)),
                 id="cn-not-allowed"),
])
def test_front_proxy_refusals(peer: PeerCertificate | None, config: RequestHeaderConfig | None,
                              expected: Unauthenticated) -> None:
    assert authenticate_front_proxy(config=config, peer=peer, headers=HPA_HEADERS) == expected


def test_front_proxy_empty_allowed_names_accepts_any_verified_cn() -> None:
    config = RequestHeaderConfig(ca_pem=b"x", allowed_names=())
    result = authenticate_front_proxy(config=config, peer=proxy_peer(cn="anything"),
                                      headers=[("x-remote-user", "u")])
    assert isinstance(result, Authenticated)
    assert result.user.name == "u"


def test_front_proxy_cert_without_username_header_is_not_an_identity() -> None:
    result = authenticate_front_proxy(config=PROXY_CONFIG, peer=proxy_peer(),
                                      headers=[("X-Remote-Group", "system:masters")])
    assert result == Unauthenticated()


def test_front_proxy_without_uid_headers_configured_sets_no_uid() -> None:
    config = RequestHeaderConfig(ca_pem=b"x", username_headers=("X-Remote-User",))
    result = authenticate_front_proxy(config=config, peer=proxy_peer(cn="x"), headers=HPA_HEADERS)
    assert isinstance(result, Authenticated)
    assert result.user.uid == ""


# -------------------------------------------------------------------- client certificate (§3.2 2)

def client_peer(check: ChainCheck, cn: str = "jane") -> PeerCertificate:
    return PeerCertificate(common_name=cn, organizations=("dev", "ops"),
                           request_header_ca=FAILED, client_ca=check,
                           identifier="SN=7, SKID=AA, AKID=BB")


@pytest.mark.parametrize(("peer", "expected"), [
    (None, Unauthenticated()),
    (client_peer(VERIFIED), Authenticated(UserInfo(name="jane", groups=("dev", "ops")),
                                          AuthMethod.CLIENT_CERTIFICATE)),
    (client_peer(NO_CA), Unauthenticated()),
    (client_peer(VERIFIED, cn=""), Unauthenticated()),
    (client_peer(FAILED), Unauthenticated((
        "verifying certificate SN=7, SKID=AA, AKID=BB failed: "
        "x509: certificate signed by unknown authority",))),
])
def test_client_certificate_cn_is_user_and_o_are_groups(
        peer: PeerCertificate | None, expected: object) -> None:
    assert authenticate_client_certificate(peer) == expected


def test_client_ca_cert_cannot_assert_remote_user_headers() -> None:
    config = AuthenticationConfig(client_ca_pem=b"x", request_header=PROXY_CONFIG)
    peer = client_peer(VERIFIED)
    result = authenticate_certificate(config=config, peer=peer, headers=HPA_HEADERS)
    assert result == Authenticated(UserInfo(name="jane", groups=("dev", "ops")),
                                   AuthMethod.CLIENT_CERTIFICATE)


def test_front_proxy_cert_without_user_header_fails_when_client_ca_differs() -> None:
    config = AuthenticationConfig(client_ca_pem=b"x", request_header=PROXY_CONFIG)
    cert = authenticate_certificate(config=config, peer=proxy_peer(), headers=[])
    final = finish_authentication(cert)
    assert isinstance(final, AuthenticationFailure)


def test_front_proxy_cert_without_user_header_and_no_client_ca_is_anonymous() -> None:
    config = AuthenticationConfig(request_header=PROXY_CONFIG)
    cert = authenticate_certificate(config=config, peer=proxy_peer(client=NO_CA), headers=[])
    assert finish_authentication(cert) == Authenticated(ANONYMOUS, AuthMethod.ANONYMOUS)


# -------------------------------------------------------------------------- bearer token (§3.2 3)

@pytest.mark.parametrize(("value", "token"), [
    ("Bearer abc", "abc"),
    ("bearer abc", "abc"),
    ("BEARER abc", "abc"),
    ("  Bearer abc  ", "abc"),
    ("Bearer abc def", "abc"),
    ("Bearer  abc", None),  # the space before the token makes it empty
    ("Bearer", None),
    ("Bearer ", None),
    ("Basic dXNlcjpwdw==", None),
    ("", None),
])
def test_bearer_token_extraction(value: str, token: str | None) -> None:
    assert extract_bearer_token([("Authorization", value)]) == token


def test_bearer_token_absent_header() -> None:
    assert extract_bearer_token([("Accept", "*/*")]) is None


def test_token_review_body_has_no_audiences() -> None:
    assert token_review_body("t0k") == {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
        "spec": {"token": "t0k"}}


def test_token_cache_key_never_contains_the_token() -> None:
    key = token_cache_key("secret-token-value")
    assert "secret-token-value" not in key
    assert key == token_cache_key("secret-token-value")
    assert key != token_cache_key("other")


def test_token_review_authenticated_user_is_read_whole() -> None:
    body = {"status": {"authenticated": True, "user": {
        "username": "system:serviceaccount:shop:alice", "uid": "u-1",
        "groups": ["system:serviceaccounts"], "extra": {"k": ["v1", "v2"]}}}}
    assert read_token_review(body) == Authenticated(
        UserInfo(name="system:serviceaccount:shop:alice", uid="u-1",
                 groups=("system:serviceaccounts",), extra={"k": ("v1", "v2")}),
        AuthMethod.TOKEN)


@pytest.mark.parametrize(("status", "error"), [
    ({"authenticated": False, "error": "token expired"}, "token expired"),
    ({"authenticated": False}, "invalid bearer token"),
    ({}, "invalid bearer token"),
])
def test_token_review_not_authenticated_is_an_error(status: dict[str, Any], error: str) -> None:
    assert read_token_review({"status": status}) == Unauthenticated((error,))


@pytest.mark.parametrize("body", [
    {"status": "yes"},
    {"status": []},
    {"status": {"authenticated": True, "user": []}},
    {"status": {"authenticated": True, "user": {"username": "u", "groups": "g"}}},
    {"status": {"authenticated": True, "user": {"username": 5}}},
])
def test_token_review_malformed_answer_is_rejected(body: dict[str, Any]) -> None:
    with pytest.raises(ReviewResponseError):
        read_token_review(body)


# ------------------------------------------------------------------------------- the chain (§3.2)

def test_no_credentials_at_all_is_anonymous() -> None:
    assert finish_authentication(Unauthenticated(), Unauthenticated()) == Authenticated(
        UserInfo(name="system:anonymous", groups=("system:unauthenticated",)),
        AuthMethod.ANONYMOUS)


def test_any_error_without_a_later_success_is_a_failure_not_anonymous() -> None:
    result = finish_authentication(Unauthenticated(("bad cert",)), Unauthenticated(),
                                   Unauthenticated(("invalid bearer token",)))
    assert result == AuthenticationFailure(("bad cert", "invalid bearer token"))


def test_a_later_success_wins_over_earlier_errors() -> None:
    token_user = Authenticated(UserInfo(name="bob"), AuthMethod.TOKEN)
    result = finish_authentication(Unauthenticated(("bad cert",)), token_user)
    assert result == Authenticated(UserInfo(name="bob", groups=("system:authenticated",)),
                                   AuthMethod.TOKEN)


def test_section_14_case_4_groups_with_commas() -> None:
    headers = [("X-Remote-User", "u"), ("X-Remote-Group", "a, b"), ("X-Remote-Group", "c")]
    config = AuthenticationConfig(request_header=PROXY_CONFIG)
    result = finish_authentication(
        authenticate_certificate(config=config, peer=proxy_peer(), headers=headers))
    assert isinstance(result, Authenticated)
    assert result.user.groups == ("a, b", "c", "system:authenticated")


def test_spoofed_remote_user_without_certificate_is_anonymous() -> None:
    config = AuthenticationConfig(client_ca_pem=b"x", request_header=PROXY_CONFIG)
    result = finish_authentication(authenticate_certificate(
        config=config, peer=None, headers=[("X-Remote-User", "system:admin"),
                                           ("X-Remote-Group", "system:masters")]))
    assert result == Authenticated(ANONYMOUS, AuthMethod.ANONYMOUS)


@pytest.mark.parametrize(("user", "groups"), [
    (UserInfo(name="u"), ("system:authenticated",)),
    (UserInfo(name="u", groups=("g",)), ("g", "system:authenticated")),
    (UserInfo(name="u", groups=("system:authenticated", "g")), ("system:authenticated", "g")),
    (UserInfo(name="u", groups=("system:unauthenticated",)), ("system:unauthenticated",)),
    (UserInfo(name="system:anonymous", groups=("x",)), ("x",)),
])
def test_authenticated_group_is_added_once(user: UserInfo, groups: tuple[str, ...]) -> None:
    assert with_authenticated_group(user).groups == groups


# ---------------------------------------------------------------------- request attributes (§4.2)

def res(*, verb: str, path: str, group: str, version: str, namespace: str = "",
        resource: str = "", subresource: str = "", name: str = "", parts: tuple[str, ...] = (),
        prefix: str = "apis") -> RequestAttributes:
    return RequestAttributes(verb=verb, path=path, is_resource_request=True, api_prefix=prefix,
                             api_group=group, api_version=version, namespace=namespace,
                             resource=resource, subresource=subresource, name=name, parts=parts)


CM = "custom.metrics.k8s.io"
EM = "external.metrics.k8s.io"

ATTRIBUTE_ROWS: list[tuple[str, str, list[tuple[str, str]], RequestAttributes]] = [
    ("GET", f"/apis/{CM}/v1beta2/namespaces/shop/pods/*/http_requests",
     [("labelSelector", "app=web")],
     res(verb="get", path=f"/apis/{CM}/v1beta2/namespaces/shop/pods/*/http_requests", group=CM,
         version="v1beta2", namespace="shop", resource="pods", subresource="http_requests",
         name="*", parts=("pods", "*", "http_requests"))),
    ("GET", f"/apis/{CM}/v1beta2/namespaces/shop/pods/web-0/http_requests", [],
     res(verb="get", path=f"/apis/{CM}/v1beta2/namespaces/shop/pods/web-0/http_requests",
         group=CM, version="v1beta2", namespace="shop", resource="pods",
         subresource="http_requests", name="web-0", parts=("pods", "web-0", "http_requests"))),
    ("GET", f"/apis/{CM}/v1beta1/namespaces/shop/deployments.apps/web/rps", [],
     res(verb="get", path=f"/apis/{CM}/v1beta1/namespaces/shop/deployments.apps/web/rps",
         group=CM, version="v1beta1", namespace="shop", resource="deployments.apps",
         subresource="rps", name="web", parts=("deployments.apps", "web", "rps"))),
    ("GET", f"/apis/{CM}/v1beta2/nodes/node-1/temp", [],
     res(verb="get", path=f"/apis/{CM}/v1beta2/nodes/node-1/temp", group=CM, version="v1beta2",
         resource="nodes", subresource="temp", name="node-1", parts=("nodes", "node-1", "temp"))),
    ("GET", f"/apis/{CM}/v1beta2/nodes/*/temp", [],
     res(verb="get", path=f"/apis/{CM}/v1beta2/nodes/*/temp", group=CM, version="v1beta2",
         resource="nodes", subresource="temp", name="*", parts=("nodes", "*", "temp"))),
    ("GET", f"/apis/{CM}/v1beta2/namespaces/shop/metrics/queue_length", [],
     res(verb="get", path=f"/apis/{CM}/v1beta2/namespaces/shop/metrics/queue_length", group=CM,
         version="v1beta2", namespace="shop", resource="metrics", name="queue_length",
         parts=("metrics", "queue_length"))),
    ("GET", f"/apis/{EM}/v1beta1/namespaces/shop/queue_messages_ready",
     [("labelSelector", "queue=orders")],
     res(verb="list", path=f"/apis/{EM}/v1beta1/namespaces/shop/queue_messages_ready", group=EM,
         version="v1beta1", namespace="shop", resource="queue_messages_ready",
         parts=("queue_messages_ready",))),
    ("GET", f"/apis/{CM}/v1beta2", [], RequestAttributes(verb="get", path=f"/apis/{CM}/v1beta2")),
    ("GET", f"/apis/{CM}", [], RequestAttributes(verb="get", path=f"/apis/{CM}")),
    ("GET", "/apis", [], RequestAttributes(verb="get", path="/apis")),
    ("GET", "/openapi/v2", [], RequestAttributes(verb="get", path="/openapi/v2")),
    ("GET", "/openapi/v3/apis/custom.metrics.k8s.io/v1beta2", [],
     RequestAttributes(verb="get", path="/openapi/v3/apis/custom.metrics.k8s.io/v1beta2")),
    ("GET", "/version", [], RequestAttributes(verb="get", path="/version")),
    ("GET", "/metrics", [], RequestAttributes(verb="get", path="/metrics")),
    ("GET", "/livez", [], RequestAttributes(verb="get", path="/livez")),
    ("HEAD", "/readyz", [], RequestAttributes(verb="head", path="/readyz")),
    ("POST", "/healthz", [], RequestAttributes(verb="post", path="/healthz")),
]


@pytest.mark.parametrize(("method", "path", "query", "expected"), ATTRIBUTE_ROWS,
                         ids=[row[1] for row in ATTRIBUTE_ROWS])
def test_request_attributes_table_of_section_4_2(
        method: str, path: str, query: list[tuple[str, str]], expected: RequestAttributes) -> None:
    assert request_attributes(method=method, path=path, query=query) == expected


@pytest.mark.parametrize(("method", "path", "query", "verb", "name"), [
    ("GET", f"/apis/{EM}/v1beta1/namespaces/shop/m", [("watch", "true")], "watch", ""),
    ("GET", f"/apis/{EM}/v1beta1/namespaces/shop/m", [("watch", "1")], "watch", ""),
    ("GET", f"/apis/{EM}/v1beta1/namespaces/shop/m", [("watch", "")], "watch", ""),
    ("GET", f"/apis/{EM}/v1beta1/namespaces/shop/m", [("watch", "False")], "list", ""),
    ("GET", f"/apis/{EM}/v1beta1/namespaces/shop/m", [("watch", "0")], "list", ""),
    ("GET", f"/apis/{EM}/v1beta1/namespaces/shop/m",
     [("fieldSelector", "metadata.name=foo")], "list", "foo"),
    ("GET", f"/apis/{EM}/v1beta1/namespaces/shop/m",
     [("fieldSelector", "spec.x=1,metadata.name==foo")], "list", "foo"),
    ("GET", f"/apis/{EM}/v1beta1/namespaces/shop/m",
     [("fieldSelector", "metadata.name!=foo")], "list", ""),
    ("GET", f"/apis/{EM}/v1beta1/namespaces/shop/m",
     [("fieldSelector", "metadata.name=a/b")], "list", ""),
    ("GET", f"/apis/{EM}/v1beta1/namespaces/shop/m",
     [("fieldSelector", "metadata.name=..")], "list", ""),
    ("GET", f"/apis/{EM}/v1beta1/namespaces/shop/m",
     [("fieldSelector", "metadata.name=a\\,b")], "list", "a,b"),
    ("GET", f"/apis/{EM}/v1beta1/namespaces/shop/m",
     [("fieldSelector", "metadata.name=a\\xb")], "list", ""),
    ("GET", f"/apis/{EM}/v1beta1/namespaces/shop/m", [("fieldSelector", "junk")], "list", ""),
    ("POST", f"/apis/{CM}/v1beta2/namespaces/shop/pods/*/x", [], "create", "*"),
    ("PUT", f"/apis/{CM}/v1beta2/namespaces/shop/pods/a/x", [], "update", "a"),
    ("PATCH", f"/apis/{CM}/v1beta2/namespaces/shop/pods/a/x", [], "patch", "a"),
    ("DELETE", f"/apis/{CM}/v1beta2/namespaces/shop/pods/a", [], "delete", "a"),
    ("DELETE", f"/apis/{CM}/v1beta2/namespaces/shop/pods", [], "deletecollection", ""),
    ("OPTIONS", f"/apis/{CM}/v1beta2/namespaces/shop/pods/a", [], "", "a"),
    ("HEAD", f"/apis/{CM}/v1beta2/namespaces/shop/pods/a/x", [], "get", "a"),
])
def test_request_verbs(method: str, path: str, query: list[tuple[str, str]], verb: str,
                       name: str) -> None:
    attributes = request_attributes(method=method, path=path, query=query)
    assert (attributes.verb, attributes.name) == (verb, name)


def test_namespace_status_subresource_is_not_a_namespaced_resource() -> None:
    attributes = request_attributes(method="GET", path="/api/v1/namespaces/shop/status")
    assert attributes == res(verb="get", path="/api/v1/namespaces/shop/status", group="",
                             version="v1", namespace="shop", resource="namespaces", name="shop",
                             subresource="status", prefix="api",
                             parts=("namespaces", "shop", "status"))


def test_legacy_api_prefix_has_no_group() -> None:
    attributes = request_attributes(method="GET", path="/api/v1/pods")
    assert (attributes.api_group, attributes.api_version, attributes.resource,
            attributes.verb) == ("", "v1", "pods", "list")


def test_watch_path_prefix_sets_the_verb() -> None:
    attributes = request_attributes(method="GET", path=f"/apis/{CM}/v1beta2/watch/pods")
    assert (attributes.verb, attributes.resource) == ("watch", "pods")


def test_bare_special_verb_cannot_be_resolved() -> None:
    with pytest.raises(RequestAttributesError):
        request_attributes(method="GET", path=f"/apis/{CM}/v1beta2/watch")


def test_inner_empty_segments_are_kept_as_upstream_does() -> None:
    attributes = request_attributes(method="GET", path=f"/apis/{CM}//v1beta2/pods")
    assert (attributes.api_group, attributes.api_version, attributes.resource) == (
        CM, "", "v1beta2")


def test_outer_slashes_are_ignored() -> None:
    attributes = request_attributes(method="GET", path=f"/apis/{CM}/v1beta2/nodes/n/temp/")
    assert (attributes.name, attributes.subresource) == ("n", "temp")


@pytest.mark.parametrize(("raw", "decoded"), [
    (f"/apis/{CM}/v1beta2/namespaces/shop/pods/%2A/http_requests",
     f"/apis/{CM}/v1beta2/namespaces/shop/pods/*/http_requests"),
    (f"/apis/{CM}/v1beta2/nodes/n/a%7Cb", f"/apis/{CM}/v1beta2/nodes/n/a|b"),
    ("/livez", "/livez"),
    ("/", "/"),
    ("/x/caf%C3%A9", "/x/café"),
    ("/x/...", "/x/..."),
    ("/x/.hidden", "/x/.hidden"),
])
def test_request_path_is_decoded_like_go(raw: str, decoded: str) -> None:
    assert decode_request_path(raw) == decoded


@pytest.mark.parametrize("raw", [
    "/apis/g/v/namespaces/shop/pods/a%2Fb/m",
    "/apis/g/v/namespaces/shop/pods/a%2fb/m",
    "/apis/g/v/namespaces/shop/pods/../../kube-system/pods/x/m",
    "/apis/g/v/namespaces/shop/pods/%2E%2E/m",
    "/apis/g/v/./namespaces",
    "/apis/g/v/x/..",
    "/x/%00",
    "/x/%zz",
    "/x/%2",
    "/x/%ff",
    "relative",
])
def test_ambiguous_request_paths_are_refused(raw: str) -> None:
    with pytest.raises(RequestPathError):
        decode_request_path(raw)


# ------------------------------------------------------------------------------ SAR bodies (§4.3)

def test_sar_body_for_the_hpa_pods_request_is_byte_equal_to_section_4_3() -> None:
    user = UserInfo(
        name="system:serviceaccount:kube-system:horizontal-pod-autoscaler",
        uid="…",
        groups=("system:serviceaccounts", "system:serviceaccounts:kube-system",
                "system:authenticated"),
        extra={"authentication.kubernetes.io/credential-id": ("JTI=…",)},
    )
    attributes = request_attributes(
        method="GET", path=f"/apis/{CM}/v1beta2/namespaces/shop/pods/*/http_requests",
        query=[("labelSelector", "app=web")])
    expected = json.loads("""{
      "kind": "SubjectAccessReview",
      "apiVersion": "authorization.k8s.io/v1",
      "metadata": {"creationTimestamp": null},
      "spec": {
        "resourceAttributes": {
          "namespace": "shop",
          "verb": "get",
          "group": "custom.metrics.k8s.io",
          "version": "v1beta2",
          "resource": "pods",
          "subresource": "http_requests",
          "name": "*"
        },
        "user": "system:serviceaccount:kube-system:horizontal-pod-autoscaler",
        "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"],
        "extra": {"authentication.kubernetes.io/credential-id": ["JTI=…"]},
        "uid": "…"
      },
      "status": {"allowed": false}
    }""")  # noqa: E501 (verbatim from the contract)
    body = subject_access_review_body(user, attributes)
    assert body == expected
    # Key order too: the same bytes as the Go server's encoder (which sorts map keys).
    assert json.dumps(body) == json.dumps(expected)


def test_sar_spec_for_an_external_metric_omits_the_selector_and_empty_fields() -> None:
    user = UserInfo(name="bob", groups=("devs", "system:authenticated"))
    attributes = request_attributes(
        method="GET", path=f"/apis/{EM}/v1beta1/namespaces/shop/queue_messages_ready",
        query=[("labelSelector", "queue=orders")])
    assert json.dumps(subject_access_review_spec(user, attributes)) == json.dumps({
        "resourceAttributes": {"namespace": "shop", "verb": "list", "group": EM,
                               "version": "v1beta1", "resource": "queue_messages_ready"},
        "user": "bob", "groups": ["devs", "system:authenticated"]})


def test_sar_spec_for_a_non_resource_path() -> None:
    user = with_authenticated_group(UserInfo(name="system:kube-aggregator"))
    attributes = request_attributes(method="GET", path=f"/apis/{CM}/v1beta1")
    assert json.dumps(subject_access_review_spec(user, attributes)) == json.dumps({
        "nonResourceAttributes": {"path": "/apis/custom.metrics.k8s.io/v1beta1", "verb": "get"},
        "user": "system:kube-aggregator", "groups": ["system:authenticated"]})


def test_sar_cluster_scoped_request_omits_the_namespace() -> None:
    attributes = request_attributes(method="GET", path=f"/apis/{CM}/v1beta2/nodes/*/temp")
    spec = subject_access_review_spec(UserInfo(name="u"), attributes)
    assert "namespace" not in spec["resourceAttributes"]


def test_review_cache_key_is_the_json_of_the_spec_with_sorted_extra() -> None:
    attributes = request_attributes(method="GET", path="/metrics")
    one = UserInfo(name="u", extra={"b": ("1",), "a": ("2",)})
    two = UserInfo(name="u", extra={"a": ("2",), "b": ("1",)})
    key = review_cache_key(subject_access_review_spec(one, attributes))
    assert key == review_cache_key(subject_access_review_spec(two, attributes))
    assert json.loads(key) == subject_access_review_spec(one, attributes)
    assert key.index('"a"') < key.index('"b"')


def test_review_cache_key_differs_by_user_group_and_attributes() -> None:
    attributes = request_attributes(method="GET", path="/metrics")
    keys = {
        review_cache_key(subject_access_review_spec(UserInfo(name="u"), attributes)),
        review_cache_key(subject_access_review_spec(UserInfo(name="v"), attributes)),
        review_cache_key(subject_access_review_spec(UserInfo(name="u", groups=("g",)),
                                                    attributes)),
        review_cache_key(subject_access_review_spec(
            UserInfo(name="u"), request_attributes(method="GET", path="/version"))),
    }
    assert len(keys) == 4


@pytest.mark.parametrize(("name_length", "cached"), [(100, True), (10_000, False)])
def test_oversized_attributes_are_not_cached(name_length: int, cached: bool) -> None:
    attributes = request_attributes(
        method="GET", path=f"/apis/{CM}/v1beta2/namespaces/shop/pods/{'x' * name_length}/m")
    assert should_cache_review(attributes) is cached


# --------------------------------------------------------------- SAR answers and the union (§4.1)

@pytest.mark.parametrize(("status", "decision", "error"), [
    ({"allowed": True}, Decision.ALLOW, ""),
    ({"allowed": False, "denied": True, "reason": "no"}, Decision.DENY, ""),
    ({"allowed": False}, Decision.NO_OPINION, ""),
    ({}, Decision.NO_OPINION, ""),
    ({"allowed": True, "denied": True}, Decision.DENY,
     "webhook subject access review returned both allow and deny response"),
])
def test_review_answer_interpretation(status: dict[str, Any], decision: Decision,
                                      error: str) -> None:
    result = decide_from_review(read_subject_access_review({"status": status}))
    assert (result.decision, result.error) == (decision, error)


def test_review_reason_is_carried_to_the_decision() -> None:
    status = read_subject_access_review({"status": {"allowed": False, "reason": "RBAC: nope",
                                                    "evaluationError": "e"}})
    assert status == ReviewStatus(allowed=False, denied=False, reason="RBAC: nope",
                                  evaluation_error="e")
    assert decide_from_review(status).reason == "RBAC: nope"


@pytest.mark.parametrize("body", [{"status": []}, {"status": {"allowed": "true"}},
                                  {"status": {"allowed": True, "reason": 3}}])
def test_malformed_review_answer_is_rejected(body: dict[str, Any]) -> None:
    with pytest.raises(ReviewResponseError):
        read_subject_access_review(body)


def test_review_ttls_for_allowed_and_denied() -> None:
    assert review_ttl(ReviewStatus(allowed=True), authorized_ttl=5, unauthorized_ttl=7) == 5
    assert review_ttl(ReviewStatus(allowed=False), authorized_ttl=5, unauthorized_ttl=7) == 7
    assert review_ttl(ReviewStatus(allowed=True)) == 10


@pytest.mark.parametrize(("code", "retry"), [(None, True), (429, True), (500, True), (503, True),
                                             (400, False), (403, False), (404, False)])
def test_only_retryable_review_failures_are_retried(code: int | None, retry: bool) -> None:
    assert should_retry_review(code) is retry


ALWAYS = parse_always_allow_paths(["/healthz", "/readyz", "/livez"])


@pytest.mark.parametrize(("user", "method", "path", "decision"), [
    (UserInfo(name="system:kube-aggregator", groups=("system:masters",)), "GET",
     f"/apis/{CM}/v1beta2/namespaces/a/pods/*/m", Decision.ALLOW),
    (ANONYMOUS, "GET", "/livez", Decision.ALLOW),
    (ANONYMOUS, "GET", "/readyz", Decision.ALLOW),
    (ANONYMOUS, "GET", "/healthz", Decision.ALLOW),
    (ANONYMOUS, "GET", "/livez/ping", Decision.NO_OPINION),
    (ANONYMOUS, "GET", "/livezz", Decision.NO_OPINION),
    (ANONYMOUS, "GET", "/metrics", Decision.NO_OPINION),
    (UserInfo(name="u", groups=("system:authenticated",)), "GET",
     f"/apis/{CM}/v1beta2/namespaces/a/pods/*/m", Decision.NO_OPINION),
])
def test_local_authorization_union(user: UserInfo, method: str, path: str,
                                   decision: Decision) -> None:
    attributes = request_attributes(method=method, path=path)
    assert authorize_without_review(user=user, attributes=attributes,
                                    always_allow_paths=ALWAYS).decision is decision


@pytest.mark.parametrize(("configured", "path", "allowed"), [
    (["/debug/*"], "/debug/pprof", True),
    (["/debug/*"], "/debug", False),
    (["debug/*"], "/debugger", False),
    (["/debug*"], "/debugger", True),
    (["/"], "/", True),
    (["/"], "/x", False),
    (["livez"], "/livez", True),
])
def test_always_allow_paths_exact_or_trailing_star_prefix(
        configured: list[str], path: str, allowed: bool) -> None:
    paths = parse_always_allow_paths(configured)
    assert paths.allows(request_attributes(method="GET", path=path)) is allowed


def test_always_allow_paths_never_cover_resource_requests() -> None:
    paths = parse_always_allow_paths(["/apis/*"])
    attributes = request_attributes(method="GET", path=f"/apis/{CM}/v1beta2/nodes/n/m")
    assert not paths.allows(attributes)


def test_always_allow_paths_star_only_at_the_end() -> None:
    with pytest.raises(AuthConfigError, match="only trailing"):
        parse_always_allow_paths(["/a*b"])


# -------------------------------------------------------------- Status bodies (§3.2, §4.4, §10.2)

def test_unauthorized_status_is_exact() -> None:
    assert json.dumps(unauthorized(), separators=(",", ":")) == (
        '{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
        '"message":"Unauthorized","reason":"Unauthorized","code":401}')


def test_forbidden_status_for_a_namespaced_custom_metric_is_exact() -> None:
    attributes = request_attributes(
        method="GET", path=f"/apis/{CM}/v1beta2/namespaces/shop/pods/*/http_requests")
    body = forbidden_status(user=UserInfo(name="system:serviceaccount:shop:alice"),
                            attributes=attributes)
    expected = json.loads(r"""{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
     "message":"pods.custom.metrics.k8s.io \"*\" is forbidden: User \"system:serviceaccount:shop:alice\" cannot get resource \"pods/http_requests\" in API group \"custom.metrics.k8s.io\" in the namespace \"shop\"",
     "reason":"Forbidden","details":{"name":"*","group":"custom.metrics.k8s.io","kind":"pods"},"code":403}""")  # noqa: E501 (verbatim from the contract)
    assert json.dumps(body) == json.dumps(expected)


def test_forbidden_status_for_an_external_metric_has_no_name() -> None:
    attributes = request_attributes(
        method="GET", path=f"/apis/{EM}/v1beta1/namespaces/shop/queue_messages_ready")
    body = forbidden_status(user=UserInfo(name="bob"), attributes=attributes)
    expected = json.loads(r"""{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
     "message":"queue_messages_ready.external.metrics.k8s.io is forbidden: User \"bob\" cannot list resource \"queue_messages_ready\" in API group \"external.metrics.k8s.io\" in the namespace \"shop\"",
     "reason":"Forbidden","details":{"group":"external.metrics.k8s.io","kind":"queue_messages_ready"},"code":403}""")  # noqa: E501 (verbatim from the contract)
    assert json.dumps(body) == json.dumps(expected)


def test_forbidden_status_for_a_non_resource_path() -> None:
    attributes = request_attributes(method="GET", path=f"/apis/{CM}/v1beta2")
    body = forbidden_status(user=ANONYMOUS, attributes=attributes)
    expected = json.loads(r"""{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",
     "message":"forbidden: User \"system:anonymous\" cannot get path \"/apis/custom.metrics.k8s.io/v1beta2\"",
     "reason":"Forbidden","details":{},"code":403}""")  # noqa: E501 (verbatim from the contract)
    assert json.dumps(body) == json.dumps(expected)


@pytest.mark.parametrize(("path", "reason", "message"), [
    (f"/apis/{CM}/v1beta2/nodes/n1/temp", "",
     'nodes.custom.metrics.k8s.io "n1" is forbidden: User "u" cannot get resource '
     '"nodes/temp" in API group "custom.metrics.k8s.io" at the cluster scope'),
    (f"/apis/{CM}/v1beta2/namespaces/shop/metrics/queue_length", "",
     'metrics.custom.metrics.k8s.io "queue_length" is forbidden: User "u" cannot get resource '
     '"metrics" in API group "custom.metrics.k8s.io" in the namespace "shop"'),
    ("/metrics", "RBAC: clusterrole not found",
     'forbidden: User "u" cannot get path "/metrics": RBAC: clusterrole not found'),
    ("/api/v1/pods", "",
     'pods is forbidden: User "u" cannot list resource "pods" in API group "" '
     "at the cluster scope"),
])
def test_forbidden_message_templates(path: str, reason: str, message: str) -> None:
    attributes = request_attributes(method="GET", path=path)
    assert forbidden_message(user=UserInfo(name="u"), attributes=attributes,
                             reason=reason) == message


def test_forbidden_message_escapes_html_and_quotes_like_go() -> None:
    attributes = request_attributes(method="GET", path="/x<script>")
    message = forbidden_message(user=UserInfo(name='a"b&c'), attributes=attributes)
    assert message == 'forbidden: User "a\\"b&amp;c" cannot get path "/x&lt;script&gt;"'


@pytest.mark.parametrize(("text", "quoted"), [
    ("plain", '"plain"'),
    ('q"q', '"q\\"q"'),
    ("back\\slash", '"back\\\\slash"'),
    ("new\nline\t", '"new\\nline\\t"'),
    ("\x01", '"\\x01"'),
    ("café ✓", '"café ✓"'),
    ("\u200b", '"\\u200b"'),
])
def test_go_quote(text: str, quoted: str) -> None:
    assert quote_go_string(text) == quoted


def test_internal_error_status_shape() -> None:
    assert internal_error("the authorization check could not be completed") == {
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "Internal error occurred: the authorization check could not be completed",
        "reason": "InternalError",
        "details": {"causes": [{"message": "the authorization check could not be completed"}]},
        "code": 500}


# -------------------------------------------------------------------------------------- TTL cache

def test_cache_entry_lives_until_its_ttl() -> None:
    cache: TTLCache[str, int] = TTLCache()
    cache.put("k", 1, ttl=10, now=100.0)
    assert cache.get("k", now=109.9) == 1
    assert cache.get("k", now=110.0) is None
    assert len(cache) == 0


def test_cache_evicts_the_least_recently_used_entry() -> None:
    cache: TTLCache[str, int] = TTLCache(max_entries=2)
    cache.put("a", 1, ttl=10, now=0)
    cache.put("b", 2, ttl=10, now=0)
    assert cache.get("a", now=1) == 1
    cache.put("c", 3, ttl=10, now=1)
    assert cache.get("b", now=1) is None
    assert (cache.get("a", now=1), cache.get("c", now=1)) == (1, 3)


def test_cache_with_zero_ttl_stores_nothing() -> None:
    cache: TTLCache[str, int] = TTLCache()
    cache.put("k", 1, ttl=0, now=0)
    assert cache.get("k", now=0) is None
