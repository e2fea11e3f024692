"""A real Prometheus for tests, benchmarks and the demo: runner, HTTP API helpers, bulk backfill."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from testbed.fakes.exporter import (
    Exporter,
    MetricType,
    Number,
    check_labels,
    check_metric_name,
    escape_label_value,
    format_value,
    render_labels,
    to_decimal,
)

logger = logging.getLogger(__name__)

# Prometheus answers in milliseconds; a scrape timestamp may be aligned by up to 2 ms
# (ScrapeTimestampTolerance), so "scraped after t" is checked with a margin above that.
_SCRAPE_ALIGNMENT_MARGIN = 0.005
_LOG_TAIL_LINES = 40


# --------------------------------------------------------------------------- tool lookup


def find_prometheus() -> str | None:
    """`$PROMETHEUS` when set, else `prometheus` on the PATH; None when neither is executable."""
    return _executable(os.environ.get("PROMETHEUS", "") or shutil.which("prometheus"))


def find_promtool(prometheus: str | None = None) -> str | None:
    """`$PROMTOOL`, else the promtool next to the Prometheus binary, else the PATH."""
    override = _executable(os.environ.get("PROMTOOL", ""))
    if override:
        return override
    binary = prometheus or find_prometheus()
    if binary:
        beside = _executable(str(Path(binary).with_name("promtool")))
        if beside:
            return beside
    return _executable(shutil.which("promtool"))


def _executable(path: str | None) -> str | None:
    if path and os.path.isfile(path) and os.access(path, os.X_OK):
        return path
    return None


# --------------------------------------------------------------------------- errors


class PrometheusError(Exception):
    """Anything that went wrong with the test Prometheus."""


class PrometheusStartError(PrometheusError):
    """Prometheus did not become ready; the message carries the tail of its log."""


class PrometheusUnavailable(PrometheusError):
    """Prometheus could not answer (not running, not ready, 5xx): worth retrying."""


class PrometheusQueryError(PrometheusError):
    """Prometheus rejected a request (bad PromQL, bad parameters): retrying will not help."""


class PrometheusWaitTimeout(PrometheusError, AssertionError):
    """A bounded wait ended without the expected answer; pytest shows it as a failed assertion."""


class BackfillError(PrometheusError):
    """promtool could not turn the OpenMetrics file into blocks."""


# --------------------------------------------------------------------------- query results


@dataclass(frozen=True)
class Sample:
    """One element of an instant-query answer (a scalar answer has no labels)."""

    labels: Mapping[str, str]
    value: Decimal
    timestamp: float

    @property
    def name(self) -> str:
        return self.labels.get("__name__", "")

    def __str__(self) -> str:
        rest = {k: v for k, v in self.labels.items() if k != "__name__"}
        inner = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in sorted(rest.items()))
        return f"{self.name}{{{inner}}} => {format_value(self.value)} @{self.timestamp:.3f}"


Expectation = Number | str | Callable[[list[Sample]], bool]


def exists(samples: list[Sample]) -> bool:
    """Expectation: the answer has at least one sample."""
    return bool(samples)


def absent(samples: list[Sample]) -> bool:
    """Expectation: the answer is empty."""
    return not samples


def count_of(expected: int) -> Callable[[list[Sample]], bool]:
    """Expectation: the answer has exactly `expected` samples."""

    def check(samples: list[Sample]) -> bool:
        return len(samples) == expected

    check.__name__ = f"count_of({expected})"
    return check


def approximately(expected: Number, *, tolerance: Number) -> Callable[[list[Sample]], bool]:
    """Expectation: exactly one sample, within `tolerance` of `expected` (for rate() results)."""
    target, slack = to_decimal(expected), to_decimal(tolerance)

    def check(samples: list[Sample]) -> bool:
        return (
            len(samples) == 1
            and samples[0].value.is_finite()
            and abs(samples[0].value - target) <= slack
        )

    check.__name__ = f"approximately({expected}, tolerance={tolerance})"
    return check


def _matcher(expected: Expectation) -> tuple[Callable[[list[Sample]], bool], str]:
    if callable(expected):
        return expected, getattr(expected, "__name__", repr(expected))
    if isinstance(expected, float):
        wanted_float = expected

        def check_float(samples: list[Sample]) -> bool:
            return len(samples) == 1 and float(samples[0].value) == wanted_float

        return check_float, f"one sample equal to {expected!r}"
    wanted = Decimal(expected) if isinstance(expected, str) else to_decimal(expected)

    def check_exact(samples: list[Sample]) -> bool:
        return len(samples) == 1 and samples[0].value == wanted

    return check_exact, f"one sample equal to {expected}"


def selector(name: str, labels: Mapping[str, str] | None = None) -> str:
    """A PromQL series selector with exact matchers, values escaped: `name{a="b"}`."""
    check_metric_name(name)
    pairs = check_labels(labels or {})
    inner = ",".join(f'{key}="{escape_label_value(value)}"' for key, value in pairs)
    return f"{name}{{{inner}}}" if inner else name


def _describe(samples: list[Sample], *, limit: int = 20) -> str:
    if not samples:
        return "an empty result"
    shown = "\n  ".join(str(sample) for sample in samples[:limit])
    more = f"\n  ... and {len(samples) - limit} more" if len(samples) > limit else ""
    return f"{len(samples)} sample(s):\n  {shown}{more}"


def _parse_value(text: str) -> Decimal:
    try:
        return Decimal(text)
    except InvalidOperation as error:
        raise PrometheusError(f"Prometheus returned a non-numeric value {text!r}") from error


def _parse_samples(data: Mapping[str, Any]) -> list[Sample]:
    kind = data.get("resultType")
    result = data.get("result")
    if kind == "vector" and isinstance(result, list):
        return [
            Sample(
                labels=dict(item["metric"]),
                value=_parse_value(item["value"][1]),
                timestamp=float(item["value"][0]),
            )
            for item in result
        ]
    if kind == "scalar" and isinstance(result, list):
        return [Sample(labels={}, value=_parse_value(result[1]), timestamp=float(result[0]))]
    raise PrometheusQueryError(
        f"query() handles instant vectors and scalars, Prometheus answered a {kind}"
    )


class _Waiter:
    """The bookkeeping of one bounded poll: deadline, last answer, failure message."""

    def __init__(self, *, promql: str, expected: Expectation, timeout: float) -> None:
        self.promql = promql
        self.check, self.wanted = _matcher(expected)
        self.timeout = timeout
        self.started = time.monotonic()
        self.deadline = self.started + timeout
        self.last = "no answer yet"
        self.samples: list[Sample] = []

    def accept(self, samples: list[Sample]) -> bool:
        self.samples = samples
        self.last = _describe(samples)
        return self.check(samples)

    def failed(self, error: PrometheusUnavailable) -> None:
        self.last = f"an error: {error}"

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def timed_out(self) -> PrometheusWaitTimeout:
        waited = time.monotonic() - self.started
        return PrometheusWaitTimeout(
            f"waited {waited:.1f}s (timeout {self.timeout}s) for {self.wanted} from\n"
            f"  {self.promql}\nthe last answer was {self.last}"
        )


# --------------------------------------------------------------------------- HTTP API client


class PrometheusClient:
    """Synchronous helpers over Prometheus' HTTP API, with `*_async` twins for asyncio tests.

    The sync methods block (urllib); the async ones run each request in a worker thread and
    sleep with asyncio between polls, so a server under test in the same loop keeps running.
    """

    def __init__(self, url: str, *, request_timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.request_timeout = request_timeout
        # Proxies from the environment must never see loopback test traffic.
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    # ---- requests

    def api(
        self,
        path: str,
        params: Sequence[tuple[str, str]] = (),
        *,
        timeout: float | None = None,
        method: str = "POST",
    ) -> Any:
        """Form parameters to /api/v1/<path> (POST, or GET for the endpoints that take only
        GET, such as targets) and the `data` of a success answer."""
        encoded = urllib.parse.urlencode(list(params))
        if method == "GET":
            request = urllib.request.Request(
                f"{self.url}/api/v1/{path}" + (f"?{encoded}" if encoded else ""), method="GET")
        else:
            request = urllib.request.Request(
                f"{self.url}/api/v1/{path}",
                data=encoded.encode(),
                method="POST",
                headers={"Content-Type": "application/x-www-form-urlencoded"},
            )
        try:
            with self._opener.open(request, timeout=timeout or self.request_timeout) as response:
                payload = json.load(response)
        except urllib.error.HTTPError as error:
            detail = _error_detail(error)
            if error.code >= 500:
                raise PrometheusUnavailable(f"{path}: HTTP {error.code}: {detail}") from None
            raise PrometheusQueryError(f"{path}: HTTP {error.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise PrometheusUnavailable(f"{path}: cannot reach {self.url}: {reason}") from None
        if payload.get("status") != "success":
            raise PrometheusQueryError(f"{path}: {payload.get('error', payload)}")
        return payload.get("data")

    def query(
        self, promql: str, *, at: float | None = None, timeout: float | None = None
    ) -> list[Sample]:
        """Instant query (now, or at unix time `at`); vectors and scalars become samples."""
        params = [("query", promql)]
        if at is not None:
            params.append(("time", f"{at:.3f}"))
        return _parse_samples(self.api("query", params, timeout=timeout))

    def series(
        self,
        match: str | Sequence[str],
        *,
        start: float | None = None,
        end: float | None = None,
    ) -> list[dict[str, str]]:
        """/api/v1/series: label sets of the series matching any selector in `match`."""
        matches = [match] if isinstance(match, str) else list(match)
        params = [("match[]", item) for item in matches]
        if start is not None:
            params.append(("start", f"{start:.3f}"))
        if end is not None:
            params.append(("end", f"{end:.3f}"))
        data = self.api("series", params)
        return [dict(item) for item in data]

    def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets with their health and last error (for diagnostics)."""
        data = self.api("targets", [("state", "active")], method="GET")
        return list(data.get("activeTargets", []))

    def ready(self) -> bool:
        request = urllib.request.Request(f"{self.url}/-/ready")
        try:
            with self._opener.open(request, timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    # ---- bounded waits

    def wait_for(
        self,
        promql: str,
        expected: Expectation,
        *,
        timeout: float = 120.0,
        interval: float = 0.2,
    ) -> list[Sample]:
        """Poll an instant query until `expected` holds; returns the matching answer.

        `expected` is a number (exactly one sample with that value) or a predicate over the
        samples (`exists`, `absent`, `count_of(n)`, `approximately(x, tolerance=...)`, a lambda).
        Raises PrometheusWaitTimeout (an AssertionError) showing the last answer.
        """
        waiter = _Waiter(promql=promql, expected=expected, timeout=timeout)
        while True:
            try:
                samples = self.query(promql, timeout=max(0.5, min(5.0, waiter.remaining())))
            except PrometheusUnavailable as error:
                waiter.failed(error)
            else:
                if waiter.accept(samples):
                    return samples
            if waiter.remaining() <= 0:
                raise waiter.timed_out()
            time.sleep(min(interval, max(0.0, waiter.remaining())))

    async def query_async(self, promql: str, *, at: float | None = None) -> list[Sample]:
        return await asyncio.to_thread(self.query, promql, at=at)

    async def series_async(
        self,
        match: str | Sequence[str],
        *,
        start: float | None = None,
        end: float | None = None,
    ) -> list[dict[str, str]]:
        return await asyncio.to_thread(self.series, match, start=start, end=end)

    async def wait_for_async(
        self,
        promql: str,
        expected: Expectation,
        *,
        timeout: float = 120.0,  # noqa: ASYNC109 - bounds the polling and names it on failure
        interval: float = 0.2,
    ) -> list[Sample]:
        """`wait_for` without blocking the event loop."""
        waiter = _Waiter(promql=promql, expected=expected, timeout=timeout)
        while True:
            attempt_timeout = max(0.5, min(5.0, waiter.remaining()))
            try:
                samples = await asyncio.to_thread(self.query, promql, timeout=attempt_timeout)
            except PrometheusUnavailable as error:
                waiter.failed(error)
            else:
                if waiter.accept(samples):
                    return samples
            if waiter.remaining() <= 0:
                raise waiter.timed_out()
            await asyncio.sleep(min(interval, max(0.0, waiter.remaining())))


def _error_detail(error: urllib.error.HTTPError) -> str:
    try:
        payload = json.loads(error.read() or b"{}")
    except (ValueError, OSError):
        return str(error.reason)
    if isinstance(payload, dict) and "error" in payload:
        return f"{payload.get('errorType', 'error')}: {payload['error']}"
    return str(error.reason)


# --------------------------------------------------------------------------- OpenMetrics backfill


@dataclass(frozen=True, slots=True)
class SeriesSamples:
    """One series of a backfill: its labels and (unix seconds, value) samples in time order."""

    labels: Mapping[str, str]
    samples: Sequence[tuple[float, Number]]


@dataclass(frozen=True)
class MetricFamily:
    """A metric of a backfill. Counters are written as family `x` with samples `x_total`,
    whether `name` is given with or without the `_total` suffix. `series` may be a generator."""

    name: str
    type: MetricType
    series: Iterable[SeriesSamples]

    @property
    def sample_name(self) -> str:
        return f"{self.family_name}_total" if self.type == "counter" else self.name

    @property
    def family_name(self) -> str:
        if self.type == "counter" and self.name.endswith("_total"):
            return self.name[: -len("_total")]
        return self.name


@dataclass(frozen=True)
class OpenMetricsFile:
    path: Path
    families: int
    series: int
    samples: int
    seconds: float


@dataclass(frozen=True)
class BackfillResult:
    """What a backfill wrote and how long generating and loading took."""

    families: int
    series: int
    samples: int
    write_seconds: float
    load_seconds: float


def _openmetrics_value(value: Number) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return format_value(to_decimal(value))


def write_openmetrics(path: Path, families: Iterable[MetricFamily]) -> OpenMetricsFile:
    """Stream families to an OpenMetrics file as promtool reads it (timestamps in seconds, # EOF).

    Memory stays flat: families and their series may be generators.
    """
    started = time.monotonic()
    family_count = series_count = sample_count = 0
    seen_label_names: set[str] = set()
    with open(path, "w", encoding="utf-8", buffering=1 << 20) as out:
        for family in families:
            check_metric_name(family.name)
            family_count += 1
            out.write(f"# TYPE {family.family_name} {family.type}\n")
            name = family.sample_name
            lines: list[str] = []
            for series in family.series:
                series_count += 1
                new_names = series.labels.keys() - seen_label_names
                if new_names:
                    check_labels({key: series.labels[key] for key in new_names})
                    seen_label_names |= new_names
                head = f"{name}{render_labels(tuple(sorted(series.labels.items())))} "
                for timestamp, value in series.samples:
                    lines.append(f"{head}{_openmetrics_value(value)} {timestamp:.3f}\n")
                sample_count += len(series.samples)
                if len(lines) >= 10_000:
                    out.write("".join(lines))
                    lines.clear()
            out.write("".join(lines))
        out.write("# EOF\n")
    return OpenMetricsFile(
        path=path,
        families=family_count,
        series=series_count,
        samples=sample_count,
        seconds=time.monotonic() - started,
    )


def recent_timestamps(
    count: int = 3, *, span: float = 60.0, now: float | None = None
) -> list[float]:
    """`count` evenly spaced unix times ending at `now`, for backfills that instant queries
    (lookback 5m) and /api/v1/series with start=now-10m both see."""
    end = time.time() if now is None else now
    if count == 1:
        return [end]
    step = span / (count - 1)
    return [end - span + index * step for index in range(count)]


def synthetic_families(
    *,
    metric_count: int,
    series_per_metric: int,
    timestamps: Sequence[float],
    metric_type: MetricType = "counter",
    name_prefix: str = "bench_metric",
    labels_for: Callable[[int], Mapping[str, str]] | None = None,
) -> Iterator[MetricFamily]:
    """Generated families `<prefix>_0000[_total]`..., each with `series_per_metric` series.

    Series j gets `labels_for(j)`, by default namespace `ns-<j % 10>` and pod `pod-<j>`;
    counters grow by (j % 7 + 1) per timestamp so rate() is positive, gauges hold j % 100.
    """
    label_sets = [
        dict(labels_for(index))
        if labels_for
        else {"namespace": f"ns-{index % 10}", "pod": f"pod-{index}"}
        for index in range(series_per_metric)
    ]
    suffix = "_total" if metric_type == "counter" else ""

    def series_of() -> Iterator[SeriesSamples]:
        for index, labels in enumerate(label_sets):
            if metric_type == "counter":
                step = index % 7 + 1
                points = [(ts, step * (position + 1)) for position, ts in enumerate(timestamps)]
            else:
                points = [(ts, index % 100) for ts in timestamps]
            yield SeriesSamples(labels=labels, samples=points)

    for number in range(metric_count):
        yield MetricFamily(
            name=f"{name_prefix}_{number:04d}{suffix}", type=metric_type, series=series_of()
        )


def create_blocks(*, promtool: str, openmetrics: Path, data_dir: Path) -> float:
    """Run `promtool tsdb create-blocks-from openmetrics` into a data dir; returns seconds taken."""
    data_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    result = subprocess.run(
        [
            promtool,
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            "--quiet",
            str(openmetrics),
            str(data_dir),
        ],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        tail = "\n".join((result.stderr or result.stdout).splitlines()[-_LOG_TAIL_LINES:])
        raise BackfillError(f"promtool exited with {result.returncode} on {openmetrics}:\n{tail}")
    return time.monotonic() - started


# --------------------------------------------------------------------------- the server


@dataclass(frozen=True)
class Target:
    """A scrape target registered through file_sd."""

    address: str
    job: str
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def instance(self) -> str:
        return self.labels.get("instance", self.address)


class _Resources:
    """What must not outlive a runner, even at interpreter exit: its process and directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.process: subprocess.Popen[bytes] | None = None
        self.log: IO[bytes] | None = None

    def release(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait()
        if self.log is not None:
            self.log.close()
        shutil.rmtree(self.root, ignore_errors=True)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class _PortTaken(Exception):
    pass


class PrometheusServer(PrometheusClient):
    """Runs Debian's Prometheus on 127.0.0.1:<free port> with a temporary directory.

    Scrapes every `scrape_interval` the targets listed in a file_sd file, which `add_target` /
    `remove_target` rewrite while it runs (Prometheus takes ~2-10 s to pick a change up).
    `with PrometheusServer() as prometheus:` starts it, and stops it and removes its directory
    at the end, also on an exception. `stop()`/`start()` take it down and bring it back on the
    same port and data (to simulate an outage); `pause()`/`resume()` freeze it (a hung server).
    Thread-safe; the sync methods work from any thread.
    """

    def __init__(
        self,
        *,
        binary: str | None = None,
        promtool: str | None = None,
        scrape_interval: str = "1s",
        lookback_delta: str = "5m",
        retention: str = "3650d",
        extra_args: Sequence[str] = (),
        ready_timeout: float = 120.0,
        stop_timeout: float = 10.0,
        parent_dir: str | None = None,
    ) -> None:
        found = binary or find_prometheus()
        if not found:
            raise PrometheusError("prometheus was not found on $PROMETHEUS or the PATH")
        self.binary = found
        self.promtool = promtool
        self.scrape_interval = scrape_interval
        self.lookback_delta = lookback_delta
        self.retention = retention
        self.extra_args = tuple(extra_args)
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.port = _free_port()
        super().__init__(f"http://127.0.0.1:{self.port}")
        self.directory = Path(tempfile.mkdtemp(prefix="metricscale-prometheus-", dir=parent_dir))
        self.data_dir = self.directory / "data"
        self.config_file = self.directory / "prometheus.yml"
        self.targets_file = self.directory / "targets.json"
        self.log_file = self.directory / "prometheus.log"
        self._lock = threading.RLock()
        self._targets: dict[str, Target] = {}
        self._started_once = False
        self._paused = False
        self._backfills = 0
        self._resources = _Resources(self.directory)
        self._finalizer = weakref.finalize(self, _Resources.release, self._resources)
        self._write_config()
        self._write_targets()

    # ---- lifecycle

    @property
    def running(self) -> bool:
        process = self._resources.process
        return process is not None and process.poll() is None

    def start(self) -> None:
        """Start Prometheus and wait until /-/ready (bounded by `ready_timeout`)."""
        with self._lock:
            if not self._finalizer.alive:
                raise PrometheusError("this PrometheusServer was closed")
            if self.running:
                raise PrometheusError(f"Prometheus is already running at {self.url}")
            for _attempt in range(3):
                try:
                    self._spawn_and_wait()
                except _PortTaken:
                    if self._started_once:
                        raise PrometheusStartError(
                            f"port {self.port} was taken while Prometheus was stopped; "
                            f"log tail:\n{self.log_tail()}"
                        ) from None
                    self.port = _free_port()
                    self.url = f"http://127.0.0.1:{self.port}"
                    continue
                self._started_once = True
                logger.info("prometheus ready at %s (dir %s)", self.url, self.directory)
                return
            raise PrometheusStartError(f"no free port for Prometheus; log tail:\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after `stop_timeout`; keeps the directory for a later start()."""
        with self._lock:
            process = self._resources.process
            if process is not None and process.poll() is None:
                if self._paused:
                    process.send_signal(signal.SIGCONT)
                process.terminate()
                try:
                    process.wait(timeout=self.stop_timeout)
                except subprocess.TimeoutExpired:
                    logger.warning("prometheus at %s ignored SIGTERM; killing it", self.url)
                    process.kill()
                    process.wait()
            self._paused = False
            self._resources.process = None
            if self._resources.log is not None:
                self._resources.log.close()
                self._resources.log = None

    def close(self) -> None:
        """Stop Prometheus and remove its directory. Idempotent."""
        with self._lock:
            if not self._finalizer.alive:
                return
            self.stop()
            self._finalizer()

    def pause(self) -> None:
        """SIGSTOP: the port stays open but nothing answers (requests time out)."""
        with self._lock:
            if not self.running or self._resources.process is None:
                raise PrometheusError("Prometheus is not running")
            self._resources.process.send_signal(signal.SIGSTOP)
            self._paused = True
            _wait_until_stopped(self._resources.process.pid)

    def resume(self) -> None:
        with self._lock:
            if self._paused and self._resources.process is not None:
                self._resources.process.send_signal(signal.SIGCONT)
            self._paused = False

    def __enter__(self) -> PrometheusServer:
        try:
            if not self.running:
                self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"

    # ---- targets

    def add_target(
        self,
        target: Exporter | str,
        *,
        job: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> Target:
        """Scrape an exporter (or any host:port serving /metrics) under `job` (default: the
        exporter's own job); `labels` are added to every series of the target."""
        address = target.address if isinstance(target, Exporter) else target
        job_name = job or (target.job if isinstance(target, Exporter) else None)
        if not job_name:
            raise ValueError("a target given as host:port needs a job")
        extra = dict(labels or {})
        check_labels({k: v for k, v in extra.items() if k != "instance"})
        registered = Target(address=address, job=job_name, labels=extra)
        with self._lock:
            self._targets[address] = registered
            self._write_targets()
        return registered

    def remove_target(self, target: Exporter | str) -> None:
        address = target.address if isinstance(target, Exporter) else target
        with self._lock:
            if self._targets.pop(address, None) is not None:
                self._write_targets()

    def target(self, target: Exporter | str) -> Target:
        address = target.address if isinstance(target, Exporter) else target
        with self._lock:
            registered = self._targets.get(address)
        if registered is None:
            raise PrometheusError(f"{address} is not a target of this Prometheus")
        return registered

    def wait_for_scrape(
        self,
        target: Exporter | str,
        *,
        series: str | None = None,
        timeout: float = 120.0,
    ) -> None:
        """Wait until Prometheus has stored a successful scrape of `target` that began after
        this call (so it holds what the exporter served by now), then, if given, until the
        PromQL `series` returns something. The default timeout covers discovery of a new target."""
        deadline = time.monotonic() + timeout
        registered = self.target(target)
        try:
            self.wait_for(
                _scraped_query(registered),
                _scraped_since(time.time()),
                timeout=timeout,
            )
        except PrometheusWaitTimeout as error:
            raise PrometheusWaitTimeout(f"{error}\n{self._target_report(registered)}") from None
        if series is not None:
            self.wait_for(series, exists, timeout=max(0.5, deadline - time.monotonic()))

    async def wait_for_scrape_async(
        self,
        target: Exporter | str,
        *,
        series: str | None = None,
        timeout: float = 120.0,  # noqa: ASYNC109 - bounds the polling and names it on failure
    ) -> None:
        """`wait_for_scrape` without blocking the event loop."""
        deadline = time.monotonic() + timeout
        registered = self.target(target)
        try:
            await self.wait_for_async(
                _scraped_query(registered),
                _scraped_since(time.time()),
                timeout=timeout,
            )
        except PrometheusWaitTimeout as error:
            report = await asyncio.to_thread(self._target_report, registered)
            raise PrometheusWaitTimeout(f"{error}\n{report}") from None
        if series is not None:
            await self.wait_for_async(series, exists, timeout=max(0.5, deadline - time.monotonic()))

    # ---- backfill

    def backfill(self, families: Iterable[MetricFamily]) -> BackfillResult:
        """Write families to OpenMetrics and load them with promtool into the data directory.

        Best done before start(); on a running server it stops, loads and starts again
        (same port), because Prometheus only opens blocks it finds at start-up.
        """
        with self._lock:
            self._backfills += 1
            path = self.directory / f"backfill-{self._backfills}.om"
            try:
                written = write_openmetrics(path, families)
                load_seconds = self.load_openmetrics(path)
            finally:
                path.unlink(missing_ok=True)
            return BackfillResult(
                families=written.families,
                series=written.series,
                samples=written.samples,
                write_seconds=written.seconds,
                load_seconds=load_seconds,
            )

    def load_openmetrics(self, path: Path) -> float:
        """promtool an existing OpenMetrics file into the data directory; returns the seconds
        promtool took (restarts a running server around it)."""
        promtool = self.promtool or find_promtool(self.binary)
        if not promtool:
            raise BackfillError(
                "promtool was not found on $PROMTOOL, beside prometheus, or the PATH"
            )
        with self._lock:
            was_running = self.running
            if was_running:
                self.stop()
            seconds = create_blocks(promtool=promtool, openmetrics=path, data_dir=self.data_dir)
            if was_running:
                self.start()
            return seconds

    # ---- internals

    def _spawn_and_wait(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_file, "ab")  # noqa: SIM115 - closed by stop() / the finalizer
        self._resources.log = log
        command = [
            self.binary,
            f"--config.file={self.config_file}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--storage.tsdb.retention.time={self.retention}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-admin-api",
            f"--query.lookback-delta={self.lookback_delta}",
            *self.extra_args,
        ]
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )
        self._resources.process = process
        deadline = time.monotonic() + self.ready_timeout
        while True:
            if process.poll() is not None:
                self.stop()
                tail = self.log_tail()
                if "address already in use" in tail:
                    raise _PortTaken
                raise PrometheusStartError(
                    f"prometheus exited with status {process.returncode} before it was ready; "
                    f"log tail:\n{tail}"
                )
            if self.ready():
                return
            if time.monotonic() >= deadline:
                self.stop()
                raise PrometheusStartError(
                    f"prometheus at {self.url} was not ready after {self.ready_timeout}s; "
                    f"log tail:\n{self.log_tail()}"
                )
            time.sleep(0.05)

    def _write_config(self) -> None:
        # JSON is YAML, and needs no YAML library here.
        config = {
            "global": {
                "scrape_interval": self.scrape_interval,
                "scrape_timeout": self.scrape_interval,
                "evaluation_interval": self.scrape_interval,
            },
            "scrape_configs": [
                {
                    "job_name": "exporters",
                    # What the exporter serves is what tests query, job/instance included.
                    "honor_labels": True,
                    "file_sd_configs": [{"files": [str(self.targets_file)]}],
                }
            ],
        }
        self.config_file.write_text(json.dumps(config, indent=2) + "\n")

    def _write_targets(self) -> None:
        groups = [
            {"targets": [target.address], "labels": {"job": target.job, **target.labels}}
            for target in self._targets.values()
        ]
        # Prometheus watches the file; a rename makes each change appear whole.
        staging = self.directory / "targets.json.new"
        staging.write_text(json.dumps(groups, indent=2) + "\n")
        os.replace(staging, self.targets_file)

    def _target_report(self, registered: Target) -> str:
        try:
            active = self.targets()
        except PrometheusError as error:
            return f"the target list is unavailable: {error}"
        for item in active:
            labels = item.get("labels", {})
            if (
                labels.get("job") == registered.job
                and labels.get("instance") == registered.instance
            ):
                return (
                    f"target {registered.job}/{registered.instance}: health={item.get('health')} "
                    f"lastScrape={item.get('lastScrape')} lastError={item.get('lastError')!r}"
                )
        return (
            f"target {registered.job}/{registered.instance} is not (yet) among Prometheus' "
            f"{len(active)} active targets: file_sd changes take up to ~10 s to apply"
        )

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"PrometheusServer({self.url}, {state}, dir={self.directory})"


def _scraped_query(registered: Target) -> str:
    up = selector("up", {"job": registered.job, "instance": registered.instance})
    return f"timestamp({up}) and {up} == 1"


def _scraped_since(moment: float) -> Callable[[list[Sample]], bool]:
    threshold = Decimal(repr(moment + _SCRAPE_ALIGNMENT_MARGIN))

    def check(samples: list[Sample]) -> bool:
        return any(sample.value >= threshold for sample in samples)

    check.__name__ = f"a successful scrape (up == 1) that began after {moment:.3f}"
    return check


# --------------------------------------------------------------------------- exporters for tests


class ExporterPool:
    """Hands out exporters already scraped by a Prometheus, each with a job of its own.

    Adding a target takes Prometheus ~2-10 s (discovery and scrape-manager throttles), so the
    pool keeps `spares` exporters registered ahead of need: a lease usually returns at once,
    and the next spare is discovered while the test runs. A released exporter is deregistered
    and closed, never reused, so no two leases share a job label.
    """

    def __init__(
        self, server: PrometheusServer, *, spares: int = 2, job_prefix: str = "exporter"
    ) -> None:
        self.server = server
        self.spares = spares
        self.job_prefix = job_prefix
        self._lock = threading.Lock()
        self._ready: list[Exporter] = []
        self._leased: set[Exporter] = set()
        self._count = 0
        self._closed = False
        with self._lock:
            self._top_up()

    def lease(self, *, timeout: float = 30.0) -> Exporter:
        """An empty exporter whose target Prometheus scrapes successfully."""
        with self._lock:
            if self._closed:
                raise PrometheusError("the exporter pool is closed")
            exporter = self._ready.pop(0) if self._ready else self._new_exporter()
            self._leased.add(exporter)
            self._top_up()
        # A fresh exporter serves nothing yet, so any successful scrape will do.
        registered = self.server.target(exporter)
        up = selector("up", {"job": registered.job, "instance": registered.instance})
        self.server.wait_for(f"{up} == 1", exists, timeout=timeout)
        return exporter

    def release(self, exporter: Exporter) -> None:
        with self._lock:
            self._leased.discard(exporter)
        self.server.remove_target(exporter)
        exporter.close()

    @contextlib.contextmanager
    def exporter(self, *, timeout: float = 30.0) -> Iterator[Exporter]:
        leased = self.lease(timeout=timeout)
        try:
            yield leased
        finally:
            self.release(leased)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            everything = [*self._ready, *self._leased]
            self._ready.clear()
            self._leased.clear()
        for exporter in everything:
            self.server.remove_target(exporter)
            exporter.close()

    def _top_up(self) -> None:
        while len(self._ready) < self.spares:
            self._ready.append(self._new_exporter())

    def _new_exporter(self) -> Exporter:
        self._count += 1
        exporter = Exporter(job=f"{self.job_prefix}-{self._count}")
        self.server.add_target(exporter)
        return exporter


def _wait_until_stopped(pid: int, within: float = 5.0) -> None:
    """A signal is delivered asynchronously: wait until every thread of `pid` is stopped
    (state T in /proc), so a request sent after `pause()` cannot be answered."""
    deadline = time.monotonic() + within
    tasks = Path(f"/proc/{pid}/task")
    while time.monotonic() < deadline:
        try:
            states = [(task / "stat").read_text().rsplit(")", 1)[1].split()[0]
                      for task in tasks.iterdir()]
        except (OSError, IndexError):
            return  # gone, or not Linux: nothing more to wait for
        if states and all(state in ("T", "t") for state in states):
            return
        time.sleep(0.005)
    raise PrometheusError(f"Prometheus (pid {pid}) did not stop within {within}s")
