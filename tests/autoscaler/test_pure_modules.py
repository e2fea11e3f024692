"""The decision core is pure: no clock reads (now is a parameter) and no I/O imports."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PURE_MODULES = ["model", "replicas", "behavior", "conditions", "decision", "settings",
                "snapshot", "explain", "persistence"]
AUTOSCALER = Path(__file__).resolve().parents[2] / "autoscaler"
CLOCK_READS = re.compile(r"datetime\.now|time\.time|time\.monotonic|utcnow|date\.today|"
                         r"time\.perf_counter")
IO_IMPORTS = re.compile(r"^\s*(import|from)\s+(asyncio|aiohttp|kubernetes_asyncio)\b",
                        re.MULTILINE)


@pytest.mark.parametrize("module", PURE_MODULES)
def test_pure_module_reads_no_clock(module: str) -> None:
    source = (AUTOSCALER / f"{module}.py").read_text(encoding="utf-8")
    assert CLOCK_READS.findall(source) == [], f"autoscaler/{module}.py reads the clock"


@pytest.mark.parametrize("module", PURE_MODULES)
def test_pure_module_imports_no_io_library(module: str) -> None:
    source = (AUTOSCALER / f"{module}.py").read_text(encoding="utf-8")
    assert IO_IMPORTS.findall(source) == []
