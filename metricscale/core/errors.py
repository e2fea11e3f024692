"""The root of every configuration error: input a user gave that cannot be used."""

from __future__ import annotations

from typing import ClassVar

__all__ = ["ConfigError"]


class ConfigError(ValueError):
    """A flag, a file or a field that cannot be used; `str(err)` names it and says what to fix,
    and never shows a secret.

    Each program's configuration errors derive from this class. One that leaves a command is
    bad usage: `metricscale` (cli/main.py) prints it on one line, `metricscale COMMAND:
    HEADING: MESSAGE`, and exits 2. A program that meets one while running (a certificate
    file that became unreadable) reports it itself, as a runtime failure.
    """

    # How the command's line names this kind of error ("error", "invalid snapshot"); empty
    # for none.
    heading: ClassVar[str] = "error"
