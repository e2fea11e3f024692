"""Labels ↔ resources: the catalog as REST mapper, overrides, templates, a deterministic choice."""

from __future__ import annotations

import re

import pytest

from adapter.rules.resources import (
    GroupResource,
    LabelTemplateError,
    NoLabelForResourceError,
    ResourceCatalog,
    ResourceMapper,
    UnknownResourceError,
    builtin_catalog,
    compile_label_template,
)

CATALOG = ResourceCatalog.from_discovery([
    {"groupVersion": "v1", "resources": [
        {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod"},
        {"name": "pods/status", "singularName": "", "namespaced": True, "kind": "Pod"},
        {"name": "nodes", "singularName": "", "namespaced": False, "kind": "Node"},
        {"name": "namespaces", "singularName": "namespace", "namespaced": False,
         "kind": "Namespace"},
        {"name": "events", "singularName": "event", "namespaced": True, "kind": "Event"},
    ]},
    {"groupVersion": "apps/v1", "resources": [
        {"name": "deployments", "singularName": "deployment", "namespaced": True,
         "kind": "Deployment"},
    ]},
    {"groupVersion": "apps/v1beta2", "resources": [
        {"name": "deployments", "singularName": "deployment", "namespaced": True,
         "kind": "Deployment"},
    ]},
    {"groupVersion": "events.k8s.io/v1", "resources": [
        {"name": "events", "singularName": "event", "namespaced": True, "kind": "Event"},
    ]},
    {"groupVersion": "metrics.k8s.io/v1beta1", "resources": [
        {"name": "pods", "singularName": "", "namespaced": True, "kind": "PodMetrics"},
    ]},
])


@pytest.mark.parametrize(("written", "found"), [
    (GroupResource("pods"), GroupResource("pods")),
    (GroupResource("pod"), GroupResource("pods")),
    (GroupResource("Pods"), GroupResource("pods")),
    (GroupResource("Namespaces"), GroupResource("namespaces")),
    (GroupResource("deployment", "apps"), GroupResource("deployments", "apps")),
    (GroupResource("deployments"), GroupResource("deployments", "apps")),
    (GroupResource("Deployment"), GroupResource("deployments", "apps")),  # kind
    (GroupResource("events"), GroupResource("events")),  # core wins: first in discovery
    (GroupResource("events", "events.k8s.io"), GroupResource("events", "events.k8s.io")),
    (GroupResource("pods", "metrics.k8s.io"), GroupResource("pods", "metrics.k8s.io")),
    (GroupResource("node"), GroupResource("nodes")),  # singular from the kind when unset
    (GroupResource("deployments", "extensions"), None),
    (GroupResource("status"), None),  # subresources are not resources
    (GroupResource("gizmos"), None),
])
def test_catalog_normalises_like_the_rest_mapper(written: GroupResource,
                                                 found: GroupResource | None) -> None:
    info = CATALOG.find(written)
    assert (info.group_resource if info else None) == found


def test_first_version_of_a_group_resource_is_kept() -> None:
    info = CATALOG.info(GroupResource("deployments", "apps"))
    assert info is not None and info.version == "v1" and info.api_version == "apps/v1"
    core = CATALOG.info(GroupResource("pods"))
    assert core is not None and core.api_version == "v1"


def test_singularizer_and_normalize_errors() -> None:
    assert CATALOG.singular("deployments") == "deployment"
    assert CATALOG.singular("nodes") == "node"
    with pytest.raises(UnknownResourceError):
        CATALOG.singular("gizmos")
    with pytest.raises(UnknownResourceError):
        CATALOG.normalize(GroupResource("gizmos"))


def test_builtin_catalog_knows_the_common_resources() -> None:
    catalog = builtin_catalog()
    for written in ("pod", "service", "namespace", "node", "deployment.apps", "job.batch",
                    "ingress.networking.k8s.io", "storageclass.storage.k8s.io"):
        assert catalog.find(GroupResource.parse(written)) is not None, written


@pytest.mark.parametrize(("text", "resource"), [
    ("pods", GroupResource("pods")),
    ("deployments.apps", GroupResource("deployments", "apps")),
    ("ingresses.networking.k8s.io", GroupResource("ingresses", "networking.k8s.io")),
])
def test_group_resource_parse_and_print(text: str, resource: GroupResource) -> None:
    assert GroupResource.parse(text) == resource and str(resource) == text


def mapper(*, template: str | None = None,
           overrides: tuple[tuple[str, GroupResource], ...] = ()) -> ResourceMapper:
    return ResourceMapper.build(template=compile_label_template(template) if template else None,
                                overrides=overrides, catalog=CATALOG)


def test_two_overrides_for_one_resource_query_the_lexically_first_label() -> None:
    for order in ((("node", GroupResource("node")), ("instance", GroupResource("nodes"))),
                  (("instance", GroupResource("nodes")), ("node", GroupResource("node")))):
        both = mapper(overrides=order)
        assert both.label_for_resource(GroupResource("nodes")) == "instance"
        assert both.resource_for_label("node") == both.resource_for_label("instance") == \
            GroupResource("nodes")


def test_overrides_come_before_the_template() -> None:
    mixed = mapper(template="<<.Resource>>",
                   overrides=(("kubernetes_pod_name", GroupResource("pod")),))
    assert mixed.label_for_resource(GroupResource("pods")) == "kubernetes_pod_name"
    assert mixed.label_for_resource(GroupResource("namespaces")) == "namespace"
    assert mixed.resource_for_label("pod") == GroupResource("pods")


def test_template_renders_the_singular_and_a_sanitised_group() -> None:
    grouped = mapper(template="<<.Group>>__<<.Resource>>")
    assert grouped.label_for_resource(GroupResource("events", "events.k8s.io")) == \
        "events_k8s_io__event"


def test_no_template_and_no_override_has_no_label() -> None:
    with pytest.raises(NoLabelForResourceError, match="no generic resource label form"):
        mapper().label_for_resource(GroupResource("pods"))


def test_resources_for_labels_reports_upstreams_namespaced_flag() -> None:
    plain = mapper(template="<<.Resource>>")
    assert plain.resources_for_labels({"pod", "namespace", "instance"}) == (
        (GroupResource("namespaces"), GroupResource("pods")), True)
    assert plain.resources_for_labels({"node"}) == ((GroupResource("nodes"),), False)
    assert plain.resources_for_labels({"node", "le"}) == ((GroupResource("nodes"),), False)
    assert mapper().resources_for_labels({"node"}) == ((), True)


@pytest.mark.parametrize(("template", "message"), [
    ("<<.Group>>", "must include at least `{{.Resource}}` in the label template"),
    ("<<.Resource", 'unable to parse label template "<<.Resource": template: resource-label:1: '
                    "unclosed action"),
    ("<<.Nope>>_<<.Resource>>", "can't evaluate field Nope in type schema.GroupResource"),
    ("(<<.Resource>>", "error parsing regexp: missing closing )"),
    ("<<if false>>x<<end>>", "empty template"),
])
def test_label_templates_upstream_refuses(template: str, message: str) -> None:
    with pytest.raises(LabelTemplateError, match=re.escape(message)):
        compile_label_template(template)
