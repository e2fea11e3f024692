"""`metricscale demo --help` and the demo's page (docs/getting-started/demo.md, where the README
sends a reader) state the windows the code uses (FAST, NORMAL); the help offers the fake cluster,
and the demo says what it needs: a checkout, and for the real control plane the binaries
`make peers` builds."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cli import demo
from cli.demo import FAST, NORMAL

CHECKOUT = Path(__file__).resolve().parents[2]
DEMO_PAGE = CHECKOUT / "docs" / "getting-started" / "demo.md"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _demo_page() -> str:
    return _one_line(DEMO_PAGE.read_text(encoding="utf-8"))


def test_help_states_the_fast_and_normal_windows() -> None:
    result = subprocess.run([sys.executable, "-m", "metricscale", "demo", "--help"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    expected = (f"sync {FAST.sync_period_seconds}s, rate window {FAST.rate_window_seconds}s, "
                f"scale-down window {FAST.scale_down_window_seconds}s; without it "
                f"{NORMAL.sync_period_seconds}s, {NORMAL.rate_window_seconds}s and "
                f"{NORMAL.scale_down_window_seconds}s")
    assert expected in _one_line(result.stdout)


def test_the_demo_page_states_the_same_windows_as_the_code() -> None:
    page = _demo_page()
    assert (f"a {NORMAL.sync_period_seconds} s sync period, a {NORMAL.rate_window_seconds} s "
            f"rate window and a {NORMAL.scale_down_window_seconds} s scale-down window") in page
    assert (f"`metricscale demo --fast`: about 45 s, with {FAST.sync_period_seconds} s, "
            f"{FAST.rate_window_seconds} s and {FAST.scale_down_window_seconds} s") in page


def test_the_demo_page_names_no_other_window_for_the_demo() -> None:
    # any "N s ... window" figure on the page is one of the code's
    known = {t.rate_window_seconds for t in (FAST, NORMAL)} | {
        t.scale_down_window_seconds for t in (FAST, NORMAL)}
    for seconds in re.findall(r"(\d+) s (?:rate|scale-down) window", _demo_page()):
        assert int(seconds) in known, seconds


def test_help_offers_the_fake_cluster_and_says_how_long_the_real_one_takes() -> None:
    result = subprocess.run([sys.executable, "-m", "metricscale", "demo", "--help"],
                            capture_output=True, text=True, timeout=60, check=False)
    help_text = _one_line(result.stdout)
    assert "--fake" in help_text and "make peers" in help_text
    assert (f"on the real control plane the whole story about {demo.REAL_FAST_SECONDS} s "
            f"instead of {demo.REAL_NORMAL_SECONDS} s") in help_text


def test_outside_a_checkout_the_demo_names_where_it_is_installed(tmp_path: Path) -> None:
    with pytest.raises(demo.DemoError) as refused:
        demo.require_checkout(tmp_path)
    message = str(refused.value)
    assert f"{tmp_path} (where this metricscale is installed) is not one" in message
    assert "testbed/fakes" in message and "testbed/" in message
    assert "run `make demo` in it" in message


def test_the_checkout_is_where_the_fakes_and_the_test_bed_are() -> None:
    checkout = demo.require_checkout()
    assert (checkout / "testbed" / "fakes" / "kube_api.py").is_file()
    assert (checkout / "testbed" / "controlplane.py").is_file()


def test_without_the_binaries_the_demo_says_how_to_get_them_and_what_it_takes() -> None:
    note = _one_line(demo.peers_note(missing=["etcd", "kube-apiserver"],
                                     looked_in=["$METRICSCALE_PEERS", "/x/tests/peers/bin"]))
    assert "(etcd, kube-apiserver missing; looked in $METRICSCALE_PEERS, /x/tests/peers/bin)" \
        in note
    assert "runs on the embedded fake cluster" in note
    assert f"`make peers` builds them (it needs Go; the first build takes {demo.PEERS_BUILD})" \
        in note
    assert "about 6 minutes" in demo.PEERS_BUILD and "METRICSCALE_PEERS" in note
    assert "`make demo` never builds them itself" in note


def test_run_from_a_copy_without_the_checkout_says_so_and_exits_1(tmp_path: Path) -> None:
    """As from an installed package: the command's packages without tests/ and testbed/."""
    checkout = CHECKOUT
    for package in ("cli", "metricscale", "adapter", "autoscaler"):
        shutil.copytree(checkout / package, tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    result = subprocess.run([sys.executable, "-m", "metricscale", "demo", "--fake"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"{tmp_path} (where this metricscale is installed) is not one" in result.stderr
    assert "Clone the repository and run `make demo` in it." in result.stderr
