"""The one kubeconfig rule: --kubeconfig, $KUBECONFIG (merged), ~/.kube/config, in-cluster."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest
import yaml

from metricscale.kube.config import (
    add_kubeconfig_arguments,
    merge_kubeconfigs,
    open_configuration,
    read_kubeconfig,
    resolve_kubeconfig,
)
from metricscale.kube.errors import KubeConfigError


def _write(path: Path, *, current: str | None, contexts: dict[str, str],
           server: str = "https://a.example:6443", extra: dict[str, object] | None = None) -> Path:
    document: dict[str, object] = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": cluster, "cluster": {"server": server}}
                     for cluster in sorted(set(contexts.values()))],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": name, "context": {"cluster": cluster, "user": "u"}}
                     for name, cluster in contexts.items()],
    }
    if current:
        document["current-context"] = current
    document.update(extra or {})
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    return path


# --- the order ------------------------------------------------------------------------------

def test_flag_beats_env_and_home(tmp_path: Path) -> None:
    (tmp_path / ".kube").mkdir()
    _write(tmp_path / ".kube" / "config", current="h", contexts={"h": "h"})
    assert resolve_kubeconfig("/flag", environ={"KUBECONFIG": "/env"}, home=tmp_path) == "/flag"


def test_env_beats_home(tmp_path: Path) -> None:
    (tmp_path / ".kube").mkdir()
    _write(tmp_path / ".kube" / "config", current="h", contexts={"h": "h"})
    listed = f"/a{os.pathsep}/b"
    assert resolve_kubeconfig(None, environ={"KUBECONFIG": listed}, home=tmp_path) == listed


def test_home_beats_in_cluster(tmp_path: Path) -> None:
    (tmp_path / ".kube").mkdir()
    home_config = _write(tmp_path / ".kube" / "config", current="h", contexts={"h": "h"})
    assert resolve_kubeconfig(None, environ={}, home=tmp_path) == str(home_config)
    assert resolve_kubeconfig(None, environ={"KUBECONFIG": os.pathsep}, home=tmp_path) \
        == str(home_config)


def test_in_cluster_when_nothing_else(tmp_path: Path) -> None:
    assert resolve_kubeconfig(None, environ={}, home=tmp_path) is None


def test_home_is_read_from_the_environment(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".kube").mkdir()
    home_config = _write(tmp_path / ".kube" / "config", current="h", contexts={"h": "h"})
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    assert resolve_kubeconfig(None) == str(home_config)


# --- the merge ------------------------------------------------------------------------------

def test_merge_first_file_wins_and_contexts_merge(tmp_path: Path) -> None:
    first = _write(tmp_path / "one", current="one", contexts={"shared": "c1", "one": "c1"},
                   server="https://first:6443")
    second = _write(tmp_path / "two", current="two", contexts={"shared": "c2", "two": "c2"},
                    server="https://second:6443")
    merged = read_kubeconfig(f"{first}{os.pathsep}{second}")
    assert merged["current-context"] == "one"
    contexts = {entry["name"]: entry["context"]["cluster"] for entry in merged["contexts"]}
    assert contexts == {"shared": "c1", "one": "c1", "two": "c2"}
    assert {entry["name"] for entry in merged["clusters"]} == {"c1", "c2"}


def test_merge_current_context_from_first_file_that_sets_it() -> None:
    merged = merge_kubeconfigs([("a", {"contexts": []}), ("b", {"current-context": "x"}),
                                ("c", {"current-context": "y"})])
    assert merged["current-context"] == "x"


def test_merge_skips_missing_files(tmp_path: Path) -> None:
    second = _write(tmp_path / "two", current="two", contexts={"two": "c2"})
    merged = read_kubeconfig(f"{tmp_path / 'missing'}{os.pathsep}{second}")
    assert merged["current-context"] == "two"


async def test_merged_list_connects_with_the_second_files_context(tmp_path: Path) -> None:
    first = _write(tmp_path / "one", current="one", contexts={"one": "c1"},
                   server="https://first:6443")
    second = _write(tmp_path / "two", current=None, contexts={"two": "c2"},
                    server="https://second:6443")
    async with open_configuration(kubeconfig=f"{first}{os.pathsep}{second}") as configuration:
        assert configuration.host == "https://first:6443"
    async with open_configuration(kubeconfig=f"{first}{os.pathsep}{second}",
                                  context="two") as configuration:
        assert configuration.host == "https://second:6443"


# --- one-line errors ------------------------------------------------------------------------

async def test_bad_file_in_the_list_is_named(tmp_path: Path) -> None:
    good = _write(tmp_path / "good", current="g", contexts={"g": "g"})
    bad = tmp_path / "bad"
    bad.write_text("a: [", encoding="utf-8")
    with pytest.raises(KubeConfigError) as caught:
        async with open_configuration(kubeconfig=f"{good}{os.pathsep}{bad}"):
            pass
    message = str(caught.value)
    assert "\n" not in message and str(bad) in message and "not YAML" in message.splitlines()[0]


async def test_unknown_context_in_the_merged_list(tmp_path: Path) -> None:
    one = _write(tmp_path / "one", current="one", contexts={"one": "c1"})
    two = _write(tmp_path / "two", current=None, contexts={"two": "c2"})
    listed = f"{one}{os.pathsep}{two}"
    with pytest.raises(KubeConfigError) as caught:
        async with open_configuration(kubeconfig=listed, context="nope"):
            pass
    assert str(caught.value) == (f'kubeconfig {listed}: context "nope" not found '
                                 "(contexts: one, two)")


async def test_no_file_of_the_list_exists(tmp_path: Path) -> None:
    listed = f"{tmp_path / 'a'}{os.pathsep}{tmp_path / 'b'}"
    with pytest.raises(KubeConfigError, match="none of these files exists"):
        async with open_configuration(kubeconfig=listed):
            pass


# --- every command takes --kubeconfig and --context -----------------------------------------

def test_shared_arguments() -> None:
    parser = argparse.ArgumentParser()
    add_kubeconfig_arguments(parser)
    args = parser.parse_args(["--context", "c"])
    assert args.context == "c" and args.kubeconfig is None


@pytest.mark.parametrize("module", ["adapter.server", "autoscaler.server", "autoscaler.explain",
                                    "cli.autoscale"])
def test_every_command_accepts_context(module: str) -> None:
    import importlib

    parser = argparse.ArgumentParser()
    importlib.import_module(module).add_arguments(parser)
    args = parser.parse_args(["--kubeconfig", "/k", "--context", "c"])
    assert args.context == "c" and args.kubeconfig == "/k"
