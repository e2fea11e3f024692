"""The one kubeconfig loader: connection settings from a kubeconfig or the service account.

kubernetes_asyncio is used for what it does well, reading kubeconfig files (contexts, exec and
gcp credential plugins, client certificates) and the in-cluster service account (whose
projected token it re-reads through the Configuration's refresh hook). Always into an explicit
`Configuration`, never the library's global default. exec/gcp credentials that expire are
refreshed by a guarded background task for as long as the connection is open.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import Configuration
from kubernetes_asyncio.config.config_exception import ConfigException

from metricscale.kube.errors import KubeConfigError
from metricscale.tasks import start_guarded_task

__all__ = ["Configuration", "open_configuration"]


def _check_file(kubeconfig: str, context: str | None) -> None:
    """Read the file first, so each way it can be unusable gets a message naming the file.

    kubernetes_asyncio reports a missing file as "Expected key current-context" and lets a
    decoding error or a RecursionError through.
    """
    try:
        raw = Path(kubeconfig).read_bytes()
    except OSError as error:
        reason = (error.strerror or str(error)).lower()
        raise KubeConfigError(f"cannot read kubeconfig {kubeconfig}: {reason}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise KubeConfigError(f"kubeconfig {kubeconfig}: not UTF-8 text (byte {error.start})") \
            from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise KubeConfigError(f"kubeconfig {kubeconfig}: not YAML: {error}") from None
    except RecursionError:
        raise KubeConfigError(f"kubeconfig {kubeconfig}: not YAML: nested too deeply") from None
    if not isinstance(document, dict):
        raise KubeConfigError(f"kubeconfig {kubeconfig}: not a kubeconfig (want a mapping "
                              "with contexts, clusters and users)")
    contexts = document.get("contexts") or []
    names = [str(entry.get("name")) for entry in contexts if isinstance(entry, dict)]
    wanted = context or document.get("current-context")
    if not wanted:
        raise KubeConfigError(f"kubeconfig {kubeconfig}: no current-context; pick one with "
                              f"--context (contexts: {', '.join(names) or 'none'})")
    if str(wanted) not in names:
        raise KubeConfigError(f'kubeconfig {kubeconfig}: context "{wanted}" not found '
                              f"(contexts: {', '.join(names) or 'none'})")


async def _load(kubeconfig: str | None, context: str | None,
                configuration: Configuration) -> Any:
    """Fill `configuration`; returns the kubeconfig loader (None in-cluster)."""
    try:
        if kubeconfig:
            _check_file(kubeconfig, context)
            return await kube_config.load_kube_config(
                config_file=kubeconfig, context=context, client_configuration=configuration,
                persist_config=False)
        kube_config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration)
    except (ConfigException, OSError, ValueError) as exc:
        where = f"kubeconfig {kubeconfig}" if kubeconfig else "the in-cluster service account"
        raise KubeConfigError(f"cannot use {where}: {exc}") from None
    return None


def _needs_refresh(loader: Any) -> bool:
    """Credentials that expire and that only the loader can renew: exec plugins and gcp."""
    return loader is not None and (getattr(loader, "provider", None) == "gcp"
                                   or "exec" in (getattr(loader, "_user", None) or {}))


@contextlib.asynccontextmanager
async def open_configuration(*, kubeconfig: str | None, context: str | None = None,
                             on_failure: Callable[[BaseException], None] | None = None,
                             ) -> AsyncIterator[Configuration]:
    """Connection settings from a kubeconfig file, else the in-cluster service account.

    Raises KubeConfigError when neither can be used. While the `async with` lasts, exec and
    gcp credentials are refreshed in the background (a failure of that task goes to
    `on_failure`); in-cluster tokens are re-read by the Configuration's own hook.
    """
    configuration = Configuration()
    loader = await _load(kubeconfig, context, configuration)
    refresher: asyncio.Task[Any] | None = None
    if _needs_refresh(loader):
        refresher = start_guarded_task(
            kube_config.refresh_token(loader, client_configuration=configuration),
            name="kubeconfig token refresh", on_failure=on_failure)
    try:
        yield configuration
    finally:
        if refresher is not None:
            refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresher
