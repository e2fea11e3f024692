"""An in-test Prometheus exporter: series tests set and change, served over HTTP by a thread."""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Mapping
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Literal

logger = logging.getLogger(__name__)

MetricType = Literal["counter", "gauge"]
Number = int | float | Decimal

_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

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


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # The exporter is restarted often in one session; a lingering TIME_WAIT must not block a port.
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], exporter: Exporter) -> None:
        super().__init__(address, _Handler)
        self.exporter = exporter


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

    def __init__(self, *, job: str | None = None, host: str = "127.0.0.1") -> None:
        self._lock = threading.Lock()
        self._families: dict[str, _Family] = {}
        self._scrapes = 0
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
            self._family(name, type).series[key] = amount

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
            value = family.series.get(key, Decimal(0)) + delta
            family.series[key] = value
            return value

    def get(self, name: str, labels: Mapping[str, str] | None = None) -> Decimal | None:
        key = check_labels(labels or {})
        with self._lock:
            family = self._families.get(name)
            return None if family is None else family.series.get(key)

    def remove(self, name: str, labels: Mapping[str, str] | None = None) -> None:
        """Stop exposing one series, or every series of `name` when labels is None."""
        with self._lock:
            family = self._families.get(name)
            if family is None:
                return
            if labels is None:
                del self._families[name]
                return
            family.series.pop(check_labels(labels), None)
            if not family.series:
                del self._families[name]

    def clear(self) -> None:
        with self._lock:
            self._families.clear()

    def render(self) -> str:
        """The exposition body of the current series (counts as a scrape)."""
        with self._lock:
            self._scrapes += 1
            lines: list[str] = []
            for name in sorted(self._families):
                family = self._families[name]
                lines.append(f"# TYPE {name} {family.type}")
                for key in sorted(family.series):
                    lines.append(f"{name}{render_labels(key)} {format_value(family.series[key])}")
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
