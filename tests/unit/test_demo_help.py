"""`metricscale demo --help` and the README state the windows the code uses (FAST, NORMAL)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from cli.demo import FAST, NORMAL

README = Path(__file__).resolve().parents[2] / "README.md"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _demo_section() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("## What `make demo` does")
    end = text.index("\n## ", start + 1)
    return _one_line(text[start:end])


def test_help_states_the_fast_and_normal_windows() -> None:
    result = subprocess.run([sys.executable, "-m", "metricscale", "demo", "--help"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    expected = (f"sync {FAST.sync_period_seconds}s, rate window {FAST.rate_window_seconds}s, "
                f"scale-down window {FAST.scale_down_window_seconds}s; without it "
                f"{NORMAL.sync_period_seconds}s, {NORMAL.rate_window_seconds}s and "
                f"{NORMAL.scale_down_window_seconds}s")
    assert expected in _one_line(result.stdout)


def test_readme_states_the_same_windows_as_the_code() -> None:
    section = _demo_section()
    assert (f"a {NORMAL.sync_period_seconds} s sync period, a {NORMAL.rate_window_seconds} s "
            f"rate window and a {NORMAL.scale_down_window_seconds} s scale-down window") in section
    assert (f"`metricscale demo --fast`: about 45 s, with {FAST.sync_period_seconds} s, "
            f"{FAST.rate_window_seconds} s and {FAST.scale_down_window_seconds} s") in section
    # the act that starts the autoscaler (normal speed) repeats its period and window
    assert f"sync period {NORMAL.sync_period_seconds} s" in section
    assert f"{NORMAL.scale_down_window_seconds} s downscale stabilization" in section
    assert f"waits {NORMAL.scale_down_window_seconds} s before scaling down" in section


def test_readme_names_no_other_window_for_the_demo() -> None:
    # any "N s ... window" figure in the section is one of the code's
    known = {t.rate_window_seconds for t in (FAST, NORMAL)} | {
        t.scale_down_window_seconds for t in (FAST, NORMAL)}
    for seconds in re.findall(r"(\d+) s (?:rate|scale-down) window", _demo_section()):
        assert int(seconds) in known, seconds
