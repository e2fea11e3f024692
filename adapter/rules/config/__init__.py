"""prometheus-adapter's configuration file, parsed strictly into immutable, compiled rules.

Strict like go-yaml v2's `UnmarshalStrict`: unknown keys, duplicate keys and wrong types are
errors, each reported with its field path (`rules[2].name.as`) and line. Then the checks
prometheus-adapter makes at startup (filters, regexes, `as`, templates) run on every rule, and
all problems are reported together. Scalars go into string fields as their source text, as
go-yaml does (`as: 123` is the string "123"). Things upstream accepts but that cannot work
(a rule without `seriesQuery` or `metricsQuery`) are errors too; things that are merely
suspicious are returned as warnings.

The values are in `values`, the YAML decoding in `nodes`, the sections in `backends` and
`sections`; everything a caller needs is importable from here.
"""

from __future__ import annotations

import re

import yaml

from adapter.rules.config.nodes import _child_path
from adapter.rules.config.sections import ConfigBuilder
from adapter.rules.config.values import (
    DEFAULT_BACKEND,
    AdapterConfig,
    BackendConfig,
    BackendHeader,
    ConfigError,
    ConfigIssue,
    DiscoveryRule,
    ResourceMappingConfig,
    ResourceRule,
    ResourceRules,
)
from metricscale.core.durations import parse_prometheus_duration

__all__ = [
    "DEFAULT_BACKEND",
    "AdapterConfig",
    "BackendConfig",
    "BackendHeader",
    "ConfigError",
    "ConfigIssue",
    "DiscoveryRule",
    "ResourceMappingConfig",
    "ResourceRule",
    "ResourceRules",
    "parse_config",
    "parse_prometheus_duration",
]


def parse_config(text: str) -> AdapterConfig:
    """Parse and check a whole configuration; raise ConfigError listing every problem."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        line = None if mark is None else mark.line + 1
        problem = " ".join(p for p in (error.context, error.problem) if p)
        raise ConfigError([ConfigIssue("", f"yaml: {problem}", line)]) from None
    except yaml.YAMLError as error:
        raise ConfigError([ConfigIssue("", f"yaml: {error}")]) from None
    except RecursionError:
        raise ConfigError([ConfigIssue("", "yaml: nested too deeply")]) from None
    unencodable = _surrogate_issues(root)
    if unencodable:
        # Reported alone: the other checks would quote these strings, which cannot be printed.
        raise ConfigError(unencodable)
    builder = ConfigBuilder()
    config = builder.config(root)
    if builder.issues:
        raise ConfigError(sorted(builder.issues, key=_issue_order))
    return config


_SURROGATE = re.compile("[\ud800-\udfff]")


def _surrogate_issues(root: yaml.Node | None) -> list[ConfigIssue]:
    """Every key or value holding a UTF-16 surrogate escape (`"\\ud800"`): YAML decodes it to a
    lone surrogate, which is not a character and cannot be encoded to send, log or print."""
    issues: list[ConfigIssue] = []
    seen: set[int] = set()  # anchors and aliases share nodes, and may loop
    pending: list[tuple[yaml.Node, str]] = [] if root is None else [(root, "")]
    while pending:
        node, path = pending.pop()
        if isinstance(node, yaml.ScalarNode):
            found = _SURROGATE.search(str(node.value))
            if found is not None:
                issues.append(ConfigIssue(
                    path, f"\\u{ord(found.group()):04x} is a UTF-16 surrogate escape, not a "
                    "character: write the character itself", node.start_mark.line + 1))
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            pending.extend((item, f"{path}[{index}]") for index, item in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                key = str(key_node.value) if isinstance(key_node, yaml.ScalarNode) else "?"
                # quote_go_string shows a surrogate as U+FFFD, so the path itself prints.
                child = _child_path(path, key)
                pending.extend([(value_node, child), (key_node, child)])
    return sorted(issues, key=_issue_order)


def _issue_order(issue: ConfigIssue) -> tuple[int, str]:
    return (issue.line or 0, issue.path)
