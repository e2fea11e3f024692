"""`metricscale replay --live NAMESPACE/NAME`: the Autoscaler (or HPA) read from the cluster.

The only Kubernetes I/O of replay: one GET, over metricscale.kube.http, in its own event loop.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from typing import Any

from cli.replay_sim import ReplayInputError

USER_AGENT = "metricscale-replay"


def parse_live_name(text: str) -> tuple[str, str]:
    namespace, sep, name = text.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ReplayInputError(f"--live {text!r}: use NAMESPACE/NAME")
    return namespace, name


async def _get(path: str, *, kubeconfig: str | None, context: str | None,
               lease_path: str | None = None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The object at `path`, and the Lease at `lease_path` if it can be read (else None)."""
    from metricscale.kube.errors import error_from_response
    from metricscale.kube.http import connect

    lease: dict[str, Any] | None = None
    async with connect(kubeconfig=kubeconfig, context=context, user_agent=USER_AGENT) as http:
        response = await http.request("GET", path)
        if lease_path is not None and response.status == 200:
            answer = await http.request("GET", lease_path)
            if answer.status == 200:  # not found or not allowed: nothing published
                found = json.loads(answer.body)
                lease = found if isinstance(found, dict) else None
    if response.status != 200:
        raise error_from_response(response.status, headers=response.headers,
                                  body=response.body, verb="GET")
    document = json.loads(response.body)
    if not isinstance(document, dict):
        raise ReplayInputError(f"GET {path}: not an object")
    return document, lease


def read_live_autoscaler(text: str, *, hpa: bool, kubeconfig: str | None,
                         context: str | None, lease: tuple[str, str] | None = None
                         ) -> tuple[dict[str, Any], str | None]:
    """The Autoscaler (or autoscaling/v2 HPA with `hpa`) NAMESPACE/NAME as the API serves it,
    and the decision settings the controller published on its Lease `lease` (namespace, name)
    as the annotation's text (None when there are none)."""
    import aiohttp

    from autoscaler.controller.capture import object_path
    from autoscaler.decision.settings import SETTINGS_ANNOTATION
    from metricscale.kube.config import resolve_kubeconfig
    from metricscale.kube.errors import KubeError

    namespace, name = parse_live_name(text)
    # The one rule, as every command: --kubeconfig, $KUBECONFIG, ~/.kube/config, in-cluster.
    kubeconfig = resolve_kubeconfig(kubeconfig)
    path = object_path(namespace=urllib.parse.quote(namespace, safe=""),
                       name=urllib.parse.quote(name, safe=""), hpa=hpa)
    lease_path = None if lease is None else (
        f"/apis/coordination.k8s.io/v1/namespaces/{urllib.parse.quote(lease[0], safe='')}"
        f"/leases/{urllib.parse.quote(lease[1], safe='')}")
    try:
        document, found = asyncio.run(_get(path, kubeconfig=kubeconfig, context=context,
                                           lease_path=lease_path))
        annotations = (found or {}).get("metadata", {}).get("annotations") or {}
        published = annotations.get(SETTINGS_ANNOTATION)
        return document, published if isinstance(published, str) else None
    except KubeError as err:
        raise ReplayInputError(f"--live {text}: {err}") from None
    except (aiohttp.ClientError, TimeoutError, OSError) as err:
        raise ReplayInputError(f"--live {text}: cannot reach the API server: {err}") from None
