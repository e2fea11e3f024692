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


async def _get(path: str, *, kubeconfig: str | None, context: str | None) -> dict[str, Any]:
    from metricscale.kube.errors import error_from_response
    from metricscale.kube.http import connect

    async with connect(kubeconfig=kubeconfig, context=context, user_agent=USER_AGENT) as http:
        response = await http.request("GET", path)
    if response.status != 200:
        raise error_from_response(response.status, headers=response.headers,
                                  body=response.body, verb="GET")
    document = json.loads(response.body)
    if not isinstance(document, dict):
        raise ReplayInputError(f"GET {path}: not an object")
    return document


def read_live_autoscaler(text: str, *, hpa: bool, kubeconfig: str | None,
                         context: str | None) -> dict[str, Any]:
    """The Autoscaler (or autoscaling/v2 HPA with `hpa`) NAMESPACE/NAME as the API serves it."""
    import aiohttp

    from autoscaler.controller.capture import object_path
    from metricscale.kube.errors import KubeError

    namespace, name = parse_live_name(text)
    path = object_path(namespace=urllib.parse.quote(namespace, safe=""),
                       name=urllib.parse.quote(name, safe=""), hpa=hpa)
    try:
        return asyncio.run(_get(path, kubeconfig=kubeconfig, context=context))
    except KubeError as err:
        raise ReplayInputError(f"--live {text}: {err}") from None
    except (aiohttp.ClientError, TimeoutError, OSError) as err:
        raise ReplayInputError(f"--live {text}: cannot reach the API server: {err}") from None
