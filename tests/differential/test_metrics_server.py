"""metricscale's metrics.k8s.io beside the real metrics-server v0.8.0 (issue 22).

Both serve the same pods and nodes on one control plane, from the same kubelet counters
(metrics-server from each Node's /metrics/resource, we from Prometheus scraping cAdvisor's
series): `kubectl top pods`, `kubectl top pods --containers`, `kubectl top nodes`, `kubectl get
--raw` of the PodMetrics/NodeMetrics objects (through the aggregator, pointed at one server,
then the other) and the same objects asked of both servers directly at one moment. Every
difference found must be a row of docs/differences-metrics-server.md, following that row's
rule (metrics_server_differences); a difference the document does not list fails the test.
Each test also says which rows it expects, so a row that no longer happens is noticed.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest

from metricscale.core.quantity import parse_quantity
from testbed.controlplane import ControlPlane, Kubelet
from testbed.kubelet import ANNOTATION_PREFIX
from testbed.processes import wait_until
from testbed.pytest_plugin import require_peers
from tests.differential.metrics_server_differences import (
    DOC,
    Difference,
    KubectlRun,
    compare_items,
    compare_lists,
    compare_top,
    listed_rows,
    unlisted,
)
from tests.differential.metrics_server_world import (
    RANGE,
    SETTLE_SECONDS,
    SideBySide,
    Usage,
    pod_manifest,
    side_by_side,
)

pytestmark = [pytest.mark.prometheus, pytest.mark.kubectl]

MI = 1024 * 1024
METRICS = "/apis/metrics.k8s.io/v1beta1"
# 0.0125 cores is 12.5 millicores: metrics-server keeps it, we truncate it (and kubectl rounds
# metrics-server's up); the rest are whole millicores. 100,000,000 bytes is not a whole Mi.
STEADY: dict[str, Usage] = {
    "web-0": {"app": ("0.25", 64 * MI)},
    "web-1": {"app": ("0.4", 96 * MI), "sidecar": ("0.0125", 100_000_000)},
}
NODES_OF = {"web-0": "node-a", "web-1": "node-b"}


@pytest.fixture(scope="module")
def side(control_plane: ControlPlane, kubelet: Kubelet, prometheus_binary: str,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[SideBySide]:
    require_peers("metrics-server")
    with side_by_side(control_plane, kubelet, prometheus_binary=prometheus_binary,
                      workdir=tmp_path_factory.mktemp("beside-metrics-server")) as world:
        yield world


def assert_listed(differences: Sequence[Difference]) -> None:
    for difference in differences:
        print(difference)
    missing = unlisted(differences, listed_rows(DOC.read_text()))
    assert not missing, (f"differences not listed in {DOC.name}:\n"
                         + "\n".join(str(d) for d in missing))


def rows(differences: Sequence[Difference]) -> set[str]:
    return {d.row for d in differences}


def raw(run: KubectlRun) -> tuple[Any, list[str]]:
    """`kubectl get --raw`'s object and the Warning headers kubectl printed."""
    assert run.code == 0, run.stderr
    warnings = [line.removeprefix("Warning: ") for line in run.stderr.splitlines()
                if line.startswith("Warning: ")]
    return json.loads(run.stdout), warnings


def create_steady(side: SideBySide, namespace: str) -> None:
    side.create(*(pod_manifest(namespace, name, node=NODES_OF[name], usage=usage)
                  for name, usage in STEADY.items()))
    side.wait_pods_served(namespace, STEADY)


def wait_phases(cluster: ControlPlane, namespace: str, phases: dict[str, str]) -> None:
    def reached() -> bool:
        listed = cluster.get(f"/api/v1/namespaces/{namespace}/pods")
        found = {p["metadata"]["name"]: (p.get("status") or {}).get("phase")
                 for p in listed["items"]}
        return all(found.get(name) == phase for name, phase in phases.items())

    wait_until(reached, what=f"pod phases {phases}", timeout=SETTLE_SECONDS)


# --------------------------------------------------------------------------------------------
# The same usage


def _compare_pod_usage(side: SideBySide, namespace: str
                       ) -> tuple[list[Difference], Any, Any]:
    """The steady pods through kubectl (metrics-server's, then ours) and straight to both."""
    expect = side.expect
    found: list[Difference] = []
    commands = [("get", "--raw", f"{METRICS}/namespaces/{namespace}/pods"),
                ("get", "--raw", f"{METRICS}/namespaces/{namespace}/pods/web-1"),
                ("top", "pods", "-n", namespace),
                ("top", "pods", "-n", namespace, "--containers"),
                ("top", "pods", "-n", namespace, "-l", "app=web-1"),
                ("top", "pod", "-n", namespace, "web-1", "--containers"),
                ("top", "pods", "-n", namespace, "--sort-by=cpu")]
    (list_ms, list_ours), (one_ms, one_ours), *tops = side.kubectl_many(*commands)
    ms_list, ms_warnings = raw(list_ms)
    our_list, our_warnings = raw(list_ours)
    found += compare_lists(ms_list, our_list, where="get --raw pods", expect=expect,
                           ms_warnings=ms_warnings, our_warnings=our_warnings)
    found += compare_items(raw(one_ms)[0], raw(one_ours)[0], where="get --raw pods/web-1",
                           expect=expect)
    for command, (ms, ours) in zip(commands[2:], tops, strict=True):
        assert ms.code == 0, ms.stderr
        found += compare_top(ms, ours, where="kubectl " + " ".join(command[:2] + command[4:]),
                             expect=expect)
    # The same moment, asked of both servers directly.
    ms_direct, our_direct = side.direct_both(f"{METRICS}/namespaces/{namespace}/pods")
    found += compare_lists(ms_direct.json(), our_direct.json(), where="direct pods",
                           expect=expect, ms_warnings=ms_direct.warnings,
                           our_warnings=our_direct.warnings)
    return found, ms_list, our_list


# Through the aggregator only, metrics-server's CPU figures were seen a millicore or two low
# (248m for 250m, 399m for 400m) about once in twenty runs on the busy CI machine, while the
# direct answers of the same moment agreed; its stored points, asked again by hand, gave the
# exact figures. The cause is not found. Such a pair is asked again, up to ATTEMPTS times in all:
# a real difference shows every time, and any other unexplained difference fails at once.
ATTEMPTS = 3


def _aggregated_cpu_only(unexplained: Sequence[Difference]) -> bool:
    return bool(unexplained) and all(
        d.row in ("unexplained: cpu figure", "unexplained: CPU(cores)")
        and not d.where.startswith("direct") for d in unexplained)


def test_the_same_pod_usage_shows_the_same_figures_or_a_listed_difference(
        side: SideBySide, namespace: str) -> None:
    create_steady(side, namespace)
    for attempt in range(1, ATTEMPTS + 1):
        found, ms_list, our_list = _compare_pod_usage(side, namespace)
        unexplained = unlisted(found, listed_rows(DOC.read_text()))
        if attempt < ATTEMPTS and _aggregated_cpu_only(unexplained):
            print(f"attempt {attempt}: asked again after", *unexplained, sep="\n  ")
            continue
        break
    assert_listed(found)
    # What this usage must show: windows and timestamps always differ. The CPU figures differ
    # only in what metrics-server's rate keeps below a millicore, and that depends on when its
    # two scrapes fell: 12.5m is 12500u against our 12m (kubectl 13m against 12m) when the two
    # kubelet samples are exactly the sidecar's rate apart, 12499u (kubectl 12m, the same) when
    # they are a hair further. So the CPU rows may or may not show, but never more than that.
    # web-1's two containers come in Go's map order from metrics-server: sometimes ours.
    assert {"window", "timestamp"} <= rows(found)
    assert rows(found) <= {"window", "timestamp", "cpu-precision", "cpu-rounding",
                           "container-order"}
    for difference in found:
        if difference.row == "cpu-rounding" and "sidecar" in difference.where:
            assert (difference.metrics_server, difference.ours) == ("13m", "12m"), difference
    for answer in (ms_list, our_list):
        web_1 = next(i for i in answer["items"] if i["metadata"]["name"] == "web-1")
        assert {c["name"]: c["usage"]["memory"] for c in web_1["containers"]} == \
            {"app": "96Mi", "sidecar": "100000000"}


def _compare_nodes(side: SideBySide, ghost: str
                   ) -> tuple[list[Difference], list[tuple[KubectlRun, KubectlRun]]]:
    """The nodes through kubectl, metrics-server's then ours."""
    found: list[Difference] = []
    commands = [("get", "--raw", f"{METRICS}/nodes"),
                ("get", "--raw", f"{METRICS}/nodes/node-a"),
                ("top", "nodes"), ("top", "node", "node-b"), ("top", "node", ghost),
                ("top", "node", "no-such-node")]
    (list_ms, list_ours), (one_ms, one_ours), *tops = side.kubectl_many(*commands)
    ms_list, ms_warnings = raw(list_ms)
    our_list, our_warnings = raw(list_ours)
    found += compare_lists(ms_list, our_list, where="get --raw nodes", expect=side.expect,
                           ms_warnings=ms_warnings, our_warnings=our_warnings)
    found += compare_items(raw(one_ms)[0], raw(one_ours)[0], where="get --raw node-a",
                           expect=side.expect)
    for command, (ms, ours) in zip(commands[2:], tops, strict=True):
        found += compare_top(ms, ours, where="kubectl " + " ".join(command),
                             expect=side.expect)
    return found, tops


def _ghost_report(side: SideBySide, ghost: str) -> str:
    """What our adapter says of the ghost now, and its log's lines about nodes: a required
    row missing means we did not know the ghost when kubectl asked."""
    reply = side.adapter.request(f"{METRICS}/nodes/{ghost}")
    child = side.adapter.child
    log = child.tail(400) if child is not None else ""
    lines = [line for line in log.splitlines() if "node" in line.lower()][-40:]
    return "\n".join([f"our {ghost} now: {reply.status} warnings={reply.warnings}", *lines])


def test_nodes_show_the_same_figures_and_a_node_without_a_kubelet_is_unknown_in_both(
        side: SideBySide, control_plane: ControlPlane) -> None:
    ghost = f"ghost-{int(time.time())}"
    # A Node no kubelet answers for (its port is closed), that nothing is scheduled to.
    control_plane.request("POST", "/api/v1/nodes", {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": ghost, "labels": {"kubernetes.io/hostname": ghost}},
        "spec": {"unschedulable": True,
                 "taints": [{"key": "testbed/ghost", "effect": "NoSchedule"}]},
        "status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
                   "daemonEndpoints": {"kubeletEndpoint": {"Port": 1}},
                   "capacity": {"cpu": "2", "memory": "4Gi", "pods": "10"},
                   "allocatable": {"cpu": "2", "memory": "4Gi", "pods": "10"}}})
    try:
        side.wait_nodes_agree()
        # Our node cache learns of the ghost from its watch, which a busy machine delays:
        # until then we know nothing to warn about (once we know it, its NodeMetrics is a 404
        # with a Warning saying why, and the list counts it in its Warning).
        wait_until(lambda: bool(side.adapter.request(f"{METRICS}/nodes/{ghost}").warnings)
                   and bool(side.adapter.request(f"{METRICS}/nodes").warnings),
                   what=f"our node cache holding {ghost}", timeout=SETTLE_SECONDS,
                   interval=0.2)
        for attempt in range(1, ATTEMPTS + 1):
            found, tops = _compare_nodes(side, ghost)
            unexplained = unlisted(found, listed_rows(DOC.read_text()))
            if attempt < ATTEMPTS and _aggregated_cpu_only(unexplained):
                # The stand-in's nodes are shared with the other tests of the worker, whose
                # pods come and go: metrics-server's 15-30 s window and our 10 s one then
                # average different stretches. Once they agree again, asked again.
                print(f"attempt {attempt}: asked again after", *unexplained, sep="\n  ")
                side.wait_nodes_agree()
                continue
            if attempt < ATTEMPTS and not unexplained and "warning-header" not in rows(found):
                # Once in a busy CI run our answers through kubectl carried no Warning about
                # the ghost although our cache had held it a moment before; what we say of
                # it then is printed, and it is asked again once we warn about it directly.
                print(f"attempt {attempt}: no Warning about {ghost} through kubectl:",
                      _ghost_report(side, ghost), sep="\n")
                wait_until(lambda: bool(side.adapter.request(f"{METRICS}/nodes").warnings),
                           what=f"our node list warning about {ghost}",
                           timeout=SETTLE_SECONDS, interval=0.2)
                continue
            break
        assert_listed(found)
        for top in tops[0]:
            assert any(line.split()[:2] == [ghost, "<unknown>"]
                       for line in top.stdout.splitlines()), top.stdout
        # Neither serves the ghost: the same NotFound; we say why in a Warning.
        ghost_ms, ghost_ours = tops[2]
        assert ghost_ms.code == ghost_ours.code == 1
        assert f'nodemetrics.metrics.k8s.io "{ghost}" not found' in ghost_ms.stderr
        nothing_ms, nothing_ours = tops[3]
        assert nothing_ms.code == nothing_ours.code == 1
        assert nothing_ms.stderr == nothing_ours.stderr
        # Timestamps differ unless both answers fall in the same second.
        assert {"window", "warning-header"} <= rows(found), _ghost_report(side, ghost)
    finally:
        control_plane.delete({"apiVersion": "v1", "kind": "Node", "metadata": {"name": ghost}})


# --------------------------------------------------------------------------------------------
# Pods left out


def test_a_container_with_no_cpu_or_memory_used_is_left_out_by_metrics_server_only(
        side: SideBySide, namespace: str) -> None:
    usage: dict[str, Usage] = {"web-0": {"app": ("0.25", 64 * MI)},
                               "idle-0": {"app": ("0", 16 * MI)},
                               "hollow-0": {"app": ("0.05", 0)}}
    side.create(*(pod_manifest(namespace, name, node="node-a", usage=u)
                  for name, u in usage.items()))
    side.wait_pods_served(namespace, {"web-0": usage["web-0"]})
    # We serve all three once the rate has its range; metrics-server drops a pod while any
    # of its containers reports 0 CPU seconds or a working set of 0 bytes.
    wait_until(lambda: {i["metadata"]["name"] for i in side.adapter.request(
        f"{METRICS}/namespaces/{namespace}/pods").json()["items"]} == set(usage),
        what="us serving the three pods", timeout=SETTLE_SECONDS)
    expect = replace(side.expect, only_ours={"idle-0": "zero-usage", "hollow-0": "zero-usage"})
    commands = [("get", "--raw", f"{METRICS}/namespaces/{namespace}/pods"),
                ("top", "pods", "-n", namespace), ("top", "pod", "-n", namespace, "idle-0")]
    (list_ms, list_ours), (top_ms, top_ours), (idle_ms, idle_ours) = \
        side.kubectl_many(*commands)
    found = compare_lists(*_lists(list_ms, list_ours), where="get --raw pods", expect=expect)
    found += compare_top(top_ms, top_ours, where="kubectl top pods", expect=expect)
    assert idle_ms.code == 1
    assert f'podmetrics.metrics.k8s.io "{namespace}/idle-0" not found' in idle_ms.stderr
    assert idle_ours.code == 0 and "idle-0" in idle_ours.stdout
    found.append(Difference("zero-usage", "kubectl top pod idle-0", idle_ms.stderr.strip(),
                            idle_ours.stdout.strip()))
    assert_listed(found)
    assert [d.where for d in found if d.row == "zero-usage"]
    assert not rows(found) & {"warning-header"}  # nothing is left out on our side
    ours = {i["metadata"]["name"]: i["containers"][0]["usage"]
            for i in raw(list_ours)[0]["items"]}
    assert ours["idle-0"]["cpu"] == "0" and ours["hollow-0"]["memory"] == "0"


def _lists(ms: KubectlRun, ours: KubectlRun) -> tuple[Any, Any]:
    return raw(ms)[0], raw(ours)[0]


def test_pods_not_running_or_without_samples_are_left_out_by_both(
        side: SideBySide, namespace: str) -> None:
    prefix = ANNOTATION_PREFIX
    side.create(
        pod_manifest(namespace, "web-0", node="node-a", usage=STEADY["web-0"]),
        pod_manifest(namespace, "nostats-0", node="node-a", usage={"app": ("0.1", MI)},
                     annotations={prefix + "stats": "none"}),
        pod_manifest(namespace, "pending-0", node="node-b",
                     annotations={prefix + "phase": "Pending"}),
        pod_manifest(namespace, "done-0", node="node-b",
                     annotations={prefix + "phase": "Succeeded"}),
        pod_manifest(namespace, "failed-0", node="node-b",
                     annotations={prefix + "phase": "Failed"}))
    wait_phases(side.cluster, namespace, {"nostats-0": "Running", "pending-0": "Pending",
                                          "done-0": "Succeeded", "failed-0": "Failed"})
    side.wait_pods_served(namespace, {"web-0": STEADY["web-0"]})
    commands = [("get", "--raw", f"{METRICS}/namespaces/{namespace}/pods"),
                ("top", "pods", "-n", namespace),
                ("top", "pod", "-n", namespace, "nostats-0"),
                ("top", "pod", "-n", namespace, "pending-0"),
                ("top", "pod", "-n", namespace, "done-0"),
                ("top", "pod", "-n", namespace, "no-such-pod")]
    results = side.kubectl_many(*commands)
    ms_list, ms_warnings = raw(results[0][0])
    our_list, our_warnings = raw(results[0][1])
    found = compare_lists(ms_list, our_list, where="get --raw pods", expect=side.expect,
                          ms_warnings=ms_warnings, our_warnings=our_warnings)
    for command, (ms, ours) in zip(commands[1:], results[1:], strict=True):
        found += compare_top(ms, ours, where="kubectl " + " ".join(command),
                             expect=side.expect)
    assert_listed(found)
    assert [i["metadata"]["name"] for i in our_list["items"]] == ["web-0"]
    # Only the running pod without samples is counted in our Warning; the others are not
    # running, which is why both leave them out.
    assert our_warnings == ["1 of 2 running pods have no metrics: 1 without a CPU sample "
                            "(resourceRules.cpu.containerQuery); 1 without a memory sample "
                            "(resourceRules.memory.containerQuery)"]
    nostats_ms = results[2][0]
    assert nostats_ms.code == 1
    assert f'podmetrics.metrics.k8s.io "{namespace}/nostats-0" not found' in nostats_ms.stderr
    for (ms, ours), pod in zip(results[3:], ("pending-0", "done-0", "no-such-pod"),
                               strict=True):
        assert ms.code == ours.code == 1
        assert ms.stderr == ours.stderr
        assert f'pods "{pod}" not found' in ms.stderr


def test_a_terminating_pod_is_served_by_both_until_it_is_gone(
        side: SideBySide, namespace: str) -> None:
    usage = {"web-0": STEADY["web-0"], "linger-0": {"app": ("0.2", 32 * MI)},
             "quick-0": {"app": ("0.3", 48 * MI)}}
    side.create(
        pod_manifest(namespace, "web-0", node="node-a", usage=usage["web-0"]),
        pod_manifest(namespace, "linger-0", node="node-a", usage=usage["linger-0"],
                     grace_seconds=600,
                     annotations={ANNOTATION_PREFIX + "ignores-sigterm": "true"}),
        pod_manifest(namespace, "quick-0", node="node-b", usage=usage["quick-0"]))
    side.wait_pods_served(namespace, usage)
    for pod in ("linger-0", "quick-0"):
        side.cluster.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{pod}")

    def terminating() -> bool:
        names = {p["metadata"]["name"]: p for p in side.cluster.get(
            f"/api/v1/namespaces/{namespace}/pods")["items"]}
        linger = names.get("linger-0") or {}
        return "quick-0" not in names and bool(linger.get("metadata", {}).get(
            "deletionTimestamp")) and linger["status"]["phase"] == "Running"

    wait_until(terminating, what="quick-0 gone and linger-0 terminating",
               timeout=SETTLE_SECONDS)
    # Both still serve the terminating pod (phase Running) and neither the deleted one.
    side.wait_pods_served(namespace, {"web-0": usage["web-0"], "linger-0": usage["linger-0"]})
    commands = [("get", "--raw", f"{METRICS}/namespaces/{namespace}/pods"),
                ("top", "pods", "-n", namespace)]
    (list_ms, list_ours), (top_ms, top_ours) = side.kubectl_many(*commands)
    found = compare_lists(*_lists(list_ms, list_ours), where="get --raw pods",
                          expect=side.expect)
    found += compare_top(top_ms, top_ours, where="kubectl top pods", expect=side.expect)
    assert_listed(found)
    for answer in _lists(list_ms, list_ours):
        assert [i["metadata"]["name"] for i in answer["items"]] == ["linger-0", "web-0"]
    side.cluster.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/linger-0",
                         {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})


def test_a_new_pod_is_served_by_us_first_reading_low_until_its_series_spans_the_range(
        side: SideBySide, namespace: str) -> None:
    usage: Usage = {"app": ("0.5", 64 * MI)}
    want = Decimal("0.5")
    side.create(pod_manifest(namespace, "new-0", node="node-a", usage=usage))
    path = f"{METRICS}/namespaces/{namespace}/pods/new-0"
    seen: list[tuple[float, Decimal | None, Decimal | None]] = []
    began = time.monotonic()

    def cpu(reply_status: int, body: Any) -> Decimal | None:
        if reply_status != 200:
            return None
        return parse_quantity(body["containers"][0]["usage"]["cpu"])

    def metrics_server_steady() -> bool:
        ms, ours = side.direct_both(path)
        ms_cpu = cpu(ms.status, ms.json())
        our_cpu = cpu(ours.status, ours.json())
        seen.append((time.monotonic() - began, ms_cpu, our_cpu))
        return ms_cpu is not None and abs(ms_cpu - want) <= Decimal("0.000001") and \
            our_cpu is not None and want - Decimal("0.001001") <= our_cpu <= want

    wait_until(metrics_server_steady, what="both serving new-0 at 0.5 cores",
               timeout=SETTLE_SECONDS, interval=0.25)
    found: list[Difference] = []
    for at, ms_cpu, our_cpu in seen:
        if ms_cpu is None and our_cpu is not None:
            found.append(Difference("young-pod", f"new-0 after {at:.1f} s", "not served",
                                    str(our_cpu)))
        elif ms_cpu is not None and our_cpu is None:
            found.append(Difference("unexplained: served by metrics-server only",
                                    f"new-0 after {at:.1f} s", str(ms_cpu), "not served"))
        elif ms_cpu is not None and our_cpu is not None and \
                not want - Decimal("0.001001") <= our_cpu <= want:
            row = "young-pod" if our_cpu < want else "unexplained: cpu figure"
            found.append(Difference(row, f"new-0 after {at:.1f} s", str(ms_cpu),
                                    str(our_cpu)))
    assert_listed(found)
    ours_first = next(i for i, (_, _, our_cpu) in enumerate(seen) if our_cpu is not None)
    ms_first = next(i for i, (_, ms_cpu, _) in enumerate(seen) if ms_cpu is not None)
    # Prometheus has two samples a second or two after the start; metrics-server needs two
    # scrapes (or one, 10-15 s after the start): we serve first, reading low for a while.
    assert ours_first < ms_first
    first_value = seen[ours_first][2]
    assert first_value is not None and first_value < want
    print("new-0 (age s, metrics-server, ours):",
          ", ".join(f"({a:.1f}, {m}, {o})" for a, m, o in seen[ours_first:ms_first + 1]))


# --------------------------------------------------------------------------------------------
# Selectors and other views


def test_field_selectors_beyond_the_name_and_namespace_work_only_here(
        side: SideBySide, namespace: str) -> None:
    create_steady(side, namespace)
    commands = [("top", "pods", "-n", namespace, "--field-selector", "spec.nodeName=node-a"),
                ("top", "pods", "-n", namespace, "--field-selector", "metadata.name=web-1"),
                ("top", "pods", "-n", namespace, "-l", "app in (web-0)")]
    (node_ms, node_ours), *same = side.kubectl_many(*commands)
    assert node_ms.code == 1
    assert ('"spec.nodeName" is not a known field selector: only "metadata.name", '
            '"metadata.namespace"') in node_ms.stderr
    assert node_ours.code == 0
    assert [line.split()[0] for line in node_ours.stdout.splitlines()[1:]] == ["web-0"]
    found = [Difference("field-selector", "kubectl top pods --field-selector spec.nodeName",
                        node_ms.stderr.strip(), node_ours.stdout.strip())]
    for command, (ms, ours) in zip(commands[1:], same, strict=True):
        assert ms.code == 0, ms.stderr
        found += compare_top(ms, ours, where="kubectl " + " ".join(command),
                             expect=side.expect)
    assert_listed(found)


# kubectl get's Accept for a server-side Table.
TABLE_ACCEPT = ("application/json;as=Table;v=v1;g=meta.k8s.io,"
                "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json")


def compare_table_cells(ms: Sequence[str], ours: Sequence[str], *, where: str,
                        containers: int) -> list[Difference]:
    """One row of `kubectl get podmetrics|nodemetrics` (NAME CPU MEMORY WINDOW) from each."""
    if (ms[0], ms[2]) != (ours[0], ours[2]):
        return [Difference("unexplained: table name or memory", where, " ".join(ms),
                           " ".join(ours))]
    found = []
    if ms[1] != ours[1]:
        # Ours: each container's whole millicores cut down, summed (cpu-precision); within a
        # millicore each, plus float noise (the raw objects' rule, per container).
        apart = abs(parse_quantity(ms[1]) - parse_quantity(ours[1]))
        row = ("cpu-precision" if apart < Decimal(containers) / 1000 + Decimal("0.000001")
               else "unexplained: table cpu")
        found.append(Difference(row, f"{where} CPU", ms[1], ours[1]))
    if ms[3] != ours[3]:
        row = "window" if ours[3] == RANGE else "unexplained: table window"
        found.append(Difference(row, f"{where} WINDOW", ms[3], ours[3]))
    return found


def test_kubectl_get_podmetrics_prints_the_same_table(side: SideBySide, namespace: str) -> None:
    create_steady(side, namespace)
    side.wait_nodes_agree()  # the nodes' new pods' CPU in both servers' rates
    (pods_ms, pods_ours), (nodes_ms, nodes_ours) = side.kubectl_many(
        ("get", "podmetrics", "-n", namespace), ("get", "nodemetrics", "node-a"))
    found: list[Difference] = []
    for (ms, ours), what in (((pods_ms, pods_ours), "podmetrics"),
                             ((nodes_ms, nodes_ours), "nodemetrics")):
        assert ms.code == ours.code == 0, (ms.stderr, ours.stderr)
        ms_lines = [line.split() for line in ms.stdout.splitlines()]
        our_lines = [line.split() for line in ours.stdout.splitlines()]
        assert ms_lines[0] == our_lines[0] == ["NAME", "CPU", "MEMORY", "WINDOW"], ours.stdout
        assert [row[0] for row in ms_lines[1:]] == [row[0] for row in our_lines[1:]]
        for ms_row, our_row in zip(ms_lines[1:], our_lines[1:], strict=True):
            found += compare_table_cells(
                ms_row, our_row, where=f"kubectl get {what} {ms_row[0]}",
                containers=side.containers.get(ms_row[0], 1) if what == "podmetrics" else 1)
    assert_listed(found)
    assert rows(found) <= {"cpu-precision", "window"}


def test_the_table_answers_have_the_same_shape(side: SideBySide, namespace: str) -> None:
    create_steady(side, namespace)
    path = f"{METRICS}/namespaces/{namespace}/pods"
    ms, ours = (server.request(path, accept=TABLE_ACCEPT)
                for server in (side.metrics_server, side.adapter))
    assert (ms.status, ms.content_type) == (ours.status, ours.content_type) == (
        200, "application/json")
    ms_table, our_table = ms.json(), ours.json()
    assert [key for key in ms_table] == [key for key in our_table]
    assert (ms_table["kind"], ms_table["apiVersion"], ms_table["metadata"]) == (
        our_table["kind"], our_table["apiVersion"], our_table["metadata"])
    assert ms_table["columnDefinitions"] == our_table["columnDefinitions"]
    for ms_row, our_row in zip(ms_table["rows"], our_table["rows"], strict=True):
        ms_object, our_object = ms_row["object"], our_row["object"]
        assert (ms_object["kind"], ms_object["apiVersion"]) == (
            our_object["kind"], our_object["apiVersion"]) == (
            "PartialObjectMetadata", "meta.k8s.io/v1")
        assert {k: v for k, v in ms_object["metadata"].items() if k != "creationTimestamp"} == \
            {k: v for k, v in our_object["metadata"].items() if k != "creationTimestamp"}


def test_the_document_lists_each_row_once_with_a_reason() -> None:
    text = DOC.read_text()
    listed = listed_rows(text)
    assert {"window", "timestamp", "cpu-precision", "cpu-rounding", "container-order",
            "zero-usage", "young-pod", "warning-header", "field-selector"} <= listed
    # The rows of the two tables of differences (`Differences` and `Fixed`).
    lines = [line for line in text.splitlines() if re.match(r"^\| `[a-z0-9-]+` \|", line)]
    names = [line.split("`")[1] for line in lines]
    assert len(names) == len(set(names)), "a row is listed twice"
    for line in lines:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == 5 and all(cells), f"a row needs all five cells: {line}"
