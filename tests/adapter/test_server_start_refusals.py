"""Bad input stops `metricscale adapter` at start: exit 2 and one line on stderr naming the flag
(and the rule file's field) and the problem, never a traceback; --check-config agrees.

Each case runs the real command. Nothing here needs a Prometheus or a cluster: every refusal
comes before the adapter opens anything.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

# Only ends a wedged run; no behaviour is timed against it.
HANG_GUARD_SECONDS = 120
# The address space a refused start gets: reading /dev/zero without a bound (5.9 GB in 8 s
# before the limit) fails fast in a MemoryError here instead of filling the machine.
ADDRESS_SPACE_BYTES = 2 << 30
PROMETHEUS = ("--prometheus-url", "http://127.0.0.1:9")
MAX_CONFIG_BYTES = 4 * 1024 * 1024  # the documented limit (adapter.http.reloading)
RULES = """rules:
- seriesQuery: 'refusal_requests'
  resources: {overrides: {namespace: {resource: namespace}, pod: {resource: pod}}}
  metricsQuery: "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)"
"""
# A YAML escape for half a UTF-16 pair: a lone surrogate, which no encoder takes.
LONE_SURROGATE = RULES.replace("(<<.GroupBy>>)\"", "(<<.GroupBy>>) \\ud800\"")


def limit_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_BYTES, ADDRESS_SPACE_BYTES))


def adapter(args: Sequence[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items()
           if key not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    return subprocess.run([sys.executable, "-m", "metricscale", "adapter", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, check=False,
                          timeout=HANG_GUARD_SECONDS, preexec_fn=limit_address_space)


def assert_refused(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.splitlines() == [f"metricscale adapter: error: {message}"], \
        result.stderr
    assert result.returncode == 2, result.stderr


@pytest.fixture
def rules(tmp_path: Path) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(RULES)
    return path


# --- the rule file ------------------------------------------------------------------------


def test_a_lone_surrogate_escape_is_refused_naming_its_field(tmp_path: Path) -> None:
    path = tmp_path / "surrogate.yaml"
    path.write_text(LONE_SURROGATE)
    problem = ("rules[0].metricsQuery: \\ud800 is a UTF-16 surrogate escape, not a character: "
               "write the character itself (line 4)")
    assert_refused(adapter(["--config", str(path), *PROMETHEUS], tmp_path),
                   f"--config {path}: {problem}")
    # --check-config says the same (it called this file valid).
    checked = adapter(["--check-config", str(path)], tmp_path)
    assert checked.returncode == 1, checked.stdout + checked.stderr
    assert checked.stdout.splitlines() == [f"{path}: error: {problem}",
                                           f"{path}: invalid (1 problem(s))"]


def test_an_unbounded_config_is_refused_past_4_mib(tmp_path: Path) -> None:
    problem = ("larger than 4 MiB, the most a rule file may hold (a ConfigMap holds at most "
               "1 MiB)")
    assert_refused(adapter(["--config", "/dev/zero", *PROMETHEUS], tmp_path),
                   f"--config /dev/zero: {problem}")
    big = tmp_path / "big.yaml"
    big.write_text(RULES + "#" * MAX_CONFIG_BYTES + "\n")
    assert_refused(adapter(["--config", str(big), *PROMETHEUS], tmp_path),
                   f"--config {big}: {problem}")
    checked = adapter(["--check-config", "/dev/zero"], tmp_path)
    assert checked.returncode == 1
    assert f"/dev/zero: error: {problem}" in checked.stdout


def test_a_file_of_exactly_4_mib_is_read(tmp_path: Path) -> None:
    path = tmp_path / "padded.yaml"
    padding = MAX_CONFIG_BYTES - len(RULES.encode()) - 1
    path.write_text(RULES + "#" * padding + "\n")
    assert path.stat().st_size == MAX_CONFIG_BYTES
    checked = adapter(["--check-config", str(path)], tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_several_problems_share_the_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("rules:\n" + "".join(f"- seriesQuery: q{index}\n  nope: 1\n"
                                          for index in range(5)))
    result = adapter(["--config", str(path), *PROMETHEUS], tmp_path)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    line = result.stderr.rstrip("\n")
    assert line.startswith(f"metricscale adapter: error: --config {path}: rules[0]"), line
    # Three problems shown, then a count of the rest and where to see them.
    assert line.count("; ") == 3 and line.endswith(
        f"more (`metricscale adapter --check-config {path}` lists them all)"), line


def test_a_missing_config_is_refused(tmp_path: Path) -> None:
    assert_refused(adapter(["--config", str(tmp_path / "none.yaml"), *PROMETHEUS], tmp_path),
                   f"--config {tmp_path / 'none.yaml'}: cannot read it: No such file or "
                   "directory")


# --- the Prometheus flags -----------------------------------------------------------------


def test_a_header_without_equals_is_refused(rules: Path, tmp_path: Path) -> None:
    assert_refused(adapter(["--config", str(rules), *PROMETHEUS,
                            "--prometheus-header=NoEquals"], tmp_path),
                   "--prometheus-header 'NoEquals': expected NAME=VALUE (no '=' found; write "
                   "NAME= for an empty value)")


def test_a_header_without_equals_never_echoes_a_value(rules: Path, tmp_path: Path) -> None:
    result = adapter(["--config", str(rules), *PROMETHEUS,
                      "--prometheus-header", "Authorization: Bearer s3cr3t"], tmp_path)
    assert_refused(result, "--prometheus-header: expected NAME=VALUE (no '=' found; write "
                           "NAME= for an empty value)")
    assert "s3cr3t" not in result.stderr


@pytest.mark.parametrize("flag", ["--prometheus-ca-file", "--prometheus-token-file"])
def test_a_missing_file_is_refused_naming_its_flag(rules: Path, tmp_path: Path,
                                                   flag: str) -> None:
    missing = tmp_path / "missing.pem"
    assert_refused(adapter(["--config", str(rules), "--prometheus-url", "https://127.0.0.1:9",
                            flag, str(missing)], tmp_path),
                   f"{flag} {missing}: no such file")


def test_a_directory_is_not_a_token_file(rules: Path, tmp_path: Path) -> None:
    assert_refused(adapter(["--config", str(rules), *PROMETHEUS,
                            "--prometheus-token-file", str(tmp_path)], tmp_path),
                   f"--prometheus-token-file {tmp_path}: not a regular file")


def test_a_ca_file_without_a_certificate_is_refused(rules: Path, tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not a certificate\n")
    assert_refused(adapter(["--config", str(rules), "--prometheus-url", "https://127.0.0.1:9",
                            "--prometheus-ca-file", str(ca)], tmp_path),
                   f"--prometheus-ca-file {ca}: no PEM certificate in it")


def test_check_config_refuses_the_same_files(rules: Path, tmp_path: Path) -> None:
    missing = tmp_path / "token"
    assert_refused(adapter(["--check-config", str(rules), *PROMETHEUS,
                            "--prometheus-token-file", str(missing)], tmp_path),
                   f"--prometheus-token-file {missing}: no such file")


@pytest.mark.parametrize(("url", "where"), [
    ("http://prometheus:9090/\n", "U+000A at position 23"),
    ("http://prom\tetheus:9090", "U+0009 at position 11"),
    ("http://prometheus:9090/x\x7f", "U+007F at position 24"),
])
def test_a_prometheus_url_with_a_control_character_is_refused(
        rules: Path, tmp_path: Path, url: str, where: str) -> None:
    assert_refused(adapter(["--config", str(rules), "--prometheus-url", url], tmp_path),
                   f"--prometheus-url contains a control character ({where})")
