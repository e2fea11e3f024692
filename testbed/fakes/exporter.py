"""An in-test Prometheus exporter: series tests set and change, served over HTTP by a thread.

A counter can also be given a rate (`set_rate`): it then advances by that rate times the time
passed, reckoned whenever it is read, so a scrape sees the exact rate however seldom the code
that sets it gets to run (a starved event loop's ticks would make it lumpy).
"""

from __future__ import annotations

import logging
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Literal

logger = logging.getLogger(__name__)

MetricType = Literal["counter", "gauge"]
Number = int | float | Decimal

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_RATED_PLACES = Decimal("1e-9")  # what a rate adds is kept to the nanounit
# A scraper that gives up (Prometheus' scrape timeout on a loaded machine) closes the connection
# while the answer is being written: nothing to report.
_CLIENT_GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)

LabelKey = tuple[tuple[str, str], ...]


def check_metric_name(name: str) -> None:
    if not _METRIC_NAME.match(name):
        raise ValueError(f"invalid metric name {name!r}")


def check_labels(labels: Mapping[str, str]) -> LabelKey:
    """Validated labels as a sorted tuple, the identity of a series within its metric."""
    for key, value in labels.items():
        if not _LABEL_NAME.match(key) or key.startswith("__"):
            raise ValueError(f"invalid label name {key!r}")
        if not isinstance(value, str):
            raise TypeError(f"label {key!r} must be a string, got {type(value).__name__}")
    return tuple(sorted(labels.items()))


def escape_label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_labels(labels: LabelKey) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labels) + "}"


def format_value(value: Decimal) -> str:
    """Exposition spelling of a value; Go's ParseFloat reads every form Decimal prints."""
    if value.is_nan():
        return "NaN"
    if value.is_infinite():
        return "-Inf" if value < 0 else "+Inf"
    return str(value)


def to_decimal(value: Number) -> Decimal:
    if isinstance(value, bool):
        raise TypeError("a sample value must be a number, not a bool")
    if isinstance(value, float):
        # repr is the shortest string that round-trips, so 0.1 stays 0.1 on the wire.
        return Decimal(repr(value))
    return Decimal(value)


def infer_type(name: str) -> MetricType:
    return "counter" if name.endswith("_total") else "gauge"


class _Family:
    def __init__(self, metric_type: MetricType) -> None:
        self.type: MetricType = metric_type
        self.series: dict[LabelKey, Decimal] = {}
        # A counter's rate: (per second, since when); its value is then the stored one plus
        # the rate times the time since.
        self.rates: dict[LabelKey, tuple[Decimal, float]] = {}

    def value(self, key: LabelKey, now: float) -> Decimal:
        value = self.series[key]
        rated = self.rates.get(key)
        if rated is None:
            return value
        per_second, since = rated
        return value + (per_second * Decimal(repr(max(0.0, now - since)))).quantize(
            _RATED_PLACES)

    def fold(self, key: LabelKey, now: float) -> None:
        """Store what the rate added so far; the rate (if any) goes on from `now`."""
        if key in self.rates:
            self.series[key] = self.value(key, now)
            self.rates[key] = (self.rates[key][0], now)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # The exporter is restarted often in one session; a lingering TIME_WAIT must not block a port.
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], exporter: Exporter) -> None:
        super().__init__(address, _Handler)
        self.exporter = exporter

    def handle_error(self, request: socket.socket | tuple[bytes, socket.socket],
                     client_address: Any) -> None:
        # socketserver prints a traceback for any error; a client that went away is none.
        error = sys.exc_info()[1]
        if isinstance(error, _CLIENT_GONE):
            self.exporter.count_disconnect()
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] != "/metrics":
            self.send_error(404, "only /metrics is served")
            return
        body = self.server.exporter.render().encode()
        self.send_response(200)
        self.send_header("Content-Type", _CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        # One line per scrape every second would drown the test log.
        return


class Exporter:
    """Serves the text exposition of series a test sets, on 127.0.0.1:<free port>/metrics.

    The HTTP server runs in a background thread, so an exporter is independent of any asyncio loop
    and can be shared across tests. It is serving as soon as it is constructed; `close()` (or the
    end of a `with` block) stops it. All methods are safe to call from any thread.
    """

    def __init__(self, *, job: str | None = None, host: str = "127.0.0.1",
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._families: dict[str, _Family] = {}
        self._scrapes = 0
        self._disconnects = 0
        self._server = _Server((host, 0), self)
        self.host = host
        self.port: int = self._server.server_address[1]
        self.job = job or f"exporter-{self.port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"exporter-{self.port}",
            daemon=True,
        )
        self._thread.start()
        self._closed = False
        logger.debug("exporter %s serving on %s", self.job, self.address)

    @property
    def address(self) -> str:
        """host:port, the form Prometheus' targets take."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}/metrics"

    @property
    def scrapes(self) -> int:
        """How many times /metrics has been served."""
        with self._lock:
            return self._scrapes

    @property
    def disconnects(self) -> int:
        """How many clients went away before their answer was written."""
        with self._lock:
            return self._disconnects

    def count_disconnect(self) -> None:
        with self._lock:
            self._disconnects += 1

    def set(
        self,
        name: str,
        labels: Mapping[str, str] | None,
        value: Number,
        *,
        type: MetricType | None = None,
    ) -> None:
        """Set one series; the type defaults to counter for `*_total` names, else gauge."""
        key = check_labels(labels or {})
        amount = to_decimal(value)
        with self._lock:
            family = self._family(name, type)
            family.series[key] = amount
            family.rates.pop(key, None)

    def set_rate(
        self,
        name: str,
        labels: Mapping[str, str] | None,
        per_second: Number,
        *,
        type: MetricType | None = None,
    ) -> None:
        """From now on a counter advances by `per_second` (created at 0); what it had gained at
        the old rate stays. Read at any time, it is exact to the rate."""
        key = check_labels(labels or {})
        rate = to_decimal(per_second)
        if not rate.is_finite() or rate < 0:
            raise ValueError(f"a counter's rate must be finite and not negative, got {rate}")
        with self._lock:
            family = self._family(name, type or "counter")
            if family.type != "counter":
                raise ValueError(f"{name} is a {family.type}: only a counter has a rate")
            now = self._clock()
            family.fold(key, now)
            family.series.setdefault(key, Decimal(0))
            family.rates[key] = (rate, now)

    def inc(
        self,
        name: str,
        labels: Mapping[str, str] | None = None,
        amount: Number = 1,
        *,
        type: MetricType | None = None,
    ) -> Decimal:
        """Add to one series (created at 0); returns the new value."""
        key = check_labels(labels or {})
        delta = to_decimal(amount)
        with self._lock:
            family = self._family(name, type)
            family.fold(key, self._clock())
            value = family.series.get(key, Decimal(0)) + delta
            family.series[key] = value
            return value

    def get(self, name: str, labels: Mapping[str, str] | None = None) -> Decimal | None:
        key = check_labels(labels or {})
        with self._lock:
            family = self._families.get(name)
            if family is None or key not in family.series:
                return None
            return family.value(key, self._clock())

    def remove(self, name: str, labels: Mapping[str, str] | None = None) -> None:
        """Stop exposing one series, or every series of `name` when labels is None."""
        with self._lock:
            family = self._families.get(name)
            if family is None:
                return
            if labels is None:
                del self._families[name]
                return
            key = check_labels(labels)
            family.series.pop(key, None)
            family.rates.pop(key, None)
            if not family.series:
                del self._families[name]

    def clear(self) -> None:
        with self._lock:
            self._families.clear()

    def render(self) -> str:
        """The exposition body of the current series (counts as a scrape)."""
        with self._lock:
            self._scrapes += 1
            now = self._clock()
            lines: list[str] = []
            for name in sorted(self._families):
                family = self._families[name]
                lines.append(f"# TYPE {name} {family.type}")
                for key in sorted(family.series):
                    lines.append(f"{name}{render_labels(key)} "
                                 f"{format_value(family.value(key, now))}")
        lines.append("")
        return "\n".join(lines)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Exporter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Exporter(job={self.job!r}, address={self.address!r})"

    def _family(self, name: str, metric_type: MetricType | None) -> _Family:
        family = self._families.get(name)
        if family is None:
            check_metric_name(name)
            family = _Family(metric_type or infer_type(name))
            self._families[name] = family
        elif metric_type is not None and metric_type != family.type:
            raise ValueError(f"{name} is a {family.type}, not a {metric_type}")
        return family
