"""`metricscale demo --fake --fast` end to end as a user runs it, on the embedded fake cluster:
the Deployments and pods through kubectl, custom metrics through the aggregator, the autoscaler
scaling up and back down, then `kubectl top` and CPU autoscaling on resource metrics, then
`metricscale replay` of the first act agreeing with what the live controller did (and its plot),
and nothing left running or lying around afterwards, also when the demo is terminated halfway;
and `--keep`, which leaves the cluster up for a user's commands until Ctrl-C. (The story on the
real control plane: tests/cluster/test_demo_cluster.py.)

The tests wait for the demo's own lines and for its exit: every step of the demo is bounded by
the demo itself, which then fails and ends."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
from contextlib import suppress
from pathlib import Path

import pytest

from cli.demo import story_counts
from testbed.fakes.tools import find_tool, require_tool
from tests.cli.demo_runs import REPO, Lines, demo_process, group_alive, leftovers

pytestmark = [pytest.mark.prometheus, pytest.mark.kubectl]

SCALE_LINE = re.compile(r"^\s+[\d.]+s  replicas (\d+) -> (\d+) scaled (up|down)\s.*?"
                        r"  desired +(\d+|-)  ", re.MULTILINE)
# A row of the replay's table: time, values, CUR, PROP, DEC, OBS, then the limiting rule.
REPLAY_ROW = re.compile(
    r"^\d{4}-\d\d-\d\dT[\d:]+Z\s+\S+\s+(\d+)\s+(?:\d+|-)\s+(\d+)\s+(\d+|-)(?:\s|$)",
    re.MULTILINE)
SUMMARY_FIGURE = re.compile(r"^(mean_replicas|replica_hours|seconds_above_target): (\S+)$",
                            re.MULTILINE)


def section(output: str, number: int) -> str:
    """The text of numbered section `number` (its banner to the next one)."""
    start = output.index(f"\n[{number}/13] ")
    end = output.find(f"\n[{number + 1}/13] ", start)
    return output[start:end if end >= 0 else len(output)]


def check_story_lines(output: str) -> None:
    """What the demo prints agrees with itself: the Deployments and pods as a short table, each
    scale line with the desired count that caused it, the replay's summary as figures, and no
    traceback from anything the demo runs."""
    assert "Traceback" not in output, output[output.index("Traceback"):][:3000]
    # --fake: no note about the real control plane's binaries, whether or not they are here
    assert "programs are not here" not in output and "on a real control plane" not in output
    pods = section(output, 3)
    assert len(pods.splitlines()) < 20, pods[:3000]
    assert re.search(r"^NAME\s+READY\s+STATUS\s+RESTARTS\s+AGE\s*$", pods, re.MULTILINE), pods
    assert all(re.search(rf"^pod/web-{index}\s+1/1\s+Running\s", pods, re.MULTILINE)
               for index in range(3)), pods
    assert re.search(r"^deployment.apps/web\s+3/3\s", pods, re.MULTILINE), pods
    for before, after, way, desired in SCALE_LINE.findall(output):
        assert desired == after, f"{before} -> {after} scaled {way} with desired {desired}"
    figures = SUMMARY_FIGURE.findall(output)
    assert len(figures) == 3, output[-3000:]
    for name, value in figures:
        assert len(value.partition(".")[2]) <= 4, f"{name}: {value}"


def test_demo_scales_web_up_and_down_and_leaves_nothing_running(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    up_to, down_to, cpu_up_to = story_counts()
    with demo_process(workdir) as process:
        output, _ = process.communicate()
        assert process.returncode == 0, output[-4000:]
        assert not group_alive(process.pid), "a process the demo started is still running"
    check_story_lines(output)
    assert '"kind": "MetricValueList"' in output
    assert '"name": "http_requests_per_second"' in output
    first_act, _, cpu_act = output.partition("top pods -n demo\n")
    assert cpu_act, output[-4000:]
    cpu_act, _, replay_act = cpu_act.partition("[13/13] metricscale replay")
    assert replay_act, output[-4000:]
    steps = [(int(before), int(after), way)
             for before, after, way, _ in SCALE_LINE.findall(first_act)]
    ups = [step for step in steps if step[2] == "up"]
    downs = [step for step in steps if step[2] == "down"]
    assert ups and downs, output[-4000:]
    assert ups[0][0] == 3, output[-4000:]  # the first act's steady start held 3 pods
    assert all(before < after for before, after, _ in ups)
    assert max(after for _, after, _ in ups) >= up_to
    assert downs[-1][1] == down_to  # after the stabilization window
    assert steps.index(ups[0]) < steps.index(downs[0])
    assert "ScaleDownStabilized" in output
    assert re.search(r"NAME\s+REFERENCE\s+TARGETS\s+MINPODS\s+MAXPODS\s+REPLICAS\s+AGE",
                     output), "kubectl get msa without the CRD's printer columns"
    assert "$ metricscale explain --live demo/web" in output
    # explain decides with the settings the demo's controller published (not assumed defaults)
    assert "settings: from the controller" in output
    assert "Decision:" in output
    # The second act: kubectl top (pods, then nodes), then CPU autoscaling of php-apache.
    assert re.search(r"^NAME\s+CPU\(cores\)\s+MEMORY\(bytes\)\s*$", cpu_act, re.MULTILINE)
    assert re.search(r"^php-apache-0\s+\d+m\s+96Mi\s*$", cpu_act, re.MULTILINE)
    assert re.search(r"^node-1\s+\d+m\s+\d+%\s+\d+Mi\s+\d+%\s*$", cpu_act, re.MULTILINE)
    cpu_steps = [(int(before), int(after), way)
                 for before, after, way, _ in SCALE_LINE.findall(cpu_act)]
    assert [way for _, _, way in cpu_steps][:1] == ["up"], cpu_act[-3000:]
    assert max(after for _, after, _ in cpu_steps) >= cpu_up_to
    assert cpu_steps[-1][1:] == (1, "down")
    assert "% cpu" in cpu_act
    check_replay_act(replay_act, workdir=workdir, up_to=max(after for _, after, _ in ups),
                     down_to=down_to)
    assert leftovers(workdir) == []
    assert (workdir / "kubeconfig").is_file() and (workdir / "autoscaler.log").is_file()


def check_replay_act(act: str, *, workdir: Path, up_to: int, down_to: int) -> None:
    """The third act: `metricscale replay` of the web Autoscaler over the first act's range,
    its table with the replayed (DEC) and observed (OBS) replicas, the plot, and the line that
    says they agree within one replica."""
    assert "$ metricscale replay " in act and "--step 1s" in act, act[:3000]
    rows = [(int(current), int(decided), None if observed == "-" else int(observed))
            for current, decided, observed in REPLAY_ROW.findall(act)]
    assert len(rows) >= 10, act[:3000]
    assert rows[0][0] == 3  # the replay starts from the 3 replicas kube-state-metrics recorded
    decided = [d for _, d, _ in rows]
    observed = [o for _, _, o in rows if o is not None]
    # The demo plays kube-state-metrics for the whole range. A scrape that fails (a loaded
    # machine: one took longer than the 1 s scrape timeout) marks the series stale until the
    # next one, so a step may show no observed value ("-"), the next ones do again.
    missing = [index for index, (_, _, o) in enumerate(rows) if o is None]
    assert len(missing) <= len(rows) // 10 and rows[-1][2] is not None, act[:3000]
    # Both curves go up and back down; the live one to the live run's top size.
    assert max(observed) == up_to and max(decided) > rows[0][0], act[:3000]
    assert decided[-1] == observed[-1] == down_to, act[:3000]
    assert re.search(r"^scale_ups: [1-9]", act, re.MULTILINE), act[:3000]
    assert re.search(r"^scale_downs: [1-9]", act, re.MULTILINE), act[:3000]
    verdict = re.search(r"Replay vs live controller: (\w+).*", act)
    assert verdict is not None, act[-3000:]
    if verdict.group(1) == "AGREE":  # as on a machine doing nothing else
        assert "within 1 replica at every one of" in verdict.group(0)
        assert abs(max(decided) - up_to) <= 1, act[:3000]
    else:  # a loaded machine delays the live controller: the demo says where, and why
        assert verdict.group(1) == "DIFFER" and "by up to" in verdict.group(0), verdict.group(0)
        assert "Why: the live controller decides on its own clock" in verdict.group(0)
    plot = workdir / "replay.png"
    if importlib.util.find_spec("matplotlib") is None:
        assert "no plot: --plot needs matplotlib" in act
        assert not plot.exists()
    else:
        assert "plotted in" in act and str(plot) in act
        assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert plot.stat().st_size > 10_000


def test_sigterm_halfway_stops_every_process_and_removes_the_temporary_files(
        tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    with demo_process(workdir) as process:
        # By then Prometheus, the fake cluster, the adapter and the autoscaler all run.
        lines = Lines(process)
        lines.until("The load rises")
        process.send_signal(signal.SIGTERM)  # to the demo alone: it must stop the others
        assert "terminated; every process was stopped" in lines.rest()
        assert process.wait() == 128 + signal.SIGTERM
        assert not group_alive(process.pid), "a process the demo started outlived it"
    assert leftovers(workdir) == []


def run(*command: str, kubeconfig: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, env={**os.environ, "KUBECONFIG": kubeconfig}, cwd=REPO,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)


def test_keep_leaves_the_cluster_up_for_commands_until_ctrl_c(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    with demo_process(workdir, "--keep", sigint_ignored=True) as process:
        lines = Lines(process)
        export = lines.until("export KUBECONFIG=")
        kubeconfig = export.split("export KUBECONFIG=", 1)[1].strip()
        assert Path(kubeconfig) == workdir.resolve() / "kubeconfig"
        prometheus = lines.until("Prometheus: http://127.0.0.1:")
        assert re.search(r"Prometheus: http://127\.0\.0\.1:\d+ ", prometheus), prometheus
        lines.until("Ctrl-C stops everything")
        # As the README has a user do: kubectl (the real client when there is one, else the
        # product's own), then a server-side dry run, which must create nothing (issue 21).
        kubectl = find_tool("kubectl", env_var="KUBECTL")
        if kubectl is not None:
            listed = run(kubectl, "get", "msa", "-n", "demo", "-o", "name", kubeconfig=kubeconfig)
            assert listed.returncode == 0, listed.stderr
            assert listed.stdout.split() == ["autoscaler.metricscale.dev/php-apache",
                                             "autoscaler.metricscale.dev/web"]
        explained = run(sys.executable, "-m", "metricscale", "explain", "--live", "demo/web",
                        "-o", "text", kubeconfig=kubeconfig)
        assert explained.returncode == 0, explained.stderr
        assert explained.stdout.startswith("Autoscaler demo/web -> Deployment/web")
        dry = run(sys.executable, "-m", "metricscale", "autoscale", "deployment/php-apache",
                  "--name", "php-apache-2", "--max", "10", "--cpu-percent", "50", "-n", "demo",
                  "--dry-run=server", kubeconfig=kubeconfig)
        assert (dry.returncode, dry.stdout.strip()) == (
            0, "autoscaler.metricscale.dev/php-apache-2 autoscaled (server dry run)"), dry.stderr
        if kubectl is not None:
            listed = run(kubectl, "get", "msa", "-n", "demo", "-o", "name", kubeconfig=kubeconfig)
            assert "php-apache-2" not in listed.stdout, listed.stdout
        assert leftovers(workdir) != []  # the keys are still there while it runs
        process.send_signal(signal.SIGINT)  # Ctrl-C, to the demo alone
        rest = lines.rest()
        assert process.wait() == 0, rest[-3000:]
        assert "stopped; everything it started is stopped" in rest, rest[-3000:]
        assert not group_alive(process.pid), "a process the demo started outlived it"
    assert leftovers(workdir) == []
    check_story_lines(lines.text)


def test_without_the_binaries_it_says_so_up_front_and_runs_on_the_fake(tmp_path: Path) -> None:
    """A checkout where `make peers` never ran (copied without tests/peers/bin): the first
    line says what is missing, how to get it and what that takes, before anything starts;
    then the fake cluster's story begins."""
    require_tool("prometheus", env_var="PROMETHEUS")
    checkout = tmp_path / "checkout"
    for part in ("cli", "metricscale", "adapter", "autoscaler", "testbed", "manifests"):
        shutil.copytree(REPO / part, checkout / part,
                        ignore=shutil.ignore_patterns("__pycache__"))
    env = {key: value for key, value in os.environ.items()
           if key not in {"METRICSCALE_PEERS", "KUBEBUILDER_ASSETS"}}
    process = subprocess.Popen(
        [sys.executable, "-m", "metricscale", "demo", "--fast", "--workdir",
         str(tmp_path / "demo")], cwd=checkout, env=env, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        lines = Lines(process)
        first = lines.until("metricscale demo")
        assert first.startswith("metricscale demo: the real control plane's programs are not "
                                "here (etcd, kube-apiserver,"), first
        assert str(checkout / "tests" / "peers" / "bin") in first
        assert "`make peers` builds them (it needs Go; the first build takes about 6 minutes"\
            in first
        lines.until("[1/13] Prometheus and the pods' traffic")
        process.send_signal(signal.SIGTERM)
        assert "terminated; every process was stopped" in lines.rest()
        assert process.wait() == 128 + signal.SIGTERM
        assert not group_alive(process.pid), "a process the demo started outlived it"
    finally:
        if group_alive(process.pid):
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        if process.stdout is not None:
            process.stdout.close()
