"""Every test here is marked `cluster` (some start control planes of their own); metricscale
installed from its manifests (`installation`) is testbed.pytest_plugin's, for the tests of
any directory."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(HERE):
            item.add_marker(pytest.mark.cluster)
