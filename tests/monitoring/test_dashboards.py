"""The committed dashboards are what monitoring/dashboards.py generates."""

from __future__ import annotations

import json

import yaml

from monitoring.dashboards import OUTPUT, render_files


def test_committed_dashboards_match_the_generator_run_make_dashboards_if_not() -> None:
    for name, text in render_files().items():
        assert (OUTPUT / name).read_text(encoding="utf-8") == text, (
            f"{name} is stale: run `make dashboards`")


def test_configmap_carries_the_grafana_sidecar_label_and_both_dashboards() -> None:
    configmap = yaml.safe_load((OUTPUT / "configmap.yaml").read_text())
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    boards = {key: json.loads(text) for key, text in configmap["data"].items()}
    assert {board["uid"] for board in boards.values()} == {
        "metricscale-adapter", "metricscale-autoscaler"}


def test_every_panel_has_a_unique_id_and_a_query_on_the_chosen_datasource() -> None:
    for name in ("adapter.json", "autoscaler.json"):
        board = json.loads((OUTPUT / name).read_text())
        ids = [panel["id"] for panel in board["panels"]]
        assert len(ids) == len(set(ids))
        for panel in board["panels"]:
            if panel["type"] != "row":
                assert panel["datasource"]["uid"] == "${datasource}"
                assert panel["targets"] and all(t["expr"] for t in panel["targets"])
