"""Raw HTTP/1.1 over a socket, for requests an HTTP client would refuse to send: the requests
aiohttp's parser rejects, and one exchange that returns the status and the body as bytes.
Shared by the adapter's and the autoscaler's parse-error tests (neither imports the other)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl

import pytest


def unparseable_requests(path: str) -> list[object]:
    """Requests to `path` that aiohttp's parser rejects (400), each carrying the marker `QQQQ`
    that the answer must not repeat: a request line too long, a Content-Length that is no
    number, too many headers."""
    return [
        pytest.param(b"GET /" + b"Q" * 9000 + b" HTTP/1.1\r\nHost: a\r\n\r\n", id="long-line"),
        pytest.param(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: a\r\n"
                     b"Content-Length: QQQQQQQQ\r\n\r\n", id="bad-content-length"),
        pytest.param(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: a\r\n"
                     + b"".join(b"X-QQQQ-%d: QQQQ\r\n" % n for n in range(200)) + b"\r\n",
                     id="too-many-headers"),
    ]


async def raw_exchange(port: int, request: bytes, *,
                       ssl_context: ssl.SSLContext | None = None) -> tuple[int, bytes]:
    """Send `request` as is to 127.0.0.1:`port` (over TLS to "localhost" with `ssl_context`)
    and read until the server closes: the status code and the body of the answer."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, ssl=ssl_context,
        server_hostname="localhost" if ssl_context is not None else None)
    try:
        writer.write(request)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout=10)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError):
            await writer.wait_closed()
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body
