"""Bad flags and unusable files stop both programs with one line on stderr, never a traceback.

Each case runs the real command (`python -m metricscale ...`): exit 2 for bad usage, 1 for a
runtime failure (a taken port; a rule file that cannot be used).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

_TIMEOUT_SECONDS = 20
_DURATION_HINT = "use Go durations such as 15s or 1m30s"
_KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:1"}
users:
- name: u
  user: {token: not-a-real-token}
contexts:
- name: a
  context: {cluster: c, user: u}
- name: b
  context: {cluster: c, user: u}
current-context: a
"""


def _run(args: Sequence[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    return subprocess.run([sys.executable, "-m", "metricscale", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=_TIMEOUT_SECONDS, check=False)


def _assert_one_line(result: subprocess.CompletedProcess[str], *, status: int,
                     message: str) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == status, result.stderr
    lines = result.stderr.strip().splitlines()
    # A usage error is its line, then a one-line hint; a program's own error is the only line.
    if lines[-1].startswith("usage: "):
        assert len(lines) == 2 and lines[-1].endswith(" --help"), result.stderr
    else:
        assert len(lines) == 1, result.stderr
    assert message in lines[0], result.stderr


@pytest.fixture
def not_utf8(tmp_path: Path) -> Path:
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"rules:\n  - \xff\xfe\x80 garbage\n")
    return path


@pytest.fixture
def too_deep(tmp_path: Path) -> Path:
    path = tmp_path / "deep.yaml"
    path.write_text("[" * 20_000 + "\n", encoding="utf-8")
    return path


@pytest.fixture
def kubeconfig_file(tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(_KUBECONFIG, encoding="utf-8")
    return path


# --- adapter: the rule file ---------------------------------------------------------------


def test_adapter_config_not_utf8_is_one_line(tmp_path: Path, not_utf8: Path) -> None:
    result = _run(["adapter", "--config", str(not_utf8), "--prometheus-url", "http://x:9090"],
                  tmp_path)
    _assert_one_line(result, status=2, message=f"{not_utf8}: not UTF-8 text")


def test_adapter_config_nested_too_deep_is_one_line(tmp_path: Path, too_deep: Path) -> None:
    result = _run(["adapter", "--config", str(too_deep), "--prometheus-url", "http://x:9090"],
                  tmp_path)
    _assert_one_line(result, status=2, message=f"{too_deep}: yaml: nested too deeply")


@pytest.mark.parametrize(("fixture", "problem"), [
    ("not_utf8", "not UTF-8 text"), ("too_deep", "yaml: nested too deeply")])
def test_adapter_check_config_reports_unusable_file(
        tmp_path: Path, request: pytest.FixtureRequest, fixture: str, problem: str) -> None:
    path: Path = request.getfixturevalue(fixture)
    result = _run(["adapter", "--check-config", str(path)], tmp_path)
    # --check-config reports on stdout (its contract: 0 valid, 1 not).
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == 1
    assert f"{path}: error: {problem}" in result.stdout


# --- adapter: flags -----------------------------------------------------------------------


def test_adapter_prometheus_url_that_does_not_parse(tmp_path: Path, too_deep: Path) -> None:
    result = _run(["adapter", "--config", str(too_deep), "--prometheus-url", "http://[::1"],
                  tmp_path)
    _assert_one_line(result, status=2,
                     message="--prometheus-url is not a valid URL: Invalid IPv6 URL")


def test_adapter_bad_duration_names_the_format(tmp_path: Path, too_deep: Path) -> None:
    result = _run(["adapter", "--config", str(too_deep), "--prometheus-url", "http://x:9090",
                   "--metrics-relist-interval", "5x"], tmp_path)
    _assert_one_line(result, status=2,
                     message=f"--metrics-relist-interval: invalid duration '5x': {_DURATION_HINT}")


# --- adapter: the kubeconfigs (bad usage, as the autoscaler: exit 2) ------------------------


def _adapter(*flags: str, too_deep: Path) -> list[str]:
    # The rule file is never read: a named kubeconfig is checked first.
    return ["adapter", "--config", str(too_deep), "--prometheus-url", "http://x:9090", *flags]


@pytest.mark.parametrize("flag", ["--kubeconfig", "--lister-kubeconfig",
                                  "--authentication-kubeconfig", "--authorization-kubeconfig"])
def test_adapter_missing_kubeconfig_is_named(tmp_path: Path, too_deep: Path, flag: str) -> None:
    result = _run(_adapter(flag, "/nonexistent", too_deep=too_deep), tmp_path)
    _assert_one_line(result, status=2,
                     message=f"{flag}: cannot read kubeconfig /nonexistent: no such file")


def test_adapter_kubeconfig_not_utf8(tmp_path: Path, not_utf8: Path, too_deep: Path) -> None:
    result = _run(_adapter("--kubeconfig", str(not_utf8), too_deep=too_deep), tmp_path)
    _assert_one_line(result, status=2,
                     message=f"--kubeconfig: kubeconfig {not_utf8}: not UTF-8 text")


def test_adapter_unknown_context_lists_the_contexts(tmp_path: Path, too_deep: Path,
                                                    kubeconfig_file: Path) -> None:
    result = _run(_adapter("--kubeconfig", str(kubeconfig_file), "--context", "nope",
                           too_deep=too_deep), tmp_path)
    _assert_one_line(result, status=2, message=f'--kubeconfig: kubeconfig {kubeconfig_file}: '
                                               'context "nope" not found (contexts: a, b)')


# --- autoscaler: the kubeconfig -----------------------------------------------------------


def test_autoscaler_missing_kubeconfig_is_named(tmp_path: Path) -> None:
    result = _run(["autoscaler", "--kubeconfig", "/nonexistent"], tmp_path)
    _assert_one_line(result, status=2,
                     message="cannot read kubeconfig /nonexistent: no such file")


def test_autoscaler_kubeconfig_not_utf8(tmp_path: Path, not_utf8: Path) -> None:
    result = _run(["autoscaler", "--kubeconfig", str(not_utf8)], tmp_path)
    _assert_one_line(result, status=2, message=f"kubeconfig {not_utf8}: not UTF-8 text")


def test_autoscaler_unknown_context_lists_the_contexts(tmp_path: Path,
                                                       kubeconfig_file: Path) -> None:
    result = _run(["autoscaler", "--kubeconfig", str(kubeconfig_file), "--context", "nope"],
                  tmp_path)
    _assert_one_line(result, status=2, message=f'kubeconfig {kubeconfig_file}: context "nope" '
                                               "not found (contexts: a, b)")


# --- autoscaler: the metrics endpoint ------------------------------------------------------


def test_autoscaler_bad_metrics_bind_address(tmp_path: Path) -> None:
    result = _run(["autoscaler", "--metrics-bind-address", "bad:address:1"], tmp_path)
    _assert_one_line(result, status=2, message="--metrics-bind-address 'bad:address:1': want "
                                               "HOST:PORT")


def test_autoscaler_metrics_port_in_use(tmp_path: Path, kubeconfig_file: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _run(["autoscaler", "--kubeconfig", str(kubeconfig_file), "--leader-elect=false",
                       "--metrics-bind-address", f"127.0.0.1:{port}"], tmp_path)
    _assert_one_line(result, status=1,
                     message=f"cannot listen on --metrics-bind-address 127.0.0.1:{port}")


# --- autoscaler: values out of range (a zero period would reconcile in a loop) ---------------


@pytest.mark.parametrize(("flag", "message"), [
    ("--horizontal-pod-autoscaler-sync-period=0s",
     "--horizontal-pod-autoscaler-sync-period: must be > 0s, got 0s"),
    ("--horizontal-pod-autoscaler-tolerance=-1",
     "--horizontal-pod-autoscaler-tolerance: must be >= 0, got -1"),
    ("--horizontal-pod-autoscaler-downscale-stabilization=-1s",
     "--horizontal-pod-autoscaler-downscale-stabilization: must be >= 0s, got -1s"),
    ("--horizontal-pod-autoscaler-cpu-initialization-period=-5m",
     "--horizontal-pod-autoscaler-cpu-initialization-period: must be >= 0s, got -5m0s"),
    ("--concurrent-syncs=0", "must be an integer >= 1, got '0'"),
    ("--leader-elect-renew-deadline=20s",
     "--leader-elect-*: leaseDuration must be greater than renewDeadline"),
    ("--horizontal-pod-autoscaler-sync-period=5x", f"invalid duration '5x': {_DURATION_HINT}"),
    ("--leader-elect-lease-duration=5x", f"invalid duration '5x': {_DURATION_HINT}"),
])
def test_autoscaler_refuses_flag_out_of_range(tmp_path: Path, flag: str, message: str) -> None:
    result = _run(["autoscaler", flag, "--kubeconfig", "/nonexistent"], tmp_path)
    _assert_one_line(result, status=2, message=message)
