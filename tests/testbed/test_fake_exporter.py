"""The in-test exporter's exposition and the OpenMetrics backfill writer, without Prometheus."""

from __future__ import annotations

import socket
import struct
import urllib.error
import urllib.request
from decimal import Decimal
from pathlib import Path

import pytest

from testbed.fakes.cadvisor import CPU, CAdvisor
from testbed.fakes.exporter import Exporter
from testbed.fakes.prometheus import (
    MetricFamily,
    SeriesSamples,
    recent_timestamps,
    selector,
    synthetic_families,
    write_openmetrics,
)


def test_exposition_declares_types_and_escapes_label_values() -> None:
    with Exporter() as exporter:
        exporter.set("requests_total", {"pod": 'we"b\\1\n'}, 3)
        exporter.set("temperature", {"room": "a"}, 21.5)
        exporter.set("ratio", None, float("nan"))
        exporter.set("ceiling", None, float("inf"), type="gauge")
        body = exporter.render()
    assert body.splitlines() == [
        "# TYPE ceiling gauge",
        "ceiling +Inf",
        "# TYPE ratio gauge",
        "ratio NaN",
        "# TYPE requests_total counter",
        'requests_total{pod="we\\"b\\\\1\\n"} 3',
        "# TYPE temperature gauge",
        'temperature{room="a"} 21.5',
    ]


def test_inc_creates_at_zero_and_accumulates_exactly() -> None:
    with Exporter() as exporter:
        assert exporter.inc("hits_total", {"pod": "a"}) == 1
        assert exporter.inc("hits_total", {"pod": "a"}, 0.1) == Decimal("1.1")
        assert exporter.get("hits_total", {"pod": "a"}) == Decimal("1.1")
        assert exporter.get("hits_total", {"pod": "b"}) is None


def test_remove_drops_one_series_or_the_whole_metric() -> None:
    with Exporter() as exporter:
        for pod in ("a", "b"):
            exporter.set("load", {"pod": pod}, 1)
        exporter.set("other", None, 1)
        exporter.remove("load", {"pod": "a"})
        assert 'load{pod="a"}' not in exporter.render()
        assert 'load{pod="b"} 1' in exporter.render()
        exporter.remove("load")
        assert "load" not in exporter.render()
        exporter.clear()
        assert exporter.render() == ""


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_rated_counter_is_exact_to_its_rate_however_seldom_anything_runs() -> None:
    clock = Clock()
    with Exporter(clock=clock) as exporter:
        exporter.set_rate("requests_total", {"pod": "a"}, Decimal(14) / 3)
        clock.now += 2.5  # nothing ran meanwhile: a starved loop would have advanced nothing
        assert exporter.get("requests_total", {"pod": "a"}) == Decimal("11.666666667")
        exporter.set_rate("requests_total", {"pod": "a"}, 2)  # the gain so far is kept
        clock.now += 1
        assert 'requests_total{pod="a"} 13.666666667' in exporter.render()
        assert exporter.inc("requests_total", {"pod": "a"}, 1) == Decimal("14.666666667")
        clock.now += 0.5
        assert exporter.get("requests_total", {"pod": "a"}) == Decimal("15.666666667")
        exporter.set("requests_total", {"pod": "a"}, 0)  # a plain value again, no rate
        clock.now += 10
        assert exporter.get("requests_total", {"pod": "a"}) == 0


def test_cadvisor_cpu_counters_advance_by_their_use_without_ticks() -> None:
    clock = Clock()
    with Exporter(clock=clock) as exporter:
        cadvisor = CAdvisor(exporter)
        cadvisor.add_node("n1", system_cpu=0.5)
        cadvisor.set_container("ns", "p", "app", node="n1", cpu=0.25, memory=1)
        app = {"namespace": "ns", "pod": "p", "container": "app", "id": "/kubepods/ns/p/app",
               "node": "n1"}
        pod = {**app, "container": "", "id": "/kubepods/ns/p"}
        clock.now += 4
        assert exporter.get(CPU, app) == 1
        assert exporter.get(CPU, pod) == Decimal("1.004")  # the pause container's 1m too
        assert exporter.get(CPU, {"id": "/", "node": "n1"}) == Decimal("3.004")
        cadvisor.set_pod_cpu("ns", "p", 0.5)
        clock.now += 2
        assert exporter.get(CPU, app) == 2


def test_only_a_counter_has_a_rate_and_never_a_negative_one() -> None:
    with Exporter() as exporter:
        exporter.set("depth", None, 1)
        with pytest.raises(ValueError, match="gauge"):
            exporter.set_rate("depth", None, 1)
        with pytest.raises(ValueError, match="not negative"):
            exporter.set_rate("hits_total", None, -1)


def test_a_scraper_that_hangs_up_mid_answer_leaves_no_traceback(
        capfd: pytest.CaptureFixture[str]) -> None:
    exporter = Exporter()
    try:
        # An answer far larger than the socket buffers, so that writing it outlives the client.
        for index in range(60_000):
            exporter.set("padding_total", {"series": f"{index:08d}", "filler": "x" * 64}, index)
        with socket.create_connection(("127.0.0.1", exporter.port)) as client:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            client.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            assert client.recv(12).startswith(b"HTTP/1.0 200")  # the answer has begun
            # Reset rather than close, as a scraper that gives up does.
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        exporter.close()  # waits for the thread that was writing the answer
    assert "Traceback" not in capfd.readouterr().err
    assert exporter.disconnects == 1


@pytest.mark.parametrize(
    ("name", "labels"),
    [("bad-name", {}), ("ok", {"bad-label": "x"}), ("ok", {"__reserved": "x"})],
)
def test_invalid_names_are_refused(name: str, labels: dict[str, str]) -> None:
    with Exporter() as exporter, pytest.raises(ValueError, match="invalid"):
        exporter.set(name, labels, 1)


def test_a_metric_keeps_its_type() -> None:
    with Exporter() as exporter:
        exporter.set("depth", None, 1)
        with pytest.raises(ValueError, match="gauge, not a counter"):
            exporter.inc("depth", None, 1, type="counter")


def test_metrics_are_served_over_http_and_other_paths_are_404() -> None:
    with Exporter() as exporter:
        exporter.set("served", {"pod": "a"}, 2)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(exporter.url, timeout=5) as response:
            assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            assert b'served{pod="a"} 2' in response.read()
        with pytest.raises(urllib.error.HTTPError) as caught:
            opener.open(f"http://{exporter.address}/other", timeout=5)
        caught.value.close()
        assert caught.value.code == 404
        assert exporter.scrapes == 1


def test_selector_escapes_values() -> None:
    assert selector("up") == "up"
    assert selector("up", {"job": 'a"b', "instance": "x"}) == 'up{instance="x",job="a\\"b"}'


def test_openmetrics_file_names_counter_families_and_ends_with_eof(tmp_path: Path) -> None:
    families = [
        MetricFamily(
            name="jobs_total",
            type="counter",
            series=[SeriesSamples(labels={"pod": "a"}, samples=[(100.0, 1), (160.5, 2.5)])],
        ),
        MetricFamily(
            name="depth", type="gauge", series=[SeriesSamples(labels={}, samples=[(100, 4)])]
        ),
    ]
    written = write_openmetrics(tmp_path / "data.om", families)
    assert (written.families, written.series, written.samples) == (2, 2, 3)
    assert (tmp_path / "data.om").read_text().splitlines() == [
        "# TYPE jobs counter",
        'jobs_total{pod="a"} 1 100.000',
        'jobs_total{pod="a"} 2.5 160.500',
        "# TYPE depth gauge",
        "depth 4 100.000",
        "# EOF",
    ]


def test_synthetic_families_stream_the_requested_shape(tmp_path: Path) -> None:
    timestamps = recent_timestamps(2, span=30, now=1000.0)
    assert timestamps == [970.0, 1000.0]
    families = synthetic_families(
        metric_count=3, series_per_metric=4, timestamps=timestamps, metric_type="gauge"
    )
    written = write_openmetrics(tmp_path / "synthetic.om", families)
    assert (written.families, written.series, written.samples) == (3, 12, 24)
    text = (tmp_path / "synthetic.om").read_text()
    assert 'bench_metric_0002{namespace="ns-3",pod="pod-3"} 3 1000.000' in text
