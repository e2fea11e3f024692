"""The default rule set: prometheus-adapter's `config-gen` rules, without the `job` surprise.

Rules 1-3 are config-gen's cAdvisor rules verbatim. Rules 4-6 are its general rules with one
change: config-gen maps labels with `template: <<.Resource>>`, which turns *every* label that
happens to be a resource name into a resource, including Prometheus' own scrape `job` label
(→ `jobs.batch`, prometheus-adapter issues #185, #123). Here the same resources are listed as
explicit `overrides` instead, and `job` is simply not among them. The `resourceRules` read
cAdvisor's series only (one scrape job serves pods and nodes), with the node name taken from
the `node` label, not `instance` (an IP:port on most setups: the usual `kubectl top nodes`
failure, prometheus-adapter issues #385, #549, #639).
"""

from __future__ import annotations

from adapter.rules.config import AdapterConfig, parse_config

__all__ = ["CONFIG_GEN_DEFAULTS_YAML", "DEFAULT_CONFIG_YAML", "configmap_yaml",
           "default_config"]

DEFAULT_CONFIG_YAML = """\
# metricscale default rules (prometheus-adapter config format).
rules:
# cAdvisor container counters in seconds: container_cpu_usage_seconds_total -> cpu_usage
- seriesQuery: '{__name__=~"^container_.*",container!="POD",namespace!="",pod!=""}'
  seriesFilters: []
  resources:
    overrides:
      namespace: {resource: namespace}
      pod: {resource: pod}
  name: {matches: ^container_(.*)_seconds_total$, as: ''}
  metricsQuery: sum(rate(<<.Series>>{<<.LabelMatchers>>,container!="POD"}[5m])) by (<<.GroupBy>>)
# other cAdvisor counters: container_network_receive_bytes_total -> network_receive_bytes
- seriesQuery: '{__name__=~"^container_.*",container!="POD",namespace!="",pod!=""}'
  seriesFilters: [{isNot: ^container_.*_seconds_total$}]
  resources:
    overrides:
      namespace: {resource: namespace}
      pod: {resource: pod}
  name: {matches: ^container_(.*)_total$, as: ''}
  metricsQuery: sum(rate(<<.Series>>{<<.LabelMatchers>>,container!="POD"}[5m])) by (<<.GroupBy>>)
# cAdvisor gauges: container_memory_working_set_bytes -> memory_working_set_bytes
- seriesQuery: '{__name__=~"^container_.*",container!="POD",namespace!="",pod!=""}'
  seriesFilters: [{isNot: ^container_.*_total$}]
  resources:
    overrides:
      namespace: {resource: namespace}
      pod: {resource: pod}
  name: {matches: ^container_(.*)$, as: ''}
  metricsQuery: sum(<<.Series>>{<<.LabelMatchers>>,container!="POD"}) by (<<.GroupBy>>)
# Gauges of every other namespaced series keep their name: queue_length -> queue_length
- seriesQuery: '{namespace!="",__name__!~"^container_.*"}'
  seriesFilters: [{isNot: .*_total$}]
  resources: &workload-labels
    # config-gen uses `template: <<.Resource>>` here; these overrides map the same labels
    # except Prometheus' scrape `job` label, which is not a batch Job.
    overrides:
      namespace: {resource: namespace}
      pod: {resource: pod}
      service: {resource: service}
      node: {resource: node}
      persistentvolumeclaim: {resource: persistentvolumeclaim}
      deployment: {group: apps, resource: deployment}
      statefulset: {group: apps, resource: statefulset}
      daemonset: {group: apps, resource: daemonset}
      replicaset: {group: apps, resource: replicaset}
      ingress: {group: networking.k8s.io, resource: ingress}
  name: {matches: '', as: ''}
  metricsQuery: sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)
# Counters lose _total and become rates: http_requests_total -> http_requests
- seriesQuery: '{namespace!="",__name__!~"^container_.*"}'
  seriesFilters: [{isNot: .*_seconds_total}]
  resources: *workload-labels
  name: {matches: ^(.*)_total$, as: ''}
  metricsQuery: sum(rate(<<.Series>>{<<.LabelMatchers>>}[5m])) by (<<.GroupBy>>)
# Counters in seconds lose _seconds_total: process_cpu_seconds_total -> process_cpu
- seriesQuery: '{namespace!="",__name__!~"^container_.*"}'
  seriesFilters: []
  resources: *workload-labels
  name: {matches: ^(.*)_seconds_total$, as: ''}
  metricsQuery: sum(rate(<<.Series>>{<<.LabelMatchers>>}[5m])) by (<<.GroupBy>>)
# External metrics are site-specific (queues, cloud services): add externalRules here, e.g.
# - seriesQuery: '{__name__="queue_consumer_lag",name!=""}'
#   resources: {overrides: {namespace: {resource: namespace}}}
#   metricsQuery: sum(<<.Series>>{<<.LabelMatchers>>}) by (name)
externalRules: []
# metrics.k8s.io (kubectl top, CPU and memory HPAs), all from cAdvisor's series (the kubelet's
# /metrics/cadvisor): containers by pod and container, minus the pause container (POD) and the
# pod-level cgroup (container=""); nodes from the root cgroup (id="/"), whose node name must be
# in a `node` label (see docs/reference/resource-rules.md, "The node name").
resourceRules:
  cpu:
    containerQuery: |
      sum by (<<.GroupBy>>) (
        rate(container_cpu_usage_seconds_total{<<.LabelMatchers>>,container!="",container!="POD"}[5m])
      )
    nodeQuery: |
      sum by (<<.GroupBy>>) (
        rate(container_cpu_usage_seconds_total{<<.LabelMatchers>>,id="/"}[5m])
      )
    resources:
      overrides:
        node: {resource: node}
        namespace: {resource: namespace}
        pod: {resource: pod}
    containerLabel: container
  memory:
    containerQuery: |
      sum by (<<.GroupBy>>) (
        container_memory_working_set_bytes{<<.LabelMatchers>>,container!="",container!="POD"}
      )
    nodeQuery: |
      sum by (<<.GroupBy>>) (
        container_memory_working_set_bytes{<<.LabelMatchers>>,id="/"}
      )
    resources:
      overrides:
        node: {resource: node}
        namespace: {resource: namespace}
        pod: {resource: pod}
    containerLabel: container
  window: 5m
"""


def default_config() -> AdapterConfig:
    """The default rules, parsed (they always parse; a test keeps it that way)."""
    return parse_config(DEFAULT_CONFIG_YAML)


_CONFIGMAP_HEAD = """\
# Generated from adapter/rules/defaults.py by `make manifests`: edit that file, not this one.
# The adapter's rules, in prometheus-adapter's configuration format (see docs/reference/rules.md).
apiVersion: v1
kind: ConfigMap
metadata:
  name: metricscale-adapter-config
  namespace: metricscale
  labels:
    app.kubernetes.io/name: metricscale-adapter
    app.kubernetes.io/part-of: metricscale
data:
  config.yaml: |
"""


def configmap_yaml() -> str:
    """manifests/adapter/configmap.yaml: the default rules, byte for byte, as a ConfigMap."""
    body = "".join(f"    {line}" if line.strip() else "\n"
                   for line in DEFAULT_CONFIG_YAML.splitlines(keepends=True))
    return _CONFIGMAP_HEAD + body


if __name__ == "__main__":
    print(configmap_yaml(), end="")


# prometheus-adapter's own `config-gen` output with no prefix (prometheus-adapter.md §3),
# verbatim: what most installations run. Not our default (see above); the compatibility tests
# and bench/adapter.py's discovery pass use it to measure against the real thing.
CONFIG_GEN_DEFAULTS_YAML = """
rules:
- seriesQuery: '{__name__=~"^container_.*",container!="POD",namespace!="",pod!=""}'
  seriesFilters: []
  resources: {overrides: {namespace: {resource: namespace}, pod: {resource: pod}}}
  name: {matches: ^container_(.*)_seconds_total$, as: ''}
  metricsQuery: sum(rate(<<.Series>>{<<.LabelMatchers>>,container!="POD"}[5m])) by (<<.GroupBy>>)
- seriesQuery: '{__name__=~"^container_.*",container!="POD",namespace!="",pod!=""}'
  seriesFilters: [{isNot: ^container_.*_seconds_total$}]
  resources: {overrides: {namespace: {resource: namespace}, pod: {resource: pod}}}
  name: {matches: ^container_(.*)_total$, as: ''}
  metricsQuery: sum(rate(<<.Series>>{<<.LabelMatchers>>,container!="POD"}[5m])) by (<<.GroupBy>>)
- seriesQuery: '{__name__=~"^container_.*",container!="POD",namespace!="",pod!=""}'
  seriesFilters: [{isNot: ^container_.*_total$}]
  resources: {overrides: {namespace: {resource: namespace}, pod: {resource: pod}}}
  name: {matches: ^container_(.*)$, as: ''}
  metricsQuery: sum(<<.Series>>{<<.LabelMatchers>>,container!="POD"}) by (<<.GroupBy>>)
- seriesQuery: '{namespace!="",__name__!~"^container_.*"}'
  seriesFilters: [{isNot: .*_total$}]
  resources: {template: <<.Resource>>}
  name: {matches: '', as: ''}
  metricsQuery: sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)
- seriesQuery: '{namespace!="",__name__!~"^container_.*"}'
  seriesFilters: [{isNot: .*_seconds_total}]
  resources: {template: <<.Resource>>}
  name: {matches: ^(.*)_total$, as: ''}
  metricsQuery: sum(rate(<<.Series>>{<<.LabelMatchers>>}[5m])) by (<<.GroupBy>>)
- seriesQuery: '{namespace!="",__name__!~"^container_.*"}'
  seriesFilters: []
  resources: {template: <<.Resource>>}
  name: {matches: ^(.*)_seconds_total$, as: ''}
  metricsQuery: sum(rate(<<.Series>>{<<.LabelMatchers>>}[5m])) by (<<.GroupBy>>)
"""
