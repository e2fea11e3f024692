"""Hot reload refuses a rule-less file (empty, truncated, comments only, `rules: []`) like an
invalid one: the running configuration keeps serving, the reload gauge says 0, and one ERROR
line says why; unless the adapter started from a rule-less file itself."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from adapter.http.app import METRICS_REGISTRY_KEY, RELOADER_KEY, SNAPSHOTS_KEY
from testbed.fakes.exporter import Exporter
from testbed.fakes.prometheus import PrometheusServer
from tests.adapter.cluster import ModuleCluster, pod_manifest
from tests.adapter.harness import RunningAdapter, running_adapter, wait_for_series

pytestmark = [pytest.mark.prometheus]

CUSTOM = "/apis/custom.metrics.k8s.io/v1beta2"
RULES = """rules:
- seriesQuery: 'hrr_requests{namespace!="",pod!=""}'
  resources: {overrides: {namespace: {resource: namespace}, pod: {resource: pod}}}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
"""
RULE_LESS = {
    "empty": "",
    "truncated to nothing but whitespace": "\n  \n",
    "comments only": "# rules:\n# - seriesQuery: 'hrr_requests'\n",
    "empty sections": "rules: []\nexternalRules: []\n",
    "a section with no value": "rules:\n",
}
REFUSED = ("the file has no rules (empty, or rules, externalRules and resourceRules all "
           "missing: a truncated or emptied file?)")


def replace_file(path: Path, text: str) -> None:
    """Write as editors and config tools do: a new file renamed over the old one."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


def sample(adapter: RunningAdapter, name: str, labels: dict[str, str] | None = None) -> float:
    value = adapter.app[METRICS_REGISTRY_KEY].get_sample_value(name, labels or {})
    return -1.0 if value is None else value


async def reload_now(adapter: RunningAdapter) -> None:
    """Have the reloader look at the file now. Its one-second poll may get there first; either
    way the new version has been handled when this returns (one reload at a time)."""
    await adapter.app[RELOADER_KEY].check_once()


def listed(reply_json: dict[str, object]) -> set[str]:
    resources = reply_json["resources"]
    assert isinstance(resources, list)
    return {resource["name"] for resource in resources}


@contextlib.asynccontextmanager
async def adapter_from(tmp_path: Path, prometheus: PrometheusServer, exporter: Exporter,
                       config_text: str, *, cluster: ModuleCluster,
                       ) -> AsyncIterator[RunningAdapter]:
    namespace = cluster.namespace(exporter.job)  # the test's own
    exporter.set("hrr_requests", {"namespace": namespace, "pod": "web-0"}, 3)
    await wait_for_series(prometheus, f'hrr_requests{{namespace="{namespace}"}}', 1)
    cluster.control_plane.apply(pod_manifest("web-0", namespace))
    async with running_adapter(workdir=tmp_path / "adapter", config_text=config_text,
                               prometheus_url=prometheus.url,
                               kubeconfig=cluster.adapter_kubeconfig()) as adapter:
        yield adapter


@pytest.mark.parametrize("text", RULE_LESS.values(), ids=RULE_LESS.keys())
async def test_a_rule_less_file_is_refused_and_the_running_rules_keep_serving(
        exporter: Exporter, prometheus: PrometheusServer, tmp_path: Path,
        caplog: pytest.LogCaptureFixture, text: str, cluster: ModuleCluster) -> None:
    async with adapter_from(tmp_path, prometheus, exporter, RULES, cluster=cluster) as adapter:
        config_file = tmp_path / "adapter" / "config.yaml"
        before = adapter.app[SNAPSHOTS_KEY].current
        assert "pods/hrr_requests" in listed((await adapter.get(CUSTOM)).json())
        with caplog.at_level(logging.ERROR, logger="adapter.http.reloading"):
            replace_file(config_file, text)
            await reload_now(adapter)
        assert adapter.app[SNAPSHOTS_KEY].current is before
        assert "pods/hrr_requests" in listed((await adapter.get(CUSTOM)).json())
        assert sample(adapter, "metricscale_config_last_reload_successful") == 0
        assert sample(adapter, "metricscale_config_reloads_total", {"result": "failure"}) == 1
        assert sample(adapter, "metricscale_config_reloads_total", {"result": "success"}) == 0
        errors = [record for record in caplog.records if record.levelno == logging.ERROR]
        assert [record.getMessage() for record in errors] == [
            f"{config_file}: reload (the file changed) failed, keeping the running "
            f"configuration: {REFUSED}; an adapter started with rules does not reload into "
            "none"]

        # The whole file again: applied, and the gauge says so.
        replace_file(config_file, RULES + "\n# restored\n")
        await reload_now(adapter)
        assert adapter.app[SNAPSHOTS_KEY].current is not before
        assert sample(adapter, "metricscale_config_last_reload_successful") == 1


async def test_sighup_does_not_apply_an_emptied_file_either(
        exporter: Exporter, prometheus: PrometheusServer, tmp_path: Path,
        cluster: ModuleCluster) -> None:
    async with adapter_from(tmp_path, prometheus, exporter, RULES, cluster=cluster) as adapter:
        config_file = tmp_path / "adapter" / "config.yaml"
        before = adapter.app[SNAPSHOTS_KEY].current
        # Truncated in place (no rename): what `> config.yaml` or a crashed writer leaves.
        config_file.write_text("")
        adapter.app[RELOADER_KEY].request_reload()
        await reload_now(adapter)
        assert adapter.app[SNAPSHOTS_KEY].current is before
        assert sample(adapter, "metricscale_config_last_reload_successful") == 0


async def test_an_adapter_started_rule_less_reloads_rule_less_files(
        exporter: Exporter, prometheus: PrometheusServer, tmp_path: Path,
        cluster: ModuleCluster) -> None:
    async with adapter_from(tmp_path, prometheus, exporter, "", cluster=cluster) as adapter:
        config_file = tmp_path / "adapter" / "config.yaml"
        replace_file(config_file, "# still no rules\nrules: []\n")
        await reload_now(adapter)
        assert sample(adapter, "metricscale_config_last_reload_successful") == 1
        assert sample(adapter, "metricscale_config_reloads_total", {"result": "success"}) == 1
        # Rules added, then removed again: the configuration it started with.
        replace_file(config_file, RULES)
        await reload_now(adapter)
        assert "pods/hrr_requests" in listed((await adapter.get(CUSTOM)).json())
        replace_file(config_file, "")
        await reload_now(adapter)
        assert sample(adapter, "metricscale_config_reloads_total", {"result": "success"}) == 3
        assert "pods/hrr_requests" not in listed((await adapter.get(CUSTOM)).json())
