"""The identity headers a front proxy sends for an authenticated user (no I/O).

When the adapter passes a request on to another metrics adapter (`--delegate-*-to`), it plays
the aggregator: it presents a front-proxy client certificate and names the caller in the
headers client-go's `transport.SetAuthProxyHeaders` writes, so the other adapter authenticates
and authorizes the original caller exactly as it would behind kube-apiserver.
"""

from __future__ import annotations

from adapter.auth.users import UserInfo

__all__ = [
    "canonical_header_key",
    "escape_extra_key",
    "identity_headers",
]

USER_HEADER = "X-Remote-User"
UID_HEADER = "X-Remote-Uid"
GROUP_HEADER = "X-Remote-Group"
EXTRA_HEADER_PREFIX = "X-Remote-Extra-"
_TOKEN_PUNCTUATION = frozenset(b"!#$&'*+-.^_`|~")


def _legal_header_byte(byte: int) -> bool:
    """An RFC 7230 token byte, `%` excepted (it is escaped so that decoding is unambiguous)."""
    return (48 <= byte <= 57 or 65 <= byte <= 90 or 97 <= byte <= 122
            or byte in _TOKEN_PUNCTUATION)


def escape_extra_key(key: str) -> str:
    """client-go's `headerKeyEscape`: %-encode every byte that is not a token byte, and `%`.

    The receiving side lower-cases the rest of the header name, then percent-decodes it
    (aggregation-contract.md §3.2), which gives `key` back for any lower-case key.
    """
    return "".join(chr(byte) if _legal_header_byte(byte) else f"%{byte:02X}"
                   for byte in key.encode("utf-8"))


def canonical_header_key(name: str) -> str:
    """Go's `textproto.CanonicalMIMEHeaderKey` for a token: `x-remote-extra-a%2Fb` becomes
    `X-Remote-Extra-A%2fb` (the form the aggregator sends; names are case-insensitive)."""
    out = []
    upper = True
    for char in name:
        if upper and "a" <= char <= "z":
            char = char.upper()
        elif not upper and "A" <= char <= "Z":
            char = char.lower()
        out.append(char)
        upper = char == "-"
    return "".join(out)


def identity_headers(user: UserInfo) -> tuple[tuple[str, str], ...]:
    """`X-Remote-User`, `X-Remote-Uid` (when set), one `X-Remote-Group` per group and one
    `X-Remote-Extra-<key>` per extra value, in the order the aggregator writes them."""
    headers = [(USER_HEADER, user.name)]
    if user.uid:
        headers.append((UID_HEADER, user.uid))
    headers.extend((GROUP_HEADER, group) for group in user.groups)
    for key in sorted(user.extra):
        name = canonical_header_key(EXTRA_HEADER_PREFIX + escape_extra_key(key))
        headers.extend((name, value) for value in user.extra[key])
    return tuple(headers)
