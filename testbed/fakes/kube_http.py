"""A thin raw-HTTP client for the fake kube-apiserver, for tests that check the wire itself."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import aiohttp

from testbed.fakes.kube_api import FakeKubeAPI

__all__ = ["KubeHTTPClient", "Reply"]


@dataclass(frozen=True)
class Reply:
    status: int
    text: str
    headers: Mapping[str, str]
    header_list: tuple[tuple[str, str], ...]

    @property
    def json(self) -> Any:
        return json.loads(self.text)

    def headers_named(self, name: str) -> list[str]:
        return [v for k, v in self.header_list if k.lower() == name.lower()]


class KubeHTTPClient:
    """``async with KubeHTTPClient(kube) as http: reply = await http.get("/api/v1/pods")``."""

    def __init__(self, kube: FakeKubeAPI, *, token: str | None = None,
                 client_certificate: tuple[str, str] | None = None,
                 anonymous: bool = False) -> None:
        self.kube = kube
        self.token = None if anonymous else (token or kube.admin_token)
        self._context = ssl.create_default_context(cafile=str(kube.ca_file))
        if client_certificate is not None:
            self._context.load_cert_chain(*client_certificate)
            self.token = token
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> KubeHTTPClient:
        self._session = aiohttp.ClientSession()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        traceback: TracebackType | None) -> None:
        if self._session is not None:
            await self._session.close()

    def _headers(self, headers: Mapping[str, str] | Sequence[tuple[str, str]] | None,
                 content_type: str | None) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        if self.token:
            out.append(("Authorization", f"Bearer {self.token}"))
        if content_type:
            out.append(("Content-Type", content_type))
        if headers is not None:
            out.extend(headers.items() if isinstance(headers, Mapping) else headers)
        return out

    async def request(self, method: str, path: str, *, body: Any = None,
                      content_type: str | None = None,
                      params: Mapping[str, str] | Sequence[tuple[str, str]] | None = None,
                      headers: Mapping[str, str] | Sequence[tuple[str, str]] | None = None,
                      raw: bytes | None = None) -> Reply:
        assert self._session is not None, "use `async with KubeHTTPClient(...)`"
        data: bytes | None = raw
        if body is not None:
            data = json.dumps(body).encode()
            content_type = content_type or "application/json"
        async with self._session.request(method, self.kube.url + path, params=params, data=data,
                                         headers=self._headers(headers, content_type),
                                         ssl=self._context) as response:
            text = await response.text()
            return Reply(response.status, text, dict(response.headers),
                         tuple(response.headers.items()))

    async def get(self, path: str, **kwargs: Any) -> Reply:
        return await self.request("GET", path, **kwargs)

    async def post(self, path: str, body: Any, **kwargs: Any) -> Reply:
        return await self.request("POST", path, body=body, **kwargs)

    async def put(self, path: str, body: Any, **kwargs: Any) -> Reply:
        return await self.request("PUT", path, body=body, **kwargs)

    async def patch(self, path: str, body: Any, *, content_type: str, **kwargs: Any) -> Reply:
        return await self.request("PATCH", path, body=body, content_type=content_type, **kwargs)

    async def delete(self, path: str, **kwargs: Any) -> Reply:
        return await self.request("DELETE", path, **kwargs)

    async def watch(self, path: str, params: Mapping[str, str] | None = None, *,
                    headers: Mapping[str, str] | None = None,
                    ) -> AsyncIterator[dict[str, Any]]:
        """Yield watch events (parsed lines) until the server ends the stream. A non-200 answer
        is yielded once as {"type": "HTTP", "status": code, "object": body}."""
        assert self._session is not None, "use `async with KubeHTTPClient(...)`"
        query = {"watch": "true", **(params or {})}
        async with self._session.get(self.kube.url + path, params=query,
                                     headers=self._headers(headers, None),
                                     ssl=self._context) as response:
            if response.status != 200:
                text = await response.text()
                try:
                    body: Any = json.loads(text)
                except ValueError:
                    body = text
                yield {"type": "HTTP", "status": response.status, "object": body}
                return
            async for line in response.content:
                if line.strip():
                    yield json.loads(line)
