"""The one kubeconfig rule: --kubeconfig, $KUBECONFIG (merged), ~/.kube/config, in-cluster."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from metricscale.kube.config import (
    NO_KUBECONFIG,
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
                                    "cli.autoscale", "cli.replay"])
def test_every_command_accepts_context(module: str) -> None:
    import importlib

    parser = argparse.ArgumentParser()
    importlib.import_module(module).add_arguments(parser)
    required = ["--prometheus-url", "http://p:9090"] if module == "cli.replay" else []
    args = parser.parse_args([*required, "--kubeconfig", "/k", "--context", "c"])
    assert args.context == "c" and args.kubeconfig == "/k"


# --- every command resolves the rule the same way ---------------------------------------------
# Each command runs as a user runs it (`python -m metricscale ...`), with a kubeconfig that is
# not YAML where the rule looks: its error must name that file, so the command looked there.
# With nothing anywhere, the error names every place the rule looked, not only the in-cluster
# service account.


def _commands(tmp_path: Path) -> dict[str, list[str]]:
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules: []\n", encoding="utf-8")
    with socket.socket() as probe:  # the adapter stops before it listens; a port all the same
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return {
        "adapter": ["adapter", "--config", str(rules), "--prometheus-url", "http://127.0.0.1:1",
                    "--secure-port", str(port), "--bind-address", "127.0.0.1",
                    "--cert-dir", str(tmp_path / "serving"), "--self-managed-certs", "off"],
        "autoscaler": ["autoscaler", "--leader-elect=false",
                       "--metrics-bind-address", "127.0.0.1:0"],
        "explain --live": ["explain", "--live", "shop/api"],
        "autoscale": ["autoscale", "deployment/api", "--max", "3"],
        "replay --live": ["replay", "--live", "shop/api", "--prometheus-url",
                          "http://127.0.0.1:1", "--last", "1h", "--query", "0=up"],
    }


COMMANDS = ("adapter", "autoscaler", "explain --live", "autoscale", "replay --live")


def _run_command(arguments: list[str], *, home: Path,
                 kubeconfig: str | None) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")}
    env["HOME"] = str(home)
    if kubeconfig is not None:
        env["KUBECONFIG"] = kubeconfig
    return subprocess.run([sys.executable, "-m", "metricscale", *arguments], cwd=home, env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def _not_yaml(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("a: [\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_reads_the_kubeconfig_environment_variable(tmp_path: Path,
                                                                 command: str) -> None:
    listed = _not_yaml(tmp_path / "from-env")
    result = _run_command(_commands(tmp_path)[command], home=tmp_path, kubeconfig=str(listed))
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert f"kubeconfig {listed}: not YAML" in result.stderr, result.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_reads_the_home_kubeconfig(tmp_path: Path, command: str) -> None:
    home_config = _not_yaml(tmp_path / ".kube" / "config")
    result = _run_command(_commands(tmp_path)[command], home=tmp_path, kubeconfig=None)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert f"kubeconfig {home_config}: not YAML" in result.stderr, result.stderr


@pytest.mark.parametrize("command", COMMANDS)
def test_without_any_kubeconfig_every_command_names_each_place_looked(tmp_path: Path,
                                                                       command: str) -> None:
    result = _run_command(_commands(tmp_path)[command], home=tmp_path, kubeconfig=None)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert f"{NO_KUBECONFIG}; cannot use the in-cluster service account either: " \
        in result.stderr, result.stderr
    assert "--kubeconfig" in NO_KUBECONFIG and "$KUBECONFIG" in NO_KUBECONFIG \
        and "~/.kube/config" in NO_KUBECONFIG


def test_the_flag_beats_the_environment_in_a_command(tmp_path: Path) -> None:
    listed = _not_yaml(tmp_path / "from-env")
    flagged = _not_yaml(tmp_path / "from-flag")
    arguments = [*_commands(tmp_path)["replay --live"], "--kubeconfig", str(flagged)]
    result = _run_command(arguments, home=tmp_path, kubeconfig=str(listed))
    assert f"kubeconfig {flagged}: not YAML" in result.stderr, result.stderr
    assert str(listed) not in result.stderr


@pytest.mark.parametrize("name", ["sparse", "/dev/zero"])
def test_a_kubeconfig_larger_than_any_real_one_is_refused_unread(tmp_path: Path,
                                                                 name: str) -> None:
    from metricscale.files import MAX_FILE_BYTES

    path = Path(name) if name.startswith("/") else tmp_path / name
    if not name.startswith("/"):
        with path.open("wb") as handle:  # sparse: no disk used
            handle.truncate(MAX_FILE_BYTES + 1)
    with pytest.raises(KubeConfigError) as caught:
        read_kubeconfig(str(path))
    assert str(caught.value) == (f"cannot read kubeconfig {path}: larger than 16 MiB (the "
                                 "most a command reads)")
