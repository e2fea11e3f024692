"""Where the peer programs are: a folder named by the environment, or `make peers`' output.

Users without Go point `METRICSCALE_PEERS` (or controller-runtime envtest's
`KUBEBUILDER_ASSETS`) at a folder holding `kube-apiserver`, `etcd` and the rest; `make peers`
builds them into `tests/peers/bin` of the checkout.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["CHECKOUT", "CONTROL_PLANE", "PEERS_BIN", "find_peer", "missing_peers", "where"]

CHECKOUT = Path(__file__).resolve().parents[1]
PEERS_BIN = CHECKOUT / "tests" / "peers" / "bin"
ENV_VARS = ("METRICSCALE_PEERS", "KUBEBUILDER_ASSETS")
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                 "kubectl")


def _folders() -> list[Path]:
    folders = [Path(value) for var in ENV_VARS if (value := os.environ.get(var, ""))]
    folders.append(PEERS_BIN)
    return folders


def find_peer(name: str) -> Path | None:
    """The executable `name` from the first folder that has it, else None."""
    for folder in _folders():
        path = folder / name
        if path.is_file() and os.access(path, os.X_OK):
            return path
    return None


def missing_peers(names: tuple[str, ...] = CONTROL_PLANE) -> list[str]:
    return [name for name in names if find_peer(name) is None]


def where() -> str:
    """Where the peers are looked for, for messages."""
    return ", ".join([f"${var}" for var in ENV_VARS] + [str(PEERS_BIN)]) + \
        " (build them with `make peers`, which needs Go)"
