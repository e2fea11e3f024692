"""`metricscale demo --fast` on the real control plane, as a user runs it once `make peers` has
built the binaries: upstream's HPA and ours side by side on twin Deployments, each act ending
with the line that says both went through the same sizes (the ones the story walks), the
table's rows in step with it, then `kubectl get hpa,msa`, `kubectl top`, explain and replay on
the real cluster; `--keep` leaves it up for a user's kubectl until Ctrl-C, after which nothing
the demo started runs and no temporary file is left; SIGTERM halfway stops everything too.

Skipped when the binaries are missing, failed instead under CI=true (require_peers). The tests
wait for the demo's own lines and its exit: each step of the demo is bounded by the demo."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

import pytest

from testbed.binaries import CONTROL_PLANE, find_peer
from testbed.demo_cluster import SECTIONS, UPSTREAM, story_walks
from testbed.pytest_plugin import require_peers
from tests.cli.demo_runs import Lines, demo_process, group_alive, leftovers

pytestmark = [pytest.mark.prometheus]

# A row of a side-by-side table: time, load, upstream's HPA, ours, agree|differ.
ROW = re.compile(r"^\s+[\d.]+s\s+(\S+)\s+(\d+|-)\s+(\d+|-)\s+(agree|differ)$", re.MULTILINE)
VERDICT = re.compile(r"^\s+Upstream's HPA and ours on (\S+): (AGREE|DIFFER): (.*)$",
                     re.MULTILINE)


@pytest.fixture(autouse=True)
def _peers() -> None:
    require_peers(*CONTROL_PLANE)


def section(output: str, number: int) -> str:
    start = output.index(f"\n[{number}/{SECTIONS}] ")
    end = output.find(f"\n[{number + 1}/{SECTIONS}] ", start)
    return output[start:end if end >= 0 else len(output)]


def check_side_by_side(act: str, *, what: str, walked: list[int]) -> None:
    """The act's verdict: AGREE on the sizes the story walks; its table's rows only ever show
    counts of that walk, and its last row both twins at the end of it."""
    verdicts = VERDICT.findall(act)
    assert len(verdicts) == 1, act[-3000:]
    metric, verdict, rest = verdicts[0]
    assert (metric, verdict) == (what, "AGREE"), f"{verdict}: {rest}\n{act[-3000:]}"
    assert rest.startswith("both went " + " -> ".join(map(str, walked)) + " ("), rest
    rows = ROW.findall(act)
    assert len(rows) >= len(walked), act[-3000:]
    for _, upstream, ours, _ in rows:
        assert {int(upstream), int(ours)} <= set(walked), act[-3000:]
    assert rows[-1][1:] == (str(walked[-1]), str(walked[-1]), "agree"), act[-3000:]


def check_story(output: str) -> None:
    assert "Traceback" not in output, output[output.index("Traceback"):][:3000]
    assert "on a real control plane, from " in output.splitlines()[0], output[:2000]
    assert re.search(r"^\s+ready in [\d.]+ s at https://127\.0\.0\.1:\d+", output, re.MULTILINE)
    assert re.search(r"^v1beta1\.metrics\.k8s\.io\s+metricscale/metricscale-adapter\s+True\s",
                     output, re.MULTILINE), output[:6000]
    twins = section(output, 4)
    for name in ("web", "web-upstream"):
        assert re.search(rf"^deployment\.apps/{name}\s+3/3\s", twins, re.MULTILINE), twins
    assert '"kind": "MetricValueList"' in section(output, 5)
    walks = story_walks()
    check_side_by_side(section(output, 6), what="http_requests_per_second", walked=walks["web"])
    check_side_by_side(section(output, 7), what="CPU", walked=walks["php-apache"])
    scalers = section(output, 8)
    for kind, name in (("horizontalpodautoscaler.autoscaling", f"web{UPSTREAM}"),
                       ("horizontalpodautoscaler.autoscaling", f"php-apache{UPSTREAM}"),
                       ("autoscaler.metricscale.dev", "web"),
                       ("autoscaler.metricscale.dev", "php-apache")):
        assert re.search(rf"^{re.escape(kind)}/{name}\s+Deployment/{name}\s", scalers,
                         re.MULTILINE), scalers
    top = section(output, 9)
    assert re.search(r"^NAME\s+CPU\(cores\)\s+MEMORY\(bytes\)\s*$", top, re.MULTILINE), top
    assert re.search(r"^php-apache-upstream-\S+\s+\d+m\s+\d+Mi\s*$", top, re.MULTILINE), top
    assert re.search(r"^node-1\s+\d+m\s+\d+%\s+\d+Mi\s+\d+%\s*$", top, re.MULTILINE), top
    explained = section(output, 10)
    assert "Decision: keep 2 replicas" in explained, explained
    assert "settings: from the controller" in explained, explained
    doctor = section(output, 11)
    assert "$ metricscale doctor " in doctor, doctor[:3000]
    assert re.search(r"^FAIL .*http_request_per_second", doctor, re.MULTILINE), doctor
    assert "http_requests_per_second" in doctor  # the nearest metric the rules serve
    replay = section(output, 12)
    assert "$ metricscale replay " in replay and "--step 1s" in replay, replay[:3000]
    verdict = re.search(r"Replay vs live controller: (AGREE|DIFFER)", replay)
    assert verdict is not None, replay[-3000:]


def test_keep_upstreams_hpa_and_ours_agree_and_ctrl_c_leaves_nothing(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    with demo_process(workdir, "--keep", fake=False, sigint_ignored=True) as process:
        lines = Lines(process)
        export = lines.until("export KUBECONFIG=")
        kubeconfig = export.split("export KUBECONFIG=", 1)[1].strip()
        assert Path(kubeconfig) == workdir.resolve() / "kubeconfig"
        lines.until("Ctrl-C stops everything")
        check_story(lines.text)
        # A user's kubectl on the cluster the demo left up: both kinds of scaler are there.
        listed = subprocess.run(
            [str(find_peer("kubectl")), "--kubeconfig", kubeconfig, "get", "hpa,msa", "-n",
             "demo", "-o", "name"], capture_output=True, text=True, timeout=60, check=False)
        assert listed.returncode == 0, listed.stderr
        assert sorted(listed.stdout.split()) == [
            "autoscaler.metricscale.dev/php-apache", "autoscaler.metricscale.dev/web",
            "horizontalpodautoscaler.autoscaling/php-apache-upstream",
            "horizontalpodautoscaler.autoscaling/web-upstream"]
        assert leftovers(workdir) != []  # the keys are there while it runs
        process.send_signal(signal.SIGINT)  # Ctrl-C, to the demo alone
        rest = lines.rest()
        assert process.wait() == 0, rest[-3000:]
        assert "stopped; everything it started is stopped" in rest, rest[-3000:]
        assert not group_alive(process.pid), "a process the demo started outlived it"
    assert leftovers(workdir) == []
    logs = workdir / "logs"
    assert {"kube-controller-manager.log", "autoscaler.log", "adapter.log"} <= {
        log.name for log in logs.iterdir()}
    assert (workdir / "replay.png").is_file() or "no plot" in lines.text


def test_sigterm_halfway_stops_the_control_plane_and_everything_else(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    with demo_process(workdir, fake=False) as process:
        # By then the control plane, the kubelet stand-in, Prometheus, the adapter, the
        # autoscaler and both loads run.
        lines = Lines(process)
        lines.until("the load rises to")
        process.send_signal(signal.SIGTERM)  # to the demo alone: it must stop the others
        assert "terminated; every process was stopped" in lines.rest()
        assert process.wait() == 128 + signal.SIGTERM
        assert not group_alive(process.pid), "a process the demo started outlived it"
    assert leftovers(workdir) == []
