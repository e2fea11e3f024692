"""Every example of README.md and docs/ works as printed: YAML is loaded by what reads it, and
commands shown with their output are run and their output compared (tests/docs/blocks.py says
how blocks are marked; tests/cluster/test_docs_commands.py runs the `cluster-check` blocks on a
real control plane)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from autoscaler.model.validation import validate_spec
from testbed.binaries import find_peer
from testbed.fakes.kube_cel import rule_errors
from testbed.fakes.tools import in_ci, require_tool
from tests.docs.blocks import (
    KINDS,
    MARKED_LANGUAGES,
    REPO,
    Block,
    all_blocks,
    command_lines,
    commands_and_outputs,
    output_matches,
    script_of,
)

BLOCKS = all_blocks()
KUBERNETES_VERSION = "1.32"
CRD = yaml.safe_load((REPO / "manifests" / "autoscaler" / "crd.yaml").read_text())
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
# What a scratch folder of a `run` block sees of the checkout, so that commands name repository
# files as a reader in a checkout names them.
CHECKOUT_ENTRIES = ("manifests", "tests", "charts", "docs", "adapter", "autoscaler", "cli",
                    "metricscale", "testbed", "monitoring", "certs")


def of_kind(*kinds: str) -> list[Any]:
    return [pytest.param(block, id=block.where) for block in BLOCKS if block.kind in kinds]


def documents(block: Block) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(block.text) if doc is not None]


# ------------------------------------------------------------------------------ the markers


def test_every_yaml_and_shell_block_is_marked_with_a_known_kind() -> None:
    unmarked = [block.where for block in BLOCKS
                if block.language in MARKED_LANGUAGES and block.kind is None]
    unknown = [f"{block.where}: {block.kind}" for block in BLOCKS
               if block.kind is not None and block.kind not in KINDS]
    assert not unmarked, f"mark these blocks (<!-- example: KIND -->): {unmarked}"
    assert not unknown, f"unknown example kinds: {unknown}"


def test_the_readme_is_a_first_visit_of_at_most_about_250_lines() -> None:
    assert len((REPO / "README.md").read_text().splitlines()) <= 260


# ---------------------------------------------------------------------------------- YAML


def _strict(node: Any) -> Any:
    """The CRD schema as JSON Schema refusing unknown fields (kubectl's field validation)."""
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _strict(value) for key, value in node.items()
           if not key.startswith("x-kubernetes-") and key != "default"}
    if node.get("x-kubernetes-int-or-string"):
        out["type"] = ["integer", "string"]
    if node.get("type") == "object" and node.get("properties") \
            and "additionalProperties" not in node:
        out["additionalProperties"] = False
    return out


_VALIDATOR = jsonschema.Draft7Validator(
    {**_strict(SCHEMA), "properties": {**_strict(SCHEMA)["properties"], "metadata": {}}})


@pytest.mark.parametrize("block", of_kind("autoscaler"))
def test_autoscaler_examples_are_accepted_by_the_crd_schema_and_its_cel_rules(
        block: Block) -> None:
    for obj in documents(block):
        assert (obj["apiVersion"], obj["kind"]) == ("metricscale.dev/v1alpha1", "Autoscaler")
        schema_errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
                         for e in _VALIDATOR.iter_errors(obj)]
        assert not schema_errors, f"{block.where}: {schema_errors}"
        cel = rule_errors(SCHEMA, obj, None)
        assert not cel, f"{block.where}: {cel}"
        validate_spec(obj["spec"], strict=True)  # what `metricscale explain` accepts


@pytest.mark.parametrize("block", of_kind("kubernetes"))
def test_kubernetes_examples_are_valid_objects(block: Block) -> None:
    for obj in documents(block):
        kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)


def _metricscale(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "metricscale", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120, check=False)


@pytest.mark.parametrize("block", of_kind("rules", "rules-invalid"))
def test_rule_file_examples_pass_check_config(block: Block, tmp_path: Path) -> None:
    path = tmp_path / block.options.get("file", "rules.yaml")
    path.write_text(block.text)
    result = _metricscale("adapter", "--check-config", str(path), cwd=tmp_path)
    expected = 1 if block.kind == "rules-invalid" else 0
    assert result.returncode == expected, f"{block.where}:\n{result.stdout}{result.stderr}"


@pytest.mark.parametrize("block", of_kind("snapshot"))
def test_snapshot_examples_are_explained(block: Block, tmp_path: Path) -> None:
    path = tmp_path / block.options.get("file", "snapshot.yaml")
    path.write_text(block.text)
    result = _metricscale("explain", "-o", "text", str(path), cwd=tmp_path)
    assert result.returncode == 0, f"{block.where}:\n{result.stdout}{result.stderr}"
    assert "Decision:" in result.stdout


@pytest.mark.parametrize("block", of_kind("kustomization"))
def test_kustomization_examples_build_over_the_manifests(block: Block, tmp_path: Path) -> None:
    kubectl = require_tool("kubectl")
    manifests = tmp_path / "manifests"
    shutil.copytree(REPO / "manifests", manifests)
    (manifests / "kustomization.yaml").write_text(block.text)
    result = subprocess.run([kubectl, "kustomize", str(manifests)], capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, f"{block.where}: {result.stderr}"
    assert any(doc and doc.get("kind") == "Deployment"
               for doc in yaml.safe_load_all(result.stdout))


@pytest.mark.peers  # helm
@pytest.mark.parametrize("block", of_kind("helm-values"))
def test_helm_values_examples_render_the_chart(block: Block, tmp_path: Path) -> None:
    helm = find_peer("helm")
    if helm is None:
        if in_ci():
            pytest.fail("helm was not found (make peers); CI=true forbids skipping")
        pytest.skip("helm was not found (make peers)")
    values = tmp_path / "values.yaml"
    values.write_text(block.text)
    result = subprocess.run([str(helm), "template", "metricscale", str(REPO / "charts" /
                             "metricscale"), "-n", "metricscale", "-f", str(values)],
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, f"{block.where}: {result.stderr}"


# ------------------------------------------------------------------------------ commands


@contextlib.contextmanager
def scratch(block: Block, folder: Path) -> Iterator[Path]:
    """A folder holding the page's `file=` examples and links to the checkout's folders."""
    for entry in CHECKOUT_ENTRIES:
        if (REPO / entry).exists():
            (folder / entry).symlink_to(REPO / entry)
    for other in BLOCKS:
        if other.page == block.page and "file" in other.options:
            (folder / other.options["file"]).write_text(other.text)
    yield folder


def _environment(folder: Path) -> dict[str, str]:
    environment = dict(os.environ)
    environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environment['PATH']}"
    # No cluster is reachable from a `run` example: a command that tried would say so.
    environment["KUBECONFIG"] = str(folder / "no-kubeconfig")
    environment["COLUMNS"] = "100"
    return environment


@pytest.mark.parametrize("block", of_kind("run"))
def test_commands_shown_with_their_output_print_that_output(block: Block,
                                                             tmp_path: Path) -> None:
    status = int(block.options.get("status", "0"))
    with scratch(block, tmp_path) as folder:
        for command, shown in commands_and_outputs(block):
            result = subprocess.run(["bash", "-c", command], cwd=folder, capture_output=True,
                                    text=True, timeout=180, env=_environment(folder),
                                    check=False)
            printed = (result.stdout + result.stderr).rstrip("\n").split("\n")
            assert result.returncode == status, \
                f"{block.where}: `{command}` exited {result.returncode}:\n" + "\n".join(printed)
            assert output_matches(shown, printed), (
                f"{block.where}: `{command}` printed\n" + "\n".join(printed)
                + "\n\nwhere the page shows\n" + "\n".join(shown))


def _subcommand_parser(name: str) -> argparse.ArgumentParser:
    from cli.main import SUBCOMMANDS, CommandParser

    (chosen,) = [s for s in SUBCOMMANDS if s.name == name]
    parser = CommandParser(prog=f"metricscale {name}")
    importlib.import_module(chosen.module).add_arguments(parser)
    return parser


def metricscale_invocations(script: str) -> list[list[str]]:
    """The argument lists of each `metricscale ...` command of a script (up to a pipe or `&&`)."""
    found = []
    for line in command_lines(script):
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words: list[str] = []
        for word in [*lexer, ";"]:
            if word and set(word) <= set("|&;<>()"):  # an operator or a redirection ends it
                if words[:1] == ["metricscale"] and len(words) > 1:
                    found.append(words[1:])
                words = ["(a redirection's file)"] if word in (">", ">>", "<") else []
                continue
            words.append(word)
    return found


@pytest.mark.parametrize("block", of_kind("cluster", "cluster-check", "run"))
def test_shell_examples_parse_and_their_metricscale_flags_exist(block: Block) -> None:
    script = script_of(block)
    syntax = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True,
                            check=False)
    assert syntax.returncode == 0, f"{block.where}: {syntax.stderr}"
    for arguments in metricscale_invocations(script):
        parser = _subcommand_parser(arguments[0])
        try:
            parser.parse_args(arguments[1:])
        except SystemExit as error:
            raise AssertionError(f"{block.where}: `metricscale {shlex.join(arguments)}` "
                                 "is refused by its parser") from error


def test_the_output_matcher_allows_figures_and_elisions_but_not_other_words() -> None:
    shown = ["NAME   AGE", "web    1m", "..."]
    assert output_matches(shown, ["NAME   AGE", "web  17s", "a", "b"])
    assert not output_matches(shown, ["NAME   AGE", "api  17s"])
    assert not output_matches(["reachable"], ["reachable", "extra"])
