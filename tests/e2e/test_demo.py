"""`metricscale demo --fast` end to end as a user runs it: the pod list through kubectl, custom
metrics through the aggregator, the autoscaler scaling up and back down, then `kubectl top` and
CPU autoscaling on resource metrics, then `metricscale replay` of the first act agreeing with
what the live controller did (and its plot), and nothing left running or lying around
afterwards, also when the demo is terminated halfway."""

from __future__ import annotations

import importlib.util
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest

from tests.fakes.tools import require_tool

pytestmark = [pytest.mark.prometheus, pytest.mark.kubectl]

REPO = Path(__file__).resolve().parents[2]
# --fast finishes in under a minute here; the bound leaves room for a busy machine.
WITHIN = 240.0
SCALE_LINE = re.compile(r"^\s+[\d.]+s  replicas (\d+) -> (\d+) scaled (up|down)\s", re.MULTILINE)
# A row of the replay's table: time, values, CUR, PROP, DEC, OBS, then the limiting rule.
REPLAY_ROW = re.compile(
    r"^\d{4}-\d\d-\d\dT[\d:]+Z\s+\S+\s+(\d+)\s+(?:\d+|-)\s+(\d+)\s+(\d+|-)(?:\s|$)",
    re.MULTILINE)


@contextmanager
def demo_process(workdir: Path) -> Iterator[subprocess.Popen[str]]:
    """The demo in its own process group, so that whatever it starts can be found (and, if the
    test fails, killed) by that group."""
    kubectl = require_tool("kubectl", env_var="KUBECTL")
    require_tool("prometheus", env_var="PROMETHEUS")
    process = subprocess.Popen(
        [sys.executable, "-m", "metricscale", "demo", "--fast", "--workdir", str(workdir),
         "--kubectl", kubectl],
        cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True)
    try:
        yield process
    finally:
        if process.poll() is None or group_alive(process.pid):
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        if process.stdout is not None:
            process.stdout.close()


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_for_group_gone(pgid: int, *, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while group_alive(pgid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def leftovers(workdir: Path) -> list[Path]:
    """Temporary run directories and private keys the demo should have removed."""
    return sorted([*workdir.glob("run-*"), *workdir.rglob("*.key")])


def test_demo_scales_web_up_and_down_and_leaves_nothing_running(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    with demo_process(workdir) as process:
        try:
            output, _ = process.communicate(timeout=WITHIN)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the demo did not finish within {WITHIN:.0f} s")
        assert process.returncode == 0, output[-4000:]
        assert wait_for_group_gone(process.pid), "a process the demo started is still running"
    assert '"kind": "PodList"' in output
    assert all(f'"name": "web-{index}"' in output for index in range(3))
    assert '"kind": "MetricValueList"' in output
    assert '"name": "http_requests_per_second"' in output
    first_act, _, cpu_act = output.partition("top pods -n demo\n")
    assert cpu_act, output[-4000:]
    cpu_act, _, replay_act = cpu_act.partition("[13/13] metricscale replay")
    assert replay_act, output[-4000:]
    steps = [(int(before), int(after), way)
             for before, after, way in SCALE_LINE.findall(first_act)]
    ups = [step for step in steps if step[2] == "up"]
    downs = [step for step in steps if step[2] == "down"]
    assert ups and downs, output[-4000:]
    assert all(before < after for before, after, _ in ups)
    assert max(after for _, after, _ in ups) >= 8  # 40 requests/s at 5 a pod
    assert downs[-1][1] == 2  # 8 requests/s: two pods, after the stabilization window
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
                 for before, after, way in SCALE_LINE.findall(cpu_act)]
    assert [way for _, _, way in cpu_steps][:1] == ["up"], cpu_act[-3000:]
    assert max(after for _, after, _ in cpu_steps) >= 5  # 500m at 100m a pod
    assert cpu_steps[-1][1:] == (1, "down")
    assert "% cpu" in cpu_act
    check_replay_act(replay_act, workdir=workdir, up_to=max(after for _, after, _ in ups))
    assert leftovers(workdir) == []
    assert (workdir / "kubeconfig").is_file() and (workdir / "autoscaler.log").is_file()


def check_replay_act(act: str, *, workdir: Path, up_to: int) -> None:
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
    assert len(observed) == len(rows)  # the demo plays kube-state-metrics for the whole range
    # Both curves go up and back down to 2; the live one to the live run's top size.
    assert max(observed) == up_to and max(decided) > rows[0][0], act[:3000]
    assert decided[-1] == observed[-1] == 2, act[:3000]
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


class Lines:
    """The demo's output, read by a thread so the test can wait for a line with a bound."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        self.stream = process.stdout
        self.queue: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        for line in self.stream:
            self.queue.put(line)
        self.queue.put(None)

    def until(self, marker: str, *, within: float) -> None:
        deadline = time.monotonic() + within
        while True:
            try:
                line = self.queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no {marker!r} within {within:.0f} s:\n{self.text[-3000:]}")
            if line is None:
                pytest.fail(f"the demo ended before {marker!r}:\n{self.text[-3000:]}")
            self.seen.append(line)
            if marker in line:
                return

    @property
    def text(self) -> str:
        return "".join(self.seen)


def test_sigterm_halfway_stops_every_process_and_removes_the_temporary_files(
        tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    with demo_process(workdir) as process:
        # By then Prometheus, the fake cluster, the adapter and the autoscaler all run.
        lines = Lines(process)
        lines.until("The load rises", within=WITHIN)
        process.send_signal(signal.SIGTERM)  # to the demo alone: it must stop the others
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("the demo did not stop within 30 s of SIGTERM")
        lines.thread.join(timeout=10)
        lines.until("terminated; every process was stopped", within=1)
        assert process.returncode == 128 + signal.SIGTERM
        assert wait_for_group_gone(process.pid), "a process the demo started outlived it"
    assert leftovers(workdir) == []
