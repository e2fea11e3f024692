"""`metricscale explain`: what the autoscaler would decide for a snapshot, and why."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import sys
from datetime import datetime
from typing import Any, TextIO

import yaml

from autoscaler.decision.decide import Decision
from autoscaler.decision.snapshot import (
    Snapshot,
    SnapshotError,
    decide_snapshot,
    parse_snapshot,
    render_decision,
)
from autoscaler.model import format_time

__all__ = ["add_arguments", "load_document", "run"]

logger = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_INVALID = 2


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
    live.add_argument("--kubeconfig", metavar="PATH",
                      help="kubeconfig for --live (default: in-cluster configuration)")
    live.add_argument("--context", help="kubeconfig context for --live")
    live.add_argument("--save-snapshot", metavar="FILE",
                      help="also write the captured snapshot to FILE, to replay it later")


def load_document(text: str) -> Any:
    """A snapshot document from JSON or YAML text."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            pass  # maybe YAML flow style; let YAML have a go and report its error
    return yaml.load(text, Loader=_Loader)  # a SafeLoader subclass: no arbitrary objects


def _read(path: str, stdin: TextIO) -> str:
    if path == "-":
        return stdin.read()
    with open(path, encoding="utf-8") as handle:
        return handle.read()


def _snapshot_from_file(path: str, stdin: TextIO) -> Snapshot:
    try:
        text = _read(path, stdin)
    except OSError as err:
        raise SnapshotError("", f"cannot read {path}: {err.strerror or err}") from None
    try:
        document = load_document(text)
    except yaml.YAMLError as err:
        raise SnapshotError("", f"{path} is neither JSON nor YAML: {err}") from None
    return parse_snapshot(document)


def _load_snapshot(args: argparse.Namespace) -> Snapshot:
    """The snapshot to explain, from where the arguments say (a file, standard input, or
    the cluster)."""
    if getattr(args, "live", None):
        # Imported by name so that explaining a file never loads the cluster client.
        capture = importlib.import_module("autoscaler.controller.capture")
        return parse_snapshot(capture.capture_document(args))
    if not args.snapshot:
        raise SnapshotError("", "a snapshot FILE (or - for standard input) is required")
    return _snapshot_from_file(args.snapshot, sys.stdin)


def run(args: argparse.Namespace) -> int:
    """Print the decision for the snapshot; exit 2 (with the field named) for bad input."""
    try:
        snapshot = _load_snapshot(args)
    except SnapshotError as err:
        print(f"metricscale explain: invalid snapshot: {err}", file=sys.stderr)
        return EXIT_INVALID
    try:
        decision = decide_snapshot(snapshot)
    except OverflowError:
        # only times within minutes of year 1 or 9999 get here (`now - window`, start + period)
        print("metricscale explain: invalid snapshot: now: times this close to year 1 or 9999 "
              "cannot be computed with", file=sys.stderr)
        return EXIT_INVALID
    if args.output == "text":
        output = render_text(snapshot, decision)
    else:
        output = json.dumps(render_decision(decision), indent=2) + "\n"
    try:
        sys.stdout.write(output)
        sys.stdout.flush()
    except BrokenPipeError:  # `| head`: the reader has all it wanted
        pass
    return EXIT_OK


def _when(value: datetime | None) -> str:
    return "-" if value is None else format_time(value)


def render_text(snapshot: Snapshot, decision: Decision) -> str:
    """A readable report of the decision."""
    autoscaler = snapshot.autoscaler
    ref = autoscaler.spec.scale_target_ref
    lines = [
        f"{autoscaler.kind} {autoscaler.key} -> {ref.kind}/{ref.name} at {_when(snapshot.now)}",
    ]
    if decision.rescale:
        lines.append(f"Decision: scale to {decision.new_replicas} "
                     f"({decision.rescale_reason})")
    else:
        lines.append(f"Decision: keep {decision.desired_replicas} replicas")
    lines.append("")
    if decision.metrics:
        lines.append("Metrics:")
        for detail in decision.metrics:
            label = detail.description or f"{detail.type} {detail.name}".strip()
            if detail.error is not None:
                lines.append(f"  [{detail.index}] {label}: FAILED ({detail.reason}): "
                             f"{detail.error}")
                continue
            ratio = f"{detail.ratio:.4g}" if detail.ratio is not None else "undefined"
            lines.append(f"  [{detail.index}] {label}: current {detail.current}, target "
                         f"{detail.target}, ratio {ratio} -> {detail.proposed_replicas}")
        lines.append("")
    if decision.limits:
        lines.append("Rules that changed the number:")
        for limit in decision.limits:
            lines.append(f"  {limit.rule}: {limit.from_replicas} -> {limit.to_replicas} "
                         f"({limit.detail})")
        lines.append("")
    lines.append("Why:")
    lines.extend(f"  - {line}" for line in decision.explanation)
    lines.append("")
    status = decision.status
    lines.append(f"Status: currentReplicas {status.current_replicas}, desiredReplicas "
                 f"{status.desired_replicas}, lastScaleTime {_when(status.last_scale_time)}")
    for condition in status.conditions:
        lines.append(f"  {condition.type:<15} {condition.status:<6} {condition.reason:<28} "
                     f"{condition.message}")
    if decision.events:
        lines.append("")
        lines.append("Events:")
        for event in decision.events:
            lines.append(f"  {event.type:<8} {event.reason:<28} {event.message}")
    return "\n".join(lines) + "\n"
