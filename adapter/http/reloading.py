"""Configuration hot reload: notice a changed rule file (or SIGHUP), validate it, swap it in.

The file is polled once a second: its resolved path (a ConfigMap volume's `config.yaml ->
..data/config.yaml` points elsewhere after each atomic `..data` swap), inode, size and mtime.
A change, or SIGHUP, reloads it: the file is parsed and validated in full (the errors of
start-up), its clients are opened and its first discovery pass is run; only then is it swapped
in (adapter.http.snapshots). A file that does not validate is left alone until it changes
again; a valid one whose first discovery pass fails on some backend is retried with a backoff
(1s doubling, at most a minute) until it succeeds or the file changes. Either way the running
configuration keeps serving, the log says why in one line, and
`metricscale_config_last_reload_successful` is 0 until a reload succeeds.

A file without any rule (empty, only comments, `rules: []`, only `backends:`) is refused like an
invalid one when the adapter started with rules: that is what a truncated write or an emptied
ConfigMap looks like, and taking it would make every metric disappear at once. An adapter
started from a rule-less file (which `--check-config` calls a warning) reloads such files.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from prometheus_client import CollectorRegistry, Counter, Gauge

from adapter.http.snapshots import FirstRelistFailed, LiveConfig, SnapshotOpener
from adapter.rules.config import AdapterConfig, ConfigError, ConfigIssue, parse_config
from adapter.settings import PrometheusConfigError
from metricscale.files import FileError, read_bytes

__all__ = [
    "MAX_CONFIG_BYTES",
    "POLL_SECONDS",
    "ConfigReloader",
    "FileStamp",
    "ReloadMetrics",
    "read_config_bytes",
    "read_config_file",
    "stamp_file",
]

logger = logging.getLogger(__name__)

POLL_SECONDS = 1.0
_FIRST_RETRY_SECONDS = 1.0
_MAX_RETRY_SECONDS = 60.0
# The most a rule file may hold: 4 MiB, four times what a ConfigMap can (1 MiB). Reading stops
# there, so `--config /dev/zero` or a runaway file is refused instead of read without end.
MAX_CONFIG_BYTES = 4 * 1024 * 1024


def read_config_bytes(path: str) -> bytes:
    """The rule file's bytes, by metricscale.files' bounded reader: ConfigError past
    MAX_CONFIG_BYTES, FileError (with the system's `strerror`) when it cannot be read."""
    try:
        return read_bytes(path, limit=MAX_CONFIG_BYTES)
    except FileError as error:
        if error.strerror is not None:
            raise
        raise ConfigError([ConfigIssue("", f"larger than {MAX_CONFIG_BYTES >> 20} MiB, the most "
                                       "a rule file may hold (a ConfigMap holds at most 1 MiB)")]
                          ) from None


def read_config_file(path: str) -> AdapterConfig:
    """Read and parse the rule file; raises ConfigError (or FileError) for the caller to
    report."""
    raw = read_config_bytes(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError([ConfigIssue("", f"not UTF-8 text (byte {error.start})")]) from None
    return parse_config(text)


@dataclass(frozen=True)
class FileStamp:
    """What tells one version of the file from another."""

    resolved: str
    inode: int
    size: int
    mtime_ns: int


def stamp_file(path: str) -> FileStamp | None:
    """The file's stamp, following symbolic links; None if it cannot be read now."""
    try:
        resolved = os.path.realpath(path)
        st = os.stat(resolved)
    except OSError:
        return None
    return FileStamp(resolved, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass(frozen=True)
class ReloadMetrics:
    """The reload series, with Prometheus' own names for the first two."""

    successful: Gauge
    success_timestamp: Gauge
    reloads: Counter

    @classmethod
    def register(cls, registry: CollectorRegistry) -> ReloadMetrics:
        metrics = cls(
            successful=Gauge("metricscale_config_last_reload_successful",
                             "Whether the last configuration reload attempt succeeded (1) or "
                             "kept the running configuration (0).", registry=registry),
            success_timestamp=Gauge("metricscale_config_last_reload_success_timestamp_seconds",
                                    "Unix time of the last successful configuration load (the "
                                    "one at start included).", registry=registry),
            reloads=Counter("metricscale_config_reloads_total",
                            "Configuration reload attempts, by result (success, failure).",
                            ["result"], registry=registry))
        for result in ("success", "failure"):
            metrics.reloads.labels(result)
        return metrics


class ConfigReloader:
    """Watches the rule file and swaps in each valid new version.

    `check_once()` is one poll (what the tests drive); `run()` polls forever, woken early by
    `request_reload()` (the SIGHUP handler).
    """

    def __init__(self, *, path: str, live: LiveConfig, opener: SnapshotOpener,
                 metrics: ReloadMetrics, clock: Callable[[], float],
                 on_fatal: Callable[[BaseException], None],
                 poll_seconds: float = POLL_SECONDS) -> None:
        self._path = path
        self._live = live
        self._opener = opener
        self._metrics = metrics
        self._clock = clock
        self._on_fatal = on_fatal
        self._poll_seconds = poll_seconds
        self._stamp = stamp_file(path)
        # A rule-less file is refused on reload unless the adapter started from one.
        self._started_with_rules = live.current.config.has_rules
        self._asked: str | None = None
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()  # one reload at a time, whoever asks
        self._failures = 0          # consecutive failed first discovery passes of this file
        self._retry_at: float | None = None
        metrics.successful.set(1)
        metrics.success_timestamp.set(clock())

    def request_reload(self, why: str = "SIGHUP") -> None:
        """Reload at once, changed or not (safe to call from a signal handler)."""
        self._asked = why
        self._wake.set()

    async def check_once(self) -> bool | None:
        """Reload if the file changed, a reload was asked for, or a retry is due.

        Returns None when there was nothing to do, else whether the reload succeeded.
        """
        async with self._lock:
            return await self._check()

    async def _check(self) -> bool | None:
        stamp = stamp_file(self._path)
        asked, self._asked = self._asked, None
        now = asyncio.get_running_loop().time()
        if asked is not None:
            why = asked
        elif stamp != self._stamp:
            why = "the file changed"
        elif self._retry_at is not None and now >= self._retry_at:
            why = "retrying the first discovery pass"
        else:
            return None
        if stamp != self._stamp:
            self._failures = 0
        self._stamp = stamp
        return await self._reload(why)

    async def _reload(self, why: str) -> bool:
        """Validate the file, open and discover it, and swap it in; False keeps the old one."""
        self._retry_at = None
        try:
            config = read_config_file(self._path)
        except FileError as error:
            return self._failed(why, f"cannot read it: {error.strerror}")
        except ConfigError as error:
            return self._failed(why, "; ".join(str(issue) for issue in error.issues))
        if self._started_with_rules and not config.has_rules:
            return self._failed(why, "the file has no rules (empty, or rules, externalRules "
                                "and resourceRules all missing: a truncated or emptied file?); "
                                "an adapter started with rules does not reload into none")
        try:
            snapshot = await self._opener.open(config, first_pass=True)
        except FirstRelistFailed as error:
            self._failures += 1
            delay = min(_MAX_RETRY_SECONDS, _FIRST_RETRY_SECONDS * 2.0 ** (self._failures - 1))
            self._retry_at = asyncio.get_running_loop().time() + delay
            return self._failed(why, f"its first discovery pass failed ({error}); retrying in "
                                f"{delay:.0f}s")
        except PrometheusConfigError as error:
            return self._failed(why, str(error))
        except Exception as error:  # a reload must never take down a serving adapter
            logger.exception("%s: reload failed unexpectedly", self._path)
            return self._failed(why, f"unexpected error: {error!r}")
        self._failures = 0
        snapshot.start(on_fatal=self._on_fatal, passed=True)
        self._live.swap(snapshot)
        for warning in config.warnings:
            logger.warning("%s: %s", self._path, warning)
        stats = snapshot.discovery.registry.stats
        logger.info("%s: reloaded (%s): %d rules, %d externalRules, resourceRules: %s; %d "
                    "custom and %d external metrics", self._path, why, len(config.rules),
                    len(config.external_rules),
                    "yes" if config.resource_rules is not None else "no",
                    stats.custom_metrics, stats.external_metrics)
        self._metrics.successful.set(1)
        self._metrics.success_timestamp.set(self._clock())
        self._metrics.reloads.labels("success").inc()
        return True

    def _failed(self, why: str, reason: str) -> bool:
        # A pending snapshot's passes may have touched the per-rule gauges: restore them.
        self._live.current.discovery.publish()
        logger.error("%s: reload (%s) failed, keeping the running configuration: %s",
                     self._path, why, reason)
        self._metrics.successful.set(0)
        self._metrics.reloads.labels("failure").inc()
        return False

    async def run(self) -> NoReturn:
        """Poll every second (sooner when asked) forever."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._poll_seconds):
                    await self._wake.wait()
            self._wake.clear()
            await self.check_once()
