"""adapter.security.delegation against the session's real kube-apiserver: review retries, caches,
single flights, the configuration source, the wiring and the log filter.

The reviews go to the real kube-apiserver through a recording fault proxy
(tests.adapter.cluster.RecordingProxy): it counts the TokenReviews and SubjectAccessReviews
the product sends (with their bodies) and injects what the real server cannot be made to do on
demand (429, 5xx, a dropped connection, a slow answer). The product's sleep, jitter and clock
are the tests' own: backoff delays are asserted from the injected sleep, never measured.

The reviews are posted with the adapter's own service account (its manifests' RBAC, with
system:auth-delegator); tokens under review are real TokenRequest tokens of service accounts
of the module's own, and users given rights are bound by real RBAC under names of the module's
own (the cluster is shared). Where the real server answers differently from the fake these
tests were first written against, the comment at the place says how.

One test stays on the fake kube-apiserver, in a section of its own at the end: it needs
SubjectAccessReview answers that neither the real server nor the fault proxy can give.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiohttp.http_exceptions import LineTooLong
from aiohttp.web import Application
from cryptography.hazmat.primitives.serialization import Encoding

from adapter.auth.attributes import RequestAttributes
from adapter.auth.authentication import (
    Authenticated,
    AuthenticationFailure,
    AuthMethod,
)
from adapter.auth.authorization import (
    Decision,
    parse_always_allow_paths,
)
from adapter.auth.seam import (
    ALLOW_ALL_AUTHENTICATOR,
    ALLOW_ALL_AUTHORIZER,
    AuthCheckUnavailable,
    IncomingRequest,
)
from adapter.auth.users import (
    ANONYMOUS,
    UserInfo,
)
from adapter.http.app import HEALTH_KEY, HealthChecks
from adapter.security.delegation import (
    INSECURE_CHECK,
    AuthenticationSource,
    DelegatedAuthenticator,
    DelegatedAuthorizer,
    ReviewClient,
    ReviewFailed,
    SecurityConfigError,
    build_security,
    withhold_unparsed_requests,
)
from adapter.security.reviews import SUBJECT_ACCESS_REVIEWS_PATH, TOKEN_REVIEWS_PATH, token_label
from adapter.security.tls import ReloadingServerContext
from adapter.settings import AuthFlags, parse_settings
from metricscale import pki
from metricscale.kube.http import KubeHTTP, open_kube_http
from testbed.controlplane import ControlPlane
from testbed.fakes.kube_api import FakeKubeAPI
from testbed.faultproxy import DropConnection, Latency, ServerError, TooManyRequests
from testbed.metricscale_adapter import ACCOUNT
from tests.adapter.cluster import (
    ModuleCluster,
    RecordingProxy,
    grant_metrics_readers,
    revoke_metrics_readers,
)
from tests.cluster.support import until

YEAR = timedelta(days=365)
PODS_METRIC = RequestAttributes(
    verb="get", path="/apis/custom.metrics.k8s.io/v1beta2/namespaces/shop/pods/*/rps",
    is_resource_request=True, api_prefix="apis", api_group="custom.metrics.k8s.io",
    api_version="v1beta2", namespace="shop", resource="pods", subresource="rps", name="*")


class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC).timestamp()

    def __call__(self) -> float:
        return self.now


class Sleeps:
    """The retries' sleep: records each delay, waits for nothing."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
        await asyncio.sleep(0)


DAY = 24 * 3600
TOKEN_REVIEWS = "tokenreviews"
ACCESS_REVIEWS = "subjectaccessreviews"
# Guards against a hang on a busy machine, not a measure.
WAIT = 60.0


@dataclass(frozen=True)
class Accounts:
    """Real identities of the module's own in the shared cluster."""

    adapter_token: str  # the adapter's service account: may create both kinds of review
    unprivileged_token: str  # a service account without any RBAC of its own
    users_namespace: str
    alice: str  # a user name allowed PODS_METRIC by RBAC (a ClusterRoleBinding)
    bob: str  # a user name without any right

    def user_token(self, control_plane: ControlPlane, name: str) -> str:
        """A TokenRequest token of service account `name` of the users' namespace."""
        return control_plane.service_account_token(self.users_namespace, name, seconds=DAY)

    def user_name(self, name: str) -> str:
        return f"system:serviceaccount:{self.users_namespace}:{name}"


def _allowed(control_plane: ControlPlane, user: str) -> bool:
    """Whether RBAC already allows `user` PODS_METRIC (asked directly, not through a proxy)."""
    review = control_plane.request("POST", f"/apis/authorization.k8s.io/v1/{ACCESS_REVIEWS}", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "resourceAttributes": {
            "verb": "get", "group": "custom.metrics.k8s.io", "version": "v1beta2",
            "resource": "pods", "subresource": "rps", "namespace": "shop", "name": "*"}}})
    return bool(review["status"].get("allowed"))


@pytest.fixture(scope="module")
def accounts(cluster: ModuleCluster) -> Iterator[Accounts]:
    control_plane = cluster.control_plane
    adapter_namespace = cluster.names.namespace("adapter")
    cluster.adapter_kubeconfig()  # the account and its manifests' RBAC
    users_namespace = cluster.namespace("users")
    grant = cluster.names.cluster("readers")
    alice, bob = cluster.names.cluster("alice"), cluster.names.cluster("bob")
    grant_metrics_readers(control_plane, grant, users=[alice])
    try:
        # RBAC reads bindings through an informer: the grant applies a moment after it is made.
        asyncio.run(until(lambda: _allowed(control_plane, alice), what="alice's grant",
                          within=WAIT))
        yield Accounts(
            adapter_token=control_plane.service_account_token(adapter_namespace, ACCOUNT,
                                                              seconds=DAY),
            unprivileged_token=control_plane.service_account_token(users_namespace,
                                                                   "no-rights", seconds=DAY),
            users_namespace=users_namespace, alice=alice, bob=bob)
    finally:
        revoke_metrics_readers(control_plane, grant)


@pytest.fixture
def kube(control_plane: ControlPlane) -> Iterator[RecordingProxy]:
    """The recording fault proxy in front of the session's kube-apiserver."""
    proxy = RecordingProxy(control_plane)
    proxy.start()
    try:
        yield proxy
    finally:
        proxy.stop()


@contextlib.asynccontextmanager
async def open_api(control_plane: ControlPlane, kube: RecordingProxy,
                   token: str) -> AsyncIterator[KubeHTTP]:
    async with open_kube_http(control_plane.api_client_configuration(token, server=kube.server),
                              user_agent="metricscale-tests") as client:
        yield client


@pytest.fixture
async def api(control_plane: ControlPlane, kube: RecordingProxy,
              accounts: Accounts) -> AsyncIterator[KubeHTTP]:
    """The adapter's service account, through the proxy."""
    async with open_api(control_plane, kube, accounts.adapter_token) as client:
        yield client


def reviews(api: KubeHTTP, sleeps: Sleeps, *, timeout: float = 10.0) -> ReviewClient:
    client = ReviewClient(sleep=sleeps, jitter=lambda: 0.0, timeout=timeout)
    client.api = api
    return client


def attempts(kube: RecordingProxy, resource: str) -> int:
    return len(kube.requests_to(f"/{resource}$", method="POST"))


# A review kube-apiserver allows: /healthz is every authenticated user's (the bootstrap
# ClusterRole system:public-info-viewer). The fake allowed anything, user "u" without groups
# included; RBAC only allows what a binding grants.
HEALTHZ_REVIEW = {"spec": {"nonResourceAttributes": {"path": "/healthz", "verb": "get"},
                           "user": "u", "groups": ["system:authenticated"]}}


def request_with(*, token: str | None = None, der: bytes | None = None,
                 headers: tuple[tuple[str, str], ...] = ()) -> IncomingRequest:
    if token is not None:
        headers = (*headers, ("Authorization", f"Bearer {token}"))
    return IncomingRequest(method="GET", raw_path="/livez", raw_query="", headers=headers,
                           peer_certificate_der=der)


# --------------------------------------------------------------------------------------------
# Posting reviews


async def test_review_retries_5xx_with_the_webhook_backoff_then_succeeds(
        kube: RecordingProxy, api: KubeHTTP) -> None:
    sleeps = Sleeps()
    kube.add_review_fault(ACCESS_REVIEWS, ServerError(500), times=2)
    answer = await reviews(api, sleeps).create(SUBJECT_ACCESS_REVIEWS_PATH, HEALTHZ_REVIEW)
    assert answer["status"]["allowed"] is True
    assert sleeps.delays == [0.5, 0.75]
    assert attempts(kube, ACCESS_REVIEWS) == 3
    assert len(kube.subject_access_reviews("u")) == 3


async def test_no_log_line_carries_a_token_review_body(
        control_plane: ControlPlane, kube: RecordingProxy, accounts: Accounts, api: KubeHTTP,
        caplog: pytest.LogCaptureFixture) -> None:
    token = accounts.user_token(control_plane, "jane")
    kube.add_review_fault(TOKEN_REVIEWS, ServerError(500), times=1)
    with caplog.at_level(logging.DEBUG):
        answer = await reviews(api, Sleeps()).create(TOKEN_REVIEWS_PATH,
                                                     {"spec": {"token": token}})
    assert answer["status"]["authenticated"] is True
    # The real answer names the service account (the fake's: any name it was given).
    assert answer["status"]["user"]["username"] == accounts.user_name("jane")
    # Compared into a boolean first, so that a failure does not print the token.
    leaked = token in caplog.text
    assert caplog.records and not leaked, "a log line carries the reviewed token"


async def test_review_gives_up_after_five_attempts(kube: RecordingProxy,
                                                   api: KubeHTTP) -> None:
    sleeps = Sleeps()
    kube.add_review_fault(TOKEN_REVIEWS, DropConnection(), times=None)
    with pytest.raises(ReviewFailed):
        await reviews(api, sleeps).create(TOKEN_REVIEWS_PATH, {"spec": {"token": "t"}})
    assert sleeps.delays == [0.5, 0.75, 1.125, 1.6875]
    assert attempts(kube, TOKEN_REVIEWS) == 5


async def test_review_jitter_only_lengthens_the_delay(kube: RecordingProxy,
                                                      api: KubeHTTP) -> None:
    sleeps = Sleeps()
    client = ReviewClient(sleep=sleeps, jitter=lambda: 0.999)
    client.api = api
    kube.add_review_fault(TOKEN_REVIEWS, ServerError(503), times=1)
    # "t" is no token kube-apiserver issued: the review is made (201), unauthenticated.
    answer = await client.create(TOKEN_REVIEWS_PATH, {"spec": {"token": "t"}})
    assert answer["status"].get("authenticated") is not True
    assert sleeps.delays == [pytest.approx(0.5 * 1.1998)]


async def test_review_honours_retry_after_of_429(kube: RecordingProxy, api: KubeHTTP) -> None:
    sleeps = Sleeps()
    kube.add_review_fault(TOKEN_REVIEWS, TooManyRequests(retry_after=2), times=1)
    await reviews(api, sleeps).create(TOKEN_REVIEWS_PATH, {"spec": {"token": "t"}})
    assert sleeps.delays == [2.0]
    assert attempts(kube, TOKEN_REVIEWS) == 2


async def test_review_refused_by_rbac_is_not_retried(
        control_plane: ControlPlane, kube: RecordingProxy, accounts: Accounts) -> None:
    # The fake's authorizer was scripted to refuse; here a real service account without any
    # right to create SubjectAccessReviews posts one, and RBAC refuses it.
    sleeps = Sleeps()
    async with open_api(control_plane, kube, accounts.unprivileged_token) as unprivileged:
        with pytest.raises(ReviewFailed) as failure:
            await reviews(unprivileged, sleeps).create(SUBJECT_ACCESS_REVIEWS_PATH,
                                                       HEALTHZ_REVIEW)
    assert failure.value.status == 403
    assert sleeps.delays == []
    assert attempts(kube, ACCESS_REVIEWS) == 1
    assert [r.status for r in kube.requests_to(f"/{ACCESS_REVIEWS}$")] == [403]


async def test_review_slower_than_its_timeout_is_retried(kube: RecordingProxy,
                                                         api: KubeHTTP) -> None:
    sleeps = Sleeps()
    # The fake answered in microseconds; the second attempt here goes through the proxy to the
    # real server on a possibly busy machine: a per-attempt timeout it cannot miss, and a
    # first attempt held far longer than that (released when the client hangs up).
    kube.add_review_fault(TOKEN_REVIEWS, Latency(WAIT), times=1)
    await reviews(api, sleeps, timeout=5.0).create(TOKEN_REVIEWS_PATH, {"spec": {"token": "t"}})
    assert sleeps.delays == [0.5]
    assert len(kube.token_reviews("t")) == 2


async def test_review_before_the_client_is_open_fails() -> None:
    with pytest.raises(ReviewFailed, match="not open"):
        await ReviewClient(sleep=Sleeps()).create(TOKEN_REVIEWS_PATH, {})


# --------------------------------------------------------------------------------------------
# Authentication


def authenticator(api: KubeHTTP, *, clock: Clock, ttl: float = 10.0,
                  source: AuthenticationSource | None = None) -> DelegatedAuthenticator:
    return DelegatedAuthenticator(
        source=source or AuthenticationSource(flags=AuthFlags(authentication_skip_lookup=True),
                                              tls=None),
        reviews=reviews(api, Sleeps()), token_ttl=ttl, clock=clock)


def token_reviews_of(kube: RecordingProxy, token: str) -> int:
    return len(kube.token_reviews(token))


async def test_token_answers_are_cached_for_the_ttl_success_and_failure_alike(
        control_plane: ControlPlane, kube: RecordingProxy, accounts: Accounts,
        api: KubeHTTP) -> None:
    good = accounts.user_token(control_plane, "alice")
    bad = "not-a-token-kube-apiserver-issued"
    clock = Clock()
    chain = authenticator(api, clock=clock)
    for _ in range(3):
        ok = await chain.authenticate(request_with(token=good))
        refused = await chain.authenticate(request_with(token=bad))
    # The fake answered the name and groups it was given; kube-apiserver answers a service
    # account's: its groups, a uid, and extra (the token's credential id, its node and pod
    # when bound to one): compared as the user info the review gave.
    assert isinstance(ok, Authenticated) and ok.method is AuthMethod.TOKEN
    assert ok.user.name == accounts.user_name("alice")
    assert ok.user.groups == ("system:serviceaccounts",
                              f"system:serviceaccounts:{accounts.users_namespace}",
                              "system:authenticated")
    assert ok.user.uid
    assert isinstance(refused, AuthenticationFailure)
    assert (token_reviews_of(kube, good), token_reviews_of(kube, bad)) == (1, 1)
    clock.now += 10
    await chain.authenticate(request_with(token=good))
    await chain.authenticate(request_with(token=bad))
    assert (token_reviews_of(kube, good), token_reviews_of(kube, bad)) == (2, 2)


async def test_token_review_that_cannot_be_made_is_a_500_and_not_cached(
        control_plane: ControlPlane, kube: RecordingProxy, accounts: Accounts,
        api: KubeHTTP) -> None:
    good = accounts.user_token(control_plane, "alice")
    chain = authenticator(api, clock=Clock())
    kube.add_review_fault(TOKEN_REVIEWS, ServerError(500), times=None)
    with pytest.raises(AuthCheckUnavailable):
        await chain.authenticate(request_with(token=good))
    kube.clear_faults()
    assert isinstance(await chain.authenticate(request_with(token=good)), Authenticated)
    assert token_reviews_of(kube, good) == 5 + 1


async def test_zero_ttl_reviews_every_token(control_plane: ControlPlane, kube: RecordingProxy,
                                            accounts: Accounts, api: KubeHTTP) -> None:
    good = accounts.user_token(control_plane, "alice")
    chain = authenticator(api, clock=Clock(), ttl=0)
    for _ in range(3):
        assert isinstance(await chain.authenticate(request_with(token=good)), Authenticated)
    assert token_reviews_of(kube, good) == 3


async def test_concurrent_requests_with_one_token_share_one_review(
        control_plane: ControlPlane, kube: RecordingProxy, accounts: Accounts,
        api: KubeHTTP) -> None:
    busy = accounts.user_token(control_plane, "hpa")
    kube.add_review_fault(TOKEN_REVIEWS, Latency(0.05), times=None)
    chain = authenticator(api, clock=Clock())
    results = await asyncio.gather(*(chain.authenticate(request_with(token=busy))
                                     for _ in range(20)))
    assert {result.user.name for result in results if isinstance(result, Authenticated)} == \
        {accounts.user_name("hpa")}
    assert token_reviews_of(kube, busy) == 1
    await chain.close()


async def test_no_credentials_is_anonymous_without_any_review(kube: RecordingProxy,
                                                              api: KubeHTTP) -> None:
    chain = authenticator(api, clock=Clock())
    spoofed = (("X-Remote-User", "system:admin"), ("X-Remote-Group", "system:masters"))
    assert await chain.authenticate(request_with(headers=spoofed)) == \
        Authenticated(ANONYMOUS, AuthMethod.ANONYMOUS)
    assert kube.token_reviews() == []


def proxy_setup(tmp_path: Path) -> tuple[AuthenticationSource, bytes, bytes]:
    """Flags naming a front-proxy CA; DERs of a proxy certificate and of a client-CA one."""
    now = datetime.now(UTC) - timedelta(minutes=5)
    proxy_ca = pki.generate_ca(common_name="proxy-ca", now=now, validity=YEAR)
    client_ca = pki.generate_ca(common_name="client-ca", now=now, validity=YEAR)
    proxy_file = pki.write_certificate(tmp_path / "proxy-ca.crt", proxy_ca.certificate)
    client_file = pki.write_certificate(tmp_path / "client-ca.crt", client_ca.certificate)
    flags = AuthFlags(requestheader_client_ca_file=str(proxy_file),
                      client_ca_file=str(client_file),
                      requestheader_allowed_names=("front-proxy-client",))
    proxy = pki.issue_client_certificate(proxy_ca, user="front-proxy-client", now=now,
                                         validity=YEAR)
    user = pki.issue_client_certificate(client_ca, user="jane", groups=["ops"], now=now,
                                        validity=YEAR)
    return (AuthenticationSource(flags=flags, tls=None),
            proxy.certificate.public_bytes(Encoding.DER),
            user.certificate.public_bytes(Encoding.DER))


async def test_certificates_decide_without_any_review(tmp_path: Path, kube: RecordingProxy,
                                                      api: KubeHTTP) -> None:
    source, proxy_der, user_der = proxy_setup(tmp_path)
    assert source.needs_lookup is False and source.loaded is True
    chain = authenticator(api, clock=Clock(), source=source)
    identity = (("X-Remote-User", "system:kube-aggregator"),
                ("X-Remote-Group", "system:masters"))
    assert await chain.authenticate(request_with(der=proxy_der, headers=identity)) == \
        Authenticated(UserInfo(name="system:kube-aggregator",
                               groups=("system:masters", "system:authenticated")),
                      AuthMethod.FRONT_PROXY)
    assert await chain.authenticate(request_with(der=user_der, headers=identity)) == \
        Authenticated(UserInfo(name="jane", groups=("ops", "system:authenticated")),
                      AuthMethod.CLIENT_CERTIFICATE)
    # The proxy's certificate without X-Remote-User does not verify as a client certificate.
    assert isinstance(await chain.authenticate(request_with(der=proxy_der)),
                      AuthenticationFailure)
    assert kube.token_reviews() == []


# --------------------------------------------------------------------------------------------
# Authorization


def authorizer(api: KubeHTTP, *, clock: Clock, authorized_ttl: float = 10.0,
               unauthorized_ttl: float = 10.0) -> DelegatedAuthorizer:
    return DelegatedAuthorizer(
        reviews=reviews(api, Sleeps()),
        always_allow_paths=parse_always_allow_paths(("/healthz", "/readyz", "/livez")),
        authorized_ttl=authorized_ttl, unauthorized_ttl=unauthorized_ttl, clock=clock)


async def test_masters_and_always_allowed_paths_cost_no_review(kube: RecordingProxy,
                                                               api: KubeHTTP) -> None:
    chain = authorizer(api, clock=Clock())
    masters = UserInfo(name="system:kube-aggregator", groups=("system:masters",))
    assert (await chain.authorize(masters, PODS_METRIC)).decision is Decision.ALLOW
    livez = RequestAttributes(verb="get", path="/livez")
    assert (await chain.authorize(ANONYMOUS, livez)).decision is Decision.ALLOW
    assert kube.subject_access_reviews() == []


async def test_decisions_are_cached_per_spec_with_their_own_ttls(
        kube: RecordingProxy, accounts: Accounts, api: KubeHTTP) -> None:
    # The fake was scripted to answer alice allowed and bob denied ("no"). RBAC allows alice
    # (her ClusterRoleBinding) and has no opinion on bob: RBAC never denies (status.denied is
    # only ever set by a webhook authorizer), so bob's answer is "not allowed", reason empty,
    # which the unauthorized TTL covers all the same.
    clock = Clock()
    chain = authorizer(api, clock=clock, authorized_ttl=10, unauthorized_ttl=2)
    alice, bob = UserInfo(name=accounts.alice), UserInfo(name=accounts.bob)
    for _ in range(3):
        assert (await chain.authorize(alice, PODS_METRIC)).decision is Decision.ALLOW
        refused = await chain.authorize(bob, PODS_METRIC)
        assert (refused.decision, refused.reason) == (Decision.NO_OPINION, "")
    assert len(kube.subject_access_reviews()) == 2
    clock.now += 3  # past the unauthorized TTL only
    await chain.authorize(alice, PODS_METRIC)
    await chain.authorize(bob, PODS_METRIC)
    assert len(kube.subject_access_reviews(accounts.alice)) == 1
    assert len(kube.subject_access_reviews(accounts.bob)) == 2
    # Another attribute set is another cache key.
    other = RequestAttributes(verb="get", path="/metrics")
    await chain.authorize(alice, other)
    assert len(kube.subject_access_reviews()) == 4


async def test_oversized_attributes_are_reviewed_every_time(
        kube: RecordingProxy, accounts: Accounts, api: KubeHTTP) -> None:
    chain = authorizer(api, clock=Clock())
    huge = RequestAttributes(verb="get", path="/" + "x" * 10_000)
    for _ in range(2):
        # No binding grants that path: RBAC has no opinion (the fake was scripted to allow).
        decision = await chain.authorize(UserInfo(name=accounts.alice), huge)
        assert decision.decision is Decision.NO_OPINION
    assert len(kube.subject_access_reviews(accounts.alice)) == 2


async def test_no_opinion_and_failures(kube: RecordingProxy, accounts: Accounts,
                                       api: KubeHTTP) -> None:
    # The answers both allowed and denied, and not a boolean, are the fake's: see the last
    # section.
    chain = authorizer(api, clock=Clock())
    assert (await chain.authorize(UserInfo(name=accounts.bob), PODS_METRIC)).decision is \
        Decision.NO_OPINION
    kube.add_review_fault(ACCESS_REVIEWS, ServerError(500), times=None)
    with pytest.raises(AuthCheckUnavailable):
        await chain.authorize(UserInfo(name=f"{accounts.bob}-else"), PODS_METRIC)
    assert attempts(kube, ACCESS_REVIEWS) == 1 + 5


# --------------------------------------------------------------------------------------------
# The configuration source


def configmap(request_header_ca: bytes, client_ca: bytes | None = None,
              allowed: str = '["front-proxy-client"]') -> dict[str, str]:
    data = {"requestheader-client-ca-file": request_header_ca.decode(),
            "requestheader-allowed-names": allowed,
            "requestheader-username-headers": '["X-Remote-User"]',
            "requestheader-group-headers": '["X-Remote-Group"]',
            "requestheader-extra-headers-prefix": '["X-Remote-Extra-"]'}
    if client_ca is not None:
        data["client-ca-file"] = client_ca.decode()
    return data


def new_ca(name: str) -> pki.CertifiedKey:
    return pki.generate_ca(common_name=name, now=datetime.now(UTC) - timedelta(minutes=5),
                           validity=YEAR)


def serving_tls(tmp_path: Path) -> ReloadingServerContext:
    ca = new_ca("serving")
    leaf = pki.issue_serving_certificate(ca, common_name="s", dns_names=["localhost"],
                                         now=datetime.now(UTC) - timedelta(minutes=5),
                                         validity=YEAR)
    return ReloadingServerContext(
        cert_file=pki.write_certificate(tmp_path / "s.crt", leaf.certificate),
        key_file=pki.write_private_key(tmp_path / "s.key", leaf.private_key))


def test_configmap_values_reach_the_tls_context_and_bad_ones_are_ignored(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tls = serving_tls(tmp_path)
    source = AuthenticationSource(flags=AuthFlags(), tls=tls)
    assert source.needs_lookup and source.config.request_header is None
    assert tls.current.verify_mode is ssl.CERT_NONE
    first, second = new_ca("proxy-1"), new_ca("proxy-2")
    source.apply_configmap(configmap(first.certificate_pem))
    assert source.config.request_header is not None
    assert source.config.request_header.allowed_names == ("front-proxy-client",)
    assert tls.current.verify_mode is ssl.CERT_OPTIONAL
    generation = source.generation
    with caplog.at_level(logging.ERROR):
        source.apply_configmap(configmap(b"-----BEGIN CERTIFICATE-----\ngarbage\n"
                                         b"-----END CERTIFICATE-----\n"))
        source.apply_configmap(configmap(second.certificate_pem, allowed="not json"))
    assert source.generation == generation
    assert source.config.request_header.ca_pem == first.certificate_pem
    assert len(caplog.records) == 2
    source.apply_configmap(None)  # deleted: the last configuration stays
    assert source.config.request_header.ca_pem == first.certificate_pem
    source.apply_configmap(configmap(second.certificate_pem))
    assert source.generation == generation + 1
    assert source.request_header_ca is not None
    assert source.request_header_ca.pem == second.certificate_pem


def test_flags_override_the_configmap_part_by_part(tmp_path: Path) -> None:
    flag_ca, cluster_proxy, cluster_client = new_ca("flag"), new_ca("cm-proxy"), new_ca("cm-c")
    flag_file = pki.write_certificate(tmp_path / "flag.crt", flag_ca.certificate)
    source = AuthenticationSource(flags=AuthFlags(client_ca_file=str(flag_file)), tls=None)
    assert source.needs_lookup  # the front-proxy part still comes from the cluster
    source.apply_configmap(configmap(cluster_proxy.certificate_pem,
                                     cluster_client.certificate_pem))
    assert source.config.client_ca_pem == flag_ca.certificate_pem
    assert source.config.request_header is not None
    assert source.config.request_header.ca_pem == cluster_proxy.certificate_pem


def test_lookup_can_be_skipped_and_is_unneeded_when_flags_give_both(tmp_path: Path) -> None:
    assert not AuthenticationSource(flags=AuthFlags(authentication_skip_lookup=True),
                                    tls=None).needs_lookup
    source, _, _ = proxy_setup(tmp_path)
    assert not source.needs_lookup


def test_ca_files_are_reread_when_they_change(tmp_path: Path) -> None:
    source, _, _ = proxy_setup(tmp_path)
    assert source.reload_files() is False
    replacement = new_ca("proxy-ca-2")
    pki.write_certificate(tmp_path / "proxy-ca.crt", replacement.certificate)
    assert source.reload_files() is True
    assert source.request_header_ca is not None
    assert source.request_header_ca.certificates == (replacement.certificate,)
    (tmp_path / "proxy-ca.crt").unlink()
    assert source.reload_files() is False  # a missing file keeps the last good CA


def test_unreadable_ca_flag_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(SecurityConfigError, match="--client-ca-file"):
        AuthenticationSource(flags=AuthFlags(client_ca_file=str(tmp_path / "none.crt")),
                             tls=None)
    with pytest.raises(SecurityConfigError, match="empty header name"):
        proxy = pki.write_certificate(tmp_path / "p.crt", new_ca("p").certificate)
        AuthenticationSource(flags=AuthFlags(requestheader_client_ca_file=str(proxy),
                                             requestheader_group_headers=(" ",)), tls=None)


# --------------------------------------------------------------------------------------------
# Wiring, tokens in logs


def settings(*args: str) -> Any:
    return parse_settings(["--config", "c.yaml", "--prometheus-url", "http://127.0.0.1:9",
                           "--kubeconfig", "k.yaml", *args])


def test_insecure_disable_auth_allows_everything_and_says_so_in_readyz() -> None:
    security = build_security(settings("--insecure-disable-auth"), tls=None)
    assert security.disabled
    assert security.authenticator is ALLOW_ALL_AUTHENTICATOR
    assert security.authorizer is ALLOW_ALL_AUTHORIZER
    app = Application()
    app[HEALTH_KEY] = HealthChecks()
    security.install(app, health=app[HEALTH_KEY], on_fatal=lambda error: None)
    assert (INSECURE_CHECK, True) in app[HEALTH_KEY].run("readyz")
    assert not app.cleanup_ctx


@pytest.mark.parametrize(("args", "authentication", "authorization"), [
    ((), "k.yaml", "k.yaml"),
    (("--authentication-kubeconfig", "a.yaml"), "a.yaml", "a.yaml"),
    (("--authorization-kubeconfig", "z.yaml"), "k.yaml", "z.yaml"),
])
def test_review_clusters_default_to_the_kubeconfig(args: tuple[str, ...], authentication: str,
                                                   authorization: str) -> None:
    security = build_security(settings("--authentication-skip-lookup", *args), tls=None)
    assert (security.authentication_kubeconfig, security.authorization_kubeconfig) == \
        (authentication, authorization)


def test_cache_ttl_flags_reach_the_caches() -> None:
    flags = settings("--authentication-token-webhook-cache-ttl", "1m",
                     "--authorization-webhook-cache-authorized-ttl", "0",
                     "--authorization-webhook-cache-unauthorized-ttl", "1.5s").auth
    assert (flags.token_cache_ttl, flags.authorized_cache_ttl, flags.unauthorized_cache_ttl) == \
        (60, 0, 1.5)


def test_bad_always_allow_path_is_a_config_error() -> None:
    with pytest.raises(SecurityConfigError, match="always-allow-paths"):
        build_security(settings("--authorization-always-allow-paths", "/a*b"), tls=None)


def test_token_label_is_a_digest_prefix_never_the_token() -> None:
    token = "eyJhbGciOiJSUzI1NiJ9.secret-part"
    label = token_label(token)
    assert label.startswith("sha256:") and len(label) == len("sha256:") + 12
    assert "secret" not in label and "eyJ" not in label


def test_unparsable_request_bytes_are_withheld_from_aiohttp_log(
        caplog: pytest.LogCaptureFixture) -> None:
    logger = logging.getLogger("tests.security.aiohttp-server-stand-in")
    withhold_unparsed_requests(logger)
    withhold_unparsed_requests(logger)
    assert len(logger.filters) == 1
    secret = "Bearer sekret-token-value"
    with caplog.at_level(logging.DEBUG, logger=logger.name):
        try:
            raise LineTooLong(secret, "8190")
        except LineTooLong as error:
            logger.exception("Error handling request from %s", "127.0.0.1", exc_info=error)
        logger.warning("an unrelated warning about %s", "x")
    text = caplog.text
    assert "sekret" not in text
    (withheld, unrelated) = caplog.records
    assert withheld.levelno == logging.INFO and withheld.exc_info is None
    assert withheld.getMessage() == ("Error handling request from 127.0.0.1: 400 LineTooLong "
                                     "(request bytes withheld: they may hold credentials)")
    assert unrelated.getMessage() == "an unrelated warning about x"


async def test_authenticators_close_their_in_flight_reviews(kube: RecordingProxy,
                                                            api: KubeHTTP) -> None:
    # Held far longer than the test may take: only close() ends the wait.
    kube.add_review_fault(TOKEN_REVIEWS, Latency(WAIT), times=1)
    chain = authenticator(api, clock=Clock())
    waiting = asyncio.ensure_future(chain.authenticate(request_with(token="slow")))
    # Until the review is on the wire: the proxy records a review's body when it arrives (its
    # request log only once answered). The fake ran on this loop, so a few turns of it
    # sufficed; the proxy runs in a thread of its own.
    await until(lambda: kube.token_reviews("slow"), what="the TokenReview at the proxy",
                within=WAIT)
    assert not waiting.done()
    await chain.close()
    with pytest.raises(asyncio.CancelledError):
        await waiting


# --------------------------------------------------------------------------------------------
# On the fake kube-apiserver: answers no real server gives
#
# A SubjectAccessReview answered both allowed and denied, or with a non-boolean `allowed`: the
# adapter must treat the first as an error (Go's webhook authorizer does) and the second as a
# review that could not be made. kube-apiserver's RBAC authorizer never denies, nor answers
# anything but booleans, and the fault proxy answers only with Status objects of its own; the
# fake is scripted to give these answers.


@pytest.fixture
async def fake_api(fake_kube: FakeKubeAPI) -> AsyncIterator[KubeHTTP]:
    token = "tok-adapter-service-account"
    fake_kube.add_user(token=token, username="system:serviceaccount:metricscale:adapter")
    async with open_kube_http(fake_kube.api_client_configuration(token),
                              user_agent="metricscale-tests") as client:
        yield client


async def test_answers_both_allowed_and_denied_or_garbled_are_errors(
        fake_kube: FakeKubeAPI, fake_api: KubeHTTP) -> None:
    answers: dict[str, dict[str, Any]] = {"confused": {"allowed": True, "denied": True},
                                          "garbled": {"allowed": "yes"}}
    fake_kube.subject_access_review_answer = lambda body: answers[body["spec"]["user"]]
    chain = authorizer(fake_api, clock=Clock())
    assert (await chain.authorize(UserInfo(name="confused"), PODS_METRIC)).error
    with pytest.raises(AuthCheckUnavailable):
        await chain.authorize(UserInfo(name="garbled"), PODS_METRIC)
