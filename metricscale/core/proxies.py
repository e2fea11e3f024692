"""Choosing the HTTP proxy for a backend: kubeconfig `proxy-url`, else HTTP(S)_PROXY/NO_PROXY."""

from __future__ import annotations

import base64
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from yarl import URL

__all__ = ["ProxyChoice", "proxy_for"]

# urllib's NO_PROXY matching over a given mapping (missing from typeshed's stubs); it reads no
# environment when handed the mapping.
_proxy_bypass: Callable[[str, dict[str, str]], bool] = (
    urllib.request.proxy_bypass_environment)  # type: ignore[attr-defined]


@dataclass(frozen=True)
class ProxyChoice:
    """Where requests to a backend go: straight (`url` None) or through an HTTP proxy."""

    url: URL | None = None
    headers: tuple[tuple[str, str], ...] = ()  # Proxy-Authorization
    ignored: str | None = None  # why a configured proxy is not used (for the log)


def proxy_for(target: URL, proxies: Mapping[str, str], *, configured: str | None = None,
              configured_headers: Mapping[str, str] | None = None) -> ProxyChoice:
    """The proxy for requests to `target`.

    `configured` is a kubeconfig's `proxy-url` (Configuration.proxy): it wins, as in client-go.
    Otherwise `proxies` are `urllib.request.getproxies()`-style settings (a scheme mapped to a
    proxy URL, `no` to the NO_PROXY list) with aiohttp's `trust_env` rules: NO_PROXY (urllib's
    matching) first, then the proxy for the target's scheme; `https://` proxies are not
    supported by aiohttp and are ignored, as `trust_env` ignores them; a proxy written without
    a scheme is `http://` (as Go reads it); credentials in its URL become Proxy-Authorization.
    """
    if configured:
        return ProxyChoice(url=URL(configured),
                           headers=tuple((configured_headers or {}).items()))
    host = target.host
    if host is None or _proxy_bypass(host, dict(proxies)):
        return ProxyChoice()
    raw = proxies.get(target.scheme)
    if not raw:
        return ProxyChoice()
    proxy = URL(raw if "://" in raw else f"http://{raw}")
    if proxy.scheme != "http" or not proxy.host:
        return ProxyChoice(ignored=f"{proxy.scheme}:// proxies are not supported")
    headers: tuple[tuple[str, str], ...] = ()
    if proxy.user is not None:
        pair = f"{proxy.user}:{proxy.password or ''}".encode()
        headers = (("Proxy-Authorization", "Basic " + base64.b64encode(pair).decode("ascii")),)
        proxy = proxy.with_user(None)
    return ProxyChoice(url=proxy, headers=headers)
