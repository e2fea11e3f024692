"""autoscaler.server: the flags (upstream's names and aliases), the bind address, and log lines
that name the autoscaler they are about, as text or JSON."""

from __future__ import annotations

import argparse
import io
import json
import logging
from collections.abc import Iterator
from datetime import timedelta

import pytest

from autoscaler.controller.workqueue import CURRENT_OBJECT
from autoscaler.server import (
    add_arguments,
    configure_logging,
    options_from_arguments,
    parse_bind_address,
)


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
    configure_logging(fmt="json", level="info", stream=stream)
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
    configure_logging(fmt="text", level="debug", stream=stream)
    token = CURRENT_OBJECT.set("shop/web")
    try:
        logging.getLogger("autoscaler.controller.reconciler").warning("metric failed")
    finally:
        CURRENT_OBJECT.reset(token)
    line = stream.getvalue()
    assert " WARNING shop/web autoscaler.controller.reconciler: metric failed" in line
