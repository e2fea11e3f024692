"""External tools the tests need (prometheus, promtool, kubectl) and the CI no-skip rule."""

from __future__ import annotations

import os
import shutil

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def find_tool(name: str, *, env_var: str | None = None) -> str | None:
    """Path of an executable: `$env_var` when set, else the PATH."""
    override = os.environ.get(env_var, "") if env_var else ""
    path = override or shutil.which(name)
    if path and os.path.isfile(path) and os.access(path, os.X_OK):
        return path
    return None


def require_tool(name: str, *, env_var: str | None = None) -> str:
    """Path of an external tool; skip the test when it is missing, but fail under CI=true."""
    path = find_tool(name, env_var=env_var)
    if path:
        return path
    where = f"${env_var} or the PATH" if env_var else "the PATH"
    message = f"{name} was not found on {where}"
    if in_ci():
        pytest.fail(f"{message}; CI=true forbids skipping", pytrace=False)
    pytest.skip(message)
