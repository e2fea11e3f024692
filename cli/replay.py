"""`metricscale replay`: what the autoscaler would have done over a range of Prometheus history.

For each `spec.metrics` entry the command builds the PromQL the adapter would send (the
adapter's own rule code: `parse_config`, discovery over `/api/v1/series`, `build_*_query`),
or takes `--query INDEX=PROMQL`, reads its history with range queries (prometheus-api-client,
synchronous: this command runs no event loop), and runs the closed-loop simulation of
cli/replay_sim.py.

Assumption: without a cluster the target's selector cannot be read, so the pods of a Pods
metric are chosen by `--pods REGEX` (a regex over pod names; default: every pod in the
Autoscaler's namespace). The adapter would send the same query with the pod names of the
target's selector as one alternation; here that alternation is replaced by the regex.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from cli.replay_sim import (
    PER_POD_TYPES,
    SUPPORTED_TYPES,
    MissingInitialReplicas,
    Observation,
    ReplayInputError,
    Step,
    Summary,
    simulate,
    summarize,
)
from metricscale.core.durations import DurationError, parse_range_duration
from metricscale.files import FileError, parse_yaml, read_bytes, read_text

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INVALID = 2
MAX_POINTS = 11_000  # Prometheus refuses range queries with more points per series
# The most steps a replay decides: ten range queries of MAX_POINTS per series. A step costs
# about 2.4 KB of memory and 0.2 ms of decision (measured), so this bound is ~260 MiB and well
# under a minute; 7 days at 15 s are 40,321 steps, 30 days at 30 s 86,401.
MAX_STEPS = 10 * MAX_POINTS
_PLACEHOLDER = "metricscale-replay-pods"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("autoscaler", metavar="AUTOSCALER.yaml", nargs="?",
                        help="an Autoscaler or autoscaling/v2 HorizontalPodAutoscaler object")
    live = parser.add_argument_group("the Autoscaler read from a cluster (instead of a file)")
    live.add_argument("--live", metavar="NAMESPACE/NAME",
                      help="read the Autoscaler NAMESPACE/NAME from the cluster")
    live.add_argument("--hpa", action="store_true",
                      help="--live names a native autoscaling/v2 HorizontalPodAutoscaler")
    from metricscale.kube.config import add_kubeconfig_arguments

    add_kubeconfig_arguments(live, purpose="for --live")
    from adapter.settings import add_prometheus_arguments

    prom = parser.add_argument_group("prometheus (the adapter's options, for the same backend)")
    add_prometheus_arguments(prom, default_timeout="30s", url_required=True)
    parser.add_argument("--config", metavar="RULES.yaml",
                        help="the adapter's rules, to build each metric's PromQL")
    parser.add_argument("--from", dest="start", metavar="TIME",
                        help="start of the range: RFC 3339 or a Unix timestamp (as Prometheus "
                             "takes them)")
    parser.add_argument("--to", dest="end", metavar="TIME",
                        help="end of the range: RFC 3339 or a Unix timestamp")
    parser.add_argument("--last", help="the range ending now, e.g. 24h")
    parser.add_argument("--step", help="decision interval (default: the sync period: the "
                                       "controller's published one with --live, else 15s); "
                                       f"at most {MAX_STEPS:,} steps in the range")
    parser.add_argument("--query", action="append", default=[], metavar="INDEX=PROMQL",
                        help="PromQL for spec.metrics[INDEX] (Pods: one series per pod)")
    parser.add_argument("--pods", default=".*", metavar="REGEX",
                        help="pod names of the target (a regex; default every pod in the "
                             "namespace)")
    parser.add_argument("--initial-replicas", type=int,
                        help="replicas at the start (default: kube_deployment_spec_replicas)")
    parser.add_argument("--pod-startup", default="30s", help="time until a new pod is ready")
    parser.add_argument("--request", action="append", default=[], metavar="RESOURCE=QUANTITY",
                        help="each simulated container's request, for Resource Utilization "
                             "targets (e.g. cpu=500m, memory=256Mi)")
    parser.add_argument("--compare", metavar="OTHER.yaml",
                        help="a second Autoscaler replayed over the same data, side by side")
    parser.add_argument("--plot", metavar="FILE.png",
                        help="also draw the replay to a .png or .svg (needs metricscale[plot])")
    parser.add_argument("-o", "--output", choices=("table", "csv", "json"), default="table")
    live.add_argument("--lease-namespace", metavar="NAMESPACE", default="metricscale",
                      help="with --live: namespace of the controller's Lease, where it publishes "
                           "its decision settings (default: metricscale)")
    live.add_argument("--lease-name", metavar="NAME", default="metricscale-autoscaler",
                      help="with --live: name of that Lease (default: metricscale-autoscaler)")
    from autoscaler.decision import settings as settings_flags

    # Given flags override the settings the controller published (or upstream's defaults).
    settings_flags.add_arguments(parser, with_defaults=False)


def _flag_duration(text: str, flag: str) -> timedelta:
    """A range or step flag's value, in Prometheus' duration syntax."""
    try:
        return parse_range_duration(text)
    except DurationError:
        raise ReplayInputError(f"{flag}: not a duration: {text!r} (use e.g. 15s, 5m, 24h, 2d)"
                               ) from None
    except OverflowError:
        raise ReplayInputError(f"{flag}: duration too long: {text!r}") from None


def _parse_time(text: str, flag: str) -> datetime:
    """RFC 3339, or a Unix timestamp (fractional allowed), as Prometheus' API and promtool
    take them; a number is a timestamp (Prometheus tries that first too)."""
    try:
        stamp = float(text)
    except ValueError:
        stamp = None
    try:
        if stamp is not None:
            if not math.isfinite(stamp):
                raise ValueError(text)
            return datetime.fromtimestamp(stamp, UTC)
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (ValueError, OverflowError, OSError):
        raise ReplayInputError(f"{flag}: not an RFC 3339 time or a Unix timestamp within "
                               f"years 1 to 9999: {text!r}") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _range(args: argparse.Namespace) -> tuple[datetime, datetime]:
    if args.last:
        if args.start or args.end:
            raise ReplayInputError("give either --last or --from/--to, not both")
        end = datetime.now(UTC).replace(microsecond=0)
        last = _flag_duration(args.last, "--last")
        try:
            return end - last, end
        except OverflowError:
            raise ReplayInputError(f"--last {args.last}: reaches back before year 1") from None
    if not args.start or not args.end:
        raise ReplayInputError("a range is required: --from T --to T, or --last 24h")
    start, end = _parse_time(args.start, "--from"), _parse_time(args.end, "--to")
    if end <= start:
        raise ReplayInputError("--to must be after --from")
    return start, end


def _given_step(args: argparse.Namespace) -> timedelta | None:
    """--step, if given: more than zero."""
    text = getattr(args, "step", None)
    if not text:
        return None
    step = _flag_duration(text, "--step")
    if step <= timedelta():
        raise ReplayInputError(f"--step {text}: must be more than 0s")
    return step


def step_count(args: argparse.Namespace, *, start: datetime, end: datetime,
               step: timedelta) -> int:
    """The decisions over the range; more than MAX_STEPS is refused, naming the flags."""
    count = (end - start) // step + 1
    if count > MAX_STEPS:
        span = f"--last {args.last}" if getattr(args, "last", None) else "--from/--to"
        given = f"--step {args.step}" if getattr(args, "step", None) else \
            f"the default --step of {step.total_seconds():g}s"
        raise ReplayInputError(
            f"{span} with {given} is {count:,} steps, more than the {MAX_STEPS:,} a replay "
            f"decides (ten range queries of Prometheus' {MAX_POINTS:,} points per series); "
            "use a longer --step or a shorter range")
    return count


def _queries(args: argparse.Namespace, count: int) -> dict[int, str]:
    out: dict[int, str] = {}
    for item in args.query:
        index, sep, promql = item.partition("=")
        if not sep or not index.strip().isdigit() or not promql.strip():
            raise ReplayInputError(f"--query {item!r}: use INDEX=PROMQL")
        if int(index) >= count:
            raise ReplayInputError(f"--query {item!r}: the autoscaler has {count} metrics")
        out[int(index)] = promql
    return out


def _selector_text(selector: Mapping[str, Any] | None) -> str:
    if not selector:
        return ""
    parts = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    for expression in selector.get("matchExpressions") or []:
        values = ",".join(expression.get("values") or [])
        operator = expression.get("operator")
        if operator == "In":
            parts.append(f"{expression['key']} in ({values})")
        elif operator == "NotIn":
            parts.append(f"{expression['key']} notin ({values})")
        elif operator == "Exists":
            parts.append(expression["key"])
        elif operator == "DoesNotExist":
            parts.append(f"!{expression['key']}")
    return ",".join(parts)


def _parse_rules(text: str) -> Any:
    """The adapter's rules of --config, checked by the adapter's own parser."""
    from adapter.rules.config import ConfigError, parse_config

    try:
        return parse_config(text)
    except ConfigError as err:
        raise ReplayInputError(f"--config: {err}") from None


def _rule_query(*, spec: Mapping[str, Any], index: int, config: Any, namespace: str,
                pods_regex: str, client: Any, start: datetime, end: datetime) -> str:
    """The PromQL the adapter would send for spec.metrics[index]."""
    from adapter.rules.query import QueryError, build_custom_query, build_external_query
    from adapter.rules.registry import build_registry, series_shapes
    from adapter.rules.resources import PODS, builtin_catalog
    from metricscale.core.selectors import parse_selector

    series = {query: series_shapes(client.get_series(start, end, params={"match[]": query}))
              for query in config.series_queries()}
    registry = build_registry(config=config, series=series, catalog=builtin_catalog(),
                              now=end)
    kind = spec["type"]
    if kind in ("Resource", "ContainerResource"):
        return _usage_query(config=config, spec=spec, index=index, namespace=namespace,
                            pods_regex=pods_regex)
    body = spec.get(kind.lower()) or {}
    metric = body.get("metric") or {}
    name = metric.get("name", "")
    try:
        selector = parse_selector(_selector_text(metric.get("selector")))
    except ValueError as err:
        raise ReplayInputError(f"spec.metrics[{index}].{kind.lower()}.metric.selector: {err}"
                               ) from None
    try:
        if kind == "Pods":
            resolved = registry.resolve_custom(resource=PODS, namespace=namespace, metric=name)
            if resolved is not None:
                built = build_custom_query(
                    rule=resolved.entry.rule, mapper=resolved.entry.mapper,
                    series=resolved.entry.series, resource=resolved.info.group_resource,
                    namespace=namespace, names=[_PLACEHOLDER], metric_selector=selector)
                regex = json.dumps(pods_regex)
                return built.promql.replace(f'{built.resource_label}="{_PLACEHOLDER}"',
                                            f"{built.resource_label}=~{regex}")
        elif kind == "External":
            entry = registry.resolve_external(name)
            if entry is not None:
                return build_external_query(rule=entry.rule, mapper=entry.mapper,
                                            series=entry.series, namespace=namespace,
                                            metric_selector=selector)
    except QueryError as err:
        raise ReplayInputError(f"spec.metrics[{index}]: {err}") from None
    raise ReplayInputError(f"spec.metrics[{index}]: no rule of --config serves the {kind} "
                           f"metric {name!r} over this range; give --query {index}=PROMQL")


def _usage_query(*, config: Any, spec: Mapping[str, Any], index: int, namespace: str,
                 pods_regex: str) -> str:
    """The adapter's `resourceRules` containerQuery, over the pods `--pods` matches."""
    from adapter.http.usage import usage_labels
    from adapter.rules.query import QueryError, build_pod_usage_query

    body = spec.get("resource") or spec.get("containerResource") or {}
    name = body.get("name")
    rules = config.resource_rules
    if rules is None or name not in ("cpu", "memory"):
        raise ReplayInputError(f"spec.metrics[{index}]: --config has no resourceRules for "
                               f"{name!r}; give --query {index}=PROMQL (one series per pod "
                               f"and container)")
    rule = rules.cpu if name == "cpu" else rules.memory
    try:
        labels = usage_labels(rule)
        promql = build_pod_usage_query(rule=rule, labels=labels, namespace=namespace,
                                       pods=[_PLACEHOLDER])
    except (QueryError, ValueError) as err:
        raise ReplayInputError(f"spec.metrics[{index}]: {err}") from None
    return promql.replace(f'{labels.pod}="{_PLACEHOLDER}"',
                          f"{labels.pod}=~{json.dumps(pods_regex)}")


def _range_values(client: Any, promql: str, *, start: datetime, end: datetime,
                  step: timedelta) -> list[dict[float, float]]:
    """Each series' samples by Unix time; the range split to stay under MAX_POINTS."""
    return [values for _, values in _range_series(client, promql, start=start, end=end,
                                                  step=step)]


def _range_series(client: Any, promql: str, *, start: datetime, end: datetime,
                  step: timedelta) -> list[tuple[dict[str, str], dict[float, float]]]:
    """Each series' labels and samples by Unix time (split to stay under MAX_POINTS)."""
    chunk = step * (MAX_POINTS - 1)
    by_labels: dict[str, dict[float, float]] = {}
    labels: dict[str, dict[str, str]] = {}
    cursor = start
    while cursor <= end:
        stop = min(cursor + chunk, end)
        result = client.custom_query_range(promql, start_time=cursor, end_time=stop,
                                           step=f"{int(step.total_seconds())}s")
        for series in result:
            key = json.dumps(series.get("metric", {}), sort_keys=True)
            labels.setdefault(key, dict(series.get("metric", {})))
            by_labels.setdefault(key, {}).update(
                (float(stamp), float(value)) for stamp, value in series.get("values", []))
        cursor = stop + step
    return [(labels[key], values) for key, values in by_labels.items()]


def _pod_totals(spec: Mapping[str, Any],
                series: Sequence[tuple[dict[str, str], dict[float, float]]],
                ) -> list[dict[float, float]]:
    """Resource: each pod's usage summed over its containers; ContainerResource: the named
    container's. Series are grouped by the pod label (`pod`, else the first non-container
    label); a series without labels counts as one pod."""
    if spec["type"] not in ("Resource", "ContainerResource"):
        return [values for _, values in series]
    container = (spec.get("containerResource") or {}).get("container")
    pods: dict[str, dict[float, float]] = {}
    for labels, values in series:
        if container is not None and labels.get("container", container) != container:
            continue
        pod = labels.get("pod") or labels.get("pod_name") or json.dumps(
            {k: v for k, v in labels.items() if k != "container"}, sort_keys=True)
        totals = pods.setdefault(pod, {})
        for stamp, value in values.items():
            totals[stamp] = totals.get(stamp, 0.0) + value
    return list(pods.values())


def _observations(spec: Mapping[str, Any], series: Sequence[dict[float, float]],
                  times: Sequence[datetime]) -> list[Observation]:
    stamps = [moment.timestamp() for moment in times]
    # One column per series (its value at each step, or None), read together step by step.
    columns = [list(map(values.get, stamps)) for values in series]
    missing = Observation(None)  # immutable: one for every step without a sample
    out: list[Observation] = []
    if spec["type"] in PER_POD_TYPES:
        for row in zip(*columns, strict=True) if columns else ((),) * len(stamps):
            present = [value for value in row if value is not None]
            out.append(Observation(sum(present) / len(present), len(present))
                       if present else missing)
        return out
    for row in zip(*columns, strict=True) if columns else ((),) * len(stamps):
        first = next((value for value in row if value is not None), None)
        out.append(missing if first is None else Observation(first))
    return out


def _initial_replicas(args: argparse.Namespace, client: Any, autoscaler: Mapping[str, Any],
                      start: datetime) -> int:
    if args.initial_replicas is not None:
        if args.initial_replicas < 0:
            raise ReplayInputError("--initial-replicas must not be negative")
        return int(args.initial_replicas)
    promql = _replicas_query(autoscaler)
    result = client.custom_query(promql, params={"time": start.timestamp()})
    if not result:
        raise MissingInitialReplicas("--initial-replicas is required: Prometheus has no "
                               f"{promql.split('{')[0]} for the target at --from")
    return int(float(result[0]["value"][1]))


def _replicas_query(autoscaler: Mapping[str, Any]) -> str:
    """kube-state-metrics' series of the target's replicas (StatefulSet, else Deployment)."""
    target = autoscaler["spec"]["scaleTargetRef"]
    namespace = json.dumps(autoscaler.get("metadata", {}).get("namespace", "default"))
    name = json.dumps(target.get("name", ""))
    if target.get("kind") == "StatefulSet":
        return f"kube_statefulset_replicas{{namespace={namespace},statefulset={name}}}"
    return f"kube_deployment_spec_replicas{{namespace={namespace},deployment={name}}}"


def _step_row(step: Step) -> dict[str, Any]:
    return {"time": step.time.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "values": [None if v is None else round(v, 6) for v in step.values],
            "currentReplicas": step.current_replicas, "readyPods": step.ready_pods,
            "proposedReplicas": step.proposed_replicas,
            "decidedReplicas": step.decided_replicas, "limitingRule": step.limiting_rule}


def assumptions(args: argparse.Namespace, autoscaler: Mapping[str, Any], *, step: timedelta,
                initial: int, startup: timedelta, requests: Mapping[str, str]) -> list[str]:
    """The closed loop's assumptions for this replay, said plainly in its output."""
    types = {m.get("type") for m in autoscaler["spec"].get("metrics") or []}
    out = [f"one decision every {step.total_seconds():g} s (the sync period), each with the "
           "history and status the previous one left",
           f"{initial} replicas at the start ("
           + ("--initial-replicas" if getattr(args, "initial_replicas", None) is not None
              else f"{_replicas_query(autoscaler).split('{')[0]} at --from") + ")",
           "every scale write succeeds; a new pod is ready after "
           f"{startup.total_seconds():g} s (--pod-startup); scale-down removes the newest pods",
           "a step without a sample is a failed metric fetch, as in the controller"]
    if types & set(PER_POD_TYPES):
        out.append("Pods/Resource metrics: the load is fixed, the pods are not: the observed "
                   "total is spread over the simulated ready pods"
                   + (f" (requests: {', '.join(f'{k}={v}' for k, v in requests.items())})"
                      if requests else ""))
    if types & {"Object", "External"}:
        out.append("Object/External metrics: used as observed")
    return out


def render(steps: Sequence[Step], summary: Summary, output: str,
           compare: tuple[Sequence[Step], Summary] | None = None,
           observed: Sequence[int | None] | None = None,
           assumed: Sequence[str] = ()) -> str:
    rows = [_step_row(step) for step in steps]
    if observed is not None:
        for row, value in zip(rows, observed, strict=True):
            row["observedReplicas"] = value
    other = [_step_row(step) for step in compare[0]] if compare else None
    if output == "json":
        document: dict[str, Any] = {"steps": rows, "summary": asdict(summary)}
        if compare is not None:
            document["compare"] = {"steps": other, "summary": asdict(compare[1])}
        if assumed:
            document["assumptions"] = list(assumed)
        return json.dumps(document, indent=2) + "\n"
    if output == "csv":
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["time", "values", "current", "ready", "proposed", "decided", "limit",
                         *(["compareDecided"] if other else []),
                         *(["observed"] if observed is not None else [])])
        for i, row in enumerate(rows):
            writer.writerow([row["time"], ";".join("" if v is None else str(v)
                                                   for v in row["values"]),
                             row["currentReplicas"], row["readyPods"],
                             "" if row["proposedReplicas"] is None else row["proposedReplicas"],
                             row["decidedReplicas"], row["limitingRule"] or "",
                             *([other[i]["decidedReplicas"]] if other else []),
                             *([_cell(row["observedReplicas"])] if observed is not None
                               else [])])
        return buffer.getvalue()
    extra = (f" {'CMP':>4}" if other else "") + (f" {'OBS':>4}" if observed else "")
    lines = [f"{'TIME':<21} {'VALUES':<24} {'CUR':>4} {'PROP':>5} {'DEC':>4}{extra}  LIMIT"]
    for i, row in enumerate(rows):
        values = ",".join("-" if v is None else f"{v:g}" for v in row["values"])
        proposed = "-" if row["proposedReplicas"] is None else str(row["proposedReplicas"])
        cmp = f" {other[i]['decidedReplicas']:>4}" if other else ""
        if observed:
            cmp += f" {_cell(row['observedReplicas']):>4}"
        lines.append(f"{row['time']:<21} {values:<24} {row['currentReplicas']:>4} "
                     f"{proposed:>5} {row['decidedReplicas']:>4}{cmp}  "
                     f"{row['limitingRule'] or ''}")
    lines.append("")
    if compare is None:
        lines.extend(f"{key}: {value}" for key, value in asdict(summary).items())
    else:
        lines.append(f"{'':<22} {'AUTOSCALER':>12} {'COMPARE':>12}")
        theirs = asdict(compare[1])
        lines.extend(f"{key + ':':<22} {_cell(value):>12} {_cell(theirs[key]):>12}"
                     for key, value in asdict(summary).items())
    if assumed:
        lines.append("")
        lines.append("Assumed:")
        lines.extend(f"  - {line}" for line in assumed)
    return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def observed_replicas(client: Any, autoscaler: Mapping[str, Any], *, start: datetime,
                      end: datetime, step: timedelta, times: Sequence[datetime],
                      ) -> list[int | None] | None:
    """The target's replicas as kube-state-metrics recorded them (None: not scraped)."""
    series = _range_values(client, _replicas_query(autoscaler), start=start, end=end, step=step)
    if not series:
        return None
    values = series[0]
    out: list[int | None] = []
    for moment in times:
        value = values.get(moment.timestamp())
        out.append(None if value is None else int(value))
    return out


def _load_autoscaler(path: str, flag: str = "") -> dict[str, Any]:
    """The Autoscaler (or HPA) in `path`, the file of `flag` (empty: the positional one)."""
    prefix = f"{flag}: " if flag else ""
    try:
        autoscaler = parse_yaml(read_text(path), path)
    except FileError as err:
        raise ReplayInputError(f"{prefix}{err}") from None
    if not isinstance(autoscaler, dict) or not isinstance(autoscaler.get("spec"), dict):
        raise ReplayInputError(f"{prefix}{path}: not an Autoscaler object (no spec)")
    _check_metrics(autoscaler, f"{prefix}{path}")
    return autoscaler


def _check_metrics(autoscaler: Mapping[str, Any], where: str) -> None:
    """spec.metrics: a list of metrics of the types replay decides on, before any query."""
    metrics = autoscaler["spec"].get("metrics")
    if not metrics:
        raise ReplayInputError(f"{where}: spec.metrics is empty")
    if not isinstance(metrics, list):
        raise ReplayInputError(f"{where}: spec.metrics is not a list")
    for index, spec in enumerate(metrics):
        if not isinstance(spec, dict):
            raise ReplayInputError(f"{where}: spec.metrics[{index}] is not a mapping")
        if spec.get("type") not in SUPPORTED_TYPES:
            raise ReplayInputError(f"{where}: spec.metrics[{index}]: type "
                                   f"{spec.get('type')!r} is not supported by replay yet "
                                   f"(supported: {', '.join(SUPPORTED_TYPES)})")


def _source_autoscaler(args: argparse.Namespace) -> dict[str, Any]:
    live = getattr(args, "live", None)
    if bool(live) == bool(args.autoscaler):
        raise ReplayInputError("give either AUTOSCALER.yaml or --live NAMESPACE/NAME")
    if not live:
        return _load_autoscaler(args.autoscaler)
    from cli.replay_live import read_live_autoscaler

    autoscaler, published = read_live_autoscaler(
        live, hpa=args.hpa, kubeconfig=args.kubeconfig, context=args.context,
        lease=(args.lease_namespace, args.lease_name))
    args.published_settings = published
    if not isinstance(autoscaler.get("spec"), dict):
        raise ReplayInputError(f"--live {live}: not an Autoscaler object (no spec)")
    _check_metrics(autoscaler, f"--live {live}")
    autoscaler.pop("status", None)  # replay starts from no history
    return autoscaler


def _requests(items: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, quantity = item.partition("=")
        if not sep or not name.strip() or not quantity.strip():
            raise ReplayInputError(f"--request {item!r}: use RESOURCE=QUANTITY, e.g. cpu=500m")
        out[name.strip()] = quantity.strip()
    return out


@dataclass(frozen=True)
class Replayed:
    """One replay's result, for rendering and plotting."""

    steps: list[Step]
    summary: Summary
    compare: tuple[list[Step], Summary] | None
    step: timedelta
    observed: list[int | None] | None
    requests: dict[str, str]
    autoscaler: dict[str, Any]
    settings_source: str = "defaults"  # controller, controller and flags, flags, defaults
    assumptions: tuple[str, ...] = ()


def decision_settings(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """The settings to decide with (snapshot form) and where they came from: those the
    controller published on its Lease (--live), with the settings flags given in their place,
    else upstream's defaults."""
    from autoscaler.decision.settings import (
        SettingsError,
        given_settings,
        render_settings,
        resolve_settings,
    )

    try:
        given = given_settings(args)
    except SettingsError as err:
        raise ReplayInputError(str(err)) from None
    settings, source = resolve_settings(published=getattr(args, "published_settings", None),
                                        given=given)
    return render_settings(settings), source


def replay_steps(args: argparse.Namespace, client: Any,
                 autoscaler: dict[str, Any] | None = None) -> Replayed:
    # Every flag and file is checked before the cluster or Prometheus is asked anything.
    start, end = _range(args)
    given_step = _given_step(args)
    if given_step is not None:
        step_count(args, start=start, end=end, step=given_step)
    startup = _flag_duration(args.pod_startup, "--pod-startup") \
        if args.pod_startup != "0" else timedelta()
    try:
        start - startup - timedelta(hours=1)  # when the simulation's first pods started
    except OverflowError:
        raise ReplayInputError(f"--pod-startup {args.pod_startup}: too long") from None
    requests = _requests(getattr(args, "request", []))
    rules: Any = None
    if args.config:
        try:
            rules = _parse_rules(read_text(args.config))
        except FileError as err:
            raise ReplayInputError(f"--config: {err}") from None
    other = _load_autoscaler(args.compare, "--compare") if getattr(args, "compare", None) \
        else None
    if autoscaler is None:
        autoscaler = _source_autoscaler(args)
    settings, source = decision_settings(args)
    step = given_step or timedelta(seconds=float(settings["syncPeriodSeconds"]))
    count = step_count(args, start=start, end=end, step=step)
    times = [start + step * i for i in range(count)]
    cache: dict[str, list[dict[float, float]]] = {}

    def observe(target: Mapping[str, Any], queries: Mapping[int, str]) -> list[Any]:
        namespace = target.get("metadata", {}).get("namespace", "default")
        per_metric: list[list[Observation]] = []
        for index, spec in enumerate(target["spec"]["metrics"]):
            promql = queries.get(index)
            if promql is None:
                if rules is None:
                    raise ReplayInputError(f"spec.metrics[{index}]: give --config RULES.yaml "
                                           f"or --query {index}=PROMQL")
                promql = _rule_query(spec=spec, index=index, config=rules,
                                     namespace=namespace, pods_regex=args.pods,
                                     client=client, start=start, end=end)
            key = json.dumps([spec.get("type"), spec.get("containerResource"), promql])
            if key not in cache:
                cache[key] = _pod_totals(spec, _range_series(client, promql, start=start,
                                                             end=end, step=step))
            if not cache[key]:
                raise ReplayInputError(f"spec.metrics[{index}]: no data in the range for "
                                       f"{promql}")
            per_metric.append(_observations(spec, cache[key], times))
        return list(zip(*per_metric, strict=True)) if per_metric else [()] * count

    specs = autoscaler["spec"]["metrics"]
    observations = observe(autoscaler, _queries(args, len(specs)))
    initial = _initial_replicas(args, client, autoscaler, start)
    steps = simulate(autoscaler=autoscaler, times=times, observations=observations,
                     initial_replicas=initial, startup=startup, requests=requests,
                     settings=settings)
    compared: tuple[list[Step], Summary] | None = None
    if other is not None:
        # --query applies to the compared spec too when its metrics are the same.
        same = other["spec"]["metrics"] == specs
        other_steps = simulate(autoscaler=other, times=times,
                               observations=observations if same else observe(other, {}),
                               initial_replicas=initial, startup=startup, requests=requests,
                               settings=settings)
        compared = (other_steps, summarize(other_steps, step=step))
    observed = observed_replicas(client, autoscaler, start=start, end=end, step=step,
                                 times=times)
    return Replayed(steps, summarize(steps, step=step), compared, step, observed, requests,
                    autoscaler, source,
                    tuple(assumptions(args, autoscaler, step=step, initial=initial,
                                      startup=startup, requests=requests)))


def replay(args: argparse.Namespace, client: Any) -> str:
    if getattr(args, "plot", None):
        _check_plot(args.plot)
    result = replay_steps(args, client)
    if getattr(args, "plot", None):
        from cli.replay_plot import plot_replay

        name = result.autoscaler.get("metadata", {}).get("name", "")
        plot_replay(args.plot, autoscaler=result.autoscaler, steps=result.steps,
                    compare=result.compare[0] if result.compare else None,
                    observed=result.observed, requests=result.requests,
                    title=f"metricscale replay: {name}")
    if result.settings_source == "defaults":
        print("metricscale replay: " + ("no settings published by the controller; "
                                        if getattr(args, "live", None) else "")
              + "upstream defaults are assumed", file=sys.stderr)
    else:
        print(f"metricscale replay: settings from the {result.settings_source}",
              file=sys.stderr)
    queries = -(-len(result.steps) // MAX_POINTS)
    if queries > 1:
        print(f"metricscale replay: {len(result.steps):,} steps: Prometheus answers at most "
              f"{MAX_POINTS:,} points per series in one range query, so each metric's history "
              f"is read in {queries} range queries", file=sys.stderr)
    if args.output == "csv":  # CSV stays one table: the summary and assumptions go aside
        for key, value in asdict(result.summary).items():
            print(f"metricscale replay: summary: {key}: {value}", file=sys.stderr)
        if result.compare is not None:
            for key, value in asdict(result.compare[1]).items():
                print(f"metricscale replay: compare summary: {key}: {value}", file=sys.stderr)
        for line in result.assumptions:
            print(f"metricscale replay: assumed: {line}", file=sys.stderr)
    return render(result.steps, result.summary, args.output, result.compare,
                  result.observed, result.assumptions)


def _check_plot(path: str) -> None:
    """Refuse --plot before any query when it cannot be drawn."""
    import importlib.util

    from cli.replay_plot import INSTALL_HINT

    if not path.lower().endswith((".png", ".svg")):
        raise ReplayInputError(f"--plot {path!r}: the file must end in .png or .svg")
    if importlib.util.find_spec("matplotlib") is None:
        raise ReplayInputError(INSTALL_HINT)


def _check_tls_files(*, ca_file: str | None, cert_file: str | None,
                     key_file: str | None) -> None:
    """The CA bundle and client certificate, read (bounded) and loaded before any query:
    requests would read them whole at the first one, and say only 'cannot reach'."""
    import ssl

    for flag, path in (("--prometheus-ca-file", ca_file),
                       ("--prometheus-client-tls-cert-file", cert_file),
                       ("--prometheus-client-tls-key-file", key_file)):
        if path:
            try:
                read_bytes(path)
            except FileError as err:
                raise ReplayInputError(f"{flag}: {err}") from None
    context = ssl.create_default_context()
    if ca_file:
        try:
            context.load_verify_locations(cafile=ca_file)
        except (ssl.SSLError, OSError) as err:
            raise ReplayInputError(f"--prometheus-ca-file: {ca_file} holds no usable CA "
                                   f"certificate ({getattr(err, 'reason', None) or err})"
                                   ) from None
    if cert_file and key_file:
        try:
            context.load_cert_chain(cert_file, key_file)
        except (ssl.SSLError, OSError) as err:
            raise ReplayInputError(
                f"--prometheus-client-tls-cert-file/-key-file: {cert_file} and {key_file} are "
                f"not a PEM certificate and its key ({getattr(err, 'reason', None) or err})"
                ) from None


def prometheus_client(args: argparse.Namespace) -> Any:
    """A prometheus-api-client connection with the adapter's backend options (headers, bearer
    token or basic auth, CA, client certificate), checked by the adapter's own rules."""
    import requests
    from prometheus_api_client import PrometheusConnect

    from adapter.settings import (
        PrometheusConfigError,
        prometheus_headers,
        prometheus_settings_from_args,
    )
    from metricscale.core.durations import flag_message, parse_go_duration

    try:
        timeout = float(parse_go_duration(args.prometheus_timeout))
    except DurationError:
        raise ReplayInputError(f"--prometheus-timeout: {flag_message(args.prometheus_timeout)}"
                               ) from None
    try:
        settings = prometheus_settings_from_args(args, headers=prometheus_headers(args),
                                                 timeout=timeout)
    except PrometheusConfigError as err:
        raise ReplayInputError(str(err)) from None
    _check_tls_files(ca_file=settings.ca_file, cert_file=settings.client_cert_file,
                     key_file=settings.client_key_file)

    def secret(flag: str, path: str) -> str:
        try:
            return read_text(path).strip()
        except FileError as err:
            raise ReplayInputError(f"{flag}: {err}") from None

    headers = dict(settings.headers)
    if settings.bearer_token_file:
        token = secret("--prometheus-token-file", settings.bearer_token_file)
        headers["Authorization"] = f"Bearer {token}"
    session = requests.Session()
    if settings.basic_auth_username and settings.basic_auth_password_file:
        session.auth = (settings.basic_auth_username,
                        secret("--prometheus-password-file", settings.basic_auth_password_file))
    session.verify = False if settings.insecure_skip_verify else (settings.ca_file or True)
    if settings.client_cert_file and settings.client_key_file:
        session.cert = (settings.client_cert_file, settings.client_key_file)
    return PrometheusConnect(url=settings.url, headers=headers or None, session=session,
                             disable_ssl=settings.insecure_skip_verify,
                             timeout=math.ceil(settings.timeout))


INSTALL_HINT = "pip install 'metricscale[replay]'"


def run(args: argparse.Namespace) -> int:
    try:  # the replay extra: not in the base install, nor in the container image
        import requests
        from prometheus_api_client.exceptions import PrometheusApiClientException
    except ImportError as err:
        missing = err.name.split(".")[0] if err.name else "prometheus-api-client"
        print(f"metricscale replay: needs the replay extra ({missing} is not installed): "
              f"{INSTALL_HINT}", file=sys.stderr)
        return EXIT_INVALID

    # Input the replay cannot use raises ReplayInputError: one line, exit 2 (cli/main.py).
    try:
        client = prometheus_client(args)
        output = replay(args, client)
    except PrometheusApiClientException as err:
        print(f"metricscale replay: Prometheus refused a query: {err}", file=sys.stderr)
        return EXIT_INVALID
    except requests.RequestException as err:
        print(f"metricscale replay: cannot reach Prometheus at {args.prometheus_url}: "
              f"{type(err).__name__}", file=sys.stderr)
        return EXIT_FAILED
    sys.stdout.write(output)
    return EXIT_OK
