"""`metricscale demo` on a real control plane: upstream's HPA and ours, side by side.

etcd, kube-apiserver, kube-controller-manager (with upstream's own HPA controller) and
kube-scheduler from `make peers` (testbed.controlplane), the kubelet stand-in for two Nodes
(testbed.kubelet: pods Running and Ready, cAdvisor's series), a real Prometheus, and
metricscale installed from its manifests (`kubectl apply -k`, testbed.install) with the adapter
and the autoscaler running here under the service accounts the manifests create, the
APIServices Available through the real aggregator.

Twin Deployments carry the same load (testbed.load: spread evenly over the Ready pods, as a
load balancer spreads it): one is scaled by a native autoscaling/v2 HorizontalPodAutoscaler
(kube-controller-manager's controller, reading our adapter), the other by a metricscale
Autoscaler with the same spec; the demo prints both counts as they move and whether the two
went through the same sizes. Twice: `web` on a Pods metric, `php-apache` on CPU.

Both twins step one pod per sync period either way, so that the sizes they go through do not
depend on when each controller happens to sync: a rate window fills and empties over several
syncs, and a step of "as many pods as the metric asks for" would take one controller, syncing
half a second later than the other, to a different size. The readings are exact here (each
pod's gauge is set as a whole; the kubelet stand-in stamps its CPU counters with their time),
so each count the walk passes asks for the next one beyond the tolerance, and the last one
holds inside it (tests/cli/test_demo_story.py checks both).

This module imports the test bed at its top: cli.demo imports it only once it has found the
source checkout (require_checkout), never from the installed package.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import ROUND_CEILING, Decimal
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

import yaml

from cli.demo import (
    CPU_APP,
    CPU_BUSY,
    CPU_IDLE,
    CPU_REQUEST,
    CPU_TARGET_PERCENT,
    DEMO_APP,
    DEMO_NAMESPACE,
    GUARD_SECONDS,
    MAX_REPLICAS,
    METRIC,
    MIN_REPLICAS,
    NODES,
    REPLICAS_SERIES,
    SCRAPE_SECONDS,
    TARGET_PER_POD,
    Banner,
    DemoError,
    Terminated,
    Timing,
    figure,
    preload_replay,
    replay_act,
)
from testbed.binaries import PEERS_BIN, find_peer
from testbed.controlplane import ControlPlane, ControlPlaneMissing, KubeError
from testbed.install import NAMESPACE as INSTALLED_NAMESPACE
from testbed.install import Installation, write_overlay
from testbed.load import Load
from testbed.processes import ChildFailed
from testbed.watching import ValueWatch, deployment_replicas

if TYPE_CHECKING:
    from testbed.fakes.exporter import Exporter

logger = logging.getLogger(__name__)

SECTIONS = 12
TOLERANCE = Decimal("0.1")  # upstream's default; both controllers keep it
UPSTREAM = "-upstream"  # the suffix of the twin that upstream's HPA scales
# The web twins' load in requests/s (each pod's gauge http_requests_per_second is its share):
# 14 on 3 pods holds (93%); 40 is 8 pods' worth at 5 a pod, and 7 pods still read 14% over
# the target; 8 is 2 pods' worth (80%: 2 hold by rounding up).
WEB_START_PODS = 3
WEB_LOADS = (Decimal(14), Decimal(40), Decimal(8))
# php-apache's load in cores: 50m on 1 pod of 200m (25%), 470m (5 pods at 47%; 4 read 59%).
CPU_START_PODS = 1
CPU_LOADS = (CPU_IDLE, CPU_BUSY, CPU_IDLE)
WEB_CPU = Decimal("0.03")  # what the web pods use in all, so `kubectl top` shows them too
WEB_CPU_REQUEST = "100m"
# The web Autoscaler's pods in Prometheus, for the replay: web-<template hash>-<suffix>, not
# the twin's web-upstream-<hash>-<suffix>.
WEB_PODS = rf"{DEMO_APP}-[a-z0-9]+-[a-z0-9]+"
# What separates the twins' steps besides their sync phases: a scrape, the adapter's answer.
PIPELINE_SLACK_SECONDS = 3.0
LOG_FOLDER = "logs"


# --- pure pieces: the walk, the manifests, the lines ---------------------------------------------


def walk(*, start: int, load: Decimal, per_pod: Decimal) -> list[int]:
    """The counts a steady `load` takes a workload through from `start`, one pod a step, on
    exact readings: on while the load per pod is beyond the tolerance and asks for another
    count (ceil(load / per_pod) within [MIN_REPLICAS, MAX_REPLICAS])."""
    counts = [start]
    wanted = int((load / per_pod).to_integral_value(rounding=ROUND_CEILING))
    wanted = min(max(wanted, MIN_REPLICAS), MAX_REPLICAS)
    while True:
        count = counts[-1]
        ratio = load / (count * per_pod)
        if abs(ratio - 1) <= TOLERANCE or wanted == count:
            return counts
        counts.append(count + (1 if wanted > count else -1))


@dataclass(frozen=True)
class Profile:
    """What a pair of twins goes through: its start, its loads in turn, its target a pod."""

    name: str
    start: int
    loads: tuple[Decimal, ...]
    per_pod: Decimal

    def walks(self) -> list[list[int]]:
        """The counts each load takes the twins through, from where the one before left them."""
        walks, count = [], self.start
        for load in self.loads:
            walks.append(walk(start=count, load=load, per_pod=self.per_pod))
            count = walks[-1][-1]
        return walks


PROFILES = {DEMO_APP: Profile(DEMO_APP, WEB_START_PODS, WEB_LOADS, TARGET_PER_POD),
            CPU_APP: Profile(CPU_APP, CPU_START_PODS, CPU_LOADS,
                             CPU_REQUEST * CPU_TARGET_PERCENT / 100)}


def story_walks() -> dict[str, list[int]]:
    """The sizes each pair of twins goes through, in order (distinct consecutive counts)."""
    return {name: [profile.start] + [count for counts in profile.walks() for count in counts[1:]]
            for name, profile in PROFILES.items()}


def twin_behavior(timing: Timing) -> dict[str, Any]:
    """One pod per sync period either way (see the module docstring); the scale-down waits out
    the stabilization window first."""
    def one_pod() -> list[dict[str, Any]]:
        return [{"type": "Pods", "value": 1, "periodSeconds": timing.sync_period_seconds}]

    return {
        "scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                    "policies": one_pod()},
        "scaleDown": {"stabilizationWindowSeconds": timing.scale_down_window_seconds,
                      "selectPolicy": "Max", "policies": one_pod()},
    }


def web_metrics() -> list[dict[str, Any]]:
    return [{"type": "Pods", "pods": {
        "metric": {"name": METRIC},
        "target": {"type": "AverageValue", "averageValue": str(TARGET_PER_POD)}}}]


def cpu_metrics() -> list[dict[str, Any]]:
    return [{"type": "Resource", "resource": {
        "name": "cpu", "target": {"type": "Utilization",
                                  "averageUtilization": CPU_TARGET_PERCENT}}}]


def twin_manifests(name: str, metrics: list[dict[str, Any]], timing: Timing
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
    """upstream's HorizontalPodAutoscaler `<name>-upstream` for Deployment `<name>-upstream`,
    and our Autoscaler `<name>` for Deployment `<name>`: the same spec but for the target."""
    def spec(target: str) -> dict[str, Any]:
        return {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                   "name": target},
                "minReplicas": MIN_REPLICAS, "maxReplicas": MAX_REPLICAS,
                "metrics": metrics, "behavior": twin_behavior(timing)}

    upstream = name + UPSTREAM
    return ({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
             "metadata": {"name": upstream, "namespace": DEMO_NAMESPACE},
             "spec": spec(upstream)},
            {"apiVersion": "metricscale.dev/v1alpha1", "kind": "Autoscaler",
             "metadata": {"name": name, "namespace": DEMO_NAMESPACE}, "spec": spec(name)})


def deployment(name: str, *, replicas: int, cpu_request: str) -> dict[str, Any]:
    """A Deployment whose pods the kubelet stand-in runs (the image is never pulled)."""
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": DEMO_NAMESPACE},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [{
                                      "name": "app", "image": f"registry.invalid/{name}:1",
                                      "resources": {"requests": {"cpu": cpu_request,
                                                                 "memory": "64Mi"}}}]}}}}


def format_row(*, seconds: float, load: str, upstream: int | None, ours: int | None) -> str:
    """One line of the side-by-side table."""
    def shown(count: int | None) -> str:
        return "-" if count is None else str(count)

    verdict = "agree" if upstream == ours else "differ"
    return (f"  {seconds:6.1f}s  {load:>6}  {shown(upstream):>14}  {shown(ours):>4}  "
            f"{verdict}")


TABLE_HEADER = "     time    load  upstream's HPA  ours"


@dataclass(frozen=True)
class SideBySide:
    """The sizes each twin went through, and how far apart in time their like steps were."""

    upstream: tuple[int, ...]
    ours: tuple[int, ...]
    offsets: tuple[float, ...]  # ours' step time minus upstream's, step by step
    period: float

    @property
    def agrees(self) -> bool:
        return self.upstream == self.ours

    @property
    def largest_offset(self) -> float:
        return max((abs(offset) for offset in self.offsets), default=0.0)


def compare_twins(upstream: Sequence[tuple[float, int]], ours: Sequence[tuple[float, int]], *,
                  period: float) -> SideBySide:
    """Compare two records of (time, replicas), each starting with the size at the start."""
    theirs = tuple(count for _, count in upstream)
    mine = tuple(count for _, count in ours)
    offsets = tuple(round(b - a, 1) for (a, _), (b, _) in zip(upstream[1:], ours[1:],
                                                              strict=False))
    return SideBySide(upstream=theirs, ours=mine,
                      offsets=offsets if theirs == mine else (), period=period)


def format_side_by_side(result: SideBySide, *, what: str) -> str:
    """The line that says whether upstream's HPA and ours went through the same sizes."""
    def sizes(counts: Sequence[int]) -> str:
        return " -> ".join(map(str, counts))

    head = f"Upstream's HPA and ours on {what}:"
    if not result.agrees:
        return (f"{head} DIFFER: upstream's HPA went {sizes(result.upstream)}, ours went "
                f"{sizes(result.ours)}")
    steps = len(result.upstream) - 1
    line = (f"{head} AGREE: both went {sizes(result.upstream)} ({steps} steps; like steps at "
            f"most {result.largest_offset:.1f} s apart, the sync period is "
            f"{result.period:g} s)")
    if result.largest_offset > result.period + PIPELINE_SLACK_SECONDS:
        line += ("; further apart than a sync period where one controller caught a reading a "
                 "sync before it settled and the other just after: on CPU a new pod counts "
                 "once its sample is a rate window past its Ready, and a busy machine delays "
                 "syncs")
    return line


def keep_lines(*, kubeconfig: Path, prometheus_url: str) -> list[str]:
    """What --keep prints on the real control plane once the story is over."""
    return [
        "",
        "The control plane stays up (--keep): etcd, kube-apiserver, kube-controller-manager "
        "(upstream's HPA), kube-scheduler,",
        "the kubelet stand-in, Prometheus, metricscale adapter and metricscale autoscaler run, "
        "and the loads stay as they are. In another shell:",
        "",
        f"export KUBECONFIG={shlex.quote(str(kubeconfig))}",
        f"kubectl get hpa,msa,deployments,pods -n {DEMO_NAMESPACE}",
        f"kubectl top pods -n {DEMO_NAMESPACE}",
        f"metricscale explain --live {DEMO_NAMESPACE}/{DEMO_APP}",
        f"metricscale explain --live {DEMO_NAMESPACE}/{DEMO_APP}{UPSTREAM} --hpa  "
        "# upstream's HPA, through our decision code",
        f"kubectl scale deployment/{DEMO_APP} -n {DEMO_NAMESPACE} --replicas=6  "
        "# the autoscaler brings it back",
        "",
        f"Prometheus: {prometheus_url} (the query page and /api/v1/query)",
        "",
        "Ctrl-C stops everything and removes the temporary files.",
    ]


# --- the shell ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Kubectl:
    """kubectl as the cluster's admin, its discovery cache in the demo's temporary directory."""

    binary: str
    kubeconfig: Path
    cache_dir: Path

    def __call__(self, *arguments: str, timeout: float = GUARD_SECONDS) -> str:
        try:
            result = subprocess.run(
                [self.binary, "--kubeconfig", str(self.kubeconfig), *arguments],
                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout,
                check=False, env={**os.environ, "KUBECACHEDIR": str(self.cache_dir)})
        except subprocess.TimeoutExpired:
            raise DemoError(f"kubectl {' '.join(arguments)} did not answer within "
                            f"{timeout:.0f} s") from None
        except OSError as error:
            raise DemoError(f"cannot run kubectl {self.binary}: {error}") from None
        if result.returncode != 0:
            raise DemoError(f"kubectl {' '.join(arguments)} failed (exit {result.returncode}): "
                            f"{result.stderr.strip() or 'no message'}")
        return result.stdout


@dataclass
class DemoInstallation(Installation):
    """The test bed's installation with the adapter's rules written where the demo keeps them:
    the shipped rules as the manifests applied them, with the demo's rate window for CPU and
    memory instead of 5m (upstream's HPA ignores a new pod's CPU until a window after it is
    Ready, and the demo should not wait five minutes for that)."""

    window_seconds: int = 30
    rules_file: Path = field(default_factory=lambda: Path("adapter-rules.yaml"))

    def adapter_config(self) -> Path:
        configmap = self.cluster.get(
            f"/api/v1/namespaces/{INSTALLED_NAMESPACE}/configmaps/metricscale-adapter-config")
        config = yaml.safe_load(configmap["data"]["config.yaml"])
        window = f"{self.window_seconds}s"
        for resource in ("cpu", "memory"):
            rule = config["resourceRules"][resource]
            for key in ("containerQuery", "nodeQuery"):
                rule[key] = rule[key].replace("[5m]", f"[{window}]")
        config["resourceRules"]["window"] = window
        self.rules_file.write_text(yaml.safe_dump(config, sort_keys=False))
        return self.rules_file


@dataclass
class Twins:
    """A pair of twin Deployments, their scalers, and the load on both."""

    profile: Profile
    what: str  # the metric, as the lines name it
    loads: tuple[Load, Load]
    setting: str  # what each Load takes the load as: "metric_total" or "cpu"
    unit: Callable[[Decimal], str]
    load: Decimal = field(init=False)  # the load both twins carry now

    def __post_init__(self) -> None:
        self.load = self.profile.loads[0]

    @property
    def name(self) -> str:  # ours: the Deployment and the Autoscaler
        return self.profile.name

    @property
    def upstream(self) -> str:
        return self.name + UPSTREAM

    @property
    def load_text(self) -> str:
        return self.unit(self.load)

    def set_load(self, load: Decimal) -> None:
        self.load = load
        for each in self.loads:
            each.set(**{self.setting: load})


def _requests(load: Decimal) -> str:
    return f"{figure(load)}/s"


def _millicores(load: Decimal) -> str:
    return f"{figure(load * 1000)}m"


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def _terminate(signum: int, frame: FrameType | None) -> None:
    """SIGTERM: once, as an exception in the story, so that its clean-up runs as on Ctrl-C."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated


def run_on_control_plane(*, workdir: Path, kubectl: str | None, timing: Timing,
                         keep: bool) -> None:
    """The story on the real control plane; everything it starts is stopped, and its temporary
    files removed, however it ends (DemoError, Ctrl-C, SIGTERM: Terminated)."""
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        Story(workdir=workdir, kubectl=kubectl, timing=timing).play(keep=keep)
    except (ChildFailed, KubeError, ControlPlaneMissing) as error:
        raise DemoError(f"{error}\n(the programs' logs are in {workdir / LOG_FOLDER})") from None
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def _failures(what: str) -> Iterator[None]:
    """The test bed's failures as a DemoError that says which step failed."""
    try:
        yield
    except (ChildFailed, KubeError, OSError, subprocess.SubprocessError) as error:
        raise DemoError(f"{what}: {error}") from None


class Story:
    """The sections, in order; `play` runs them inside one ExitStack."""

    def __init__(self, *, workdir: Path, kubectl: str | None, timing: Timing) -> None:
        self.workdir = workdir
        self.kubectl_binary = kubectl
        self.timing = timing
        self.period = timing.sync_period_seconds
        self.window = timing.rate_window_seconds
        self.banner = Banner(total=SECTIONS)
        self.started = time.monotonic()
        # What must keep running, checked at every poll: added as each part starts.
        self.checks: list[Callable[[], None]] = []

    # ---- the play -------------------------------------------------------------------------

    def play(self, *, keep: bool) -> None:
        from testbed.fakes.exporter import Exporter
        from testbed.fakes.prometheus import PrometheusError, PrometheusServer, find_prometheus

        if find_prometheus() is None:
            raise DemoError("prometheus was not found: install Debian's package "
                            "(`make demo` does) or set PROMETHEUS=/path/to/prometheus")
        peers = find_peer("kube-apiserver")
        assert peers is not None
        built = " (`make peers`)" if peers.parent == PEERS_BIN else ""
        print(f"metricscale demo: on a real control plane, from {peers.parent}{built}: "
              "upstream's HPA and ours, side by side. `metricscale demo --fake` runs the story "
              "on the embedded fake cluster instead.", flush=True)
        with contextlib.ExitStack() as stack:
            # Keys, certificates, tokens, etcd's data and kubectl's cache: removed at the end,
            # whatever happens; the logs are copied to the workdir first (last in, first out).
            scratch = Path(tempfile.mkdtemp(prefix="run-", dir=self.workdir))
            stack.callback(shutil.rmtree, scratch, ignore_errors=True)
            stack.callback(_keep_logs, scratch, self.workdir / LOG_FOLDER)
            self.scratch = scratch

            self.section_control_plane(stack)
            self.banner("Prometheus",
                        "A real Prometheus scrapes the kubelet stand-in's cAdvisor series and a "
                        "small exporter (each web pod's http_requests_per_second gauge, and "
                        "kube_deployment_spec_replicas: the demo plays kube-state-metrics) every "
                        f"{SCRAPE_SECONDS} s.")
            try:
                prometheus = stack.enter_context(PrometheusServer(
                    scrape_interval=f"{SCRAPE_SECONDS}s"))
            except PrometheusError as error:
                raise DemoError(f"Prometheus did not start: {error}") from None
            self.prometheus = prometheus

            def prometheus_running() -> None:
                if not prometheus.running:
                    raise DemoError(f"Prometheus exited; its log:\n{prometheus.log_tail()}")
            self.checks.append(prometheus_running)
            exporter = stack.enter_context(Exporter(job="demo"))
            prometheus.add_target(exporter)
            prometheus.add_target(self.kubelet_address, job="kubelet")
            print(f"        Prometheus {prometheus.url} scrapes {exporter.url} and "
                  f"http://{self.kubelet_address}/metrics/cadvisor")

            self.section_install(stack)
            web, cpu = self.section_twins(stack, exporter)
            self.section_custom_metrics()

            web_manifest = self.workdir / "autoscaler.yaml"
            web_began = datetime.now(UTC)
            self.section_side_by_side(
                web, metrics=web_metrics(), manifest=web_manifest,
                title=f"Side by side on a Pods metric: {DEMO_APP} and {DEMO_APP}{UPSTREAM}",
                why=f"upstream's HPA {DEMO_APP}{UPSTREAM} (kube-controller-manager) and our "
                    f"Autoscaler {DEMO_APP} (metricscale autoscaler), the same spec: "
                    f"{METRIC} at an average of {figure(TARGET_PER_POD)} a pod, 1 to "
                    f"{MAX_REPLICAS} replicas, one pod per sync period either way. The same "
                    "load on both; a row whenever the load or a count changes.")
            web_ended = datetime.now(UTC)

            # The replay act's imports (matplotlib takes seconds) load meanwhile.
            threading.Thread(target=preload_replay, name="demo replay imports",
                             daemon=True).start()
            self.wait_cpu_samples(cpu)
            self.section_side_by_side(
                cpu, metrics=cpu_metrics(), manifest=self.workdir / "autoscaler-cpu.yaml",
                title=f"Side by side on CPU: {CPU_APP} and {CPU_APP}{UPSTREAM}",
                why=f"`kubectl autoscale deployment {CPU_APP} --cpu-percent="
                    f"{CPU_TARGET_PERCENT} --min=1 --max=10` twice: as upstream's HPA and as "
                    "our Autoscaler, on resource metrics our adapter serves (metrics.k8s.io, "
                    "from cAdvisor's series: no metrics-server).")

            self.banner(f"kubectl get hpa,msa -n {DEMO_NAMESPACE}",
                        "Upstream's HorizontalPodAutoscalers and our Autoscalers, each with its "
                        "printer columns, as the real API server renders them.")
            print(f"$ kubectl --kubeconfig {self.kubeconfig} get hpa,msa -n {DEMO_NAMESPACE}")
            print(self.admin("get", "hpa,msa", "-n", DEMO_NAMESPACE), end="")

            self.banner(f"kubectl --kubeconfig {self.kubeconfig} top pods -n {DEMO_NAMESPACE}",
                        "Resource metrics (metrics.k8s.io) from cAdvisor's series in Prometheus, "
                        "through our adapter behind the real aggregator. Then the nodes.")
            print(self.top("pods", "-n", DEMO_NAMESPACE), end="")
            print(f"$ kubectl top nodes\n{self.top('nodes')}", end="")

            self.banner(f"metricscale explain --live {DEMO_NAMESPACE}/{DEMO_APP}",
                        "The autoscaler's reasoning for its last decision, from the cluster and "
                        "the settings the running controller published in its Lease.")
            print(f"$ metricscale explain --live {DEMO_NAMESPACE}/{DEMO_APP} --kubeconfig "
                  f"{self.kubeconfig} -o text")
            print(self.explain(), end="")
            self.alive()
            self.section_doctor()

            self.banner(f"metricscale replay: {DEMO_APP}'s act again, from Prometheus' history",
                        f"The Autoscaler {DEMO_NAMESPACE}/{DEMO_APP} replayed over the range it "
                        "ran in, closed-loop, beside the replicas the live controller set "
                        f"({REPLICAS_SERIES}, as kube-state-metrics exports it).")
            replay_act(workdir=self.workdir, prometheus_url=prometheus.url,
                       rules_file=self.installation.rules_file, manifest=web_manifest,
                       start=web_began, end=web_ended, timing=self.timing,
                       scrape_seconds=SCRAPE_SECONDS, pods=WEB_PODS)
            if keep:
                self.keep()

    # ---- the sections ---------------------------------------------------------------------

    def section_doctor(self) -> None:
        from cli.doctor import DoctorOptions, command_line, doctor_text

        planted = "http_request_per_second"  # the demo's metric, misspelt
        self.banner("metricscale doctor",
                    "The whole installation checked, one line per finding, after planting one "
                    f"problem: an Autoscaler asking for {planted}, a metric no rule serves. "
                    "doctor names it, with the nearest metric the rules do serve.")
        # kubectl create, not a server-side apply: an applier owning spec.replicas would be a
        # second finding about the same object.
        self.admin("create", "deployment", "typo", "-n", DEMO_NAMESPACE,
                   "--image=registry.invalid/typo:1", "--replicas=1")
        self.cluster.apply({
            "apiVersion": "metricscale.dev/v1alpha1", "kind": "Autoscaler",
            "metadata": {"name": "typo", "namespace": DEMO_NAMESPACE},
            "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                        "name": "typo"},
                     "minReplicas": 1, "maxReplicas": 3,
                     "metrics": [{"type": "Pods", "pods": {
                         "metric": {"name": planted},
                         "target": {"type": "AverageValue", "averageValue": "5"}}}]}})
        options = DoctorOptions(prometheus_url=self.prometheus.url,
                                config_file=str(self.installation.rules_file))
        print(f"$ {command_line(options, kubeconfig=str(self.kubeconfig))}")
        status, report = doctor_text(options, kubeconfig=str(self.kubeconfig))
        print(report, end="")
        if status != 1 or not any(line.startswith("FAIL") and planted in line
                                  for line in report.splitlines()):
            raise DemoError("metricscale doctor did not report the planted problem")
        # The planted problem goes again: what --keep leaves is the story's.
        self.admin("delete", "autoscaler.metricscale.dev/typo", "deployment/typo", "-n",
                   DEMO_NAMESPACE, "--wait=false")
        print("        (the planted Autoscaler and its Deployment deleted again)")

    def section_control_plane(self, stack: contextlib.ExitStack) -> None:
        self.banner("A real control plane",
                    "etcd, kube-apiserver (RBAC, the aggregator), kube-controller-manager (with "
                    f"upstream's HPA controller, syncing every {self.period} s) and "
                    "kube-scheduler on 127.0.0.1; a kubelet stand-in registers two Nodes and "
                    "runs their pods (Running and Ready, no containers).")
        with _failures("the control plane did not start"):
            cluster = ControlPlane(
                workdir=self.scratch / "cluster", hpa_sync_period=f"{self.period}s",
                hpa_downscale_stabilization=f"{self.timing.scale_down_window_seconds}s")
            stack.callback(cluster.stop)
            cluster.start()
            kubelet = cluster.start_kubelet(NODES)
        self.cluster = cluster
        self.kubelet = kubelet
        self.checks.append(cluster.check_running)
        self.kubelet_address = kubelet.address
        self.kubeconfig = cluster.write_kubeconfig("admin", cluster.admin,
                                                   path=self.workdir / "kubeconfig")
        binary = self.kubectl_binary or str(find_peer("kubectl"))
        self.admin = Kubectl(binary, self.kubeconfig, self.scratch / "kubectl-cache")
        print(f"        ready in {cluster.startup_seconds:.1f} s at {cluster.server}; "
              f"kubeconfig {self.kubeconfig}")
        print(f"$ kubectl --kubeconfig {self.kubeconfig} get nodes")
        print(self.admin("get", "nodes"), end="")

    def section_install(self, stack: contextlib.ExitStack) -> None:
        self.banner("metricscale installed from its manifests",
                    "`kubectl apply -k` of an overlay of manifests/ (with the resource-metrics "
                    "component): the Deployments at 0 replicas, since the adapter and the "
                    "autoscaler run here, as the service accounts the manifests create; the "
                    "adapter's Service an ExternalName for localhost. The APIServices become "
                    "Available through the real aggregator.")
        installation = DemoInstallation(
            cluster=self.cluster, workdir=self.scratch / "install",
            prometheus_url=self.prometheus.url, sync_period=f"{self.period}s",
            window_seconds=self.window, rules_file=self.workdir / "adapter-rules.yaml")
        installation.workdir.mkdir(parents=True, exist_ok=True)
        stack.callback(installation.stop)
        self.installation = installation
        overlay = write_overlay(installation.workdir / "overlay",
                                adapter_port=installation.adapter_port)
        print(f"$ kubectl apply -k {overlay}")
        print(self.admin("apply", "-k", str(overlay), timeout=120), end="")
        with _failures("metricscale did not start on the control plane"):
            self.admin("wait", "--for=condition=Established", "--timeout=120s",
                       "crd/autoscalers.metricscale.dev", timeout=130)
            installation.start_adapter()
            installation.start_autoscaler()
        for child in (installation.adapter, installation.autoscaler):
            if child is not None:
                self.checks.append(child.check_running)
        print(f"        metricscale adapter (rules {installation.rules_file}) and metricscale "
              f"autoscaler (sync period {self.period} s) run as their service accounts")
        names = [f"{version}.{group}" for group, version in
                 (("custom.metrics.k8s.io", "v1beta1"), ("custom.metrics.k8s.io", "v1beta2"),
                  ("external.metrics.k8s.io", "v1beta1"), ("metrics.k8s.io", "v1beta1"))]
        print(f"$ kubectl get apiservices {' '.join(names)}")
        print(self.admin("get", "apiservices", *names), end="")

    def section_twins(self, stack: contextlib.ExitStack,
                      exporter: Exporter) -> tuple[Twins, Twins]:
        self.banner(f"Twin Deployments in namespace {DEMO_NAMESPACE}",
                    f"{DEMO_APP} and {DEMO_APP}{UPSTREAM} ({WEB_START_PODS} pods each), "
                    f"{CPU_APP} and {CPU_APP}{UPSTREAM} (1 pod each, {CPU_REQUEST * 1000:.0f}m "
                    "CPU requested). The load is spread evenly over each Deployment's Ready "
                    "pods, as a load balancer spreads it, and follows them as they come and go.")
        self.admin("create", "namespace", DEMO_NAMESPACE)
        for name in (DEMO_APP, DEMO_APP + UPSTREAM):
            self.cluster.apply(deployment(name, replicas=WEB_START_PODS,
                                          cpu_request=WEB_CPU_REQUEST))
        for name in (CPU_APP, CPU_APP + UPSTREAM):
            self.cluster.apply(deployment(name, replicas=CPU_START_PODS,
                                          cpu_request=f"{CPU_REQUEST * 1000:.0f}m"))
        # It also plays kube-state-metrics: each change is published as
        # kube_deployment_spec_replicas, for the replay.
        self.watch = stack.enter_context(deployment_replicas(
            self.cluster, DEMO_NAMESPACE, on_change=lambda name, replicas: exporter.set(
                REPLICAS_SERIES, {"namespace": DEMO_NAMESPACE, "deployment": name}, replicas)))

        def watching() -> None:
            if not self.watch.alive():
                raise DemoError("the demo's Deployment watch stopped")
        self.checks.append(watching)

        def loads(name: str, **settings: Any) -> tuple[Load, Load]:
            ours, upstream = (
                stack.enter_context(Load(self.cluster, self.kubelet, namespace=DEMO_NAMESPACE,
                                         selector={"app": app}, **settings))
                for app in (name, name + UPSTREAM))
            return ours, upstream

        web = Twins(PROFILES[DEMO_APP], METRIC,
                    loads(DEMO_APP, cpu=WEB_CPU, exporter=exporter, metric=METRIC,
                          metric_total=WEB_LOADS[0]), "metric_total", _requests)
        cpu = Twins(PROFILES[CPU_APP], "CPU", loads(CPU_APP, cpu=CPU_LOADS[0]), "cpu",
                    _millicores)
        self.until(lambda: all(len(load.ready_pods()) == twins.profile.start
                               for twins in (web, cpu) for load in twins.loads),
                   within=120.0, what="the twins' pods Running and Ready")
        print(f"$ kubectl --kubeconfig {self.kubeconfig} get deployments,pods -n "
              f"{DEMO_NAMESPACE}")
        print(self.admin("get", "deployments,pods", "-n", DEMO_NAMESPACE), end="")
        return web, cpu

    def section_custom_metrics(self) -> None:
        path = (f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{DEMO_NAMESPACE}/pods/*/"
                f"{METRIC}?labelSelector=app%3D{DEMO_APP}")
        self.banner(f"kubectl --kubeconfig {self.kubeconfig} get --raw '{path}'",
                    "The custom metrics API through the real aggregator, as upstream's HPA "
                    "reads it: each pod's share of the load.")

        def served(twin: str) -> bool:
            with contextlib.suppress(DemoError, ValueError):
                listed = json.loads(self.admin(
                    "get", "--raw", path.replace(f"app%3D{DEMO_APP}", f"app%3D{twin}")))
                return len(listed.get("items", [])) == WEB_START_PODS
            return False

        self.until(lambda: served(DEMO_APP) and served(DEMO_APP + UPSTREAM),
                   within=60.0 + 3 * self.window, what=f"{METRIC} served for the web twins' pods")
        print(json.dumps(json.loads(self.admin("get", "--raw", path)), indent=2))

    def wait_cpu_samples(self, twins: Twins) -> None:
        """Until every pod's CPU sample was taken a full window after it became Ready: before
        that upstream's HPA sets a new pod's CPU aside (its CPU initialization period), and
        with every pod that new it has no sample left (FailedGetResourceMetric)."""
        def past_window() -> bool:
            try:
                metrics = self.cluster.get(
                    f"/apis/metrics.k8s.io/v1beta1/namespaces/{DEMO_NAMESPACE}/pods")
                pods = self.cluster.get(f"/api/v1/namespaces/{DEMO_NAMESPACE}/pods")
            except (KubeError, OSError):
                return False
            stamps = {m["metadata"]["name"]: _seconds(m["timestamp"]) for m in metrics["items"]}
            for pod in pods["items"]:
                app = (pod["metadata"].get("labels") or {}).get("app")
                if app not in (twins.name, twins.upstream):
                    continue
                ready = [c for c in (pod.get("status") or {}).get("conditions") or []
                         if c.get("type") == "Ready" and c.get("status") == "True"]
                name = pod["metadata"]["name"]
                if not ready or name not in stamps:
                    return False
                if stamps[name] < _seconds(ready[0]["lastTransitionTime"]) + self.window:
                    return False
            return True

        self.until(past_window, within=120.0 + 3 * self.window,
                   what=f"{CPU_APP}'s CPU samples, a window after its pods became Ready")

    def section_side_by_side(self, twins: Twins, *, metrics: list[dict[str, Any]],
                             manifest: Path, title: str, why: str) -> None:
        self.banner(title, why)
        upstream, ours = twin_manifests(twins.name, metrics, self.timing)
        manifest.write_text(yaml.safe_dump(ours, sort_keys=False))
        hpa_manifest = manifest.with_name(manifest.stem + "-hpa.yaml")
        hpa_manifest.write_text(yaml.safe_dump(upstream, sort_keys=False))
        print(f"        {manifest} (the HPA in {hpa_manifest.name}: the same spec):")
        for line in manifest.read_text().splitlines():
            print(f"          {line}")
        print(self.admin("apply", "-f", str(hpa_manifest), "-f", str(manifest)), end="")
        created = time.monotonic()
        table = Table(twins, watch=self.watch, started=self.started, alive=self.alive)
        print(TABLE_HEADER)

        def active() -> bool:
            return all(_scaling_active(self.cluster, path) for path in (
                f"/apis/autoscaling/v2/namespaces/{DEMO_NAMESPACE}/horizontalpodautoscalers/"
                f"{twins.upstream}",
                f"/apis/metricscale.dev/v1alpha1/namespaces/{DEMO_NAMESPACE}/autoscalers/"
                f"{twins.name}"))

        self.until(active, within=60.0 + 2 * self.window, tick=table.tick, twins=twins,
                   what="both controllers' first decision from real metrics (ScalingActive)")
        profile = twins.profile
        for load, steps in zip(profile.loads[1:], profile.walks()[1:], strict=True):
            rises = load > twins.load
            twins.set_load(load)
            count = steps[-1]
            worth = f"{count} pod's" if count == 1 else f"{count} pods'"
            print(f"        the load {'rises' if rises else 'falls'} to {twins.load_text}: "
                  f"{worth} worth, reached one pod at a time"
                  + ("" if rises else f" after the {self.timing.scale_down_window_seconds} s "
                                      "stabilization window"), flush=True)

            def both_at(count: int = count) -> bool:
                return self.watch.now(twins.name) == self.watch.now(twins.upstream) == count

            # Generous bounds: each step waits for a sync, and on CPU for the new pod's samples.
            self.until(both_at, within=60.0 + len(steps) * (self.window + 3 * self.period + 5.0),
                       tick=table.tick, twins=twins,
                       what=f"both {twins.name} twins at {count} replicas")
        # Two more syncs of each, in case either moves on past the end.
        settle = time.monotonic() + 2 * self.period + SCRAPE_SECONDS + 1.0
        self.until(lambda: time.monotonic() >= settle, within=30.0, tick=table.tick,
                   twins=twins, what="the twins settled")
        result = compare_twins(self.watch.since(twins.upstream, created),
                               self.watch.since(twins.name, created), period=self.period)
        print("        " + format_side_by_side(result, what=twins.what), flush=True)

    # ---- helpers --------------------------------------------------------------------------

    def alive(self) -> None:
        with _failures("a program of the demo stopped"):
            for check in self.checks:
                check()

    def until(self, check: Callable[[], bool], *, within: float, what: str,
              tick: Callable[[], None] | None = None, twins: Twins | None = None) -> None:
        """Poll `check` until it holds (ticking the table); a DemoError naming `what`, with
        the scalers' state and the logs' ends, after `within` seconds."""
        deadline = time.monotonic() + within
        while True:
            self.alive()
            if tick is not None:
                tick()
            if check():
                return
            if time.monotonic() >= deadline:
                raise DemoError(f"{what} did not happen within {within:.0f} s\n"
                                + self.diagnose(twins))
            time.sleep(0.2)

    def diagnose(self, twins: Twins | None) -> str:
        text = ""
        if twins is not None:
            for kind, name in (("hpa", twins.upstream), ("msa", twins.name)):
                with contextlib.suppress(DemoError):
                    text += self.admin("describe", kind, name, "-n", DEMO_NAMESPACE)
        logs = [self.scratch / "install" / "autoscaler.log",
                self.scratch / "install" / "adapter.log",
                self.scratch / "cluster" / "kube-controller-manager.log"]
        text += "".join(f"\nthe end of {path.name} (kept in {self.workdir / LOG_FOLDER}):\n"
                        f"{_tail(path)}" for path in logs if path.exists())
        return text

    def top(self, *arguments: str) -> str:
        """`kubectl top ...`, retried while a just-started pod's metrics are not there yet."""
        deadline = time.monotonic() + 30.0 + 2 * self.window
        while True:
            try:
                return self.admin("top", *arguments)
            except DemoError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(1.0)

    def explain(self) -> str:
        try:
            result = subprocess.run(
                [sys.executable, "-m", "metricscale", "explain", "--live",
                 f"{DEMO_NAMESPACE}/{DEMO_APP}", "--kubeconfig", str(self.kubeconfig),
                 "-o", "text"], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                timeout=GUARD_SECONDS, check=False)
        except subprocess.TimeoutExpired:
            raise DemoError(f"metricscale explain --live did not answer within "
                            f"{GUARD_SECONDS:.0f} s") from None
        if result.returncode != 0:
            raise DemoError(f"metricscale explain --live failed ({result.returncode}): "
                            f"{result.stderr.strip()}")
        return result.stdout

    def keep(self) -> None:
        """Until Ctrl-C, with everything running; a program that exits ends the demo."""
        for line in keep_lines(kubeconfig=self.kubeconfig, prometheus_url=self.prometheus.url):
            print(f"        {line}" if line else "", flush=True)
        # Ctrl-C is Python's KeyboardInterrupt only when SIGINT was not ignored at start, and a
        # shell without job control starts a background command with it ignored: the handler
        # is set here, as the fake cluster's keep sets its own, so Ctrl-C (or kill -INT) stops
        # the demo however it was started.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            while True:
                self.alive()
                time.sleep(1.0)
        except KeyboardInterrupt:
            print("\nmetricscale demo: Ctrl-C: stopping everything", flush=True)
        finally:
            signal.signal(signal.SIGINT, previous)


class Table:
    """Prints a row of the side-by-side table whenever the load or either count changes."""

    def __init__(self, twins: Twins, *, watch: ValueWatch, started: float,
                 alive: Callable[[], None]) -> None:
        self.twins = twins
        self.watch = watch
        self.started = started
        self.alive = alive
        self.last: tuple[str, int | None, int | None] | None = None

    def tick(self) -> None:
        now = (self.twins.load_text, self.watch.now(self.twins.upstream),
               self.watch.now(self.twins.name))
        if now != self.last:
            self.last = now
            print(format_row(seconds=time.monotonic() - self.started, load=now[0],
                             upstream=now[1], ours=now[2]), flush=True)


def _scaling_active(cluster: ControlPlane, path: str) -> bool:
    """The scaler's ScalingActive condition is True (it read its metrics)."""
    try:
        obj = cluster.get(path)
    except (KubeError, OSError):
        return False
    return any(c.get("type") == "ScalingActive" and c.get("status") == "True"
               for c in (obj.get("status") or {}).get("conditions") or [])


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _keep_logs(scratch: Path, target: Path) -> None:
    """The programs' logs, copied out of the temporary directory before it goes."""
    logs = [*scratch.glob("cluster/*.log"), *scratch.glob("install/*.log")]
    if not logs:
        return
    target.mkdir(parents=True, exist_ok=True)
    for log in logs:
        with contextlib.suppress(OSError):
            shutil.copyfile(log, target / log.name)
