"""Shared pytest configuration: tools that tests need, and the CI rule that nothing skips."""

from __future__ import annotations

import os
import shutil

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def require_tool(name: str, *, env_var: str | None = None) -> str:
    """Path of an external tool; skip when it is missing, but fail under CI=true."""
    override = os.environ.get(env_var, "") if env_var else ""
    path = override if override else shutil.which(name)
    if path and os.access(path, os.X_OK):
        return path
    where = f"${env_var} or the PATH" if env_var else "the PATH"
    message = f"{name} was not found on {where}"
    if in_ci():
        pytest.fail(f"{message}; CI=true forbids skipping", pytrace=False)
    pytest.skip(message)
