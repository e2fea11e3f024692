"""The install checks the README and docs/ show (`<!-- example: cluster-check -->` blocks), run
as printed against metricscale installed from its manifests on a real control plane, their
output compared with the shown output (tests/docs/blocks.py: a word with a digit stands for any
such word, `...` for any lines)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from testbed.binaries import find_peer
from testbed.install import Installation
from testbed.processes import ChildFailed, wait_until
from tests.docs.blocks import Block, all_blocks, commands_and_outputs, output_matches

CHECKS = [pytest.param(block, id=block.where) for block in all_blocks()
          if block.kind == "cluster-check"]
PATIENCE_SECONDS = 120  # "within a minute", and fresh series for kubectl top


def test_the_readme_shows_install_checks() -> None:
    assert any(block.page.name == "README.md" for block in (p.values[0] for p in CHECKS))


@pytest.mark.parametrize("block", CHECKS)
def test_install_check_prints_what_the_page_shows(block: Block, installation: Installation,
                                                  tmp_path: Path) -> None:
    kubectl = find_peer("kubectl")
    assert kubectl is not None
    environment = dict(os.environ, KUBECONFIG=str(installation.cluster.kubeconfig),
                       PATH=f"{kubectl.parent}{os.pathsep}{os.environ['PATH']}")
    for command, shown in commands_and_outputs(block):
        last: list[str] = []

        def prints_what_is_shown(command: str = command, shown: list[str] = shown,
                                  last: list[str] = last) -> bool:
            result = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=environment,
                                    capture_output=True, text=True, timeout=60, check=False)
            last[:] = [f"(exit {result.returncode})",
                       *(result.stdout + result.stderr).rstrip("\n").split("\n")]
            return result.returncode == 0 and output_matches(shown, last[1:])

        try:
            wait_until(prints_what_is_shown, what=f"`{command}` prints what {block.where} shows",
                       timeout=PATIENCE_SECONDS, interval=2.0,
                       children=[c for c in (installation.adapter, installation.autoscaler)
                                 if c is not None])
        except ChildFailed as error:
            pytest.fail(f"{error}\nlast printed:\n" + "\n".join(last) + "\n\nwhere the page "
                        "shows\n" + "\n".join(shown), pytrace=False)
