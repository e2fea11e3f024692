"""`metricscale explain`: what the autoscaler would decide for a snapshot, and why (the command:
its flags, reading the snapshot from a file, standard input or the cluster, and the output)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any, TextIO

import yaml

from autoscaler.decision import settings as settings_flags
from autoscaler.decision.explanation import render_text
from autoscaler.decision.snapshot import (
    Snapshot,
    SnapshotError,
    decide_snapshot,
    parse_checked_snapshot,
    render_decision,
)
from metricscale.files import FileError, read_document
from metricscale.kube.config import add_kubeconfig_arguments
from metricscale.kube.errors import KubeConfigError

__all__ = ["add_arguments", "load_document", "run"]

logger = logging.getLogger(__name__)

NO_SETTINGS_NOTE = "no settings published by the controller; upstream defaults are assumed"

EXIT_OK = 0
EXIT_FAILED = 1


class _Loader(yaml.SafeLoader):
    """YAML without implicit timestamps: times stay RFC 3339 strings, as on the wire."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("snapshot", nargs="?", metavar="FILE",
                        help="a decision snapshot (JSON or YAML, see docs); - reads standard input")
    parser.add_argument("-o", "--output", choices=("json", "text"), default="json",
                        help="one JSON document (default) or a readable report")
    live = parser.add_argument_group("a snapshot captured from a cluster (instead of FILE)")
    live.add_argument("--live", metavar="NAMESPACE/NAME",
                      help="capture the snapshot of this Autoscaler from the cluster, with the "
                           "history the controller persisted, and explain it")
    live.add_argument("--hpa", action="store_true",
                      help="--live names a native autoscaling/v2 HorizontalPodAutoscaler")
    live.add_argument("--shadow", action="store_true",
                      help="explain what shadow mode (metricscale autoscaler --shadow) decides "
                           "for this HPA: with the history and settings the shadow publishes "
                           "(its ConfigMap and Lease, see --lease-name) and its latest verdict; "
                           "implies --hpa")
    add_kubeconfig_arguments(live, purpose="for --live")
    live.add_argument("--save-snapshot", metavar="FILE",
                      help="also write the captured snapshot to FILE, to replay it later")
    live.add_argument("--lease-namespace", metavar="NAMESPACE",
                      help="namespace of the controller's Lease, where the leader publishes its "
                           "settings (default: this pod's namespace, else metricscale)")
    live.add_argument("--lease-name", metavar="NAME",
                      help="name of that Lease (default: metricscale-autoscaler; with --shadow "
                           "metricscale-shadow, also the name of the shadow's ConfigMap)")
    # Given flags override the settings the controller published (--live only).
    settings_flags.add_arguments(parser, with_defaults=False)


def load_document(text: str) -> Any:
    """A snapshot document from JSON or YAML text."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            pass  # maybe YAML flow style; let YAML have a go and report its error
    return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass: no arbitrary objects


def _snapshot_from_file(path: str, stdin: TextIO) -> Snapshot:
    try:  # bounded, UTF-8, JSON or YAML, every failure one line naming the file
        document = read_document(path, loader=_Loader, stream=stdin if path == "-" else None)
    except FileError as err:
        raise SnapshotError("", str(err)) from None
    return parse_checked_snapshot(document)


def _load_snapshot(args: argparse.Namespace) -> Snapshot:
    """The snapshot to explain, from where the arguments say (a file, standard input, or
    the cluster)."""
    if getattr(args, "live", None):
        # Imported by name so that explaining a file never loads the cluster client.
        from autoscaler.controller import capture

        return parse_checked_snapshot(capture.capture_document(args))
    if not args.snapshot:
        raise SnapshotError("", "a snapshot FILE (or - for standard input) is required")
    return _snapshot_from_file(args.snapshot, sys.stdin)


def run(args: argparse.Namespace) -> int:
    """Print the decision for the snapshot. Bad input raises SnapshotError naming the field,
    and a kubeconfig the user named that cannot be used KubeConfigError: one line, exit 2
    (cli/main.py)."""
    try:
        snapshot = _load_snapshot(args)
    except KubeConfigError as err:
        # No configuration at all (nothing named) is not bad usage: a runtime failure.
        if getattr(args, "kubeconfig", None):
            raise
        print(f"metricscale explain: {err}", file=sys.stderr)
        return EXIT_FAILED
    try:
        decision = decide_snapshot(snapshot)
    except OverflowError:
        # only times within minutes of year 1 or 9999 get here (`now - window`, start + period)
        raise SnapshotError("now", "times this close to year 1 or 9999 cannot be computed "
                                   "with") from None
    source = getattr(args, "settings_source", None)
    shadow = getattr(args, "shadow_published", None)
    if args.output == "text":
        output = render_text(snapshot, decision)
        if source == "defaults":
            output += NO_SETTINGS_NOTE + "\n"
        elif source is not None:
            output += f"settings: from the {source}\n"
        if shadow is not None:
            output += "".join(f"{line}\n" for line in shadow.lines)
    else:
        rendered = render_decision(decision)
        if source is not None:
            rendered = {**rendered, "settingsSource": source}
        if shadow is not None:
            rendered = {**rendered, "shadow": shadow.rendered}
        output = json.dumps(rendered, indent=2) + "\n"
    try:
        sys.stdout.write(output)
        sys.stdout.flush()
    except BrokenPipeError:  # `| head`: the reader has all it wanted
        pass
    return EXIT_OK
