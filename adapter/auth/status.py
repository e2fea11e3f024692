"""The Status bodies of refused requests, worded as kube-apiserver words them."""

from __future__ import annotations

from typing import Any

from adapter.api.wire import status_body
from adapter.auth.attributes import RequestAttributes
from adapter.auth.users import UserInfo
from metricscale.core.selectors import quote_go_string

AUTHORIZATION_FAILED_CAUSE = "the authorization check could not be completed"
AUTHENTICATION_FAILED_CAUSE = "the authentication check could not be completed"


def _html_sanitize(text: str) -> str:
    # Upstream escapes these so an error text can never be mistaken for HTML.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def forbidden_message(*, user: UserInfo, attributes: RequestAttributes, reason: str = "") -> str:
    """The message of ``responsewriters.Forbidden`` wrapped by ``NewForbidden``."""
    who = quote_go_string(user.name)
    if not attributes.is_resource_request:
        detail = f"User {who} cannot {attributes.verb} path {quote_go_string(attributes.path)}"
    else:
        resource = attributes.resource
        if attributes.subresource:
            resource = f"{resource}/{attributes.subresource}"
        scope = (f"in the namespace {quote_go_string(attributes.namespace)}"
                 if attributes.namespace else "at the cluster scope")
        detail = (f"User {who} cannot {attributes.verb} resource {quote_go_string(resource)} "
                  f"in API group {quote_go_string(attributes.api_group)} {scope}")
    detail = _html_sanitize(detail)
    if reason:
        detail = f"{detail}: {reason}"
    if not attributes.api_group and not attributes.resource:
        return f"forbidden: {detail}"
    qualified = (f"{attributes.resource}.{attributes.api_group}" if attributes.api_group
                 else attributes.resource)
    if not attributes.name:
        return f"{qualified} is forbidden: {detail}"
    return f"{qualified} {quote_go_string(attributes.name)} is forbidden: {detail}"


def forbidden_status(
    *, user: UserInfo, attributes: RequestAttributes, reason: str = ""
) -> dict[str, Any]:
    details = {"name": attributes.name, "group": attributes.api_group,
               "kind": attributes.resource}
    return status_body(
        code=403, reason="Forbidden",
        message=forbidden_message(user=user, attributes=attributes, reason=reason),
        details={key: value for key, value in details.items() if value},
    )
