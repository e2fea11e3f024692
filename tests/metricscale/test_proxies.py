"""Choosing the proxy (metricscale.core.proxies), shared by the Prometheus and Kubernetes
clients."""

from __future__ import annotations

import pytest
from yarl import URL

from metricscale.core.proxies import ProxyChoice, proxy_for

PROXY = URL("http://proxy:3128")


@pytest.mark.parametrize(("target", "proxies", "expected"), [
    ("http://prom:9090", {}, ProxyChoice()),
    ("http://prom:9090", {"http": "http://proxy:3128"}, ProxyChoice(url=PROXY)),
    ("https://10.0.0.1:6443", {"https": "http://proxy:3128"}, ProxyChoice(url=PROXY)),
    # the target's scheme only, both ways
    ("http://prom:9090", {"https": "http://proxy:3128"}, ProxyChoice()),
    ("https://10.0.0.1:6443", {"http": "http://proxy:3128"}, ProxyChoice()),
    ("http://prom:9090", {"http": "proxy:3128"}, ProxyChoice(url=PROXY)),  # no scheme: http://
])
def test_the_environment_proxy_for_the_targets_scheme_is_used(
        target: str, proxies: dict[str, str], expected: ProxyChoice) -> None:
    assert proxy_for(URL(target), proxies) == expected


@pytest.mark.parametrize(("target", "no_proxy", "expected"), [
    ("https://10.0.0.1:6443", "10.0.0.1", ProxyChoice()),
    ("http://prom:9090", "other,prom", ProxyChoice()),
    ("http://prom.monitoring.svc:9090", ".svc", ProxyChoice()),
    ("http://prom:9090", "*", ProxyChoice()),
    ("https://10.0.0.1:6443", "10.0.0.2,example.com", ProxyChoice(url=PROXY)),
    ("http://prom:9090", "prometheus", ProxyChoice(url=PROXY)),  # a whole name, not a prefix
])
def test_no_proxy_follows_urllibs_matching(target: str, no_proxy: str,
                                           expected: ProxyChoice) -> None:
    proxies = {"http": "http://proxy:3128", "https": "http://proxy:3128", "no": no_proxy}
    assert proxy_for(URL(target), proxies) == expected


def test_an_https_proxy_is_ignored_with_the_reason() -> None:
    assert proxy_for(URL("http://prom:9090"), {"http": "https://proxy:3128"}) == \
        ProxyChoice(ignored="https:// proxies are not supported")


@pytest.mark.parametrize(("proxy", "authorization"), [
    ("http://me:secret@proxy:3128", "Basic bWU6c2VjcmV0"),
    ("http://al%40ice:p%3Ass@proxy:3128", "Basic YWxAaWNlOnA6c3M="),  # percent-decoded first
])
def test_credentials_in_the_proxy_url_become_proxy_authorization(
        proxy: str, authorization: str) -> None:
    assert proxy_for(URL("https://10.0.0.1:6443"), {"https": proxy}) == \
        ProxyChoice(url=PROXY, headers=(("Proxy-Authorization", authorization),))


def test_the_kubeconfig_proxy_url_wins_over_the_environment() -> None:
    choice = proxy_for(URL("https://10.0.0.1:6443"), {"https": "http://env:1", "no": "10.0.0.1"},
                       configured="http://kubeconfig:2",
                       configured_headers={"Proxy-Authorization": "Basic eA=="})
    assert choice == ProxyChoice(url=URL("http://kubeconfig:2"),
                                 headers=(("Proxy-Authorization", "Basic eA=="),))
