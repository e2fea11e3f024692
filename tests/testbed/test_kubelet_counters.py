"""The kubelet stand-in's counters behave as a node's: the root cgroup's CPU never goes back,
even when a pod that used CPU leaves the node (metrics-server's and Prometheus' rates over a
window in which another test's pod left read low, or as a counter reset, otherwise)."""

from __future__ import annotations

import ssl

from testbed import kubelet
from testbed.kubelet import KubeletStandIn


def node_cpu_ns(stand_in: KubeletStandIn, node: str, at_ms: int) -> int:
    for labels, cpu_ns, _memory in stand_in._series(at_ms):
        if labels == {"id": "/", "node": node}:
            return cpu_ns
    raise AssertionError(f"no root cgroup for {node}")


def test_a_pod_leaving_keeps_its_cpu_in_the_node_counter() -> None:
    context = ssl.create_default_context()
    stand_in = KubeletStandIn(server="https://127.0.0.1:1", api_context=context,
                              nodes=["node-a"], serving_context=context)
    stand_in.node_root["node-a"] = kubelet._Usage(nanocores=100_000_000, since_ms=0)
    pod = kubelet._pod_from({"namespace": "ns", "name": "web", "uid": "u1", "annotations": {
        kubelet.USAGE_ANNOTATION: '{"app": {"cpu": "0.5"}}'}},
        {"containers": [{"name": "app"}]}, "node-a")
    at = kubelet._now_ms()
    for usage in pod.all_usages():
        usage.since_ms = at - 60_000  # a minute of CPU: 30 s of a core for its container
    stand_in.pods[("ns", "web")] = pod
    stand_in.by_node["node-a"][("ns", "web")] = pod
    with_pod = node_cpu_ns(stand_in, "node-a", at)
    stand_in._forget(("ns", "web"))  # the pod's CPU up to now stays in the root cgroup
    after = node_cpu_ns(stand_in, "node-a", kubelet._now_ms() + 1_000)
    assert after >= with_pod + 100_000_000 * 1  # the node's own second went on top
