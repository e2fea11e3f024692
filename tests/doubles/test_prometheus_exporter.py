"""The in-test exporter's exposition and the OpenMetrics backfill writer, without Prometheus."""

from __future__ import annotations

import urllib.error
import urllib.request
from decimal import Decimal
from pathlib import Path

import pytest

from tests.fakes.exporter import Exporter
from tests.fakes.prometheus import (
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
