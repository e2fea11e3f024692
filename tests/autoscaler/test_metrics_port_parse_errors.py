"""The autoscaler's metrics port: requests aiohttp's parser rejects get a 400 `Status` that
repeats none of the request's bytes (the adapter's port is covered in
tests/adapter/test_hostile_names.py)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import pytest

from autoscaler.decision.settings import Settings
from autoscaler.server import Options, serve_autoscaler
from testbed.controlplane import ControlPlane
from tests.autoscaler.autoscaler_objects import election
from tests.autoscaler.real_cluster_support import install_crd
from tests.raw_http import raw_exchange, unparseable_requests


@pytest.fixture(scope="module")
def crd(control_plane: ControlPlane) -> None:
    install_crd(control_plane)


@pytest.fixture
async def metrics_port(control_plane: ControlPlane, namespace: str,
                       crd: None) -> AsyncIterator[int]:
    """The autoscaler's metrics port, the program on the real kube-apiserver (confined to the
    test's namespace): the parser in front of the port is under test, not the API server."""
    options = Options(settings=Settings(), leader_election=election(enabled=False),
                      concurrent_syncs=1, namespace=namespace, identity="replica-a",
                      lease_namespace=namespace, reporting_instance="replica-a",
                      metrics_bind_address="127.0.0.1:0")
    async with serve_autoscaler(control_plane.api_client_configuration(), options) as server:
        yield server.port


@pytest.mark.parametrize("request_bytes", unparseable_requests("/metrics"))
async def test_a_request_the_parser_rejects_gets_a_status_without_its_bytes(
        metrics_port: int, request_bytes: bytes) -> None:
    status, body = await raw_exchange(metrics_port, request_bytes)
    assert status == 400
    assert b"QQQQ" not in body
    status_json = json.loads(body)
    assert (status_json["kind"], status_json["code"], status_json["reason"]) == (
        "Status", 400, "BadRequest")


async def test_connect_gets_a_client_error_without_its_bytes(metrics_port: int) -> None:
    # aiohttp's C parser takes CONNECT as an upgrade: the router answers (404), not the parser.
    status, body = await raw_exchange(
        metrics_port, b"CONNECT QQQQQQQQ:443 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
    assert 400 <= status < 500
    assert b"QQQQ" not in body
