# PYTHON_ARGCOMPLETE_OK
"""The `metricscale` command: one entry point, one subcommand per program or tool.

Each subcommand lives in its own module, which exposes
``add_arguments(parser: argparse.ArgumentParser) -> None`` and
``run(args: argparse.Namespace) -> int``.
Only the chosen subcommand's module is imported, so `metricscale explain` does not pay for
aiohttp or kubernetes-asyncio.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, Protocol, cast

from metricscale import __version__
from metricscale.core.errors import ConfigError


class SubcommandModule(Protocol):
    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


@dataclass(frozen=True)
class Subcommand:
    name: str
    module: str
    summary: str


# One line per subcommand; each issue that builds a program adds its line.
SUBCOMMANDS: tuple[Subcommand, ...] = (
    Subcommand("demo", "cli.demo", "run the local demo: Prometheus, a fake cluster"),
    Subcommand("adapter", "adapter.server", "serve custom, external and resource metrics from Prometheus"),  # noqa: E501
    Subcommand("certs", "cli.certs", "create or renew the CA and serving certificate for the APIServices"),  # noqa: E501
    Subcommand("explain", "autoscaler.explain", "explain what the autoscaler would decide for a snapshot"),  # noqa: E501
    Subcommand("autoscaler", "autoscaler.server", "run the autoscaler controller"),
    Subcommand("replay", "cli.replay", "replay Prometheus history through the autoscaler's decision"),  # noqa: E501
    Subcommand("autoscale", "cli.autoscale", "create an Autoscaler for a workload, as kubectl autoscale"),  # noqa: E501
    Subcommand("doctor", "cli.doctor", "check an installation: APIServices, RBAC, rules, workloads"),  # noqa: E501
    Subcommand("migrate", "cli.migrate", "HPAs to Autoscalers and back; a prometheus-adapter configuration"),  # noqa: E501
)


class CommandParser(argparse.ArgumentParser):
    """argparse whose usage errors are two lines: what is wrong (naming the flag), then where
    to read the options; not argparse's whole usage (22 to 53 lines) with the error last."""

    def __init__(self, *, synopsis: str = "[options]", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.synopsis = synopsis

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n"
                     f"usage: {self.prog} {self.synopsis}; see {self.prog} --help\n")


def _top_parser() -> argparse.ArgumentParser:
    lines = "\n".join(f"  {s.name:<12} {s.summary}" for s in SUBCOMMANDS)
    parser = CommandParser(
        prog="metricscale", synopsis="SUBCOMMAND [options]",
        description="Kubernetes metrics adapter and autoscaler.",
        epilog=f"subcommands:\n{lines}\n\nRun 'metricscale <subcommand> --help' for its options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"metricscale {__version__}")
    parser.add_argument("subcommand", nargs="?", choices=[s.name for s in SUBCOMMANDS],
                        metavar="SUBCOMMAND")
    return parser


def _completion_parser(comp_line: str) -> argparse.ArgumentParser:
    """The top parser with one sub-parser per subcommand, for argcomplete.

    Only the subcommand already typed on the line gets its options (importing its module), so
    completing `metricscale ad<TAB>` imports no program.
    """
    parser = argparse.ArgumentParser(prog="metricscale",
                                     description="Kubernetes metrics adapter and autoscaler.")
    parser.add_argument("--version", action="version", version=f"metricscale {__version__}")
    subparsers = parser.add_subparsers(dest="subcommand", metavar="SUBCOMMAND")
    typed = comp_line.split()[1:2]
    for subcommand in SUBCOMMANDS:
        sub = subparsers.add_parser(subcommand.name, help=subcommand.summary)
        if typed == [subcommand.name] and len(comp_line.split()) > 1 and \
                (comp_line.endswith(" ") or len(comp_line.split()) > 2):
            module = cast(SubcommandModule, importlib.import_module(subcommand.module))
            module.add_arguments(sub)
    return parser


def _complete() -> None:
    """Answer the shell's completion request and exit, when argcomplete's hook calls us."""
    if "_ARGCOMPLETE" not in os.environ:
        return
    import argcomplete

    argcomplete.autocomplete(_completion_parser(os.environ.get("COMP_LINE", "")))


def main(argv: Sequence[str] | None = None) -> int:
    _complete()
    arguments = list(sys.argv[1:] if argv is None else argv)
    by_name = {s.name: s for s in SUBCOMMANDS}
    if not arguments or arguments[0] not in by_name:
        parser = _top_parser()
        parser.parse_args(arguments)  # prints help or a usage error naming the bad subcommand
        parser.print_help()
        return 2
    chosen = by_name[arguments[0]]
    module = cast(SubcommandModule, importlib.import_module(chosen.module))
    sub = CommandParser(prog=f"metricscale {chosen.name}", description=chosen.summary)
    module.add_arguments(sub)
    args = sub.parse_args(arguments[1:])
    try:
        return module.run(args)
    except ConfigError as error:
        # Bad input (a flag, a file, a field), for every subcommand: one line naming it, exit 2.
        heading = f"{error.heading}: " if error.heading else ""
        print(f"{sub.prog}: {heading}{error}", file=sys.stderr)
        return 2
