"""autoscaler.server: the flags (upstream's names and aliases), the bind address, and log lines
that name the autoscaler they are about, as text or JSON."""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta

import pytest

from autoscaler.controller.workqueue import CURRENT_OBJECT
from autoscaler.server import (
    MAX_CONCURRENT_SYNCS,
    add_arguments,
    options_from_arguments,
    parse_bind_address,
)
from metricscale.logs import configure_logging


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(flags))


def test_defaults_are_upstreams() -> None:
    options = options_from_arguments(parse())
    assert options.concurrent_syncs == 5
    assert options.settings.sync_period == timedelta(seconds=15)
    assert options.settings.tolerance == 0.1
    assert options.settings.cpu_initialization_period == timedelta(minutes=5)
    assert options.settings.initial_readiness_delay == timedelta(seconds=30)
    assert options.settings.downscale_stabilization_window == timedelta(minutes=5)
    assert options.leader_election.enabled is True
    assert (options.dry_run, options.native_hpa, options.namespace) == (False, False, "")
    assert options.metrics_bind_address == ":8080"


@pytest.mark.parametrize("flag", ["--concurrent-syncs",
                                  "--concurrent-horizontal-pod-autoscaler-syncs"])
def test_both_names_of_the_worker_count_are_accepted(flag: str) -> None:
    assert options_from_arguments(parse(f"{flag}=9")).concurrent_syncs == 9


def test_controller_flags() -> None:
    options = options_from_arguments(parse(
        "--horizontal-pod-autoscaler-sync-period=30s", "--dry-run", "--enable-native-hpa",
        "--namespace=shop", "--leader-elect=false", "--horizontal-pod-autoscaler-tolerance=0.05",
        "--horizontal-pod-autoscaler-downscale-stabilization=1m"))
    assert options.settings.sync_period == timedelta(seconds=30)
    assert options.settings.tolerance == 0.05
    assert options.settings.downscale_stabilization_window == timedelta(minutes=1)
    assert (options.dry_run, options.native_hpa, options.namespace) == (True, True, "shop")
    assert options.leader_election.enabled is False


def test_zero_workers_is_a_usage_error() -> None:
    with pytest.raises(SystemExit):
        parse("--concurrent-syncs=0")


def test_inconsistent_lease_timings_are_refused() -> None:
    with pytest.raises(ValueError, match="leaseDuration must be greater than renewDeadline"):
        options_from_arguments(parse("--leader-elect-lease-duration=5s",
                                     "--leader-elect-renew-deadline=10s"))


@pytest.mark.parametrize(("text", "expected"), [
    (":8080", ("0.0.0.0", 8080)), ("127.0.0.1:0", ("127.0.0.1", 0)),
    ("[::1]:9090", ("::1", 9090)), ("0", None), ("", None)])
def test_bind_address(text: str, expected: tuple[str, int] | None) -> None:
    assert parse_bind_address(text) == expected


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        root.handlers = handlers
        root.setLevel(level)


def test_json_log_lines_name_the_autoscaler(restore_logging: None) -> None:
    stream = io.StringIO()
    configure_logging(fmt="json", level="info", stream=stream,
                      current_object=CURRENT_OBJECT.get)
    log = logging.getLogger("autoscaler.controller.reconciler")
    token = CURRENT_OBJECT.set("shop/web")
    try:
        log.info("scaled %s to %d", "Deployment/web", 4)
    finally:
        CURRENT_OBJECT.reset(token)
    log.info("caches filled")
    first, second = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["message"] == "scaled Deployment/web to 4"
    assert (first["object"], first["namespace"], first["name"]) == ("shop/web", "shop", "web")
    assert first["level"] == "info" and first["logger"] == "autoscaler.controller.reconciler"
    assert first["time"].endswith("Z")
    assert second["object"] == "-" and "namespace" not in second


def test_text_log_lines_name_the_autoscaler(restore_logging: None) -> None:
    stream = io.StringIO()
    configure_logging(fmt="text", level="debug", stream=stream,
                      current_object=CURRENT_OBJECT.get)
    token = CURRENT_OBJECT.set("shop/web")
    try:
        logging.getLogger("autoscaler.controller.reconciler").warning("metric failed")
    finally:
        CURRENT_OBJECT.reset(token)
    line = stream.getvalue()
    assert " WARNING shop/web autoscaler.controller.reconciler: metric failed" in line


def test_a_program_without_objects_logs_lines_without_them(restore_logging: None) -> None:
    stream = io.StringIO()
    configure_logging(fmt="json", level="info", stream=stream)
    logging.getLogger("adapter.server").info("serving")
    configure_logging(fmt="text", level="info", stream=stream)
    logging.getLogger("adapter.server").info("serving")
    as_json, as_text = stream.getvalue().splitlines()
    assert list(json.loads(as_json)) == ["time", "level", "logger", "message"]
    assert as_text.endswith("Z INFO    adapter.server: serving")


# ------------------------------------------------- values refused at start (issue 21, 10)

NOT_A_LABEL = "a namespace must be a DNS-1123 label: a lowercase RFC 1123 label must consist"
NOT_A_SUBDOMAIN = "a Lease's name must be a DNS-1123 subdomain: a lowercase RFC 1123 subdomain"


@pytest.mark.parametrize(("flag", "message"), [
    ("--namespace=Bad_NS!", f"--namespace 'Bad_NS!': {NOT_A_LABEL}"),
    ("--namespace=shop.eu", f"--namespace 'shop.eu': {NOT_A_LABEL}"),
    (f"--namespace={'a' * 64}", f"--namespace '{'a' * 64}': a namespace must be a DNS-1123 "
                                "label: must be no more than 63 characters"),
    ("--horizontal-pod-autoscaler-sync-period=1000000000h",
     "--horizontal-pod-autoscaler-sync-period: must be at most 1h0m0s, the longest "
     "spec.behavior.syncPeriodSeconds, got 1000000000h0m0s"),
    ("--horizontal-pod-autoscaler-sync-period=61m",
     "--horizontal-pod-autoscaler-sync-period: must be at most 1h0m0s"),
    ("--horizontal-pod-autoscaler-downscale-stabilization=1000000000h",
     "--horizontal-pod-autoscaler-downscale-stabilization: must be at most "
     "2562047h47m16.854775807s, Go's longest duration, got 1000000000h0m0s"),
    ("--horizontal-pod-autoscaler-cpu-initialization-period=2562048h",
     "--horizontal-pod-autoscaler-cpu-initialization-period: must be at most 2562047h"),
    ("--horizontal-pod-autoscaler-initial-readiness-delay=2562048h",
     "--horizontal-pod-autoscaler-initial-readiness-delay: must be at most 2562047h"),
    ("--scale-up-limit-factor=1e308", "--scale-up-limit-factor: must be at most 1000"),
    ("--scale-up-limit-minimum=1e10", "--scale-up-limit-minimum: must be at most 2147483647"),
    ("--leader-elect-lease-duration=1000000000h",
     "--leader-elect-lease-duration: must be at most 596523h14m7s (a Lease's "
     "leaseDurationSeconds is an int32), got 1000000000h0m0s"),
    ("--leader-elect-resource-name=Bad_Name",
     f"--leader-elect-resource-name 'Bad_Name': {NOT_A_SUBDOMAIN}"),
    ("--leader-elect-resource-namespace=Ops", f"--leader-elect-resource-namespace 'Ops': "
                                              f"{NOT_A_LABEL}"),
])
def test_a_value_that_would_fail_later_is_refused_naming_the_flag(flag: str,
                                                                  message: str) -> None:
    with pytest.raises(ValueError) as raised:
        options_from_arguments(parse(flag))
    assert str(raised.value).startswith(message), str(raised.value)


def test_the_edges_of_every_range_are_accepted() -> None:
    options = options_from_arguments(parse(
        "--horizontal-pod-autoscaler-sync-period=1h", f"--namespace={'a' * 63}",
        "--horizontal-pod-autoscaler-downscale-stabilization=2562047h",
        f"--concurrent-syncs={MAX_CONCURRENT_SYNCS}", "--scale-up-limit-factor=1000",
        "--leader-elect-lease-duration=596523h14m7s", "--leader-elect-renew-deadline=10s",
        "--leader-elect-resource-name=lock.metricscale.dev",
        "--leader-elect-resource-namespace=kube-system"))
    assert options.settings.sync_period == timedelta(hours=1)
    assert options.namespace == "a" * 63
    assert options.concurrent_syncs == MAX_CONCURRENT_SYNCS
    assert options.leader_election.resource_name == "lock.metricscale.dev"


def test_more_workers_than_the_most_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(f"--concurrent-syncs={MAX_CONCURRENT_SYNCS + 1}")
    assert (f"argument --concurrent-syncs/--concurrent-horizontal-pod-autoscaler-syncs: must "
            f"be at most {MAX_CONCURRENT_SYNCS}, got '1001'") in capsys.readouterr().err


def test_help_states_the_bounds(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse("--help")
    text = " ".join(capsys.readouterr().out.split())
    assert "(default 15s; at most 1h, as spec.behavior.syncPeriodSeconds)" in text
    assert f"(default 5, at most {MAX_CONCURRENT_SYNCS})" in text
    assert "watch only this namespace, a DNS-1123 label (default: all)" in text


def run_autoscaler(*flags: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    return subprocess.run([sys.executable, "-m", "metricscale", "autoscaler", *flags,
                           "--kubeconfig", "/nonexistent"], env=env, capture_output=True,
                          text=True, timeout=60, check=False)


@pytest.mark.parametrize(("flag", "message"), [
    ("--namespace=Bad_NS!", f"--namespace 'Bad_NS!': {NOT_A_LABEL}"),
    ("--horizontal-pod-autoscaler-sync-period=1000000000h",
     "--horizontal-pod-autoscaler-sync-period: must be at most 1h0m0s"),
])
def test_the_program_stops_at_start_with_one_line_and_exit_2(flag: str, message: str) -> None:
    # before it reads the kubeconfig (which does not exist here): the flag is what is wrong
    result = run_autoscaler(flag)
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert message in line and "kubeconfig" not in line
