"""The replay's pure parts: durations, range splitting, the closed loop and its summary."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from cli.replay import MAX_POINTS, _flag_duration, _range_values, render
from cli.replay_sim import Observation, ReplayInputError, simulate, summarize
from metricscale.core.durations import DurationError, parse_range_duration

T0 = datetime(2026, 11, 1, tzinfo=UTC)
EXTERNAL: dict[str, Any] = {
    "apiVersion": "metricscale.dev/v1alpha1", "kind": "Autoscaler",
    "metadata": {"name": "worker", "namespace": "jobs"},
    "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                "name": "worker"},
             "minReplicas": 1, "maxReplicas": 5,
             "metrics": [{"type": "External", "external": {
                 "metric": {"name": "queue_depth"},
                 "target": {"type": "AverageValue", "averageValue": "10"}}}]},
}


@pytest.mark.parametrize(("text", "seconds"), [("15s", 15), ("5m", 300), ("24h", 86400),
                                               ("1d12h", 129600)])
def test_durations(text: str, seconds: int) -> None:
    assert parse_range_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "5", "1.5h", "h"])
def test_bad_durations_are_input_errors(text: str) -> None:
    with pytest.raises(DurationError):
        parse_range_duration(text)
    with pytest.raises(ReplayInputError, match="--step: not a duration"):
        _flag_duration(text, "--step")


class _RecordingClient:
    def __init__(self) -> None:
        self.calls: list[tuple[datetime, datetime]] = []

    def custom_query_range(self, query: str, *, start_time: datetime, end_time: datetime,
                           step: str) -> list[dict[str, Any]]:
        self.calls.append((start_time, end_time))
        return [{"metric": {}, "values": [[start_time.timestamp(), "1"]]}]


def test_long_ranges_are_split_under_the_points_limit() -> None:
    client = _RecordingClient()
    step = timedelta(seconds=15)
    end = T0 + step * 25_000
    _range_values(client, "up", start=T0, end=end, step=step)
    assert len(client.calls) == 3
    for start, stop in client.calls:
        assert (stop - start) / step + 1 <= MAX_POINTS
    assert client.calls[0][0] == T0 and client.calls[-1][1] == end
    assert all(b[0] - a[1] == step for a, b in zip(client.calls, client.calls[1:], strict=False))


def test_external_metric_is_used_as_observed_and_summary_counts_changes() -> None:
    times = [T0 + timedelta(seconds=15 * i) for i in range(4)]
    depths = [10.0, 40.0, 40.0, 10.0]
    steps = simulate(autoscaler=EXTERNAL, times=times, initial_replicas=1,
                     startup=timedelta(seconds=30),
                     observations=[(Observation(d),) for d in depths])
    assert [s.decided_replicas for s in steps] == [1, 4, 4, 4]  # scale-down is stabilized
    assert steps[-1].limiting_rule == "ScaleDownStabilization"
    summary = summarize(steps, step=timedelta(seconds=15))
    assert (summary.scale_ups, summary.scale_downs) == (1, 0)
    assert summary.replica_hours == pytest.approx(13 * 15 / 3600)
    assert summary.seconds_above_target == 15
    assert "scale_ups: 1" in render(steps, summary, "table")


def test_resource_utilization_redistributes_total_usage_over_ready_pods() -> None:
    spec = {**EXTERNAL, "spec": {**EXTERNAL["spec"], "metrics": [
        {"type": "Resource", "resource": {"name": "cpu", "target": {
            "type": "Utilization", "averageUtilization": 50}}}]}}
    times = [T0 + timedelta(seconds=15 * i) for i in range(3)]
    # 2 observed pods at 0.5 cores each, request 500m, target 50%: 1 core total -> 4 pods.
    steps = simulate(autoscaler=spec, times=times, initial_replicas=2, startup=timedelta(),
                     requests={"cpu": "500m"},
                     observations=[(Observation(0.5, 2),) for _ in times])
    assert [s.decided_replicas for s in steps] == [4, 4, 4]
    assert steps[1].values[0] == pytest.approx(0.25)


def test_container_resource_counts_only_the_named_container() -> None:
    spec = {**EXTERNAL, "spec": {**EXTERNAL["spec"], "metrics": [
        {"type": "ContainerResource", "containerResource": {
            "name": "cpu", "container": "app",
            "target": {"type": "AverageValue", "averageValue": "250m"}}}]}}
    steps = simulate(autoscaler=spec, times=[T0], initial_replicas=1, startup=timedelta(),
                     observations=[(Observation(0.75, 1),)])
    assert steps[0].decided_replicas == 3


def test_compare_of_two_behaviors_differs_only_where_scale_down_is_stabilized() -> None:
    times = [T0 + timedelta(seconds=15 * i) for i in range(6)]
    depths = [10.0, 40.0, 40.0, 10.0, 10.0, 10.0]
    eager = {**EXTERNAL, "spec": {**EXTERNAL["spec"], "behavior": {
        "scaleDown": {"stabilizationWindowSeconds": 0}}}}
    runs = [simulate(autoscaler=a, times=times, initial_replicas=1,
                     startup=timedelta(seconds=30),
                     observations=[(Observation(d),) for d in depths])
            for a in (EXTERNAL, eager)]
    default, other = ([s.decided_replicas for s in run] for run in runs)
    assert default == [1, 4, 4, 4, 4, 4]
    assert other == [1, 4, 4, 1, 1, 1]
    table = render(runs[0], summarize(runs[0], step=timedelta(seconds=15)), "table",
                   (runs[1], summarize(runs[1], step=timedelta(seconds=15))))
    assert "CMP" in table and "COMPARE" in table
    assert any(line.startswith("scale_downs:") and line.split()[1:] == ["0", "1"]
               for line in table.splitlines())


def test_an_invalid_autoscaler_is_an_input_error() -> None:
    with pytest.raises(ReplayInputError, match=r"autoscaler\.apiVersion"):
        simulate(autoscaler={**EXTERNAL, "apiVersion": None}, times=[T0], initial_replicas=1,
                 startup=timedelta(), observations=[(Observation(1.0),)])


def test_carrying_models_decides_exactly_as_reparsing_every_snapshot() -> None:
    both = {**EXTERNAL, "spec": {**EXTERNAL["spec"], "maxReplicas": 12, "metrics": [
        {"type": "Pods", "pods": {"metric": {"name": "rps"}, "target": {
            "type": "AverageValue", "averageValue": "10"}}},
        {"type": "Resource", "resource": {"name": "cpu", "target": {
            "type": "Utilization", "averageUtilization": 60}}},
        *EXTERNAL["spec"]["metrics"]],
        "behavior": {"scaleDown": {"stabilizationWindowSeconds": 60, "policies": [
            {"type": "Pods", "value": 1, "periodSeconds": 30}]}}}}
    times = [T0 + timedelta(seconds=15 * i) for i in range(240)]
    observations = [(Observation(None if i % 37 == 5 else 5 + (i % 80), 3),
                     Observation(0.1 + (i % 50) / 100, 3), Observation(float(i % 90)))
                    for i in range(len(times))]
    runs = [simulate(autoscaler=both, times=times, observations=observations,
                     initial_replicas=3, startup=timedelta(seconds=45),
                     requests={"cpu": "250m"}, reparse=reparse) for reparse in (False, True)]
    assert runs[0] == runs[1]
    decided = [s.decided_replicas for s in runs[0]]
    assert len(set(decided)) > 3 and {s.limiting_rule for s in runs[0]} - {None}


@pytest.mark.parametrize("text", ["web", "/web", "shop/", "a/b/c"])
def test_live_names_are_namespace_slash_name(text: str) -> None:
    from cli.replay_live import parse_live_name

    with pytest.raises(ReplayInputError, match="NAMESPACE/NAME"):
        parse_live_name(text)


def test_a_file_and_live_together_are_refused(tmp_path: Any,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from cli.main import main

    assert main(["replay", "x.yaml", "--live", "shop/web", "--prometheus-url",
                 "http://127.0.0.1:9", "--last", "1h"]) == 2
    assert "either AUTOSCALER.yaml or --live" in capsys.readouterr().err


def test_the_targets_replicas_come_from_kube_state_metrics_series_of_its_kind() -> None:
    from cli.replay import _replicas_query

    def of(kind: str) -> str:
        return _replicas_query({"metadata": {"namespace": "shop"}, "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": kind, "name": "db"}}})

    assert of("StatefulSet") == 'kube_statefulset_replicas{namespace="shop",statefulset="db"}'
    assert of("Deployment") == 'kube_deployment_spec_replicas{namespace="shop",deployment="db"}'


# --- without the replay extra ---------------------------------------------------------------

_BLOCKED_IMPORT = """
import sys
from importlib.abc import MetaPathFinder

class Missing(MetaPathFinder):
    # As if the module were not installed (the shared venv keeps it).
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == {module!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Missing())
from cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("module", ["requests", "prometheus_api_client"])
def test_without_the_replay_extra_it_exits_2_naming_the_extra(tmp_path: Any,
                                                              module: str) -> None:
    import subprocess
    import sys

    autoscaler = tmp_path / "autoscaler.yaml"
    autoscaler.write_text("{}", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-c", _BLOCKED_IMPORT.format(module=module), "replay", str(autoscaler),
         "--prometheus-url", "http://127.0.0.1:1", "--last", "1h"],
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2, result.stderr
    assert result.stderr == (f"metricscale replay: needs the replay extra ({module} is not "
                             "installed): pip install 'metricscale[replay]'\n")


# --- bad input: exit 2 at start, one line naming the flag or file, never a traceback ---------
# Prometheus is an address nothing listens on: a case that got as far as a query would exit 1.

_AUTOSCALER_YAML = """\
apiVersion: metricscale.dev/v1alpha1
kind: Autoscaler
metadata: {name: worker, namespace: jobs}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: worker}
  minReplicas: 1
  maxReplicas: 5
  metrics:
  - type: External
    external:
      metric: {name: queue_depth}
      target: {type: AverageValue, averageValue: "10"}
"""
_NOWHERE = "http://127.0.0.1:1"


def _replay_error(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    from cli.main import main

    status = main(["replay", *arguments])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    assert status == 2, captured.err
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    prefix = "metricscale replay: "
    assert lines[0].startswith(prefix)
    return lines[0][len(prefix):]


@pytest.fixture
def autoscaler_file(tmp_path: Any) -> Any:
    path = tmp_path / "autoscaler.yaml"
    path.write_text(_AUTOSCALER_YAML, encoding="utf-8")
    return path


def _write_bytes(tmp_path: Any, name: str, data: bytes) -> Any:
    path = tmp_path / name
    path.write_bytes(data)
    return path


def _sparse(tmp_path: Any, name: str) -> Any:
    from metricscale.files import MAX_FILE_BYTES

    path = tmp_path / name
    with path.open("wb") as handle:  # sparse: no disk used
        handle.truncate(MAX_FILE_BYTES + 1)
    return path


def _common(*extra: str) -> list[str]:
    return ["--prometheus-url", _NOWHERE, "--initial-replicas", "1", "--query", "0=up", *extra]


def test_an_autoscaler_file_that_is_not_utf8_is_named(
        tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write_bytes(tmp_path, "binary.yaml", b"spec: \xff\xfe\n")
    assert _replay_error([str(path), *_common("--last", "1h")], capsys) == \
        f"{path} is not UTF-8 text (byte 6)"


def test_an_autoscaler_file_nested_too_deeply_is_named(
        tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("[" * 20_000 + "\n", encoding="utf-8")
    assert _replay_error([str(path), *_common("--last", "1h")], capsys) == \
        f"{path} is not YAML: nested too deeply"


def test_a_binary_config_file_is_named_with_its_flag(
        tmp_path: Any, autoscaler_file: Any, capsys: pytest.CaptureFixture[str]) -> None:
    rules = _write_bytes(tmp_path, "rules.bin", b"\x00\x01\x02\xfe\xff" * 100)
    assert _replay_error([str(autoscaler_file), *_common("--last", "1h", "--config",
                                                         str(rules))], capsys) == \
        f"--config: {rules} is not UTF-8 text (byte 3)"


def test_a_config_file_nested_too_deeply_is_named_with_its_flag(
        tmp_path: Any, autoscaler_file: Any, capsys: pytest.CaptureFixture[str]) -> None:
    rules = tmp_path / "deep.yaml"
    rules.write_text("[" * 20_000 + "\n", encoding="utf-8")
    message = _replay_error([str(autoscaler_file), *_common("--last", "1h", "--config",
                                                            str(rules))], capsys)
    assert message.startswith("--config: ") and "nested too deeply" in message


def test_a_compare_file_that_is_not_utf8_is_named_with_its_flag(
        tmp_path: Any, autoscaler_file: Any, capsys: pytest.CaptureFixture[str]) -> None:
    other = _write_bytes(tmp_path, "other.yaml", b"\xff")
    assert _replay_error([str(autoscaler_file), *_common("--last", "1h", "--compare",
                                                         str(other))], capsys) == \
        f"--compare: {other} is not UTF-8 text (byte 0)"


@pytest.mark.parametrize("flag", ["AUTOSCALER.yaml", "--config", "--compare",
                                  "--prometheus-token-file"])
@pytest.mark.parametrize("source", ["sparse", "/dev/zero"])
def test_files_are_read_with_a_bound(tmp_path: Any, autoscaler_file: Any, flag: str,
                                     source: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = source if source.startswith("/") else _sparse(tmp_path, "huge")
    if flag == "AUTOSCALER.yaml":
        arguments, prefix = [str(path), *_common("--last", "1h")], ""
    else:
        arguments, prefix = [str(autoscaler_file), *_common("--last", "1h", flag, str(path))], \
            f"{flag}: "
    assert _replay_error(arguments, capsys) == \
        f"{prefix}cannot read {path}: larger than 16 MiB (the most a command reads)"


@pytest.mark.parametrize("metrics", ["[1]", "{a: b}", "[{type: Bogus}]"])
def test_metrics_replay_cannot_decide_on_are_refused_before_any_query(
        tmp_path: Any, metrics: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "autoscaler.yaml"
    path.write_text(_AUTOSCALER_YAML.split("  metrics:")[0] + f"  metrics: {metrics}\n",
                    encoding="utf-8")
    message = _replay_error([str(path), *_common("--last", "1h")], capsys)
    assert message.startswith(f"{path}: spec.metrics")


@pytest.mark.parametrize("step", ["0s", "0m", "0d0h"])
def test_a_zero_step_is_refused(autoscaler_file: Any, step: str,
                                capsys: pytest.CaptureFixture[str]) -> None:
    assert _replay_error([str(autoscaler_file), *_common("--last", "1h", "--step", step)],
                         capsys) == f"--step {step}: must be more than 0s"


def test_more_steps_than_the_maximum_are_refused_naming_the_flags(
        autoscaler_file: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from cli.replay import MAX_STEPS

    assert MAX_STEPS == 110_000
    message = _replay_error([str(autoscaler_file), *_common("--last", "1000000h", "--step",
                                                            "1s")], capsys)
    assert message == ("--last 1000000h with --step 1s is 3,600,000,001 steps, more than the "
                       "110,000 a replay decides (ten range queries of Prometheus' 11,000 "
                       "points per series); use a longer --step or a shorter range")


def test_the_default_step_counts_against_the_maximum(
        autoscaler_file: Any, capsys: pytest.CaptureFixture[str]) -> None:
    message = _replay_error([str(autoscaler_file), *_common("--from", "0", "--to",
                                                            "1700000000")], capsys)
    assert message.startswith("--from/--to with the default --step of 15s is 113,333,334 "
                              "steps, more than the 110,000")


def test_the_maximum_itself_is_allowed() -> None:
    import argparse

    from cli.replay import MAX_STEPS, step_count

    step = timedelta(seconds=15)
    args = argparse.Namespace(last=None, step="15s")
    assert step_count(args, start=T0, end=T0 + step * (MAX_STEPS - 1), step=step) == MAX_STEPS
    with pytest.raises(ReplayInputError):
        step_count(args, start=T0, end=T0 + step * MAX_STEPS, step=step)


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--last", "99999999999d", "--last: duration too long: '99999999999d'"),
    ("--last", "999999999d", "--last 999999999d: reaches back before year 1"),
    ("--pod-startup", "999999999d", "--pod-startup 999999999d: too long"),
    ("--step", "5x", "--step: not a duration: '5x' (use e.g. 15s, 5m, 24h, 2d)"),
])
def test_durations_out_of_range_are_refused(autoscaler_file: Any, flag: str, value: str,
                                            message: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    arguments = [str(autoscaler_file), *_common(flag, value)]
    if flag != "--last":
        arguments += ["--last", "1h"]
    assert _replay_error(arguments, capsys) == message


# --- --from/--to: RFC 3339 or Unix timestamps, as Prometheus takes them ----------------------

@pytest.mark.parametrize(("text", "expected"), [
    ("1700000000", datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)),
    ("1700000000.5", datetime(2023, 11, 14, 22, 13, 20, 500_000, tzinfo=UTC)),
    ("1.7e9", datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)),
    ("0", datetime(1970, 1, 1, tzinfo=UTC)),
    ("2023-11-14T22:13:20Z", datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)),
    ("2023-11-14T23:13:20.25+01:00", datetime(2023, 11, 14, 22, 13, 20, 250_000, tzinfo=UTC)),
])
def test_times_are_rfc3339_or_unix_timestamps(text: str, expected: datetime) -> None:
    import argparse

    from cli.replay import _range

    start, end = _range(argparse.Namespace(last=None, start=text, end="1800000000"))
    assert start == expected and end == datetime.fromtimestamp(1_800_000_000, UTC)


@pytest.mark.parametrize("text", ["nan", "inf", "-inf", "1e300", "yesterday", ""])
def test_times_that_are_neither_are_refused(autoscaler_file: Any, text: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    message = _replay_error([str(autoscaler_file), *_common(f"--from={text or ' '}", "--to",
                                                            "1800000000")], capsys)
    assert message == ("--from: not an RFC 3339 time or a Unix timestamp within years 1 to "
                       f"9999: {text or ' '!r}")


def test_unix_timestamps_reach_prometheus(autoscaler_file: Any,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from cli.main import main

    status = main(["replay", str(autoscaler_file), *_common("--from", "1700000000.5",
                                                            "--to", "1700003600")])
    assert status == 1  # checked, then Prometheus was asked (and nothing listens there)
    assert f"cannot reach Prometheus at {_NOWHERE}" in capsys.readouterr().err


# --- Prometheus' TLS files: checked before the first query ------------------------------------

@pytest.mark.parametrize(("flags", "message"), [
    (["--prometheus-ca-file", "{missing}"],
     "--prometheus-ca-file: cannot read {missing}: no such file or directory"),
    (["--prometheus-ca-file", "{garbage}"],
     "--prometheus-ca-file: {garbage} holds no usable CA certificate "
     "(NO_CERTIFICATE_OR_CRL_FOUND)"),
    (["--prometheus-ca-file", "{huge}"],
     "--prometheus-ca-file: cannot read {huge}: larger than 16 MiB (the most a command reads)"),
    (["--prometheus-client-tls-cert-file", "{garbage}", "--prometheus-client-tls-key-file",
      "{huge}"],
     "--prometheus-client-tls-key-file: cannot read {huge}: larger than 16 MiB (the most a "
     "command reads)"),
    (["--prometheus-client-tls-cert-file", "{garbage}", "--prometheus-client-tls-key-file",
      "{garbage}"],
     "--prometheus-client-tls-cert-file/-key-file: {garbage} and {garbage} are not a PEM "
     "certificate and its key"),
])
def test_tls_files_that_cannot_be_used_are_named_with_their_flag(
        tmp_path: Any, autoscaler_file: Any, flags: list[str], message: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    names = {"missing": str(tmp_path / "missing.pem"),
             "garbage": str(_write_bytes(tmp_path, "garbage.pem", b"\x00\x01 not PEM")),
             "huge": str(_sparse(tmp_path, "huge.pem"))}
    arguments = [str(autoscaler_file), *_common("--last", "1h"),
                 *(flag.format(**names) for flag in flags)]
    arguments[arguments.index(_NOWHERE)] = "https://127.0.0.1:1"
    assert _replay_error(arguments, capsys).startswith(message.format(**names))
