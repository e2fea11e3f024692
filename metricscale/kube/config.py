"""The one kubeconfig loader: connection settings from a kubeconfig or the service account.

kubernetes_asyncio is used for what it does well, reading kubeconfig files (contexts, exec and
gcp credential plugins, client certificates) and the in-cluster service account (whose
projected token it re-reads through the Configuration's refresh hook). Always into an explicit
`Configuration`, never the library's global default. exec/gcp credentials that expire are
refreshed by a guarded background task for as long as the connection is open.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client import Configuration
from kubernetes_asyncio.config.config_exception import ConfigException

from metricscale.files import FileError, decode_text, parse_yaml, read_bytes
from metricscale.kube.errors import KubeConfigError
from metricscale.tasks import start_guarded_task

__all__ = ["NO_KUBECONFIG", "Configuration", "add_kubeconfig_arguments", "kubeconfig_files",
           "merge_kubeconfigs", "open_configuration", "read_kubeconfig", "resolve_kubeconfig"]


def add_kubeconfig_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, *,
                             purpose: str = "") -> None:
    """`--kubeconfig` and `--context`, the same for every command that talks to a cluster."""
    suffix = f" {purpose}" if purpose else ""
    parser.add_argument("--kubeconfig", default=None, metavar="PATH",
                        help=f"kubeconfig file{suffix} (default: $KUBECONFIG, a "
                             f"{os.pathsep}-separated list merged as kubectl does, else "
                             "~/.kube/config, else the in-cluster service account)")
    parser.add_argument("--context", default=None,
                        help=f"kubeconfig context to use{suffix} (default: current-context)")


# What the rule found when it found no kubeconfig: every place it looked, in its order.
NO_KUBECONFIG = ("no kubeconfig: --kubeconfig not given, $KUBECONFIG not set and no "
                 "~/.kube/config")


def resolve_kubeconfig(flag: str | None, *, environ: Mapping[str, str] | None = None,
                       home: Path | None = None) -> str | None:
    """kubectl's order: --kubeconfig, then $KUBECONFIG (kept as its os.pathsep-separated
    list), then ~/.kube/config if it exists; None means the in-cluster service account."""
    if flag:
        return flag
    environ = os.environ if environ is None else environ
    listed = environ.get("KUBECONFIG", "")
    if any(listed.split(os.pathsep)):
        return listed
    default = (Path.home() if home is None else home) / ".kube" / "config"
    return str(default) if default.is_file() else None


def kubeconfig_files(kubeconfig: str) -> list[str]:
    """The files of a resolved kubeconfig (a $KUBECONFIG-style list), empty entries dropped,
    duplicates after the first dropped (as client-go)."""
    files: list[str] = []
    for entry in kubeconfig.split(os.pathsep):
        if entry and entry not in files:
            files.append(entry)
    return files


_NAMED = ("clusters", "contexts", "users")


def merge_kubeconfigs(documents: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Merge kubeconfigs as kubectl does: the first file to set a key wins, clusters,
    contexts and users are merged by name, current-context comes from the first that sets it."""
    merged: dict[str, Any] = {}
    for _, document in documents:
        for key, value in document.items():
            if key in _NAMED:
                present = {entry.get("name") for entry in merged.setdefault(key, [])}
                for entry in value or []:
                    if isinstance(entry, dict) and entry.get("name") not in present:
                        merged[key].append(entry)
                        present.add(entry.get("name"))
            elif key not in merged or merged[key] in (None, "", {}, []):
                merged[key] = value
    return merged



def _read_file(kubeconfig: str) -> dict[str, Any]:
    """Read the file first, so each way it can be unusable gets a message naming the file.

    kubernetes_asyncio reports a missing file as "Expected key current-context" and lets a
    decoding error or a RecursionError through; and it would read /dev/zero without end.
    """
    try:
        document = parse_yaml(decode_text(read_bytes(kubeconfig), kubeconfig), kubeconfig)
    except FileError as error:
        if error.reading:
            raise KubeConfigError(f"cannot read kubeconfig {kubeconfig}: "
                                  f"{error.problem}") from None
        raise KubeConfigError(f"kubeconfig {kubeconfig}: {error.problem}") from None
    if not isinstance(document, dict):
        raise KubeConfigError(f"kubeconfig {kubeconfig}: not a kubeconfig (want a mapping "
                              "with contexts, clusters and users)")
    return document


def read_kubeconfig(kubeconfig: str) -> dict[str, Any]:
    """The kubeconfig document a resolved kubeconfig stands for (a list merged as kubectl does);
    KubeConfigError names the file and the fault."""
    files = kubeconfig_files(kubeconfig)
    if len(files) == 1:
        return _read_file(files[0])
    # kubectl skips files of the list that do not exist; other faults are errors.
    present = [path for path in files if Path(path).exists()]
    if not present:
        raise KubeConfigError(f"kubeconfig {kubeconfig}: none of these files exists")
    return merge_kubeconfigs([(path, _read_file(path)) for path in present])


def _check_context(document: dict[str, Any], kubeconfig: str, context: str | None) -> None:
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
            files = kubeconfig_files(kubeconfig)
            if len(files) == 1:
                _check_context(_read_file(files[0]), files[0], context)
                return await kube_config.load_kube_config(
                    config_file=files[0], context=context, client_configuration=configuration,
                    persist_config=False)
            merged = read_kubeconfig(kubeconfig)
            _check_context(merged, kubeconfig, context)
            return await kube_config.load_kube_config_from_dict(
                merged, context=context, client_configuration=configuration)
        kube_config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration)
    except KubeConfigError:
        raise  # ours already names the file and the fault (it is a ValueError too)
    except (ConfigException, OSError, ValueError) as exc:
        if kubeconfig:
            raise KubeConfigError(f"cannot use kubeconfig {kubeconfig}: {exc}") from None
        # The caller resolved the rule (`resolve_kubeconfig`): every place was looked at.
        raise KubeConfigError(f"{NO_KUBECONFIG}; cannot use the in-cluster service account "
                              f"either: {exc}") from None
    return None


def _needs_refresh(loader: Any) -> bool:
    """Credentials that expire and that only the loader can renew: exec plugins and gcp."""
    return loader is not None and (getattr(loader, "provider", None) == "gcp"
                                   or "exec" in (getattr(loader, "_user", None) or {}))


@contextlib.asynccontextmanager
async def open_configuration(*, kubeconfig: str | None, context: str | None = None,
                             on_failure: Callable[[BaseException], None] | None = None,
                             ) -> AsyncIterator[Configuration]:
    """Connection settings from a kubeconfig (a file, or a $KUBECONFIG-style list of files,
    merged; see `resolve_kubeconfig`), else the in-cluster service account.

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
