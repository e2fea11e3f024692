"""The oracle's fixtures: one world and three pairs of servers for the whole module.

Everything is started once per module (the servers are shared by every test and Hypothesis
example) on the session's control plane and kubelet stand-in, with a Prometheus of the
module's own so that no other test's series show up in discovery.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from testbed.controlplane import ControlPlane, Kubelet
from testbed.fakes.exporter import Exporter
from testbed.fakes.prometheus import PrometheusServer, count_of
from testbed.processes import wait_until
from testbed.pytest_plugin import require_peers
from tests.differential.comparison import Context, Difference, Outcome, Request, ask, reconcile
from tests.differential.harness import (
    Credentials,
    Pair,
    grant_rbac,
    make_credentials,
    started_pairs,
)
from tests.differential.world import (
    CRD_GROUP,
    World,
    build_world,
    delete_world,
    export_series,
    pair_configs,
)

# What both adapters may list and watch beyond their manifests' own resources: what the rules
# of the three configurations map labels to (both manifests say to add these).
EXTRA_RBAC = (
    {"apiGroups": ["apps"], "resources": ["deployments", "statefulsets", "replicasets",
                                          "daemonsets"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [CRD_GROUP], "resources": ["widgets", "gadgets"],
     "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["storage.k8s.io"], "resources": ["storageclasses"],
     "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["persistentvolumes", "persistentvolumeclaims"],
     "verbs": ["get", "list", "watch"]},
)

# Per pair, resources both servers must list before the tests ask: one per rule family.
SENTINELS = {
    "config-gen": ("pods/oracle_queue_length", "pods/cpu_usage", "pods/memory_working_set_bytes",
                   "services/oracle_http_requests", "nodes/oracle_node_queue",
                   f"widgets.{CRD_GROUP}/oracle_widget_usage"),
    "defaults": ("pods/oracle_queue_length", "pods/cpu_usage", "pods/oracle_cpu",
                 "deployments.apps/oracle_deploy_replicas", "nodes/oracle_node_queue"),
    "docs": ("pods/http_requests_per_second", "pods/oracle_dup_12", "pods/rss_bytes",
             "nodes/oracle_node_temperature_celsius", f"widgets.{CRD_GROUP}/oracle_widget_power",
             "deployments.apps/oracle_rollout_progress"),
}
EXTERNAL_SENTINELS = {"docs": ("queue_consumer_lag", "OracleQueueDepth", "oracle_external_scalar",
                               "oracle_unmapped_lag")}


class Oracle:
    """The world, the Prometheus it is scraped into, and the pairs that answer about it.
    (Not a dataclass: Hypothesis prints the fixtures of a failing example, field by field.)"""

    def __init__(self, *, cluster: ControlPlane, kubelet: Kubelet, world: World,
                 exporter: Exporter, prometheus: PrometheusServer, credentials: Credentials,
                 workdir: Path, pairs: dict[str, Pair]) -> None:
        self.cluster = cluster
        self.kubelet = kubelet
        self.world = world
        self.exporter = exporter
        self.prometheus = prometheus
        self.credentials = credentials
        self.workdir = workdir
        self.pairs = pairs
        self._namespaces = 0

    def __repr__(self) -> str:  # Hypothesis prints it with every failing example
        return f"Oracle(namespace={self.world.namespace!r}, pairs={sorted(self.pairs)})"

    def new_namespace(self) -> str:
        """A namespace of its own for one generated example (deleted by the caller)."""
        self._namespaces += 1
        name = f"{self.world.namespace}-g{self._namespaces}"
        self.cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        return name

    def wait_for_pods(self, pair: str, namespace: str, metric: str, count: int) -> None:
        """Until both servers of `pair` answer `metric` for `count` pods of `namespace`: the
        series are scraped and both have seen the pods."""
        path = f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{namespace}/pods/*/{metric}"

        def both_see_them() -> bool:
            for server in self.pairs[pair].servers:
                document = server.get_json(path)
                if document is None or len(document.get("items", [])) != count:
                    return False
            return True

        wait_until(both_see_them, what=f"{count} pods of {namespace} with {metric}",
                   timeout=120, children=self.cluster.children, interval=0.1)

    def compare(self, request: Request, differences: Sequence[Difference]) -> Outcome:
        """Both answers to `request`, normalised and reconciled with `differences`."""
        pair = self.pairs[request.pair]
        upstream, ours = ask(pair, request)
        context = Context(request, lambda path: pair.upstream.exchange(path))
        return reconcile(context, upstream, ours, differences)


def _pods_running(cluster: ControlPlane, namespace: str, count: int) -> bool:
    pods = cluster.get(f"/api/v1/namespaces/{namespace}/pods").get("items", [])
    running = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
    return len(running) == count


@pytest.fixture(scope="module")
def oracle_peers() -> None:
    """Skips (fails under CI=true) before anything starts when a peer is missing."""
    require_peers("prometheus-adapter", "kube-apiserver", "etcd", "kube-controller-manager",
                  "kube-scheduler", "kubectl")


@pytest.fixture(scope="module")
def oracle(oracle_peers: None, control_plane: ControlPlane, kubelet: Kubelet,
           prometheus_binary: str) -> Iterator[Oracle]:
    workdir = Path(tempfile.mkdtemp(prefix="metricscale-oracle-"))
    exporter = Exporter(job="oracle")
    # Targets are written before Prometheus starts: found at once, not after file_sd's delay.
    prometheus = PrometheusServer(binary=prometheus_binary)
    prometheus.add_target(kubelet.address, job="kubelet")
    prometheus.add_target(exporter)
    world: World | None = None
    try:
        prometheus.start()
        world = build_world(control_plane)
        export_series(exporter, world)
        ours_kubeconfig, upstream_kubeconfig = grant_rbac(control_plane, extra_rules=EXTRA_RBAC)
        credentials = make_credentials(control_plane, workdir, ours_kubeconfig=ours_kubeconfig,
                                       upstream_kubeconfig=upstream_kubeconfig)
        with started_pairs(pair_configs(), prometheus=prometheus.url, workdir=workdir,
                           credentials=credentials) as pairs:
            _wait_for_the_world(control_plane, prometheus, world, pairs)
            yield Oracle(cluster=control_plane, kubelet=kubelet, world=world, exporter=exporter,
                         prometheus=prometheus, credentials=credentials, workdir=workdir,
                         pairs=pairs)
    finally:
        prometheus.close()
        exporter.close()
        if world is not None:
            delete_world(control_plane, world)


def _wait_for_the_world(cluster: ControlPlane, prometheus: PrometheusServer, world: World,
                        pairs: dict[str, Pair]) -> None:
    """Every pod running and its series scraped (a rate needs two samples), and every rule
    family discovered by both servers of every pair."""
    for namespace, pods in ((world.namespace, world.pods),
                            (world.other_namespace, world.other_pods)):
        wait_until(functools.partial(_pods_running, cluster, namespace, len(pods)),
                   what=f"the pods of {namespace} running", timeout=120,
                   children=cluster.children, interval=0.1)
        containers = 2 * len(pods)  # each pod's container and its pause container
        prometheus.wait_for(
            f'irate(container_cpu_usage_seconds_total{{namespace="{namespace}",'
            f'container!=""}}[4m])', count_of(containers), timeout=120)
    prometheus.wait_for(f'oracle_queue_length{{namespace="{world.namespace}"}}',
                        count_of(2 * len(world.pods)), timeout=60)
    for name, pair in pairs.items():
        pair.wait_discovered("/apis/custom.metrics.k8s.io/v1beta1", SENTINELS.get(name, ()))
        if name in EXTERNAL_SENTINELS:
            pair.wait_discovered("/apis/external.metrics.k8s.io/v1beta1",
                                 EXTERNAL_SENTINELS[name])
