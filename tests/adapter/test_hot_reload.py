"""Configuration hot reload: an edit under load answers from the old or the new configuration and
never fails, a broken edit changes nothing and says so in `/metrics`, a ConfigMap volume's
`..data` swap is noticed by the next poll (so within 2 s), and SIGHUP reloads (in-process and
in a real process).

No wall-clock bounds: the waits below are on conditions, their limits only there to fail a
test that hangs (generous, for a busy machine)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from adapter.http.app import METRICS_REGISTRY_KEY, RELOADER_KEY, SNAPSHOTS_KEY
from adapter.http.reloading import POLL_SECONDS
from adapter.http.snapshots import ConfigSnapshot
from testbed.fakes.exporter import Exporter
from testbed.fakes.prometheus import PrometheusServer
from tests.adapter.cluster import ModuleCluster, Names, pod_manifest
from tests.adapter.harness import RunningAdapter, running_adapter, wait_for_series

pytestmark = [pytest.mark.prometheus]

CUSTOM = "/apis/custom.metrics.k8s.io/v1beta2"


def rules(*, factor: int, renamed_as: str) -> str:
    """`hr_requests` (in both versions, its query scaled by `factor`) and `hr_renamed` served
    as `renamed_as` (renamed by the edit)."""
    scale = "" if factor == 1 else f" * {factor}"
    return f"""rules:
- seriesQuery: 'hr_requests{{namespace!="",pod!=""}}'
  resources: {{overrides: {{namespace: {{resource: namespace}}, pod: {{resource: pod}}}}}}
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>}}) by (<<.GroupBy>>){scale}'
- seriesQuery: 'hr_renamed{{namespace!="",pod!=""}}'
  resources: {{overrides: {{namespace: {{resource: namespace}}, pod: {{resource: pod}}}}}}
  name: {{matches: "^hr_renamed$", as: "{renamed_as}"}}
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>}}) by (<<.GroupBy>>)'
"""


OLD = rules(factor=1, renamed_as="hr_before")
NEW = rules(factor=10, renamed_as="hr_after")
BROKEN = OLD.replace("  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'\n",
                     "  backend: nowhere\n  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) "
                     "by (<<.GroupBy>>)'\n", 1)


def replace_file(path: Path, text: str) -> None:
    """Write as editors and config tools do: a new file renamed over the old one."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def sample(adapter: RunningAdapter, name: str, labels: dict[str, str] | None = None) -> float:
    value = adapter.app[METRICS_REGISTRY_KEY].get_sample_value(name, labels or {})
    return -1.0 if value is None else value


async def wait_for_reloads(adapter: RunningAdapter, result: str, count: int, *,
                           within: float = 120.0) -> None:
    """Until `count` reloads with `result` have happened."""
    started = time.monotonic()
    while sample(adapter, "metricscale_config_reloads_total", {"result": result}) < count:
        assert time.monotonic() - started < within, f"no {result} reload within {within}s"
        await asyncio.sleep(0.02)


def listed(reply_json: dict[str, object]) -> set[str]:
    resources = reply_json["resources"]
    assert isinstance(resources, list)
    return {resource["name"] for resource in resources}


def pod_path(exporter: Exporter) -> str:
    return f"{CUSTOM}/namespaces/{namespace_of(exporter)}/pods/web-0"


NAMES = Names.unique("hot")


def namespace_of(exporter: Exporter) -> str:
    """A namespace of the test's own: the session Prometheus still holds other tests' series."""
    return NAMES.namespace(exporter.job)


@contextlib.asynccontextmanager
async def hot_adapter(tmp_path: Path, prometheus: PrometheusServer, exporter: Exporter, *,
                      cluster: ModuleCluster,
                      workdir: Path | None = None) -> AsyncIterator[RunningAdapter]:
    cluster.control_plane.apply(pod_manifest("web-0", cluster.namespace(exporter.job)))
    async with running_adapter(workdir=workdir or tmp_path / "adapter", config_text=OLD,
                               prometheus_url=prometheus.url,
                               kubeconfig=cluster.adapter_kubeconfig()) as adapter:
        yield adapter


@pytest.fixture
async def serving_exporter(exporter: Exporter, prometheus: PrometheusServer,
                           ) -> Exporter:
    namespace = namespace_of(exporter)
    exporter.set("hr_requests", {"namespace": namespace, "pod": "web-0"}, 3)
    exporter.set("hr_renamed", {"namespace": namespace, "pod": "web-0"}, 5)
    await wait_for_series(prometheus, '{__name__=~"hr_requests|hr_renamed",namespace="'
                          + namespace + '"}', 2)
    return exporter


# --------------------------------------------------------------------------------------------
# An edit under load


async def test_an_edit_under_load_answers_from_the_old_or_the_new_configuration_and_never_fails(
        serving_exporter: Exporter, prometheus: PrometheusServer, tmp_path: Path,
        cluster: ModuleCluster) -> None:
    async with hot_adapter(tmp_path, prometheus, serving_exporter, cluster=cluster) as adapter:
        config_file = tmp_path / "adapter" / "config.yaml"
        first = adapter.app[SNAPSHOTS_KEY].current
        stop = asyncio.Event()
        problems: list[str] = []
        seen: dict[str, int] = {"old": 0, "new": 0}

        async def client(number: int) -> None:
            generation = "old"  # what this client saw last: it may only move forward
            while not stop.is_set():
                kind = number % 3
                if kind == 0:
                    reply = await adapter.get(f"{pod_path(serving_exporter)}/hr_requests")
                    value = reply.json()["items"][0]["value"] if reply.status == 200 else None
                    now = {"3": "old", "30": "new"}.get(str(value))
                elif kind == 1:
                    reply = await adapter.get(CUSTOM)
                    found = listed(reply.json()) & {"pods/hr_before", "pods/hr_after"}
                    now = ("old" if found == {"pods/hr_before"} else
                           "new" if found == {"pods/hr_after"} else None)
                else:
                    # Asked one after the other: the swap may fall between the two.
                    reply = await adapter.get(f"{pod_path(serving_exporter)}/hr_before")
                    after = await adapter.get(f"{pod_path(serving_exporter)}/hr_after")
                    before_ok = reply.status == 200 and reply.json()["items"][0]["value"] == "5"
                    after_ok = after.status == 200 and after.json()["items"][0]["value"] == "5"
                    now = ("new" if after_ok and (before_ok or reply.status == 404) else
                           "old" if before_ok and after.status == 404 else None)
                if now is None:
                    problems.append(f"client {number}: {reply!r}")
                elif now == "old" and generation == "new":
                    problems.append(f"client {number}: the old configuration after the new")
                else:
                    generation = now
                    seen[now] += 1
                await asyncio.sleep(0.003)

        async def answered(generation: str, count: int, *, within: float = 60.0) -> None:
            """Until the clients have had more than `count` answers from `generation`."""
            deadline = time.monotonic() + within
            while seen[generation] <= count:
                assert time.monotonic() < deadline, f"{seen} after {within}s"
                await asyncio.sleep(0.02)

        clients = [asyncio.create_task(client(number)) for number in range(9)]
        try:
            await answered("old", 50)  # load on the old configuration first
            replace_file(config_file, NEW)
            await wait_for_reloads(adapter, "success", 1)
            await answered("new", 50)  # and on the new one after
        finally:
            stop.set()
            await asyncio.gather(*clients)
        assert not problems, problems[:10]
        assert seen["old"] > 50 and seen["new"] > 50, seen
        live = adapter.app[SNAPSHOTS_KEY]
        assert live.current is not first
        # The replaced snapshot's clients are closed once its requests are done.
        deadline = time.monotonic() + 30
        while live.retiring:
            assert time.monotonic() < deadline, "the old snapshot still retiring after 30s"
            await asyncio.sleep(0.02)
        assert first.closed and first.requests == 0
        assert sample(adapter, "metricscale_config_last_reload_successful") == 1


# --------------------------------------------------------------------------------------------
# A broken edit


async def test_a_broken_edit_changes_nothing_and_sets_the_gauge_to_zero(
        serving_exporter: Exporter, prometheus: PrometheusServer, tmp_path: Path,
        caplog: pytest.LogCaptureFixture, cluster: ModuleCluster) -> None:
    async with hot_adapter(tmp_path, prometheus, serving_exporter, cluster=cluster) as adapter:
        config_file = tmp_path / "adapter" / "config.yaml"
        before: ConfigSnapshot = adapter.app[SNAPSHOTS_KEY].current
        started_at = sample(adapter, "metricscale_config_last_reload_success_timestamp_seconds")
        assert sample(adapter, "metricscale_config_last_reload_successful") == 1
        with caplog.at_level(logging.ERROR, logger="adapter.http.reloading"):
            replace_file(config_file, BROKEN)
            await wait_for_reloads(adapter, "failure", 1)
        assert adapter.app[SNAPSHOTS_KEY].current is before
        reply = await adapter.get(f"{pod_path(serving_exporter)}/hr_before")
        assert reply.json()["items"][0]["value"] == "5"
        assert "pods/hr_before" in listed((await adapter.get(CUSTOM)).json())
        text = (await adapter.get("/metrics")).text
        assert re.search(r"^metricscale_config_last_reload_successful 0\.0$", text, re.M), text
        assert sample(adapter, "metricscale_config_last_reload_success_timestamp_seconds") == \
            started_at
        lines = [record.getMessage() for record in caplog.records
                 if "keeping the running configuration" in record.getMessage()]
        assert len(lines) == 1 and "rules[0].backend" in lines[0], lines
        assert "nowhere" in lines[0]

        # Fixing the file applies it, and the gauge says so.
        replace_file(config_file, NEW)
        await wait_for_reloads(adapter, "success", 1)
        assert sample(adapter, "metricscale_config_last_reload_successful") == 1
        assert sample(adapter, "metricscale_config_last_reload_success_timestamp_seconds") >= \
            started_at
        reply = await adapter.get(f"{pod_path(serving_exporter)}/hr_requests")
        assert reply.json()["items"][0]["value"] == "30"


async def test_a_file_whose_first_discovery_fails_is_not_swapped_in(
        serving_exporter: Exporter, prometheus: PrometheusServer, tmp_path: Path,
        cluster: ModuleCluster) -> None:
    async with hot_adapter(tmp_path, prometheus, serving_exporter, cluster=cluster) as adapter:
        config_file = tmp_path / "adapter" / "config.yaml"
        before = adapter.app[SNAPSHOTS_KEY].current
        unreachable = "backends:\n- name: gone\n  url: http://127.0.0.1:9\n" + NEW.replace(
            "  name: {matches", "  backend: gone\n  name: {matches")
        replace_file(config_file, unreachable)
        await wait_for_reloads(adapter, "failure", 1)
        assert adapter.app[SNAPSHOTS_KEY].current is before
        assert sample(adapter, "metricscale_config_last_reload_successful") == 0
        reply = await adapter.get(f"{pod_path(serving_exporter)}/hr_requests")
        assert reply.json()["items"][0]["value"] == "3"


# --------------------------------------------------------------------------------------------
# A ConfigMap volume


def configmap_version(directory: Path, stamp: str, text: str) -> str:
    version = f"..2026_11_25_{stamp}.000000001"
    (directory / version).mkdir()
    (directory / version / "config.yaml").write_text(text)
    return version


def swap_data(directory: Path, version: str) -> None:
    """What the kubelet's atomic writer does: a new `..data` link renamed over the old one."""
    temporary = directory / "..data_tmp"
    temporary.symlink_to(version)
    os.replace(temporary, directory / "..data")


async def test_a_configmap_symlink_swap_is_noticed_by_the_next_poll(
        serving_exporter: Exporter, prometheus: PrometheusServer, tmp_path: Path,
        cluster: ModuleCluster) -> None:
    volume = tmp_path / "volume"
    volume.mkdir()
    first = configmap_version(volume, "01_00_00", OLD)
    (volume / "..data").symlink_to(first)
    (volume / "config.yaml").symlink_to("..data/config.yaml")
    async with hot_adapter(tmp_path, prometheus, serving_exporter, workdir=volume,
                           cluster=cluster) as adapter:
        assert "pods/hr_before" in listed((await adapter.get(CUSTOM)).json())
        second = configmap_version(volume, "01_05_00", NEW)
        swap_data(volume, second)
        # The next poll notices it: the adapter's own (polls are POLL_SECONDS apart, so the
        # swap is served within 2 s) or this one, whichever comes first (one at a time).
        assert POLL_SECONDS <= 1
        await adapter.app[RELOADER_KEY].check_once()
        assert "pods/hr_after" in listed((await adapter.get(CUSTOM)).json())
        assert sample(adapter, "metricscale_config_reloads_total", {"result": "success"}) == 1


# --------------------------------------------------------------------------------------------
# SIGHUP


async def test_sighup_reloads_even_an_unchanged_file(
        serving_exporter: Exporter, prometheus: PrometheusServer, tmp_path: Path,
        cluster: ModuleCluster) -> None:
    async with hot_adapter(tmp_path, prometheus, serving_exporter, cluster=cluster) as adapter:
        before = adapter.app[SNAPSHOTS_KEY].current
        # The function server.py installs as the SIGHUP handler.
        adapter.app[RELOADER_KEY].request_reload()
        await wait_for_reloads(adapter, "success", 1)
        assert adapter.app[SNAPSHOTS_KEY].current is not before
        reply = await adapter.get(f"{pod_path(serving_exporter)}/hr_requests")
        assert reply.json()["items"][0]["value"] == "3"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def read_until(stream: asyncio.StreamReader, pattern: str, *, within: float,
                     lines: list[str]) -> None:
    async with asyncio.timeout(within):
        while True:
            line = (await stream.readline()).decode()
            assert line, f"the adapter exited; its log: {''.join(lines)}"
            lines.append(line)
            if re.search(pattern, line):
                return


async def test_sighup_to_a_running_adapter_process_reloads_its_rule_file(
        serving_exporter: Exporter, prometheus: PrometheusServer, tmp_path: Path,
        cluster: ModuleCluster) -> None:
    config_file = tmp_path / "config.yaml"
    config_file.write_text(OLD)
    port = free_port()
    env = {key: value for key, value in os.environ.items()
           if key != "KUBERNETES_SERVICE_HOST"}
    kubeconfig = cluster.adapter_kubeconfig()  # the adapter's account
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "metricscale", "adapter", "--config", str(config_file),
        "--prometheus-url", prometheus.url, "--kubeconfig", str(kubeconfig),
        "--secure-port", str(port), "--bind-address", "127.0.0.1",
        "--cert-dir", str(tmp_path / "certs"), "--self-managed-certs", "off",
        "--insecure-disable-auth", stderr=asyncio.subprocess.PIPE, env=env)
    assert process.stderr is not None
    lines: list[str] = []
    try:
        await read_until(process.stderr, "pass took", within=30.0, lines=lines)
        # The file changes without the watch noticing it (same size, same mtime): only
        # SIGHUP can make the adapter read it.
        stat = config_file.stat()
        renamed = OLD.replace("hr_before", "hr_sighup")
        assert len(renamed) == len(OLD)
        with config_file.open("r+") as rewritten:
            rewritten.write(renamed)
        os.utime(config_file, ns=(stat.st_atime_ns, stat.st_mtime_ns))
        process.send_signal(signal.SIGHUP)
        await read_until(process.stderr, r"reloaded \(SIGHUP\)", within=10.0, lines=lines)
        async with aiohttp.ClientSession() as session, session.get(
                f"https://127.0.0.1:{port}{CUSTOM}", ssl=False) as reply:
            assert "pods/hr_sighup" in listed(await reply.json())
    finally:
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), timeout=15)
    assert process.returncode == 0, "".join(lines)
