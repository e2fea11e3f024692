"""Aggregated API servers run beside a `ControlPlane` as local processes.

What each needs from the cluster and what a test needs from each: a serving certificate of the
cluster's CA for the name the aggregator checks (`<service>.<namespace>.svc`), a service
account's token in a kubeconfig, the APIService pointed at it (and, at the end, given back to
whoever had it), requests sent straight to it as kube-apiserver's front proxy sends them (the
front-proxy client certificate, `X-Remote-User`, `X-Remote-Group`), and the process's CPU time
and resident memory from /proc.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from metricscale import pki
from testbed.binaries import CHECKOUT
from testbed.controlplane import ControlPlane, KubeError
from testbed.processes import Child, free_port, wait_until

__all__ = ["AggregatedServer", "ProcessUsage", "Reply", "apiservice_given_back",
           "process_usage"]

DAY = 24 * 3600
CALLER = "metricscale-differential"
CALLER_GROUPS = ("system:masters",)


@dataclass(frozen=True)
class Reply:
    """One answer of a server asked directly."""

    status: int
    content_type: str
    body: bytes
    warnings: tuple[str, ...]

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class ProcessUsage:
    """CPU time (user + system) and resident memory of a process, from /proc."""

    cpu_seconds: float
    rss_bytes: int


def process_usage(pid: int) -> ProcessUsage:
    stat = Path(f"/proc/{pid}/stat").read_text()
    # The command name (field 2) may hold spaces: the fields after it follow its ')'.
    fields = stat[stat.rindex(")") + 2:].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime (fields 14 and 15)
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
    return ProcessUsage(cpu_seconds=cpu, rss_bytes=rss)


class AggregatedServer:
    """The parts every server here shares; subclasses start the process (`start`)."""

    def __init__(self, cluster: ControlPlane, *, name: str, namespace: str, service: str,
                 workdir: Path) -> None:
        self.cluster = cluster
        self.name = name
        self.namespace = namespace
        self.service = service
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.child: Child | None = None
        now = datetime.now(UTC) - timedelta(minutes=5)
        pair = pki.issue_serving_certificate(
            cluster.ca, common_name=service,
            dns_names=[f"{service}.{namespace}.svc", "localhost"],
            ip_addresses=["127.0.0.1"], now=now, validity=timedelta(days=30))
        self.cert = pki.write_certificate(workdir / f"{name}-serving.crt", pair.certificate)
        self.key = pki.write_private_key(workdir / f"{name}-serving.key", pair.private_key)
        self._context = ssl.create_default_context(cafile=str(cluster.ca_file))
        self._context.load_cert_chain(str(cluster.front_proxy_client.cert),
                                      str(cluster.front_proxy_client.key))

    # ---- identity -----------------------------------------------------------------------

    def kubeconfig_of(self, account: str) -> Path:
        """A kubeconfig with a day-long token of `account` in this server's namespace."""
        token = self.cluster.service_account_token(self.namespace, account, seconds=DAY)
        return self.cluster.write_kubeconfig(f"{self.namespace}-{account}", token,
                                             path=self.workdir / f"{account}.kubeconfig")

    def ensure_namespace(self) -> None:
        self.cluster.apply({"apiVersion": "v1", "kind": "Namespace",
                            "metadata": {"name": self.namespace}})

    # ---- the process --------------------------------------------------------------------

    def start(self) -> None:
        """Starts the process and waits until it serves."""
        raise NotImplementedError

    def _run(self, argv: Sequence[str], *, env: dict[str, str] | None = None) -> Child:
        self.child = Child(self.name, argv, log=self.workdir / f"{self.name}.log", env=env,
                           cwd=CHECKOUT)
        return self.child

    @property
    def pid(self) -> int:
        assert self.child is not None, f"{self.name} is not running"
        return self.child.process.pid

    def usage(self) -> ProcessUsage:
        return process_usage(self.pid)

    def wait_answering(self, path: str, *, timeout: float = 120) -> None:
        """Until `path` answers 200 (asked as the front proxy)."""
        def answers() -> bool:
            try:
                return self.request(path).status == 200
            except OSError:
                return False

        wait_until(answers, what=f"{self.name} answering {path}", timeout=timeout,
                   children=[self.child] if self.child else [], interval=0.2)

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()

    # ---- requests straight to the server -----------------------------------------------

    def request(self, path: str, *, accept: str = "application/json", user: str = CALLER,
                groups: Sequence[str] = CALLER_GROUPS, timeout: float = 120) -> Reply:
        request = urllib.request.Request(f"https://127.0.0.1:{self.port}{path}")
        request.add_header("Accept", accept)
        request.add_header("X-Remote-User", user)
        for group in groups:
            request.add_header("X-Remote-Group", group)
        try:
            with urllib.request.urlopen(request, context=self._context,
                                        timeout=timeout) as answer:
                return Reply(answer.status, answer.headers.get("Content-Type", ""),
                             answer.read(), tuple(answer.headers.get_all("Warning") or ()))
        except urllib.error.HTTPError as error:
            return Reply(error.code, error.headers.get("Content-Type", ""), error.read(),
                         tuple(error.headers.get_all("Warning") or ()))

    # ---- the aggregator -----------------------------------------------------------------

    def point(self, group: str = "metrics.k8s.io", version: str = "v1beta1") -> None:
        """Points the APIService of group/version at this server (see
        ControlPlane.register_apiservice: an ExternalName Service for localhost)."""
        self.cluster.register_apiservice(group, version, port=self.port,
                                         ca_pem=self.cert.read_bytes(),
                                         namespace=self.namespace, service=self.service)


def _apiservice_path(name: str) -> str:
    return f"/apis/apiregistration.k8s.io/v1/apiservices/{name}"


@contextlib.contextmanager
def apiservice_given_back(cluster: ControlPlane, name: str) -> Iterator[None]:
    """Whatever is done to APIService `name` inside, it is given back afterwards as it was:
    its spec restored, or deleted if it did not exist (other tests of the session may own it)."""
    try:
        saved: dict[str, Any] | None = cluster.get(_apiservice_path(name))
    except KubeError as error:
        if error.status != 404:
            raise
        saved = None
    try:
        yield
    finally:
        if saved is None:
            cluster.delete({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
                            "metadata": {"name": name}})
        else:
            try:
                current = cluster.get(_apiservice_path(name))
            except KubeError:
                metadata = saved.get("metadata") or {}
                cluster.request("POST", "/apis/apiregistration.k8s.io/v1/apiservices", {
                    "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
                    "metadata": {key: metadata[key] for key in ("name", "labels", "annotations")
                                 if key in metadata},
                    "spec": saved["spec"]})
            else:
                current["spec"] = copy.deepcopy(saved["spec"])
                current.pop("status", None)
                cluster.request("PUT", _apiservice_path(name), current)
