"""`metricscale adapter` flags: defaults, Go durations, prometheus-adapter's names, and the
combinations that are refused with a message naming the flag."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest

from adapter.settings import (
    AdapterSettingsError,
    parse_settings,
)
from metricscale.core.durations import DurationError, format_duration, parse_go_duration

REQUIRED = ["--config", "rules.yaml", "--prometheus-url", "http://prometheus:9090"]


@pytest.mark.parametrize(("text", "seconds"), [
    ("1m", Decimal(60)), ("90s", Decimal(90)), ("1m30s", Decimal(90)), ("1.5h", Decimal(5400)),
    ("500ms", Decimal("0.5")), ("0", Decimal(0)), ("2h45m", Decimal(9900)),
    ("-1s", Decimal(-1)), ("1us", Decimal("0.000001")),
])
def test_go_durations_parse_exactly(text: str, seconds: Decimal) -> None:
    assert parse_go_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "1", "m", "1x", "1m 30s", ".s", "--1s"])
def test_malformed_durations_are_refused(text: str) -> None:
    with pytest.raises(DurationError):
        parse_go_duration(text)
    with pytest.raises(AdapterSettingsError, match="--metrics-relist-interval: invalid duration"):
        parse_settings([*REQUIRED, f"--metrics-relist-interval={text}"])


@pytest.mark.parametrize(("seconds", "text"), [(60, "1m0s"), (90, "1m30s"), (5400, "1h30m0s"),
                                               (45, "45s"), (0, "0s")])
def test_durations_print_as_go_prints_them(seconds: int, text: str) -> None:
    assert format_duration(timedelta(seconds=seconds)) == text


def test_defaults_follow_the_readme() -> None:
    settings = parse_settings(REQUIRED)
    assert settings.serving.port == 6443
    assert settings.relist_interval == Decimal(60)
    assert settings.max_age == settings.relist_interval
    assert settings.prometheus is not None
    assert settings.prometheus.method == "POST"
    assert settings.prometheus.timeout == 10.0
    assert settings.prometheus.cache_ttl == 0  # the result cache is off unless asked for
    assert settings.serving.cert_dir == "apiserver.local.config/certificates"


def test_max_age_defaults_to_the_relist_interval() -> None:
    settings = parse_settings([*REQUIRED, "--metrics-relist-interval", "10m"])
    assert settings.max_age == Decimal(600)


def test_max_age_shorter_than_the_relist_interval_is_refused() -> None:
    with pytest.raises(AdapterSettingsError, match="--metrics-max-age"):
        parse_settings([*REQUIRED, "--metrics-relist-interval", "5m", "--metrics-max-age", "1m"])


def test_lister_kubeconfig_is_prometheus_adapters_name_for_kubeconfig() -> None:
    assert parse_settings([*REQUIRED, "--lister-kubeconfig", "k"]).kubeconfig == "k"
    assert parse_settings([*REQUIRED, "--kubeconfig", "k", "--lister-kubeconfig", "k"]) \
        .kubeconfig == "k"
    with pytest.raises(AdapterSettingsError, match="different files"):
        parse_settings([*REQUIRED, "--kubeconfig", "a", "--lister-kubeconfig", "b"])


def test_prometheus_options_reach_the_client_settings() -> None:
    settings = parse_settings([
        *REQUIRED, "--prometheus-header", "X-Scope-OrgID=team-a", "--prometheus-header",
        "X-Extra=a=b", "--prometheus-verb", "get", "--prometheus-timeout", "2500ms",
        "--prometheus-ca-file", "ca.pem", "--prometheus-insecure-skip-tls-verify",
        "--prometheus-username", "u", "--prometheus-password-file", "p",
        "--prometheus-cache-ttl", "5s"])
    prometheus = settings.prometheus
    assert prometheus is not None
    assert prometheus.headers == (("X-Scope-OrgID", "team-a"), ("X-Extra", "a=b"))
    assert prometheus.method == "GET"
    assert prometheus.timeout == 2.5
    assert prometheus.ca_file == "ca.pem" and prometheus.insecure_skip_verify
    assert prometheus.basic_auth_username == "u"
    assert prometheus.cache_ttl == 5.0
    assert prometheus.accept_encoding == "identity"


def test_answers_are_asked_uncompressed_unless_a_backend_or_the_flag_says_gzip() -> None:
    from adapter.rules.config import parse_config
    from adapter.settings import backend_prometheus_settings

    config = parse_config("backends:\n- {name: far, url: http://far, acceptEncoding: gzip}\n"
                          "- {name: near, url: http://near}\n")
    far, near = config.backends
    for flag, expected in (([], ("gzip", "identity", "identity")),
                           (["--prometheus-accept-encoding", "GZIP"], ("gzip", "gzip", "gzip"))):
        flags = parse_settings([*REQUIRED, *flag]).prometheus
        assert flags is not None
        assert (backend_prometheus_settings(far, flags=flags).accept_encoding,
                backend_prometheus_settings(near, flags=flags).accept_encoding,
                flags.accept_encoding) == expected


@pytest.mark.parametrize(("extra", "message"), [
    (["--prometheus-username", "u"], "basic auth"),
    (["--prometheus-token-file", "t", "--prometheus-username", "u",
      "--prometheus-password-file", "p"], "bearer token file or basic auth"),
    (["--prometheus-client-tls-cert-file", "c"], "client certificate"),
    (["--prometheus-header", "=x"], "header"),
    (["--prometheus-header", "NoEquals"], "--prometheus-header 'NoEquals': expected NAME=VALUE"),
    (["--delegate-external-to", "https://keda\r\n:443"],
     r"--delegate-external-to contains a control character \(U\+000D at position 12\)"),
    (["--prometheus-timeout", "0s"], "--prometheus-timeout"),
    (["--prometheus-cache-ttl=-1s"], "--prometheus-cache-ttl"),
    (["--tls-cert-file", "c"], "--tls-private-key-file"),
    (["--secure-port", "0"], "--secure-port"),
])
def test_combinations_that_cannot_work_are_refused(extra: list[str], message: str) -> None:
    with pytest.raises(AdapterSettingsError, match=message):
        parse_settings([*REQUIRED, *extra])


def test_serving_needs_a_config_and_a_prometheus_url() -> None:
    with pytest.raises(AdapterSettingsError, match="--config"):
        parse_settings(["--prometheus-url", "http://p:9090"])
    with pytest.raises(AdapterSettingsError, match="--prometheus-url"):
        parse_settings(["--config", "rules.yaml"])


def test_check_config_needs_neither() -> None:
    settings = parse_settings(["--check-config", "rules.yaml"])
    assert settings.check_config == "rules.yaml" and settings.prometheus is None


def test_auth_flags_are_parsed_for_the_auth_wiring() -> None:
    settings = parse_settings([
        *REQUIRED, "--requestheader-allowed-names", "front-proxy-client,aggregator",
        "--requestheader-username-headers", "X-Remote-User", "--authentication-skip-lookup",
        "--authorization-always-allow-paths", "/healthz,/livez", "--insecure-disable-auth"])
    assert settings.auth.requestheader_allowed_names == ("front-proxy-client", "aggregator")
    assert settings.auth.requestheader_username_headers == ("X-Remote-User",)
    assert settings.auth.authentication_skip_lookup
    assert settings.auth.authorization_always_allow_paths == ("/healthz", "/livez")
    assert settings.auth.insecure_disable_auth


def test_an_empty_header_value_is_written_with_equals() -> None:
    settings = parse_settings([*REQUIRED, "--prometheus-header", "X-Scope-OrgID="])
    assert settings.prometheus is not None
    assert settings.prometheus.headers == (("X-Scope-OrgID", ""),)


@pytest.mark.parametrize("url", ["http://prometheus:9090/\n", "http://prom\x00etheus:9090",
                                 "http://prometheus:9090/\x7f"])
def test_a_prometheus_url_with_a_control_character_is_refused(url: str) -> None:
    with pytest.raises(AdapterSettingsError, match="--prometheus-url contains a control character"):
        parse_settings(["--config", "rules.yaml", "--prometheus-url", url])
