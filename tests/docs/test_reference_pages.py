"""The generated pages of the site (flags, CRD fields, dashboards, alerts) are what
scripts/docs_reference.py makes of the code now: a flag, a field, a panel or an alert changed
without `make docs-reference` fails here."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from scripts.docs_reference import PAGES, render_page


@pytest.mark.parametrize("name", sorted(PAGES))
def test_generated_page_is_up_to_date(name: str) -> None:
    path: Path = PAGES[name]
    expected = render_page(name)
    committed = path.read_text(encoding="utf-8") if path.exists() else ""
    if committed != expected:
        diff = "".join(list(difflib.unified_diff(
            committed.splitlines(keepends=True), expected.splitlines(keepends=True),
            fromfile=f"{path.name} (committed)", tofile=f"{path.name} (from the code)"))[:60])
        pytest.fail(f"{path} is stale: run `make docs-reference`\n{diff}", pytrace=False)


def test_every_subcommand_and_every_flag_is_on_the_flags_page() -> None:
    import argparse
    import importlib

    from cli.main import SUBCOMMANDS, CommandParser

    page = PAGES["flags"].read_text(encoding="utf-8")
    for subcommand in SUBCOMMANDS:
        assert f"## metricscale {subcommand.name}\n" in page
        parser = CommandParser(prog=f"metricscale {subcommand.name}")
        importlib.import_module(subcommand.module).add_arguments(parser)
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            for option in action.option_strings:
                assert f"`{option}" in page, f"{subcommand.name}: {option} is not on the page"


def test_every_alert_and_panel_has_its_section() -> None:
    alerts = PAGES["alerts"].read_text(encoding="utf-8")
    dashboards = PAGES["dashboards"].read_text(encoding="utf-8")
    assert alerts.count("**What to do.**") >= 8
    assert dashboards.count("```promql") >= 20
