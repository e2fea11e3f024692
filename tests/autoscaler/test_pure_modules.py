"""The pure packages are pure: no clock reads (now is a parameter) and no I/O imports.

import-linter forbids the I/O libraries for these packages too; this also catches clock reads,
which an import contract cannot see. Every module of a pure package is covered, so a new one
needs no edit here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE_PACKAGES = ["autoscaler/model", "autoscaler/decision", "adapter/rules", "adapter/api",
                 "adapter/auth", "metricscale/core"]
PURE_MODULES = sorted([str(path.relative_to(ROOT)) for package in PURE_PACKAGES
                       for path in (ROOT / package).glob("*.py")]
                      + ["autoscaler/explain.py"])
CLOCK_READS = re.compile(r"datetime\.now|time\.time|time\.monotonic|utcnow|date\.today|"
                         r"time\.perf_counter")
IO_IMPORTS = re.compile(r"^\s*(import|from)\s+(asyncio|aiohttp|kubernetes_asyncio)\b",
                        re.MULTILINE)


def test_every_pure_package_has_modules() -> None:
    for package in PURE_PACKAGES:
        assert any(module.startswith(package + "/") for module in PURE_MODULES), package


@pytest.mark.parametrize("module", PURE_MODULES)
def test_pure_module_reads_no_clock(module: str) -> None:
    source = (ROOT / module).read_text(encoding="utf-8")
    assert CLOCK_READS.findall(source) == [], f"{module} reads the clock"


@pytest.mark.parametrize("module", PURE_MODULES)
def test_pure_module_imports_no_io_library(module: str) -> None:
    source = (ROOT / module).read_text(encoding="utf-8")
    assert IO_IMPORTS.findall(source) == []
