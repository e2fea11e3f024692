"""The real-Prometheus test double: scraping, queries, bounded waits, backfill and lifecycle."""

from __future__ import annotations

import time
from decimal import Decimal

import pytest

from testbed.fakes.exporter import Exporter
from testbed.fakes.prometheus import (
    PrometheusQueryError,
    PrometheusServer,
    PrometheusStartError,
    PrometheusUnavailable,
    PrometheusWaitTimeout,
    absent,
    count_of,
    exists,
    recent_timestamps,
    selector,
    synthetic_families,
)
from testbed.fakes.prometheus_fixtures import PrometheusFactory

pytestmark = pytest.mark.prometheus


# ---- scraping the in-test exporter


def test_scraped_gauge_appears_and_follows_the_exporter(
    prometheus: PrometheusServer, exporter: Exporter
) -> None:
    labels = {"namespace": "double-gauge", "pod": "web-1"}
    exporter.set("queue_depth", labels, 42)
    series = selector("queue_depth", labels)

    [sample] = prometheus.wait_for(series, 42)
    assert sample.labels["job"] == exporter.job
    assert sample.labels["pod"] == "web-1"

    exporter.set("queue_depth", labels, 7.5)
    prometheus.wait_for(series, Decimal("7.5"))


def test_rate_over_an_exporter_counter_is_positive_and_sees_resets(
    prometheus: PrometheusServer, exporter: Exporter
) -> None:
    labels = {"namespace": "double-rate", "pod": "web-1"}
    series = selector("http_requests_total", labels)
    for _ in range(3):
        exporter.inc("http_requests_total", labels, 10)
        prometheus.wait_for_scrape(exporter)

    prometheus.wait_for(f"rate({series}[1m])", lambda s: len(s) == 1 and s[0].value > 0)
    prometheus.wait_for(f"resets({series}[1m])", 0)

    exporter.set("http_requests_total", labels, 0)
    prometheus.wait_for(f"resets({series}[1m])", 1)


def test_removed_series_stop_answering_instant_queries(
    prometheus: PrometheusServer, exporter: Exporter
) -> None:
    for pod in ("a", "b"):
        exporter.set("removal_probe", {"namespace": "double-removal", "pod": pod}, 1)
    query = selector("removal_probe", {"namespace": "double-removal"})
    prometheus.wait_for(query, count_of(2))

    exporter.remove("removal_probe", {"namespace": "double-removal", "pod": "a"})
    [left] = prometheus.wait_for(query, count_of(1))
    assert left.labels["pod"] == "b"

    exporter.clear()
    prometheus.wait_for(query, absent)


async def test_async_helpers_poll_without_blocking_the_loop(
    prometheus: PrometheusServer, exporter: Exporter
) -> None:
    labels = {"namespace": "double-async", "pod": "web-1"}
    exporter.set("async_probe", labels, 3)
    await prometheus.wait_for_scrape_async(exporter, series=selector("async_probe", labels))
    [sample] = await prometheus.query_async(selector("async_probe", labels))
    assert sample.value == 3
    await prometheus.wait_for_async(f"sum({selector('async_probe', labels)})", 3)


def test_extra_exporters_get_target_labels_and_can_be_removed(
    prometheus: PrometheusServer,
) -> None:
    with Exporter(job="double-extra-a") as first, Exporter(job="double-extra-b") as second:
        for each in (first, second):
            each.set("extra_probe", {"namespace": "double-extra"}, 1)
        prometheus.add_target(first, labels={"team": "blue"})
        prometheus.add_target(second, job="double-extra-renamed")
        try:
            prometheus.wait_for_scrape(first)
            prometheus.wait_for_scrape(second)
            answer = prometheus.query(selector("extra_probe", {"namespace": "double-extra"}))
            assert sorted((s.labels["job"], s.labels.get("team", "")) for s in answer) == [
                ("double-extra-a", "blue"),
                ("double-extra-renamed", ""),
            ]
        finally:
            prometheus.remove_target(first)
            prometheus.remove_target(second)
        prometheus.wait_for(selector("up", {"job": "double-extra-a"}), absent)


# ---- bounded waits


def test_wait_for_timeout_names_the_query_and_shows_the_last_answer(
    prometheus: PrometheusServer, exporter: Exporter
) -> None:
    labels = {"namespace": "double-timeout", "pod": "web-1"}
    exporter.set("timeout_probe", labels, 1)
    query = selector("timeout_probe", labels)
    prometheus.wait_for(query, 1)

    with pytest.raises(PrometheusWaitTimeout) as caught:
        prometheus.wait_for(query, 99, timeout=0.5)
    message = str(caught.value)
    assert query in message
    assert "one sample equal to 99" in message
    assert 'pod="web-1"} => 1' in message
    assert isinstance(caught.value, AssertionError)


def test_wait_for_fails_at_once_on_invalid_promql(prometheus: PrometheusServer) -> None:
    started = time.monotonic()
    with pytest.raises(PrometheusQueryError, match="bad_data"):
        prometheus.wait_for("sum(", exists, timeout=600)
    # It did not wait the timeout out (an answer is not worth waiting again for).
    assert time.monotonic() - started < 600


# ---- backfill with promtool


def test_backfilled_series_answer_series_and_instant_queries(
    prometheus_factory: PrometheusFactory,
) -> None:
    families = synthetic_families(
        metric_count=20,
        series_per_metric=100,
        timestamps=recent_timestamps(3, span=60),
        name_prefix="double_backfill",
    )
    server = prometheus_factory(backfill=families)

    found = server.series('{__name__=~"double_backfill_.*"}', start=time.time() - 600)
    assert len(found) == 2000
    assert {labels["__name__"] for labels in found} == {
        f"double_backfill_{number:04d}_total" for number in range(20)
    }
    [total] = server.query('count({__name__=~"double_backfill_.*"})')
    assert total.value == 2000
    # Series 12 grows by 12 % 7 + 1 = 6 per sample: its third and last sample is 18.
    [last] = server.query(selector("double_backfill_0003_total", {"pod": "pod-12"}))
    assert last.value == 18
    [rate] = server.query('sum(rate(double_backfill_0000_total{namespace="ns-1"}[5m]))')
    assert rate.value > 0


# ---- lifecycle


def test_stopped_prometheus_is_unavailable_and_restarts_with_its_data(
    prometheus_factory: PrometheusFactory,
) -> None:
    server = prometheus_factory(start=False)
    with Exporter() as source:
        source.set("restart_probe", {"namespace": "double-restart"}, 5)
        # Registered before the start, the target is scraped at once, not after discovery.
        server.add_target(source)
        server.start()
        server.wait_for_scrape(source)

        server.stop()
        with pytest.raises(PrometheusUnavailable, match="cannot reach"):
            server.query("up")

        server.start()
        answer = server.query(selector("restart_probe", {"namespace": "double-restart"}))
        assert [sample.value for sample in answer] == [5]


def test_paused_prometheus_times_out_then_answers_again(
    prometheus_factory: PrometheusFactory,
) -> None:
    server = prometheus_factory()
    server.pause()
    try:
        with pytest.raises(PrometheusUnavailable):
            server.query("vector(1)", timeout=0.3)
    finally:
        server.resume()
    [one] = server.query("vector(1)")
    assert one.value == 1


def test_directory_and_process_are_gone_after_the_context(prometheus_binary: str) -> None:
    with PrometheusServer(binary=prometheus_binary) as server:
        directory = server.directory
        assert (directory / "data").is_dir()
        [one] = server.query("vector(1)")
        assert one.value == 1
    assert not directory.exists()
    assert not server.running
    with pytest.raises(PrometheusUnavailable):
        server.query("vector(1)")


def test_directory_and_process_are_gone_after_an_exception_in_the_context(
    prometheus_binary: str,
) -> None:
    with (
        pytest.raises(RuntimeError, match="boom"),
        PrometheusServer(binary=prometheus_binary) as server,
    ):
        directory = server.directory
        raise RuntimeError("boom")
    assert not directory.exists()
    assert not server.running


def test_a_prometheus_that_cannot_start_fails_with_its_log_tail(prometheus_binary: str) -> None:
    server = PrometheusServer(binary=prometheus_binary, extra_args=["--no-such-flag"])
    try:
        with pytest.raises(PrometheusStartError, match="exited with status") as caught:
            server.start()
        assert "no-such-flag" in str(caught.value)
        assert not server.running
    finally:
        server.close()
    assert not server.directory.exists()


def test_targets_lists_the_active_targets(prometheus: PrometheusServer,
                                          exporter: Exporter) -> None:
    # /api/v1/targets takes only GET (a POST is a 405).
    prometheus.wait_for_scrape(exporter)
    assert exporter.address in {t["scrapeUrl"].split("/")[2] for t in prometheus.targets()}
