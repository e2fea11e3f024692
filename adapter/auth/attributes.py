"""Request attributes: the decoded path to authorize and route on, and what a request asks in
the terms of authorization (RequestInfoFactory with API prefixes "api" and "apis")."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from string import hexdigits
from types import MappingProxyType

_API_PREFIXES = frozenset({"api", "apis"})
_GROUPLESS_API_PREFIXES = frozenset({"api"})
_SPECIAL_VERBS = frozenset({"proxy", "watch"})
_SPECIAL_VERBS_NO_SUBRESOURCES = frozenset({"proxy"})
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})
_METHOD_VERBS: Mapping[str, str] = MappingProxyType({
    "POST": "create",
    "GET": "get",
    "HEAD": "get",
    "PUT": "update",
    "PATCH": "patch",
    "DELETE": "delete",
})


class RequestAttributesError(ValueError):
    """The request path cannot be turned into authorization attributes (upstream answers 500)."""


@dataclass(frozen=True)
class RequestAttributes:
    """What is being asked, in the terms of authorization."""

    verb: str
    path: str
    is_resource_request: bool = False
    api_prefix: str = ""
    api_group: str = ""
    api_version: str = ""
    namespace: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""
    parts: tuple[str, ...] = ()


class RequestPathError(ValueError):
    """A request path the adapter refuses outright (answer 400): it could be read two ways."""


_BYTES = tuple(bytes((value,)) for value in range(256))


def decode_request_path(raw_path: str) -> str:
    """The decoded path to authorize and route on, as Go's ``URL.Path``; ambiguity refused.

    ``raw_path`` is the path as sent, without the query. Go decodes every escape, so an encoded
    slash becomes a separator there while a Python router may keep it inside a segment; a dot
    segment may be resolved by one layer and not another. Rather than authorize one reading and
    serve another, such paths are refused: ``%2F``, NUL, ``.``/``..`` segments (escaped or
    not) and malformed escapes.
    """
    if not raw_path.startswith("/"):
        raise RequestPathError("the request path must start with /")
    # Left to right, one piece per escape (every request runs this: no loop per character).
    first, *escaped = raw_path.split("%")
    out = [first.encode()]
    for piece in escaped:
        pair = piece[:2]
        if len(pair) != 2 or not (pair[0] in hexdigits and pair[1] in hexdigits):
            raise RequestPathError("malformed percent-encoding in the request path")
        value = int(pair, 16)
        if value == ord("/"):
            raise RequestPathError("encoded slashes are not allowed in the request path")
        out.append(_BYTES[value])
        out.append(piece[2:].encode())
    try:
        path = b"".join(out).decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestPathError("the request path is not UTF-8") from error
    if "\x00" in path:
        raise RequestPathError("NUL is not allowed in the request path")
    if any(segment in {".", ".."} for segment in path.split("/")):
        raise RequestPathError("dot segments are not allowed in the request path")
    return path


def _split_path(path: str) -> list[str]:
    # Only the outer slashes go: an inner empty segment stays a segment, as upstream.
    trimmed = path.strip("/")
    return trimmed.split("/") if trimmed else []


def _query_values(query: Sequence[tuple[str, str]], key: str) -> list[str]:
    return [value for name, value in query if name == key]


def _split_unescaped(text: str, separator: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    escaped = False
    for char in text:
        if escaped:
            current.append(char)
            escaped = False
        elif char == "\\":
            current.append(char)
            escaped = True
        elif char == separator:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def _unescape_field_value(value: str) -> str | None:
    out: list[str] = []
    escaped = False
    for char in value:
        if escaped:
            if char not in "\\,=":
                return None
            out.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char in ",=":
            return None
        else:
            out.append(char)
    return None if escaped else "".join(out)


def _field_selector_exact_name(selector: str) -> str | None:
    """``metadata.name`` required by a field selector (``=``/``==``), None if absent or invalid."""
    terms: list[tuple[str, str, str]] = []
    for part in sorted(_split_unescaped(selector, ",")):
        if not part:
            continue
        for index in range(len(part)):
            operator = next((op for op in ("!=", "==", "=") if part.startswith(op, index)), None)
            if operator is not None:
                value = _unescape_field_value(part[index + len(operator):])
                if value is None:
                    return None
                terms.append((part[:index], operator, value))
                break
        else:
            return None
    for lhs, operator, value in terms:
        if lhs == "metadata.name" and operator != "!=":
            return value
    return None


def _is_valid_path_segment_name(name: str) -> bool:
    return name not in {".", ".."} and "/" not in name and "%" not in name


def _query_flag(values: Sequence[str]) -> bool:
    return bool(values) and values[0].lower() not in {"false", "0"}


def request_attributes(
    *, method: str, path: str, query: Sequence[tuple[str, str]] = ()
) -> RequestAttributes:
    """Authorization attributes of a request, as ``RequestInfoFactory.NewRequestInfo``.

    ``path`` is the decoded URL path; ``query`` the decoded query pairs. Selector attributes
    (AuthorizeWithSelectors) are not produced: reviews ask for the broader permission.
    """
    non_resource = RequestAttributes(verb=method.lower(), path=path)
    parts = _split_path(path)
    if len(parts) < 3 or parts[0] not in _API_PREFIXES:
        return non_resource
    api_prefix = parts[0]
    parts = parts[1:]
    api_group = ""
    if api_prefix not in _GROUPLESS_API_PREFIXES:
        if len(parts) < 3:
            return non_resource
        api_group = parts[0]
        parts = parts[1:]
    api_version = parts[0]
    parts = parts[1:]

    verb_via_path = parts[0] in _SPECIAL_VERBS
    if verb_via_path:
        if len(parts) < 2:
            raise RequestAttributesError(
                f"unable to determine kind and namespace from url {path}")
        verb = parts[0]
        parts = parts[1:]
    else:
        verb = _METHOD_VERBS.get(method, "")  # methods are case-sensitive

    namespace = ""
    if parts[0] == "namespaces" and len(parts) > 1:
        namespace = parts[1]
        if len(parts) > 2 and parts[2] not in _NAMESPACE_SUBRESOURCES:
            parts = parts[2:]

    resource = subresource = name = ""
    if len(parts) >= 3 and verb not in _SPECIAL_VERBS_NO_SUBRESOURCES:
        subresource = parts[2]
    if len(parts) >= 2:
        name = parts[1]
    if len(parts) >= 1:
        resource = parts[0]

    if not name and verb == "get":
        verb = "watch" if _query_flag(_query_values(query, "watch")) else "list"
        selectors = _query_values(query, "fieldSelector")
        if selectors:
            exact = _field_selector_exact_name(selectors[0])
            if exact is not None and _is_valid_path_segment_name(exact):
                name = exact
    if not name and verb == "delete":
        verb = "deletecollection"

    return RequestAttributes(
        verb=verb,
        path=path,
        is_resource_request=True,
        api_prefix=api_prefix,
        api_group=api_group,
        api_version=api_version,
        namespace=namespace,
        resource=resource,
        subresource=subresource,
        name=name,
        parts=tuple(parts),
    )


def check_request_attributes(*, method: str, path: str) -> None:
    """Raise RequestAttributesError where ``request_attributes`` would, without building the
    attributes (when nothing reviews them). Only a verb in the path (``watch``, ``proxy``)
    with nothing after it fails, whatever the query: the rest is only read for those."""
    if any("/" + verb in path for verb in _SPECIAL_VERBS):
        request_attributes(method=method, path=path)
