"""The authentication and authorization seam: what the HTTP surface asks of any auth chain.

The HTTP surface hands an `IncomingRequest` to an `Authenticator`, and the user and request
attributes to an `Authorizer`, before any routing; the delegated implementations are in
adapter.security.delegation. The allow-all pair serves `--insecure-disable-auth` and tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from adapter.auth.attributes import RequestAttributes
from adapter.auth.authentication import (
    Authenticated,
    AuthenticationFailure,
    AuthMethod,
)
from adapter.auth.authorization import (
    AuthorizationDecision,
    Decision,
)
from adapter.auth.users import (
    ANONYMOUS,
    UserInfo,
)

__all__ = [
    "ALLOW_ALL_AUTHENTICATOR",
    "ALLOW_ALL_AUTHORIZER",
    "ALLOW_ALL_USER",
    "AuthCheckUnavailable",
    "Authenticator",
    "Authorizer",
    "IncomingRequest",
]


@dataclass(frozen=True)
class IncomingRequest:
    """What the auth chain needs to know about a request, before any routing."""

    method: str
    raw_path: str  # as sent, percent-encoded, without the query
    raw_query: str  # as sent, percent-encoded
    headers: tuple[tuple[str, str], ...]  # in arrival order, repeated names kept
    peer_certificate_der: bytes | None  # the TLS client's leaf certificate


class AuthCheckUnavailable(Exception):
    """A TokenReview or SubjectAccessReview could not be made: the request gets a 500."""


class Authenticator(Protocol):
    """Who is asking: a user, or a failure (401). Raise AuthCheckUnavailable for a 500."""

    async def authenticate(self, request: IncomingRequest,
                           ) -> Authenticated | AuthenticationFailure: ...


class Authorizer(Protocol):
    """Whether `user` may do `attributes`. Raise AuthCheckUnavailable for a 500."""

    async def authorize(self, user: UserInfo, attributes: RequestAttributes,
                        ) -> AuthorizationDecision: ...


# Whom the allow-all authenticator authenticates every request as (the HTTP surface uses it
# without asking, to build nothing for a request when authentication is off).
ALLOW_ALL_USER: UserInfo = ANONYMOUS


class _AllowAllAuthenticator:
    async def authenticate(self, request: IncomingRequest,
                           ) -> Authenticated | AuthenticationFailure:
        return Authenticated(ALLOW_ALL_USER, AuthMethod.ANONYMOUS)


class _AllowAllAuthorizer:
    async def authorize(self, user: UserInfo, attributes: RequestAttributes,
                        ) -> AuthorizationDecision:
        return AuthorizationDecision(Decision.ALLOW)


ALLOW_ALL_AUTHENTICATOR: Authenticator = _AllowAllAuthenticator()
ALLOW_ALL_AUTHORIZER: Authorizer = _AllowAllAuthorizer()
