"""The configuration's rule sections (`rules`, `externalRules`, `resourceRules`) and the whole
file, each rule checked as prometheus-adapter checks it at start-up."""

from __future__ import annotations

import re

import yaml

from adapter.rules.config.backends import _BackendSections
from adapter.rules.config.nodes import _child_path, _is_null
from adapter.rules.config.values import (
    AdapterConfig,
    DiscoveryRule,
    ResourceMappingConfig,
    ResourceRule,
    ResourceRules,
)
from adapter.rules.naming import NameMatcher, NamingError, SeriesFilter, make_series_filter
from adapter.rules.resources import (
    NAMESPACES,
    NODES,
    PODS,
    GroupResource,
    LabelTemplateError,
    NoLabelForResourceError,
    ResourceMapper,
    builtin_catalog,
    compile_label_template,
    is_promql_label_name,
)
from adapter.rules.templating import Template, TemplateSyntaxError, parse_template
from metricscale.core.durations import parse_prometheus_duration
from metricscale.core.selectors import quote_go_string

__all__ = ["ConfigBuilder"]

_RULE_FIELDS = ("seriesQuery", "seriesFilters", "resources", "name", "metricsQuery", "backend")
_RESOURCE_FIELDS = ("template", "overrides", "namespaced")
_RESOURCE_RULE_FIELDS = ("containerQuery", "nodeQuery", "resources", "containerLabel",
                         "backend")
_EQUALITY_WITH_REGEX = re.compile(r'__name__\s*!?=\s*"[^"]*[\^$*+?()\[\]|\\]')


class ConfigBuilder(_BackendSections):
    """Builds an AdapterConfig from the YAML tree, collecting every issue and warning."""

    def config(self, root: yaml.Node | None) -> AdapterConfig:
        top = self.decoder.mapping(root, "", "config.MetricsDiscoveryConfig",
                                   ("rules", "externalRules", "resourceRules", "backends"))
        if top is None:
            return AdapterConfig()
        backends = self.backends(top.get("backends"))
        rules = self.rules(top.get("rules"), "rules")
        external = self.rules(top.get("externalRules"), "externalRules")
        resource_rules = None
        if not _is_null(top.get("resourceRules")):
            resource_rules = self.resource_rules(top["resourceRules"])
        self.check_backend_uses(backends, top.get("backends"))
        return AdapterConfig(rules, external, resource_rules, tuple(self.warnings),
                             tuple(b for b in backends if b is not None))

    def rules(self, node: yaml.Node | None, section: str) -> tuple[DiscoveryRule, ...]:
        built: list[DiscoveryRule] = []
        for index, item in enumerate(self.decoder.sequence(node, section,
                                                           "[]config.DiscoveryRule")):
            rule = self.rule(item, section, index)
            if rule is not None:
                built.append(rule)
        return tuple(built)

    def rule(self, node: yaml.Node, section: str, index: int) -> DiscoveryRule | None:
        path = f"{section}[{index}]"
        before = len(self.issues)
        fields = self.decoder.mapping(node, path, "config.DiscoveryRule", _RULE_FIELDS)
        if fields is None:
            return None
        string = self.decoder.string
        series_query = string(fields.get("seriesQuery"), f"{path}.seriesQuery")
        if not series_query.strip() and "seriesQuery" not in fields:
            self.decoder.issue(f"{path}.seriesQuery", "required: the series selector that "
                               "discovery sends to /api/v1/series", node)
        elif not series_query.strip():
            self.decoder.issue(f"{path}.seriesQuery", "must not be empty", fields["seriesQuery"])
        elif _EQUALITY_WITH_REGEX.search(series_query):
            self.warn(f"{path}.seriesQuery", "__name__ is compared with = or != against a "
                      "value that looks like a regex; use =~ or !~", fields["seriesQuery"])
        filters = self.series_filters(fields.get("seriesFilters"), f"{path}.seriesFilters")
        resources = self.resources(fields.get("resources"), f"{path}.resources")
        name_fields = self.decoder.mapping(fields.get("name"), f"{path}.name",
                                           "config.NameMapping", ("matches", "as")) or {}
        matches = string(name_fields.get("matches"), f"{path}.name.matches")
        as_ = string(name_fields.get("as"), f"{path}.name.as")
        metrics_query = string(fields.get("metricsQuery"), f"{path}.metricsQuery")
        backend = self.rule_backend(fields, path)
        name = self.name_matcher(matches, as_, series_query, path, name_fields)
        template = self.metrics_template(metrics_query, f"{path}.metricsQuery",
                                         fields.get("metricsQuery") or node)
        if name is None or template is None or filters is None or resources is None \
                or len(self.issues) > before:
            return None
        rule = DiscoveryRule(section, index, series_query, filters, resources, matches, as_,
                             name, metrics_query, template, backend)
        self.rule_warnings(rule, fields, node)
        return rule

    def rule_warnings(self, rule: DiscoveryRule, fields: dict[str, yaml.Node],
                      node: yaml.Node) -> None:
        path = rule.path
        if rule.section == "rules":
            if rule.resources.is_empty:
                self.warn(f"{path}.resources", "maps no label to a resource (no template, no "
                          "overrides), so this rule never lists a metric", node)
            if rule.resources.namespaced is not None:
                self.warn(f"{path}.resources.namespaced", "has no effect on rules; it only "
                          "applies to externalRules", fields.get("resources"))
        elif rule.namespaced and rule.resources.label_template is None and not any(
                resource.resource.lower() in ("namespace", "namespaces")
                and not resource.group for _, resource in rule.resources.overrides):
            self.warn(f"{path}.resources", "no label maps to namespaces, so every request of "
                      "this external rule fails; add an override such as "
                      "`namespace: {resource: namespace}` or set `namespaced: false`",
                      fields.get("resources") or node)

    def series_filters(self, node: yaml.Node | None,
                       path: str) -> tuple[SeriesFilter, ...] | None:
        filters: list[SeriesFilter] = []
        ok = True
        for index, item in enumerate(self.decoder.sequence(node, path, "[]config.RegexFilter")):
            item_path = f"{path}[{index}]"
            before = len(self.issues)
            fields = self.decoder.mapping(item, item_path, "config.RegexFilter", ("is", "isNot"))
            if fields is None or len(self.issues) > before:
                ok = False
                continue
            is_ = self.decoder.string(fields.get("is"), f"{item_path}.is")
            is_not = self.decoder.string(fields.get("isNot"), f"{item_path}.isNot")
            try:
                filters.append(make_series_filter(is_=is_, is_not=is_not))
            except NamingError as error:
                self.decoder.issue(item_path, str(error), item)
                ok = False
        return tuple(filters) if ok else None

    def resources(self, node: yaml.Node | None, path: str) -> ResourceMappingConfig | None:
        before = len(self.issues)
        fields = self.decoder.mapping(node, path, "config.ResourceMapping", _RESOURCE_FIELDS)
        if fields is None:
            return None
        template = self.decoder.string(fields.get("template"), f"{path}.template")
        namespaced = self.decoder.boolean(fields.get("namespaced"), f"{path}.namespaced")
        overrides: list[tuple[str, GroupResource]] = []
        override_map = self.decoder.mapping(fields.get("overrides"), f"{path}.overrides",
                                            "map[string]config.GroupResource", None) or {}
        for label, value in override_map.items():
            item_path = _child_path(f"{path}.overrides", label)
            entry = self.decoder.mapping(value, item_path, "config.GroupResource",
                                         ("group", "resource"))
            if entry is None:
                continue
            group = self.decoder.string(entry.get("group"), f"{item_path}.group")
            resource = self.decoder.string(entry.get("resource"), f"{item_path}.resource")
            if not is_promql_label_name(label):
                self.decoder.issue(item_path, f"{quote_go_string(label)} is not a valid "
                                   "Prometheus label name", value)
            if not resource:
                self.decoder.issue(f"{item_path}.resource", "required: the resource this label "
                                   "names (e.g. pod, deployment)", value)
            overrides.append((label, GroupResource(resource, group)))
        label_template = None
        if template:
            try:
                label_template = compile_label_template(template)
            except LabelTemplateError as error:
                self.decoder.issue(f"{path}.template", str(error), fields.get("template"))
        if len(self.issues) > before:
            return None
        return ResourceMappingConfig(template, label_template, tuple(overrides), namespaced)

    def name_matcher(self, matches: str, as_: str, series_query: str, path: str,
                     fields: dict[str, yaml.Node]) -> NameMatcher | None:
        try:
            return NameMatcher.from_config(matches=matches, as_=as_, series_query=series_query)
        except NamingError as error:
            where = "as" if str(error).startswith("must specify") else "matches"
            self.decoder.issue(f"{path}.name.{where}", str(error),
                               fields.get(where) or fields.get("matches"))
            return None

    def metrics_template(self, source: str, path: str, node: yaml.Node | None,
                         *, required: bool = True) -> Template | None:
        if not source and required:
            self.decoder.issue(path, "required: the PromQL template each request renders "
                               "(prometheus-adapter has no default and fails every request)",
                               node)
            return None
        try:
            return parse_template(source, name="metrics-query")
        except TemplateSyntaxError as error:
            self.decoder.issue(path, f"unable to parse metrics query template "
                               f"{quote_go_string(source)}: {error}", node)
            return None

    def resource_rules(self, node: yaml.Node) -> ResourceRules | None:
        path = "resourceRules"
        fields = self.decoder.mapping(node, path, "config.ResourceRules",
                                      ("cpu", "memory", "window"))
        if fields is None:
            return None
        rules: list[ResourceRule | None] = []
        for key in ("cpu", "memory"):
            if _is_null(fields.get(key)):
                self.decoder.issue(f"{path}.{key}", "required: containerQuery, nodeQuery, "
                                   "resources and containerLabel", fields.get(key) or node)
                rules.append(None)
            else:
                rules.append(self.resource_rule(fields[key], f"{path}.{key}", node))
        cpu, memory = rules
        window = self.decoder.string(fields.get("window"), f"{path}.window")
        milliseconds = 0
        try:
            milliseconds = parse_prometheus_duration(window) if window else 0
        except ValueError as error:
            self.decoder.issue(f"{path}.window", str(error), fields.get("window"))
            return None
        if cpu is None or memory is None:
            return None
        return ResourceRules(cpu, memory, window, milliseconds)

    def resource_rule(self, node: yaml.Node | None, path: str,
                      parent: yaml.Node) -> ResourceRule | None:
        before = len(self.issues)
        fields = self.decoder.mapping(node, path, "config.ResourceRule", _RESOURCE_RULE_FIELDS)
        if fields is None:
            return None
        string = self.decoder.string
        container_query = string(fields.get("containerQuery"), f"{path}.containerQuery")
        node_query = string(fields.get("nodeQuery"), f"{path}.nodeQuery")
        container_label = string(fields.get("containerLabel"), f"{path}.containerLabel")
        backend = self.rule_backend(fields, path)
        resources = self.resources(fields.get("resources"), f"{path}.resources")
        container_template = self.metrics_template(
            container_query, f"{path}.containerQuery", fields.get("containerQuery") or parent)
        node_template = self.metrics_template(node_query, f"{path}.nodeQuery",
                                              fields.get("nodeQuery") or parent)
        if resources is not None and resources.is_empty:
            self.decoder.issue(f"{path}.resources", "required: map the pods, nodes and "
                               "namespaces resources to labels (overrides or a template)",
                               fields.get("resources") or parent)
        if not container_label:
            self.warn(f"{path}.containerLabel", "empty: pod metrics cannot be split into "
                      "containers", fields.get("containerLabel") or parent)
        if resources is not None and not resources.is_empty:
            mapper = ResourceMapper.build(template=resources.label_template,
                                          overrides=resources.overrides,
                                          catalog=builtin_catalog())
            for resource in (PODS, NODES, NAMESPACES):
                try:
                    label = mapper.label_for_resource(resource)
                except NoLabelForResourceError as error:
                    self.decoder.issue(f"{path}.resources", str(error),
                                       fields.get("resources") or parent)
                    continue
                if not is_promql_label_name(label):
                    self.decoder.issue(f"{path}.resources", f"{resource} maps to "
                                       f"{quote_go_string(label)}, which is not a valid "
                                       "Prometheus label name", fields.get("resources") or parent)
        if container_label and not is_promql_label_name(container_label):
            self.decoder.issue(f"{path}.containerLabel", f"{quote_go_string(container_label)} "
                               "is not a valid Prometheus label name",
                               fields.get("containerLabel") or parent)
        if len(self.issues) > before or resources is None or container_template is None \
                or node_template is None:
            return None
        return ResourceRule(container_query, container_template, node_query, node_template,
                            resources, container_label, backend)
