"""Delegated authentication and authorization with I/O: TokenReview, SubjectAccessReview, CAs.

The decisions are those of the :mod:`adapter.auth` modules; this module feeds them. It
implements the `Authenticator` and `Authorizer` seam of :mod:`adapter.auth.seam` (front proxy
and client certificate from the TLS peer, bearer tokens through TokenReviews,
SubjectAccessReviews, both cached and coalesced), keeps the current `AuthenticationConfig` from
the flags and the `kube-system/extension-apiserver-authentication` ConfigMap, and pushes its CA
bundles into the `ReloadingServerContext` so a rotated front-proxy CA applies to new
connections at once.

Tokens are never logged, nor kept as cache keys: only a short digest prefix is ever shown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from adapter.auth.attributes import RequestAttributes
from adapter.auth.authentication import (
    Authenticated,
    AuthenticationFailure,
    AuthenticatorResult,
    Unauthenticated,
    authenticate_certificate,
    extract_bearer_token,
    finish_authentication,
    read_token_review,
    token_cache_key,
    token_review_body,
)
from adapter.auth.authorization import (
    DEFAULT_PRIVILEGED_GROUPS,
    AlwaysAllowPaths,
    AuthorizationDecision,
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
)
from adapter.auth.configuration import (
    AuthConfigError,
)
from adapter.auth.reviews import (
    ReviewResponseError,
    TTLCache,
)
from adapter.auth.seam import (
    ALLOW_ALL_AUTHENTICATOR,
    ALLOW_ALL_AUTHORIZER,
    AuthCheckUnavailable,
    Authenticator,
    Authorizer,
    IncomingRequest,
)
from adapter.auth.users import UserInfo
from adapter.kube.objects import (
    AUTHENTICATION_CONFIGMAP,
    AUTHENTICATION_NAMESPACE,
    USER_AGENT,
    authentication_config_informer,
)
from adapter.security.reviews import (
    SUBJECT_ACCESS_REVIEWS_PATH,
    TOKEN_REVIEWS_PATH,
    ReviewClient,
    ReviewFailed,
    Sleep,
    token_label,
)
from adapter.security.tls import (
    ReloadingServerContext,
    inspect_peer_certificate,
)
from adapter.security.trust import AuthenticationSource, SecurityConfigError
from adapter.settings import AdapterSettings
from metricscale.kube.http import KubeHTTP, connect
from metricscale.kube.informer import InformerFailed, InformerOptions
from metricscale.tasks import SingleFlight, start_guarded_task

__all__ = [
    "AUTH_CONFIG_CHECK",
    "INSECURE_CHECK",
    "AdapterSecurity",
    "AuthenticationSource",
    "DelegatedAuthenticator",
    "DelegatedAuthorizer",
    "ReviewClient",
    "ReviewFailed",
    "SecurityConfigError",
    "build_security",
    "withhold_unparsed_requests",
]

logger = logging.getLogger(__name__)

# How long start-up waits for the ConfigMap before serving (not ready) without it.
DEFAULT_CONFIGMAP_SYNC_SECONDS = 10.0
# How often --client-ca-file / --requestheader-client-ca-file are checked for new content.
CA_FILE_RELOAD_SECONDS = 10.0

AUTH_CONFIG_CHECK = "authentication-config"
INSECURE_CHECK = "insecure-disable-auth"

Clock = Callable[[], float]


# --------------------------------------------------------------------------------------------
# Authentication


class DelegatedAuthenticator:
    """Front proxy and client certificate (no I/O), then bearer token through a TokenReview.

    TokenReview answers, authenticated or not, are cached for `token_ttl` seconds under a
    digest of the token; failures to make the review are not cached and give a 500.
    """

    def __init__(self, *, source: AuthenticationSource, reviews: ReviewClient,
                 token_ttl: float = 10.0, clock: Clock = time.time) -> None:
        self._source = source
        self._reviews = reviews
        self._token_ttl = token_ttl
        self._clock = clock
        self._cache: TTLCache[str, AuthenticatorResult] = TTLCache()
        self._flights: SingleFlight[str, AuthenticatorResult] = SingleFlight()

    async def authenticate(self, request: IncomingRequest,
                           ) -> Authenticated | AuthenticationFailure:
        source = self._source
        peer = None
        if request.peer_certificate_der is not None:
            peer = inspect_peer_certificate(
                request.peer_certificate_der, request_header_ca=source.request_header_ca,
                client_ca=source.client_ca, now=datetime.fromtimestamp(self._clock(), UTC))
        certificate = authenticate_certificate(config=source.config, peer=peer,
                                               headers=request.headers)
        if isinstance(certificate, Authenticated):
            return finish_authentication(certificate)
        token = extract_bearer_token(request.headers)
        if token is None:
            return finish_authentication(certificate)
        return finish_authentication(certificate, await self._review_token(token))

    async def _review_token(self, token: str) -> AuthenticatorResult:
        key = token_cache_key(token)
        cached = self._cache.get(key, now=self._clock())
        if cached is not None:
            return cached
        return await self._flights.run(key, lambda: self._create_review(token, key))

    async def _create_review(self, token: str, key: str) -> AuthenticatorResult:
        try:
            answer = await self._reviews.create(TOKEN_REVIEWS_PATH, token_review_body(token))
            result = read_token_review(answer)
        except ReviewFailed as error:
            logger.warning("TokenReview for token %s could not be made: %s",
                           token_label(token), error)
            raise AuthCheckUnavailable("TokenReview failed") from None
        except ReviewResponseError as error:
            logger.warning("TokenReview for token %s: unusable answer: %s",
                           token_label(token), error)
            raise AuthCheckUnavailable("TokenReview failed") from None
        self._cache.put(key, result, ttl=self._token_ttl, now=self._clock())
        if isinstance(result, Unauthenticated):
            logger.debug("token %s was not authenticated", token_label(token))
        return result

    async def close(self) -> None:
        await self._flights.close()


# --------------------------------------------------------------------------------------------
# Authorization


class DelegatedAuthorizer:
    """Privileged groups and always-allowed paths locally, everything else by SubjectAccessReview.

    Answers are cached under the JSON of the review's spec (allowed and denied answers for their
    own TTLs); a review that cannot be made raises AuthCheckUnavailable (a 500).
    """

    def __init__(self, *, reviews: ReviewClient, always_allow_paths: AlwaysAllowPaths,
                 authorized_ttl: float = 10.0, unauthorized_ttl: float = 10.0,
                 clock: Clock = time.time,
                 privileged_groups: tuple[str, ...] = DEFAULT_PRIVILEGED_GROUPS) -> None:
        self._reviews = reviews
        self._always_allow_paths = always_allow_paths
        self._authorized_ttl = authorized_ttl
        self._unauthorized_ttl = unauthorized_ttl
        self._clock = clock
        self._privileged_groups = privileged_groups
        self._cache: TTLCache[str, ReviewStatus] = TTLCache()
        self._flights: SingleFlight[str, ReviewStatus] = SingleFlight()

    async def authorize(self, user: UserInfo, attributes: RequestAttributes,
                        ) -> AuthorizationDecision:
        local = authorize_without_review(
            user=user, attributes=attributes, always_allow_paths=self._always_allow_paths,
            privileged_groups=self._privileged_groups)
        if local.decision is not Decision.NO_OPINION:
            return local
        body = subject_access_review_body(user, attributes)
        key = review_cache_key(body["spec"])
        cacheable = should_cache_review(attributes)
        cached = self._cache.get(key, now=self._clock()) if cacheable else None
        if cached is None:
            cached = await self._flights.run(
                key, lambda: self._create_review(body=body, key=key, cacheable=cacheable))
        return decide_from_review(cached)

    async def _create_review(self, *, body: Mapping[str, Any], key: str,
                             cacheable: bool) -> ReviewStatus:
        try:
            status = read_subject_access_review(
                await self._reviews.create(SUBJECT_ACCESS_REVIEWS_PATH, body))
        except (ReviewFailed, ReviewResponseError) as error:
            logger.warning("SubjectAccessReview for user %r could not be made: %s",
                           body["spec"].get("user", ""), error)
            raise AuthCheckUnavailable("SubjectAccessReview failed") from None
        if cacheable:
            self._cache.put(key, status, now=self._clock(), ttl=review_ttl(
                status, authorized_ttl=self._authorized_ttl,
                unauthorized_ttl=self._unauthorized_ttl))
        if status.evaluation_error:
            logger.info("SubjectAccessReview for user %r: evaluation error: %s",
                        body["spec"].get("user", ""), status.evaluation_error)
        return status

    async def close(self) -> None:
        await self._flights.close()


# --------------------------------------------------------------------------------------------
# Logs


class _WithholdUnparsedRequests(logging.Filter):
    """aiohttp logs a request it cannot parse with the offending bytes, an oversized
    `Authorization` header included; keep the event, drop the bytes (and the traceback)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, HttpProcessingError):
            event = record.getMessage()
            record.msg = "%s: %d %s (request bytes withheld: they may hold credentials)"
            record.args = (event, error.code, type(error).__name__)
            record.exc_info = None
            record.exc_text = None
            # A client's malformed request is not the server's error.
            record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        return True


def withhold_unparsed_requests(logger: logging.Logger) -> None:
    """Install the filter on the logger aiohttp's server writes to (idempotent)."""
    if not any(isinstance(f, _WithholdUnparsedRequests) for f in logger.filters):
        logger.addFilter(_WithholdUnparsedRequests())


# --------------------------------------------------------------------------------------------
# Wiring


class ReadinessChecks(Protocol):
    """Where readiness checks are registered (adapter.http.app.HealthChecks)."""

    def add(self, endpoints: Sequence[str], name: str, check: Callable[[], bool]) -> None: ...


@dataclass
class AdapterSecurity:
    """What the composition root hands to `create_app`, then installs on the app it made."""

    authenticator: Authenticator
    authorizer: Authorizer
    source: AuthenticationSource | None = None
    token_reviews: ReviewClient | None = None
    access_reviews: ReviewClient | None = None
    authentication_kubeconfig: str | None = None
    authorization_kubeconfig: str | None = None
    sync_timeout: float = DEFAULT_CONFIGMAP_SYNC_SECONDS
    informer_options: InformerOptions = field(default_factory=InformerOptions)
    _on_fatal: Callable[[BaseException], None] | None = field(default=None, init=False,
                                                              repr=False)

    @property
    def disabled(self) -> bool:
        return self.source is None

    def install(self, app: web.Application, *, health: ReadinessChecks,
                on_fatal: Callable[[BaseException], None]) -> None:
        """Add the readiness check to `health` and, to the app, the context that opens the
        clients and the informer (a background failure goes to `on_fatal`)."""
        withhold_unparsed_requests(logging.getLogger("aiohttp.server"))
        self._on_fatal = on_fatal
        if self.source is None:
            # Passes, so the line shows in /readyz?verbose without making the pod unready.
            health.add(("readyz",), INSECURE_CHECK, lambda: True)
            return
        source = self.source
        health.add(("readyz",), AUTH_CONFIG_CHECK, lambda: source.loaded)
        app.cleanup_ctx.append(self._context)

    async def _context(self, app: web.Application) -> AsyncIterator[None]:
        assert self.source is not None and self.token_reviews is not None
        assert self.access_reviews is not None
        on_fatal = self._on_fatal
        assert on_fatal is not None  # set by install(), which added this context
        async with contextlib.AsyncExitStack() as stack:
            authn_api = await stack.enter_async_context(connect(
                kubeconfig=self.authentication_kubeconfig, user_agent=USER_AGENT,
                on_failure=on_fatal))
            authz_api = authn_api
            if self.authorization_kubeconfig != self.authentication_kubeconfig:
                authz_api = await stack.enter_async_context(connect(
                    kubeconfig=self.authorization_kubeconfig, user_agent=USER_AGENT,
                    on_failure=on_fatal))
            self.token_reviews.api = authn_api
            self.access_reviews.api = authz_api
            stack.callback(self._forget_clients)
            if isinstance(self.authenticator, DelegatedAuthenticator):
                stack.push_async_callback(self.authenticator.close)
            if isinstance(self.authorizer, DelegatedAuthorizer):
                stack.push_async_callback(self.authorizer.close)
            if self.source.needs_lookup:
                await self._follow_configmap(authn_api, stack=stack, on_fatal=on_fatal)
            if self.source.has_ca_files:
                reload = start_guarded_task(self._reload_ca_files(), name="CA file reload",
                                            on_failure=on_fatal)
                stack.push_async_callback(_cancel, reload)
            yield

    def _forget_clients(self) -> None:
        assert self.token_reviews is not None and self.access_reviews is not None
        self.token_reviews.api = None
        self.access_reviews.api = None

    async def _follow_configmap(self, api: KubeHTTP, *, stack: contextlib.AsyncExitStack,
                                on_fatal: Callable[[BaseException], None]) -> None:
        assert self.source is not None
        informer = authentication_config_informer(
            api, on_change=self.source.apply_configmap, **self.informer_options)
        self.source.follow_lookup(lambda: informer.has_synced)
        informer.start(on_failure=on_fatal)
        stack.push_async_callback(informer.stop)
        try:
            synced = await informer.wait_synced(self.sync_timeout)
        except InformerFailed:
            return  # on_fatal has been told
        if not synced:
            logger.warning(
                "%s/%s is not read yet (%s); /readyz fails until it is. The adapter needs the "
                "extension-apiserver-authentication-reader Role in kube-system.",
                AUTHENTICATION_NAMESPACE, AUTHENTICATION_CONFIGMAP,
                informer.last_error or "no answer")
        elif self.source.config.request_header is None:
            logger.warning("no request-header CA (ConfigMap or --requestheader-client-ca-file): "
                           "requests proxied by kube-apiserver cannot be authenticated")

    async def _reload_ca_files(self) -> None:
        assert self.source is not None
        while True:
            await asyncio.sleep(CA_FILE_RELOAD_SECONDS)
            self.source.reload_files()


async def _cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def build_security(settings: AdapterSettings, *, tls: ReloadingServerContext | None,
                   clock: Clock = time.time, sleep: Sleep = asyncio.sleep,
                   jitter: Callable[[], float] = random.random,
                   sync_timeout: float = DEFAULT_CONFIGMAP_SYNC_SECONDS,
                   informer_options: InformerOptions | None = None) -> AdapterSecurity:
    """The authenticator, authorizer and configuration source the flags ask for.

    Reads the CA files of the flags now (raises SecurityConfigError); opens nothing: the
    Kubernetes clients and the ConfigMap informer start with the app (`install`).
    `--authentication-kubeconfig` (else `--kubeconfig`, else in-cluster) is used for
    TokenReviews and the ConfigMap; `--authorization-kubeconfig` (else the former) for reviews
    of access. `informer_options` go to the ConfigMap's Informer (tests shorten its backoff).
    """
    flags = settings.auth
    if flags.insecure_disable_auth:
        return AdapterSecurity(authenticator=ALLOW_ALL_AUTHENTICATOR,
                               authorizer=ALLOW_ALL_AUTHORIZER)
    try:
        always_allow = parse_always_allow_paths(flags.authorization_always_allow_paths)
    except AuthConfigError as error:
        raise SecurityConfigError(f"--authorization-always-allow-paths: {error}") from None
    source = AuthenticationSource(flags=flags, tls=tls)
    token_reviews = ReviewClient(sleep=sleep, jitter=jitter)
    access_reviews = ReviewClient(sleep=sleep, jitter=jitter)
    authentication_kubeconfig = flags.authentication_kubeconfig or settings.kubeconfig
    return AdapterSecurity(
        authenticator=DelegatedAuthenticator(
            source=source, reviews=token_reviews, token_ttl=float(flags.token_cache_ttl),
            clock=clock),
        authorizer=DelegatedAuthorizer(
            reviews=access_reviews, always_allow_paths=always_allow,
            authorized_ttl=float(flags.authorized_cache_ttl),
            unauthorized_ttl=float(flags.unauthorized_cache_ttl), clock=clock),
        source=source, token_reviews=token_reviews, access_reviews=access_reviews,
        authentication_kubeconfig=authentication_kubeconfig,
        authorization_kubeconfig=flags.authorization_kubeconfig or authentication_kubeconfig,
        sync_timeout=sync_timeout, informer_options=InformerOptions(**(informer_options or {})))
