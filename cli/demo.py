"""`metricscale demo`: the main job on one machine, with the real programs and the test doubles.

A real Prometheus scrapes per-pod request counters from a small built-in exporter; the fake
Kubernetes API server (testbed/fakes) holds a `web` Deployment and its pods; the real
`metricscale adapter` serves the custom metrics API behind the fake's aggregator (TLS verified
through caBundle, front-proxy authentication, SubjectAccessReviews), and the real
`metricscale autoscaler` scales the Deployment through an `Autoscaler` object while the demo
plays the Deployment controller and drives the load up and down. A second act does the same
on CPU, as Kubernetes' HPA walkthrough tells it: the exporter also publishes cAdvisor's series
for every pod and node, the adapter serves `metrics.k8s.io` from them (`kubectl top`), and an
Autoscaler keeps Deployment `php-apache` at 50% of its pods' CPU request. A third act replays
the first one with `metricscale replay` over Prometheus' history (the demo also plays
kube-state-metrics, so the replicas the live controller set are in Prometheus too), draws it to
.demo/replay.png and checks the replay against what the controller did. Everything listens on
127.0.0.1, and every process and temporary directory is gone when the demo ends, also on
Ctrl-C or failure; with --keep the cluster, Prometheus and both programs stay up after the story
for a user to try commands on, until Ctrl-C. The demo needs a source checkout, because the fake
cluster lives in testbed/fakes; `make demo` runs it from one.

With the real control plane's programs at hand (`make peers`, or a folder named by
METRICSCALE_PEERS or KUBEBUILDER_ASSETS: testbed/binaries.py), the story runs on a real control
plane instead, beside upstream's own HPA controller (testbed/demo_cluster.py); `--fake` keeps it on
the fake cluster. Without them the demo says so up front, with what building them takes, and
runs on the fake: it never builds them itself.

Each load the story holds steady leaves more than the HPA's 10% tolerance on both sides
before the count would change, and the loads the story moves to ask for their count with that
much room too (tests/cli/test_demo_story.py checks both): a busy machine's readings may be
off without the size going anywhere the story does not say.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import shlex
import shutil
import signal
import socket
import ssl
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
import yaml

from adapter.rules.defaults import DEFAULT_CONFIG_YAML
from metricscale import pki
from metricscale.core.quantity import QuantityError, parse_quantity

if TYPE_CHECKING:
    from cli.replay_sim import Summary
    from testbed.fakes.cadvisor import CAdvisor
    from testbed.fakes.exporter import Exporter
    from testbed.fakes.kube_api import FakeKubeAPI

logger = logging.getLogger(__name__)

_CHECKOUT = Path(__file__).resolve().parent.parent
CRD_MANIFEST = _CHECKOUT / "manifests" / "autoscaler" / "crd.yaml"
DEMO_NAMESPACE = "demo"
DEMO_APP = "web"
SERIES = "http_requests_total"
METRIC = "http_requests_per_second"
# Requests per second each of the first three pods serves: 14 in all, 4.67 a pod on average
# against a target of 5 (93%: inside the 10% tolerance, and 3 pods hold from 3.34 to 5.5 a pod).
INITIAL_RATES = {"web-0": Decimal(3), "web-1": Decimal(5), "web-2": Decimal(6)}
TARGET_PER_POD = Decimal(5)
MIN_REPLICAS, MAX_REPLICAS = 1, 10
# 7.8 pods' worth: 8 pods at 4.875 a pod (97.5%; 8 hold from 4.375 to 5.5 a pod, and are
# reached once a reading passes 35/s). Then 1.6 pods' worth: 2 pods at 4 (80%, held by rounding
# up rather than by the tolerance: 2 hold from 2.5 to 5.5 a pod, and are reached from above
# once a reading is at most 10/s, which a scale-down's lingering series push up).
HIGH_LOAD, LOW_LOAD = Decimal(39), Decimal(8)
ADAPTER_NAMESPACE, ADAPTER_SERVICE = "metricscale", "metricscale-adapter"
ADAPTER_USER = f"system:serviceaccount:{ADAPTER_NAMESPACE}:metricscale-adapter"
AUTOSCALER_USER = f"system:serviceaccount:{ADAPTER_NAMESPACE}:metricscale-autoscaler"
APISERVICES = (("custom.metrics.k8s.io", "v1beta1", 100),
               ("custom.metrics.k8s.io", "v1beta2", 200),
               ("external.metrics.k8s.io", "v1beta1", 100),
               ("metrics.k8s.io", "v1beta1", 100))
# The CPU act: the HPA walkthrough's php-apache (200m requested per pod, 50% target).
CPU_APP = "php-apache"
CPU_REQUEST = Decimal("0.2")
CPU_TARGET_PERCENT = 50
# Cores in all: one pod at 25% (the minimum of 1 holds up to 55%), then five pods at 47%
# (five hold from 40% to 55%).
CPU_IDLE, CPU_BUSY = Decimal("0.05"), Decimal("0.47")
WEB_POD_CPU = 0.01  # what each web pod uses, so `kubectl top` shows it too
POD_MEMORY = {"web": 48 << 20, CPU_APP: 96 << 20}
NODES = ("node-1", "node-2")
AUTOSCALER_API = ("metricscale.dev", "v1alpha1", "autoscalers")
CONDITION_TYPES = ("AbleToScale", "ScalingActive", "ScalingLimited")
SECTIONS = 13
# The replay act: kube-state-metrics' series of the Deployments' spec.replicas (the demo plays
# kube-state-metrics), the web pods, and where the plot goes.
REPLICAS_SERIES = "kube_deployment_spec_replicas"
DEMO_PODS = rf"{DEMO_APP}-[0-9]+"
REPLAY_PLOT = "replay.png"
REPLAY_TOLERANCE = 1  # replicas
SCRAPE_SECONDS = 1  # Prometheus' scrape interval in the demo
# How long the demo waits for a command to answer or a condition to hold before it gives up
# and says which: a guard against a hang, not a measure (it takes well under a second on a
# quiet machine; a loaded one once needed more than 30).
GUARD_SECONDS = 120.0
# How long a line waits for the Autoscaler's status to describe a size change it saw (the
# controller writes the scale, then the status).
STATUS_PATIENCE_SECONDS = 5.0


@dataclass(frozen=True)
class Timing:
    """How fast the demo moves: the autoscaler's periods, the rate window, and the bounds."""

    sync_period_seconds: int
    rate_window_seconds: int
    scale_down_window_seconds: int
    relist_seconds: int
    scale_up_within: float
    scale_down_within: float


# The rate window must hold several 1 s scrapes; the scale-down waits out the window first.
NORMAL = Timing(sync_period_seconds=2, rate_window_seconds=12, scale_down_window_seconds=12,
                relist_seconds=10, scale_up_within=75.0, scale_down_within=90.0)
FAST = Timing(sync_period_seconds=1, rate_window_seconds=6, scale_down_window_seconds=5,
              relist_seconds=5, scale_up_within=60.0, scale_down_within=60.0)


class DemoError(Exception):
    """A step of the demo failed or cannot run here; the message says what and where to look."""


class Terminated(Exception):
    """SIGTERM arrived: the demo stopped everything it had started."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workdir", type=Path, default=Path(".demo"),
                        help="where the demo writes its kubeconfig, manifests and the "
                             "programs' logs (default: .demo)")
    parser.add_argument("--kubectl", default=None,
                        help="kubectl binary (default: on the real control plane the kubectl "
                             "built with it; on the fake cluster kubectl on the PATH, else that "
                             "one)")
    parser.add_argument("--fast", action="store_true", help=fast_help())
    parser.add_argument("--keep", action="store_true",
                        help="after the story, leave the cluster, Prometheus, the adapter and "
                             "the autoscaler running, print the `export KUBECONFIG=...` line "
                             "to try commands on them, and stop everything on Ctrl-C")
    parser.add_argument("--fake", action="store_true",
                        help="run on the embedded fake cluster (testbed/fakes) even when the real "
                             "control plane's programs are there (`make peers`); without them "
                             "the demo runs on the fake anyway, and says how to get them")


def fast_help() -> str:
    """`--fast`'s help, built from FAST and NORMAL so that it cannot drift from them."""
    return (f"shorter periods and windows (sync {FAST.sync_period_seconds}s, rate window "
            f"{FAST.rate_window_seconds}s, scale-down window {FAST.scale_down_window_seconds}s; "
            f"without it {NORMAL.sync_period_seconds}s, {NORMAL.rate_window_seconds}s and "
            f"{NORMAL.scale_down_window_seconds}s): on the fake cluster the three acts take "
            f"about 45 s instead of 90 s, on the real control plane the whole story about "
            f"{REAL_FAST_SECONDS} s instead of {REAL_NORMAL_SECONDS} s")


# What the real control plane's story takes (testbed/demo_cluster.py) from start to end, as
# measured on a shared 2-core machine (66 s and 121 s; 100 s and 139 s beside two busy loops).
REAL_FAST_SECONDS, REAL_NORMAL_SECONDS = 70, 120
# `make peers` from an empty Go cache, as measured on a 2-core machine (tests/peers, issue 23).
PEERS_BUILD = "about 6 minutes, ~6 GB of Go cache and 561 MB of binaries"


def require_checkout(checkout: Path = _CHECKOUT) -> Path:
    """The source checkout the demo runs from (put first on sys.path), or a DemoError naming
    where this metricscale is: the fake cluster (testbed/fakes) and the test bed (testbed/) are
    not part of the installed package."""
    needed = ("testbed/fakes/kube_api.py", "testbed/controlplane.py")
    missing = [path for path in needed if not (checkout / path).is_file()]
    if missing:
        raise DemoError(
            f"metricscale demo runs from a source checkout of metricscale: it imports the fake "
            f"cluster (testbed/fakes) and the test bed (testbed/) from the checkout, and "
            f"{checkout} "
            f"(where this metricscale is installed) is not one: {' and '.join(missing)} "
            "missing. Clone the repository and run `make demo` in it.")
    if str(checkout) not in sys.path:
        sys.path.insert(0, str(checkout))
    return checkout


def peers_note(*, missing: Sequence[str], looked_in: Sequence[str]) -> str:
    """What the demo says up front when it runs on the fake cluster for want of the binaries."""
    return ("metricscale demo: the real control plane's programs are not here "
            f"({', '.join(missing)} missing; looked in {', '.join(looked_in)}), so the story "
            "runs on the embedded fake cluster. To run it on a real control plane, beside "
            "upstream's own HPA controller: `make peers` builds them (it needs Go; the first "
            f"build takes {PEERS_BUILD}), or METRICSCALE_PEERS names a folder that holds them; "
            "then `make demo` again. `make demo` never builds them itself; "
            "`metricscale demo --fake` skips this note.")


def _real_cluster_missing() -> tuple[list[str], list[str]]:
    """The control plane's programs not found, and where they were looked for."""
    from testbed.binaries import ENV_VARS, PEERS_BIN, missing_peers

    return missing_peers(), [f"${var}" for var in ENV_VARS] + [str(PEERS_BIN)]


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    started = time.monotonic()
    timing = FAST if args.fast else NORMAL
    try:
        require_checkout()
        workdir = args.workdir.resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        missing, looked_in = ([], []) if args.fake else _real_cluster_missing()
        if not args.fake and not missing:
            from testbed.demo_cluster import run_on_control_plane

            run_on_control_plane(workdir=workdir, kubectl=args.kubectl, timing=timing,
                                 keep=args.keep)
        else:
            if missing:
                print(peers_note(missing=missing, looked_in=looked_in), flush=True)
            asyncio.run(_until_terminated(_demo(workdir=workdir, kubectl=_fake_kubectl(args),
                                                timing=timing, keep=args.keep)))
    except DemoError as error:
        print(f"\nmetricscale demo failed: {error}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        print("\nmetricscale demo: interrupted; every process was stopped", file=sys.stderr)
        return 130
    except Terminated:
        print("\nmetricscale demo: terminated; every process was stopped", file=sys.stderr)
        return 128 + signal.SIGTERM
    if args.keep:
        print("\nmetricscale demo: stopped; everything it started is stopped and its temporary "
              "files are removed.", flush=True)
    else:
        print(f"\nThe demo took {time.monotonic() - started:.0f} s; everything it started is "
              "stopped and its temporary files are removed.", flush=True)
    return 0


def _fake_kubectl(args: argparse.Namespace) -> str:
    """kubectl for the fake cluster: --kubectl, the PATH's, else the one `make peers` built."""
    from testbed.binaries import find_peer

    found = args.kubectl or shutil.which("kubectl") or find_peer("kubectl")
    if not found:
        raise DemoError("kubectl was not found on the PATH (or pass --kubectl)")
    return str(found)


async def _until_terminated(demo: Awaitable[None]) -> None:
    """Run the demo; SIGTERM cancels it like Ctrl-C does, so its clean-up runs either way."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    terminated = asyncio.Event()

    def terminate() -> None:
        terminated.set()
        task.cancel()

    loop.add_signal_handler(signal.SIGTERM, terminate)
    try:
        await demo
    except asyncio.CancelledError:
        if terminated.is_set():
            raise Terminated from None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


# --- pure pieces: manifests, rules, load, the lines printed -------------------------------------


def adapter_rules(*, window_seconds: int) -> str:
    """prometheus-adapter rules: each pod's request counter as a per-second rate."""
    return f"""\
rules:
- seriesQuery: '{SERIES}{{namespace!="",pod!=""}}'
  resources:
    overrides:
      namespace: {{resource: namespace}}
      pod: {{resource: pod}}
  name:
    matches: "^(.*)_total$"
    as: "${{1}}_per_second"
  metricsQuery: 'sum(rate(<<.Series>>{{<<.LabelMatchers>>}}[{window_seconds}s])) by (<<.GroupBy>>)'
""" + resource_rules(window_seconds=window_seconds)


def resource_rules(*, window_seconds: int) -> str:
    """The default `resourceRules` (adapter/rules/defaults.py) with the demo's rate window in
    place of 5m: over 5m a series younger than five minutes reads low, and the demo's are."""
    section = "resourceRules:" + DEFAULT_CONFIG_YAML.split("\nresourceRules:", 1)[1]
    return (section.replace("[5m]", f"[{window_seconds}s]")
            .replace("window: 5m", f"window: {window_seconds}s"))


def autoscaler_manifest(timing: Timing) -> dict[str, Any]:
    """The Autoscaler for Deployment web: 5 requests/s a pod, and a behavior that moves fast."""
    return _autoscaler(DEMO_APP, timing, [{"type": "Pods", "pods": {
        "metric": {"name": METRIC},
        "target": {"type": "AverageValue", "averageValue": str(TARGET_PER_POD)}}}])


def cpu_autoscaler_manifest(timing: Timing) -> dict[str, Any]:
    """`kubectl autoscale deployment php-apache --cpu-percent=50 --min=1 --max=10`, as an
    Autoscaler (with the demo's fast behavior)."""
    return _autoscaler(CPU_APP, timing, [{"type": "Resource", "resource": {
        "name": "cpu",
        "target": {"type": "Utilization", "averageUtilization": CPU_TARGET_PERCENT}}}])


def _autoscaler(name: str, timing: Timing, metrics: list[dict[str, Any]]) -> dict[str, Any]:
    period = timing.sync_period_seconds
    return {
        "apiVersion": "/".join(AUTOSCALER_API[:2]), "kind": "Autoscaler",
        "metadata": {"name": name, "namespace": DEMO_NAMESPACE},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": MIN_REPLICAS, "maxReplicas": MAX_REPLICAS,
            "metrics": metrics,
            "behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max",
                            "policies": [{"type": "Percent", "value": 100,
                                          "periodSeconds": period},
                                         {"type": "Pods", "value": 4, "periodSeconds": period}]},
                "scaleDown": {"stabilizationWindowSeconds": timing.scale_down_window_seconds,
                              "policies": [{"type": "Percent", "value": 100,
                                            "periodSeconds": period}]},
            },
        },
    }


def pods_for(total: Decimal, per_pod: Decimal) -> int:
    """How many pods a steady `total` asks for at `per_pod` each (upstream rounds up)."""
    return int((total / per_pod).to_integral_value(rounding=ROUND_CEILING))


def story_counts() -> tuple[int, int, int]:
    """The sizes the story waits for: web at the top and after the fall, php-apache busy."""
    cpu_per_pod = CPU_REQUEST * CPU_TARGET_PERCENT / 100
    return (pods_for(HIGH_LOAD, TARGET_PER_POD), pods_for(LOW_LOAD, TARGET_PER_POD),
            pods_for(CPU_BUSY, cpu_per_pod))


def figure(value: Decimal) -> str:
    """A load as the story says it: 39, 9.5, 4.67."""
    text = f"{value.quantize(Decimal('0.01'), rounding=ROUND_HALF_UP):f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def readable_summary(summary: Summary) -> Summary:
    """The replay's summary with its floats rounded as a reader takes them in: two decimals,
    or three significant digits below 1 (0.0281 replica-hours)."""
    def readable(value: float) -> float:
        return round(value, 2) if abs(value) >= 1 else float(f"{value:.3g}")

    rounded: dict[str, Any] = {
        item.name: readable(value) for item in dataclasses.fields(summary)
        if isinstance(value := getattr(summary, item.name), float)}
    return dataclasses.replace(summary, **rounded)


def spread(total: Decimal, pods: Sequence[str]) -> dict[str, Decimal]:
    """`total` requests per second shared evenly by `pods`."""
    if not pods:
        return {}
    share = total / len(pods)
    return dict.fromkeys(pods, share)


@dataclass(frozen=True)
class Observation:
    """What one look at the cluster shows: the Deployment's size and the Autoscaler's status."""

    replicas: int
    current: int | None
    desired: int | None
    per_pod: str
    reasons: tuple[str, ...]

    @property
    def key(self) -> tuple[int, int | None, tuple[str, ...]]:
        return self.replicas, self.desired, self.reasons


def observe(*, deployment: Mapping[str, Any] | None,
            autoscaler: Mapping[str, Any] | None) -> Observation:
    status = (autoscaler or {}).get("status") or {}
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    reasons = tuple(f"{kind}={conditions[kind].get('reason', '')}" for kind in CONDITION_TYPES
                    if kind in conditions)
    desired, current = status.get("desiredReplicas"), status.get("currentReplicas")
    return Observation(
        replicas=int(((deployment or {}).get("spec") or {}).get("replicas", 0)),
        current=int(current) if current is not None else None,
        desired=int(desired) if desired is not None else None,
        per_pod=_per_pod(status.get("currentMetrics") or []), reasons=reasons)


def _per_pod(current_metrics: Sequence[Mapping[str, Any]]) -> str:
    for metric in current_metrics:
        utilization = ((metric.get("resource") or {}).get("current") or {}).get(
            "averageUtilization")
        if utilization is not None:
            return f"{utilization}% cpu"
        value = ((metric.get("pods") or {}).get("current") or {}).get("averageValue")
        if value is None:
            continue
        try:
            rate = parse_quantity(str(value)).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
        except QuantityError:
            return str(value)
        return f"{rate}/s"
    return "-"


def format_observation(*, seconds: float, load: Decimal | str, before: Observation | None,
                       now: Observation) -> str:
    """One compact line per change: time, replicas (and the direction), load, status."""
    if before is not None and now.replicas > before.replicas:
        size = f"{before.replicas} -> {now.replicas} scaled up"
    elif before is not None and now.replicas < before.replicas:
        size = f"{before.replicas} -> {now.replicas} scaled down"
    else:
        size = str(now.replicas)
    desired = "-" if now.desired is None else str(now.desired)
    shown = load if isinstance(load, str) else f"{load:>3.0f}/s"
    return (f"  {seconds:6.1f}s  replicas {size:<22} load {shown:>5}  per pod "
            f"{now.per_pod:>8}  desired {desired:>2}  "
            f"{' '.join(now.reasons) or '(no status yet)'}")


@dataclass(frozen=True)
class ReplayAgreement:
    """The replayed replicas against the observed ones, step by step.

    The live controller syncs on its own clock, not on the replay's steps, and Prometheus
    records the size it sets at its next scrape; so each replayed step is held against the
    observed replicas from `before` steps before it to `after` steps after it, the closest of
    them counting (`same_step` is the largest difference at the very same step)."""

    steps: int  # steps with an observed value in their allowance
    unobserved: int  # steps without one
    largest: int  # the largest difference, in replicas, with the allowance
    same_step: int  # the largest difference at the very same step
    apart: tuple[int, ...]  # the steps (indexes) more than REPLAY_TOLERANCE apart
    before: int
    after: int

    @property
    def agrees(self) -> bool:
        return self.steps > 0 and not self.apart


def replay_agreement(replayed: Sequence[int], observed: Sequence[int | None], *,
                     before: int = 0, after: int = 0) -> ReplayAgreement:
    """Compare each step's replayed (decided) replicas with the observed ones around it."""
    if len(replayed) != len(observed):
        raise ValueError("one observed value per replayed step")
    differences: list[tuple[int, int]] = []
    same_step = 0
    for index, mine in enumerate(replayed):
        theirs = observed[index]
        if theirs is not None:
            same_step = max(same_step, abs(mine - theirs))
        around = [value for value in observed[max(0, index - before):index + after + 1]
                  if value is not None]
        if around:
            differences.append((index, min(abs(mine - value) for value in around)))
    return ReplayAgreement(
        steps=len(differences), unobserved=len(replayed) - len(differences),
        largest=max((d for _, d in differences), default=0), same_step=same_step,
        apart=tuple(index for index, d in differences if d > REPLAY_TOLERANCE),
        before=before, after=after)


def format_agreement(agreement: ReplayAgreement, *, times: Sequence[str]) -> str:
    """The line that says whether the replay and the live controller agree."""
    if agreement.steps == 0:
        return ("Replay vs live controller: NOT COMPARED: Prometheus has no observed replicas "
                f"({REPLICAS_SERIES}) in the range")
    allowance = (f"each step against the observed replicas from {agreement.before} step(s) "
                 f"before to {agreement.after} after it; at the very same step the largest "
                 f"difference is {agreement.same_step}")
    skipped = (f"; {agreement.unobserved} step(s) without an observed value left out"
               if agreement.unobserved else "")
    if agreement.agrees:
        return (f"Replay vs live controller: AGREE within {REPLAY_TOLERANCE} replica at every "
                f"one of {agreement.steps} steps ({allowance}{skipped})")
    where = ", ".join(times[index] for index in agreement.apart[:5])
    more = f" and {len(agreement.apart) - 5} more" if len(agreement.apart) > 5 else ""
    return (f"Replay vs live controller: DIFFER by more than {REPLAY_TOLERANCE} replica at "
            f"{len(agreement.apart)} of {agreement.steps} steps, by up to {agreement.largest} "
            f"(at {where}{more}; {allowance}{skipped}). Why: the live controller decides on "
            "its own clock, on metric values between Prometheus' samples, and its size is "
            "recorded at the next scrape; on a busy machine its syncs drift further from the "
            "replay's steps than that allowance")


# --- the shell: processes, kubectl, the workload --------------------------------------------------


def _import_doubles() -> tuple[Any, Any, Any, Any]:
    """The test doubles live in the source tree, not in the installed package."""
    require_checkout()
    import testbed.fakes.cadvisor as cadvisor
    import testbed.fakes.exporter as exporter
    import testbed.fakes.kube_api as kube_api
    import testbed.fakes.prometheus as prometheus

    return exporter, kube_api, prometheus, cadvisor


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


@dataclass(frozen=True)
class Kubectl:
    """kubectl against the fake cluster, with its discovery cache in the demo's temporary
    directory rather than ~/.kube/cache."""

    binary: str
    kubeconfig: Path
    cache_dir: Path

    async def __call__(self, *arguments: str) -> str:
        try:
            process = await asyncio.create_subprocess_exec(
                self.binary, "--kubeconfig", str(self.kubeconfig), *arguments,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={**os.environ, "KUBECACHEDIR": str(self.cache_dir)})
        except OSError as error:
            raise DemoError(f"cannot run kubectl {self.binary}: {error}") from None
        try:
            async with asyncio.timeout(GUARD_SECONDS):
                out, err = await process.communicate()
        except TimeoutError:
            process.kill()
            await process.wait()
            raise DemoError(f"kubectl {' '.join(arguments)} did not answer within "
                            f"{GUARD_SECONDS:.0f} s") from None
        if process.returncode != 0:
            message = err.decode().strip() or "no message"
            raise DemoError(f"kubectl {' '.join(arguments)} failed (exit {process.returncode}): "
                            f"{message}")
        return out.decode()


@dataclass
class Program:
    """A metricscale program run as a subprocess, its output in a log file."""

    name: str
    process: asyncio.subprocess.Process
    log_file: Path

    def check_running(self) -> None:
        if self.process.returncode is not None:
            raise DemoError(f"metricscale {self.name} exited ({self.process.returncode}); "
                            f"the end of {self.log_file}:\n{_tail(self.log_file)}")

    async def stop(self) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(10):
                    await self.process.wait()
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


@contextlib.asynccontextmanager
async def _program(name: str, arguments: Sequence[str], *, log_file: Path
                   ) -> AsyncIterator[Program]:
    with log_file.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "metricscale", name, *arguments,
            stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    program = Program(name, process, log_file)
    try:
        yield program
    finally:
        await program.stop()


async def _until(check: Callable[[], Awaitable[bool]], *, within: float, what: str,
                 detail: Callable[[], str] = lambda: "") -> None:
    """Poll `check` until it holds; a DemoError naming `what` after `within` seconds."""
    deadline = time.monotonic() + within
    while not await check():
        if time.monotonic() >= deadline:
            extra = detail()
            raise DemoError(f"{what} did not happen within {within:.0f} s"
                            + (f"\n{extra}" if extra else ""))
        await asyncio.sleep(0.2)


async def _wait_ready(program: Program, *, url: str, ssl_context: ssl.SSLContext | bool,
                      within: float = GUARD_SECONDS) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        async def ready() -> bool:
            program.check_running()
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with http.get(url, ssl=ssl_context) as response:
                    return response.status == 200
            return False

        await _until(ready, within=within, what=f"metricscale {program.name} ready ({url})",
                     detail=lambda: f"the end of {program.log_file}:\n{_tail(program.log_file)}")


class Workload:
    """Plays the Deployment controller (pods web-<n> follow spec.replicas, status in step), the
    pods' traffic (each pod's request counter grows at its share of the load: the exporter's
    rated counter, exact however late this loop runs) and, through `cadvisor`, what each pod
    uses of CPU and memory."""

    app = DEMO_APP

    def __init__(self, *, kube: FakeKubeAPI, exporter: Exporter, cadvisor: CAdvisor) -> None:
        self.kube = kube
        self.exporter = exporter
        self.cadvisor = cadvisor
        self.load = sum(INITIAL_RATES.values(), Decimal(0))
        self.rates: dict[str, Decimal] = {}

    @property
    def load_text(self) -> str:
        return f"{figure(self.load)}/s"

    def create(self) -> None:
        self.kube.create_deployment(self.app, namespace=DEMO_NAMESPACE,
                                    replicas=len(INITIAL_RATES), labels={"app": self.app})
        for pod in INITIAL_RATES:
            self._add_pod(pod)
        self._serve(dict(INITIAL_RATES))

    def set_load(self, total: Decimal) -> None:
        self.load = total
        self._spread()

    def _spread(self) -> None:
        self._serve(spread(self.load, self.pods()))

    def _serve(self, rates: dict[str, Decimal]) -> None:
        self.rates = rates
        for pod, rate in rates.items():
            self.exporter.set_rate(SERIES, self._labels(pod), rate)

    def pods(self) -> list[str]:
        names = (p["metadata"]["name"] for p in
                 self.kube.store.list("", "v1", "pods", namespace=DEMO_NAMESPACE)
                 if (p["metadata"].get("labels") or {}).get("app") == self.app)
        return sorted(names, key=lambda name: int(name.rsplit("-", 1)[1]))

    def _labels(self, pod: str) -> dict[str, str]:
        return {"namespace": DEMO_NAMESPACE, "pod": pod}

    def _node(self, pod: str) -> str:
        return NODES[int(pod.rsplit("-", 1)[1]) % len(NODES)]

    def _add_pod(self, pod: str) -> None:
        self.kube.create_pod(pod, namespace=DEMO_NAMESPACE, labels={"app": self.app},
                             node_name=self._node(pod))
        self.exporter.set(SERIES, self._labels(pod), 0)
        self.cadvisor.set_container(DEMO_NAMESPACE, pod, self.app, node=self._node(pod),
                                    cpu=WEB_POD_CPU, memory=POD_MEMORY["web"])

    def _remove_pod(self, pod: str) -> None:
        self.kube.store.delete("", "v1", "pods", pod, namespace=DEMO_NAMESPACE)
        self.exporter.remove(SERIES, self._labels(pod))
        self.cadvisor.remove_pod(DEMO_NAMESPACE, pod)

    def sync(self) -> None:
        """One pass of the Deployment and ReplicaSet controllers."""
        deployment = self.kube.store.try_get("apps", "v1", "deployments", self.app,
                                             namespace=DEMO_NAMESPACE)
        if deployment is None:
            return
        wanted = int(deployment["spec"].get("replicas", 0))
        pods = self.pods()
        changed = False
        for index in range(wanted):
            if f"{self.app}-{index}" not in pods:
                self._add_pod(f"{self.app}-{index}")
                changed = True
        for pod in pods:
            if int(pod.rsplit("-", 1)[1]) >= wanted:
                self._remove_pod(pod)
                changed = True
        # What kube-state-metrics exports: the replicas the autoscaler set, for the replay act.
        self.exporter.set(REPLICAS_SERIES, {"namespace": DEMO_NAMESPACE, "deployment": self.app},
                          wanted)
        if (deployment.get("status") or {}).get("replicas") != wanted:
            def settle(obj: dict[str, Any]) -> None:
                status = obj.setdefault("status", {})
                for key in ("replicas", "readyReplicas", "availableReplicas", "updatedReplicas"):
                    status[key] = wanted
            self.kube.store.mutate("apps", "v1", "deployments", self.app, settle,
                                   namespace=DEMO_NAMESPACE)
        if changed:
            self._spread()

    async def run(self) -> None:
        while True:
            await asyncio.sleep(0.1)
            self.sync()


class CpuWorkload(Workload):
    """php-apache: one pod to begin with (200m CPU requested), the load in cores spread over
    the pods as each one's CPU use in cAdvisor's series."""

    app = CPU_APP

    def __init__(self, *, kube: FakeKubeAPI, exporter: Exporter, cadvisor: CAdvisor) -> None:
        super().__init__(kube=kube, exporter=exporter, cadvisor=cadvisor)
        self.load = CPU_IDLE

    @property
    def load_text(self) -> str:
        return f"{figure(self.load * 1000)}m"

    def create(self) -> None:
        self.kube.create_deployment(self.app, namespace=DEMO_NAMESPACE, replicas=1,
                                    labels={"app": self.app},
                                    cpu_request=f"{int(CPU_REQUEST * 1000)}m")
        self._add_pod(f"{self.app}-0")
        self._spread()

    def _add_pod(self, pod: str) -> None:
        self.kube.create_pod(pod, namespace=DEMO_NAMESPACE, labels={"app": self.app},
                             node_name=self._node(pod),
                             cpu_request=f"{int(CPU_REQUEST * 1000)}m")
        self.cadvisor.set_container(DEMO_NAMESPACE, pod, self.app, node=self._node(pod),
                                    cpu=0.0, memory=POD_MEMORY[CPU_APP])

    def _remove_pod(self, pod: str) -> None:
        self.kube.store.delete("", "v1", "pods", pod, namespace=DEMO_NAMESPACE)
        self.cadvisor.remove_pod(DEMO_NAMESPACE, pod)

    def _spread(self) -> None:
        pods = self.pods()
        for pod, share in spread(self.load, pods).items():
            self.cadvisor.set_pod_cpu(DEMO_NAMESPACE, pod, float(share))


class Reporter:
    """Prints a line whenever the replicas, the desired replicas or a condition changes.

    The controller writes the scale before the status that explains it, so a look can catch
    the new size beside the old status (`1 -> 2 scaled up ... desired 1`): a size change is
    shown once the status names the size it caused, or after STATUS_PATIENCE_SECONDS as it is
    (a size the controller did not set)."""

    def __init__(self, *, kube: FakeKubeAPI, workload: Workload, started: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.app = workload.app
        self.kube = kube
        self.workload = workload
        self.started = started
        self.clock = clock
        self.last: Observation | None = None
        self.ups = 0
        self.downs = 0
        self._waiting_since: float | None = None

    def look(self) -> Observation:
        return observe(
            deployment=self.kube.store.try_get("apps", "v1", "deployments", self.app,
                                               namespace=DEMO_NAMESPACE),
            autoscaler=self.kube.store.try_get(*AUTOSCALER_API, self.app,
                                               namespace=DEMO_NAMESPACE))

    def report(self) -> Observation:
        """The newest look the story goes on from (printed when it changed); while a size
        change waits for its status, the last one shown."""
        now = self.look()
        last = self.last
        if last is not None and now.key != last.key and now.replicas != last.replicas \
                and now.desired != now.replicas:
            if self._waiting_since is None:
                self._waiting_since = self.clock()
            if self.clock() - self._waiting_since < STATUS_PATIENCE_SECONDS:
                return last
        self._waiting_since = None
        if last is None or now.key != last.key:
            if last is not None:
                self.ups += now.replicas > last.replicas
                self.downs += now.replicas < last.replicas
            print(format_observation(seconds=self.clock() - self.started,
                                     load=self.workload.load_text, before=last, now=now),
                  flush=True)
            self.last = now
        return now


@dataclass(frozen=True)
class Act:
    """One Autoscaler's part of the story: its lines, and waits that, when they fail, show that
    Autoscaler's last status and the end of the controller's log."""

    reporter: Reporter
    log_file: Path
    alive: Callable[[], None]

    @property
    def name(self) -> str:
        return f"{DEMO_NAMESPACE}/{self.reporter.app}"

    async def until(self, check: Callable[[Observation], bool], *, within: float,
                    what: str) -> None:
        async def watching() -> bool:
            self.alive()
            return check(self.reporter.report())

        await _until(watching, within=within, what=what, detail=self.last_seen)

    def last_seen(self) -> str:
        autoscaler = self.reporter.kube.store.try_get(*AUTOSCALER_API, self.reporter.app,
                                                      namespace=DEMO_NAMESPACE)
        status = (autoscaler or {}).get("status") or {}
        conditions = "; ".join(f"{c.get('type')}={c.get('status')} {c.get('reason')}: "
                               f"{c.get('message')}" for c in status.get("conditions") or [])
        return (f"last status of Autoscaler {self.name}: {conditions or '(none)'}\n"
                f"the end of {self.log_file}:\n{_tail(self.log_file)}")


class Banner:
    """Numbered sections, each with a one-line explanation."""

    def __init__(self, total: int = SECTIONS) -> None:
        self.number = 0
        self.total = total

    def __call__(self, title: str, why: str) -> None:
        self.number += 1
        print(f"\n[{self.number}/{self.total}] {title}\n        {why}", flush=True)


def _node(name: str) -> dict[str, Any]:
    """A Node as kubelet registers it: what `kubectl top nodes` reads the capacity from."""
    capacity = {"cpu": "2", "memory": "4Gi", "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"capacity": capacity, "allocatable": capacity,
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def _write_pki(directory: Path) -> tuple[pki.CertifiedKey, Path, Path]:
    """A CA and the adapter's serving certificate for its Service name (and 127.0.0.1, so the
    demo can probe /readyz directly)."""
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC) - timedelta(minutes=5)
    ca = pki.generate_ca(common_name="metricscale-demo-ca", now=now, validity=timedelta(days=1))
    serving = pki.issue_serving_certificate(
        ca, common_name=ADAPTER_SERVICE,
        dns_names=(f"{ADAPTER_SERVICE}.{ADAPTER_NAMESPACE}.svc", "localhost"),
        ip_addresses=("127.0.0.1",), now=now, validity=timedelta(days=1))
    pki.write_certificate(directory / "ca.crt", ca.certificate)
    return (ca, pki.write_certificate(directory / "serving.crt", serving.certificate),
            pki.write_private_key(directory / "serving.key", serving.private_key))


# --- the demo ---------------------------------------------------------------------------------


async def _demo(*, workdir: Path, kubectl: str, timing: Timing, keep: bool = False) -> None:
    exporter_module, kube_module, prometheus_module, cadvisor_module = _import_doubles()
    if prometheus_module.find_prometheus() is None:
        raise DemoError("prometheus was not found: install Debian's package "
                        "(`make demo` does) or set PROMETHEUS=/path/to/prometheus")
    started = time.monotonic()
    banner = Banner()
    async with contextlib.AsyncExitStack() as stack:
        # Keys, certificates and kubectl's cache: removed at the end, whatever happens.
        scratch = Path(tempfile.mkdtemp(prefix="run-", dir=workdir))
        stack.callback(shutil.rmtree, scratch, ignore_errors=True)

        banner("Prometheus and the pods' traffic",
               "A real Prometheus scrapes per-pod request counters (http_requests_total) and "
               "cAdvisor's CPU and memory series from a built-in exporter every second.")
        try:
            prometheus = stack.enter_context(prometheus_module.PrometheusServer(
                scrape_interval=f"{SCRAPE_SECONDS}s"))
        except prometheus_module.PrometheusError as error:
            raise DemoError(f"Prometheus did not start: {error}") from None
        exporter = stack.enter_context(exporter_module.Exporter(job="demo"))
        prometheus.add_target(exporter)
        print(f"        Prometheus {prometheus.url} scrapes {exporter.url}")

        banner("A fake Kubernetes cluster",
               "The fake API server of the tests (HTTPS, tokens, RBAC hooks, an aggregator) "
               f"holds namespace {DEMO_NAMESPACE}, two nodes, Deployment {DEMO_APP} and its 3 "
               f"pods, and Deployment {CPU_APP} with 1 pod; the demo plays the Deployment "
               "controller.")
        kube = await stack.enter_async_context(kube_module.FakeKubeAPI(
            workdir=scratch / "kube", availability_max_backoff=0.5))
        kube.create_namespace(DEMO_NAMESPACE)
        kube.create_namespace(ADAPTER_NAMESPACE)
        cadvisor = cadvisor_module.CAdvisor(exporter)
        for node in NODES:
            kube.create("", "v1", "nodes", _node(node))
            cadvisor.add_node(node, system_cpu=0.15, system_memory=600 << 20)
        workload = Workload(kube=kube, exporter=exporter, cadvisor=cadvisor)
        workload.create()
        cpu_workload = CpuWorkload(kube=kube, exporter=exporter, cadvisor=cadvisor)
        cpu_workload.create()
        tasks = [asyncio.create_task(workload.run(), name="demo workload"),
                 asyncio.create_task(cpu_workload.run(), name="demo cpu workload")]

        async def stop_workload() -> None:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        stack.push_async_callback(stop_workload)

        def check_workload() -> None:
            for task in tasks:
                if task.done() and not task.cancelled():
                    error = task.exception()
                    raise DemoError(f"the demo's Deployment controller stopped: {error!r}")

        # The adapter starts now (its banner comes later), so that its start-up overlaps
        # Prometheus' first scrapes.
        window = timing.rate_window_seconds
        ca, serving_cert, serving_key = _write_pki(scratch / "pki")
        rules_file = workdir / "adapter-rules.yaml"
        rules_file.write_text(adapter_rules(window_seconds=window))
        adapter_token = "adapter-" + os.urandom(12).hex()
        kube.add_user(token=adapter_token, username=ADAPTER_USER,
                      groups=("system:serviceaccounts",
                              f"system:serviceaccounts:{ADAPTER_NAMESPACE}"))
        adapter_port = _free_port()
        adapter = await stack.enter_async_context(_program("adapter", [
            "--bind-address", "127.0.0.1", "--secure-port", str(adapter_port),
            "--tls-cert-file", str(serving_cert), "--tls-private-key-file", str(serving_key),
            "--kubeconfig", str(kube.write_kubeconfig(scratch / "adapter.kubeconfig",
                                                      token=adapter_token)),
            "--prometheus-url", prometheus.url, "--config", str(rules_file),
            "--metrics-relist-interval", f"{timing.relist_seconds}s",
        ], log_file=workdir / "adapter.log"))
        kubeconfig = kube.write_kubeconfig(workdir / "kubeconfig")
        admin = Kubectl(kubectl, kubeconfig, scratch / "kubectl-cache")
        print(f"        API server {kube.url}; kubeconfig {kubeconfig}")
        try:
            await prometheus.wait_for_scrape_async(exporter, timeout=60.0)
        except prometheus_module.PrometheusError as error:
            raise DemoError(f"Prometheus never scraped the exporter: {error}") from None

        banner(f"kubectl --kubeconfig {kubeconfig} get deployments,pods -n {DEMO_NAMESPACE}",
               "The Deployments and their pods, as kubectl shows them (the server renders "
               "the table).")
        print(await admin("get", "deployments,pods", "-n", DEMO_NAMESPACE), end="")

        banner("What Prometheus holds for those pods (requests per second)",
               f"rate() over {window} s of 1 s scrapes, once the window is full of samples.")
        promql = (f'sum by (pod) (rate({SERIES}{{namespace="{DEMO_NAMESPACE}"}}'
                  f'[{window}s]))')

        def settled(samples: list[Any]) -> bool:
            seen = {s.labels.get("pod"): s.value for s in samples}
            # Within 2%: a window not yet full of samples reads a few percent low.
            return all(pod in seen and abs(seen[pod] - rate) <= rate / 50
                       for pod, rate in INITIAL_RATES.items())
        try:
            samples = await prometheus.wait_for_async(promql, settled, timeout=window + 40.0)
        except prometheus_module.PrometheusError as error:
            raise DemoError(f"Prometheus' rates never matched the traffic: {error}") from None
        for sample in sorted(samples, key=lambda s: s.labels.get("pod", "")):
            rate = Decimal(sample.value).quantize(Decimal("0.01"), rounding=ROUND_HALF_UP)
            print(f"        {sample.labels.get('pod', '?'):<8} {rate} requests/s")

        banner("The metrics adapter behind the cluster's aggregator",
               "metricscale adapter serves custom.metrics.k8s.io and metrics.k8s.io from "
               "Prometheus; four APIServices route to it, verified through caBundle; auth is on "
               "as in a cluster.")
        probe = ssl.create_default_context(cafile=str(scratch / "pki" / "ca.crt"))
        await _wait_ready(adapter, url=f"https://127.0.0.1:{adapter_port}/readyz",
                          ssl_context=probe)
        print(f"        adapter on https://127.0.0.1:{adapter_port} "
              f"(log {adapter.log_file}, rules {rules_file})")
        for group, version, priority in APISERVICES:
            kube.create_apiservice(group=group, version=version,
                                   service_namespace=ADAPTER_NAMESPACE,
                                   service_name=ADAPTER_SERVICE, ca_bundle=ca.certificate_pem,
                                   version_priority=priority)
        kube.set_service_endpoint(ADAPTER_NAMESPACE, ADAPTER_SERVICE, "127.0.0.1", adapter_port)
        for group, version, _ in APISERVICES:
            name = f"{version}.{group}"
            try:
                await kube.wait_for_apiservice(name, within=GUARD_SECONDS)
            except AssertionError as error:
                adapter.check_running()
                raise DemoError(f"{error}\nthe end of {adapter.log_file}:\n"
                                f"{_tail(adapter.log_file)}") from None
            print(f"        APIService {name}: Available")

        async def discovered() -> bool:
            adapter.check_running()
            listing = json.loads(await admin("get", "--raw",
                                             "/apis/custom.metrics.k8s.io/v1beta2"))
            return f"pods/{METRIC}" in {r.get("name") for r in listing.get("resources", [])}

        await _until(discovered, within=3.0 * timing.relist_seconds + 10.0,
                     what=f"the adapter's discovery of {METRIC}",
                     detail=lambda: f"the end of {adapter.log_file}:\n{_tail(adapter.log_file)}")

        metrics_path = (f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{DEMO_NAMESPACE}/pods/*/"
                        f"{METRIC}?labelSelector=app%3D{DEMO_APP}")
        banner(f"kubectl --kubeconfig {kubeconfig} get --raw '{metrics_path}'",
               "The custom metrics API through the aggregator, as a user (or the HPA) reads it.")
        print(json.dumps(json.loads(await admin("get", "--raw", metrics_path)), indent=2))

        banner("The autoscaler",
               f"The Autoscaler CRD from {CRD_MANIFEST.relative_to(_CHECKOUT)} is applied, "
               f"metricscale autoscaler starts, and an Autoscaler targets "
               f"{figure(TARGET_PER_POD)} requests/s a pod.")
        print(await admin("apply", "-f", str(CRD_MANIFEST)), end="")
        autoscaler_token = "autoscaler-" + os.urandom(12).hex()
        kube.add_user(token=autoscaler_token, username=AUTOSCALER_USER,
                      groups=("system:serviceaccounts",
                              f"system:serviceaccounts:{ADAPTER_NAMESPACE}"))
        health_port = _free_port()
        period = timing.sync_period_seconds
        controller = await stack.enter_async_context(_program("autoscaler", [
            "--kubeconfig", str(kube.write_kubeconfig(scratch / "autoscaler.kubeconfig",
                                                      token=autoscaler_token)),
            # The Lease where explain --live looks for the controller's settings (outside a
            # cluster the controller's own default would be the namespace `default`).
            "--leader-elect=false", f"--leader-elect-resource-namespace={ADAPTER_NAMESPACE}",
            f"--horizontal-pod-autoscaler-sync-period={period}s",
            "--horizontal-pod-autoscaler-downscale-stabilization="
            f"{timing.scale_down_window_seconds}s",
            f"--metrics-bind-address=127.0.0.1:{health_port}",
        ], log_file=workdir / "autoscaler.log"))
        await _wait_ready(controller, url=f"http://127.0.0.1:{health_port}/readyz",
                          ssl_context=False)
        print(f"        autoscaler syncing every {period}s (log {controller.log_file})")
        manifest = workdir / "autoscaler.yaml"
        manifest.write_text(yaml.safe_dump(autoscaler_manifest(timing), sort_keys=False))
        print(f"        {manifest}:")
        for line in manifest.read_text().splitlines():
            print(f"          {line}")
        applied_at = datetime.now(UTC)
        print(await admin("apply", "-f", str(manifest)), end="")

        def alive() -> None:
            check_workload()
            adapter.check_running()
            controller.check_running()

        web = Act(reporter=Reporter(kube=kube, workload=workload, started=started),
                  log_file=controller.log_file, alive=alive)
        await web.until(lambda o: "ScalingActive=ValidMetricFound" in o.reasons,
                        within=GUARD_SECONDS,
                        what="the autoscaler's first decision from real metrics")
        start_load = sum(INITIAL_RATES.values(), Decimal(0))
        if web.reporter.report().replicas != len(INITIAL_RATES):
            raise DemoError(
                f"{figure(start_load)} requests/s over {len(INITIAL_RATES)} pods is "
                f"{figure(start_load / len(INITIAL_RATES))} a pod, inside the tolerance of the "
                f"target {figure(TARGET_PER_POD)}, yet the autoscaler changed the size\n"
                + web.last_seen())

        up_to, down_to, cpu_up_to = story_counts()
        banner(f"The load rises to {figure(HIGH_LOAD)} requests/s",
               f"{up_to} pods' worth at {figure(TARGET_PER_POD)} a pod "
               f"({figure(HIGH_LOAD / up_to)} each): the autoscaler adds pods as fast as its "
               "scale-up policy allows, as the rate window fills.")
        workload.set_load(HIGH_LOAD)
        await web.until(lambda o: o.replicas >= up_to, within=timing.scale_up_within,
                        what=f"a scale-up to {up_to} replicas")

        banner(f"The load falls to {figure(LOW_LOAD)} requests/s",
               f"{down_to} pods' worth ({figure(LOW_LOAD / down_to)} each): the size holds for "
               f"the {timing.scale_down_window_seconds} s scale-down stabilization window "
               "(ScaleDownStabilized), then shrinks.")
        workload.set_load(LOW_LOAD)
        await web.until(lambda o: o.replicas <= down_to, within=timing.scale_down_within,
                        what=f"a scale-down to {down_to} replicas")
        if not (web.reporter.ups and web.reporter.downs):
            raise DemoError("the demo saw no scale-up or no scale-down line\n"
                            + web.last_seen())
        # One more reconcile, so that the status shown next describes the final size.
        await web.until(lambda o: o.current == o.replicas, within=3 * period + 10.0,
                        what="a reconcile after the scale-down")
        first_act_ended = datetime.now(UTC)
        print(f"        scaled up {web.reporter.ups} times and down {web.reporter.downs} times")

        banner("What kubectl and `metricscale explain --live` say",
               "The Autoscaler with the CRD's own printer columns (the server renders them as "
               "a Table), then the autoscaler's reasoning for its last decision.")
        print(f"$ kubectl --kubeconfig {kubeconfig} get msa -n {DEMO_NAMESPACE}")
        print(await admin("get", "msa", "-n", DEMO_NAMESPACE), end="")
        print(f"\n$ metricscale explain --live {DEMO_NAMESPACE}/{DEMO_APP} "
              f"--kubeconfig {kubeconfig} -o text")
        print(await _explain(kubeconfig=kubeconfig), end="")
        reviews = [r for r in kube.subject_access_reviews
                   if (r.get("spec") or {}).get("user") == AUTOSCALER_USER]
        print(f"\n        The adapter asked the cluster {len(reviews)} SubjectAccessReview(s) "
              f"about {AUTOSCALER_USER}; kubectl's own requests arrived as system:masters "
              "through the front proxy and needed none.")
        alive()

        # --- The second act: CPU, as the HPA walkthrough tells it ---------------------------
        banner(f"kubectl --kubeconfig {kubeconfig} top pods -n {DEMO_NAMESPACE}",
               "Resource metrics (metrics.k8s.io) from cAdvisor's series in Prometheus, through "
               "the same adapter: no metrics-server. Then the nodes.")
        print(await _top(admin, "pods", "-n", DEMO_NAMESPACE, within=window + GUARD_SECONDS),
              end="")
        print(f"$ kubectl top nodes\n{await _top(admin, 'nodes', within=GUARD_SECONDS)}", end="")

        target_milli = CPU_REQUEST * CPU_TARGET_PERCENT * 10
        banner(f"CPU autoscaling: {CPU_APP} at {CPU_TARGET_PERCENT}% of its CPU request",
               f"`kubectl autoscale deployment {CPU_APP} --cpu-percent={CPU_TARGET_PERCENT} "
               f"--min=1 --max=10` as an Autoscaler; the load rises to "
               f"{figure(CPU_BUSY * 1000)}m ({cpu_up_to} pods' worth at {figure(target_milli)}m "
               f"a pod: {figure(CPU_BUSY * 1000 / cpu_up_to)}m each), then falls back.")
        # The replay act's imports (matplotlib takes seconds) load meanwhile, in a thread.
        preloaded = asyncio.create_task(asyncio.to_thread(preload_replay),
                                        name="demo replay imports")
        cpu_manifest = workdir / "autoscaler-cpu.yaml"
        cpu_manifest.write_text(yaml.safe_dump(cpu_autoscaler_manifest(timing),
                                               sort_keys=False))
        print(await admin("apply", "-f", str(cpu_manifest)), end="")
        cpu = Act(reporter=Reporter(kube=kube, workload=cpu_workload, started=started),
                  log_file=controller.log_file, alive=alive)
        await cpu.until(lambda o: "ScalingActive=ValidMetricFound" in o.reasons,
                        within=GUARD_SECONDS,
                        what=f"the first decision for {CPU_APP} from metrics.k8s.io")
        cpu_workload.set_load(CPU_BUSY)
        await cpu.until(lambda o: o.replicas >= cpu_up_to, within=timing.scale_up_within,
                        what=f"a scale-up of {CPU_APP} to {cpu_up_to} replicas")
        cpu_workload.set_load(CPU_IDLE)
        await cpu.until(lambda o: o.replicas <= MIN_REPLICAS, within=timing.scale_down_within,
                        what=f"a scale-down of {CPU_APP} to {MIN_REPLICAS}")
        print(f"        {CPU_APP} scaled up {cpu.reporter.ups} times and down "
              f"{cpu.reporter.downs} times on CPU utilization")
        alive()

        # --- The third act: the first one replayed from Prometheus' history --------------
        banner("metricscale replay: the first act again, from Prometheus' history",
               f"The Autoscaler {DEMO_NAMESPACE}/{DEMO_APP} replayed over the range it ran in, "
               "closed-loop, beside the replicas the live controller set "
               f"({REPLICAS_SERIES}, as kube-state-metrics exports it).")
        await preloaded
        await _replay(workdir=workdir, prometheus_url=prometheus.url, rules_file=rules_file,
                      manifest=manifest, start=applied_at, end=first_act_ended, timing=timing,
                      scrape_seconds=SCRAPE_SECONDS)
        if keep:
            await _keep(kubeconfig=kubeconfig, prometheus_url=prometheus.url,
                        adapter_url=f"https://127.0.0.1:{adapter_port}", alive=alive)


def keep_lines(*, kubeconfig: Path, prometheus_url: str, adapter_url: str) -> list[str]:
    """What --keep prints once the story is over: how to reach what still runs."""
    return [
        "",
        "The cluster stays up (--keep): the fake API server, Prometheus, metricscale adapter "
        "and metricscale autoscaler run,",
        f"and the demo keeps playing the Deployment controller for {DEMO_APP} and {CPU_APP}. "
        "In another shell:",
        "",
        f"export KUBECONFIG={shlex.quote(str(kubeconfig))}",
        f"kubectl get msa,deployments,pods -n {DEMO_NAMESPACE}",
        f"kubectl top pods -n {DEMO_NAMESPACE}",
        f"metricscale explain --live {DEMO_NAMESPACE}/{DEMO_APP}",
        f"metricscale autoscale deployment/{CPU_APP} --name {CPU_APP}-2 --max 10 "
        f"--cpu-percent 50 -n {DEMO_NAMESPACE} --dry-run=server  # creates nothing",
        f"kubectl scale deployment/{DEMO_APP} -n {DEMO_NAMESPACE} --replicas=6  "
        "# the autoscaler brings it back",
        "",
        f"Prometheus: {prometheus_url} (the query page and /api/v1/query)",
        f"metricscale adapter: {adapter_url} (behind the cluster's aggregator)",
        "",
        "Ctrl-C stops everything and removes the temporary files.",
    ]


async def _keep(*, kubeconfig: Path, prometheus_url: str, adapter_url: str,
                alive: Callable[[], None]) -> None:
    """Wait for Ctrl-C (SIGINT) with everything running; the caller's clean-up then runs as
    at the end of the story. A program that exits meanwhile ends the demo with its log."""
    for line in keep_lines(kubeconfig=kubeconfig, prometheus_url=prometheus_url,
                           adapter_url=adapter_url):
        print(f"        {line}" if line else "", flush=True)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    try:
        while not stop.is_set():
            alive()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await stop.wait()
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    print("\nmetricscale demo: Ctrl-C: stopping everything", flush=True)


def preload_replay() -> None:
    """Import what the replay act uses, ahead of it. Only a warm-up: whatever fails here fails
    again in the act, which reports it (a missing package) or stops the demo with it."""
    import importlib

    with contextlib.suppress(Exception):
        for module in ("prometheus_api_client", "cli.replay", "cli.replay_plot"):
            importlib.import_module(module)
    with contextlib.suppress(Exception):
        importlib.import_module("matplotlib").use("Agg")
        importlib.import_module("matplotlib.pyplot")


async def _replay(*, workdir: Path, prometheus_url: str, rules_file: Path, manifest: Path,
                  start: datetime, end: datetime, timing: Timing,
                  scrape_seconds: int) -> None:
    """The replay act in a thread (it is synchronous), so that the event loop goes on."""
    await asyncio.to_thread(replay_act, workdir=workdir, prometheus_url=prometheus_url,
                            rules_file=rules_file, manifest=manifest, start=start, end=end,
                            timing=timing, scrape_seconds=scrape_seconds)


def replay_act(*, workdir: Path, prometheus_url: str, rules_file: Path, manifest: Path,
               start: datetime, end: datetime, timing: Timing, scrape_seconds: int,
               pods: str = DEMO_PODS) -> None:
    """`metricscale replay` as a user would type it, run in-process on the demo's Prometheus;
    then the plot and the comparison with the live run. `pods` selects the Autoscaler's pods
    by name."""
    import importlib.util

    if importlib.util.find_spec("prometheus_api_client") is None:
        print("        metricscale replay needs prometheus-api-client "
              "(pip install 'metricscale[replay]'): the replay is skipped", flush=True)
        return
    import requests
    from prometheus_api_client.exceptions import PrometheusApiClientException

    from cli.replay import add_arguments, prometheus_client, render, replay_steps
    from cli.replay_plot import INSTALL_HINT, plot_replay
    from cli.replay_sim import MissingInitialReplicas, ReplayInputError

    def stamp(moment: datetime) -> str:
        return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    plot = workdir / REPLAY_PLOT
    plotting = importlib.util.find_spec("matplotlib") is not None
    # The range in whole seconds (range queries take whole seconds), one sync period longer
    # than the first act so that its last size is recorded; the autoscaler's sync period as
    # the step; the demo's pods are ready as soon as they exist.
    period = timing.sync_period_seconds
    command = ["metricscale", "replay", str(manifest), "--prometheus-url", prometheus_url,
               "--config", str(rules_file), "--from", stamp(start.replace(microsecond=0)),
               "--to", stamp(end.replace(microsecond=0) + timedelta(seconds=1 + period)),
               "--step", f"{period}s", "--pods", pods,
               "--pod-startup", "0s", *(["--plot", str(plot)] if plotting else [])]
    print(f"$ {shlex.join(command)}", flush=True)
    parser = argparse.ArgumentParser(prog="metricscale replay")
    add_arguments(parser)
    args = parser.parse_args(command[2:])
    began = time.monotonic()
    try:
        client = prometheus_client(args)
        try:
            result = replay_steps(args, client)
        except MissingInitialReplicas as error:
            # A scrape that failed at --from (a loaded machine) left the size there stale: the
            # demo knows it, the first act's start.
            args.initial_replicas = len(INITIAL_RATES)
            print(f"        ({error}: again with --initial-replicas {args.initial_replicas})",
                  flush=True)
            result = replay_steps(args, client)
    except (ReplayInputError, PrometheusApiClientException, requests.RequestException) as error:
        raise DemoError(f"metricscale replay failed: {error}") from None
    replayed = time.monotonic() - began
    print(render(result.steps, readable_summary(result.summary), "table", None,
                 result.observed, result.assumptions), end="")
    began = time.monotonic()
    if plotting:
        plot_replay(
            str(plot), autoscaler=result.autoscaler, steps=result.steps,
            observed=result.observed, requests=result.requests,
            title=f"metricscale demo: {DEMO_NAMESPACE}/{DEMO_APP} replayed beside the live "
                  "controller")
        print(f"\n        replayed {len(result.steps)} steps in {replayed:.1f} s, plotted in "
              f"{time.monotonic() - began:.1f} s: {plot}")
    else:
        print(f"\n        replayed {len(result.steps)} steps in {replayed:.1f} s; no plot: "
              f"{INSTALL_HINT}")
    observed = result.observed or [None] * len(result.steps)
    # The allowance: one sync period either way for the two clocks, and one more scrape
    # interval after for Prometheus to record the size the controller set.
    agreement = replay_agreement([s.decided_replicas for s in result.steps], observed,
                                 before=1, after=-(-(period + scrape_seconds) // period))
    print("        " + format_agreement(agreement, times=[stamp(s.time) for s in result.steps]),
          flush=True)


async def _top(admin: Kubectl, *arguments: str, within: float) -> str:
    """`kubectl top ...`, retried while the metrics of a just-started pod are not there yet."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await admin("top", *arguments)
        except DemoError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1.0)


async def _explain(*, kubeconfig: Path) -> str:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "metricscale", "explain", "--live",
        f"{DEMO_NAMESPACE}/{DEMO_APP}", "--kubeconfig", str(kubeconfig), "-o", "text",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(GUARD_SECONDS):
            out, err = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise DemoError(f"metricscale explain --live did not answer within {GUARD_SECONDS:.0f} s"
                        ) from None
    if process.returncode != 0:
        raise DemoError(f"metricscale explain --live failed ({process.returncode}): "
                        f"{err.decode().strip()}")
    return out.decode()
