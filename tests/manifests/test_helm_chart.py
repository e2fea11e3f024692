"""charts/metricscale: lint, schemas, and the same objects as `kubectl apply -k manifests`.

With the default values and with the values equivalent to each kustomize component, `helm
template` renders exactly what kustomize renders, apart from the labels Helm adds and the
differences listed in INTENDED (each with its reason). The chart's generated files (the default
rules, the CRD, the values table of docs/helm.md) must match what `make chart` writes.
"""

from __future__ import annotations

import base64
import copy
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import kubernetes_validate
import pytest
import yaml

from adapter.rules.config import parse_config
from adapter.rules.defaults import DEFAULT_CONFIG_YAML
from cli import certs
from cli.certs import CertsOptions, ensure_certificates
from testbed.binaries import find_peer
from testbed.pytest_plugin import require_peers

# helm and kubectl are peers (tests/peers/bin): these run after `make peers`, in its stage.
pytestmark = pytest.mark.peers

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "metricscale"
MANIFESTS = REPO / "manifests"
NAMESPACE = "metricscale"
RELEASE = "metricscale"
# `helm template` renders for this cluster version (the pinned kube-apiserver's); the schemas
# are those of the oldest Kubernetes we support, as in tests/manifests/test_manifests.py.
KUBE_VERSION = "1.36.3"
SCHEMA_VERSION = "1.32"
# What Helm adds to every object of a release, and kustomize cannot.
HELM_LABELS = {"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance"}
# Kinds of CRDs that are not the Kubernetes schema's (cert-manager's, prometheus-operator's).
FOREIGN_GROUPS = ("cert-manager.io/", "monitoring.coreos.com/")

Obj = dict[str, Any]
Key = tuple[str, str, str]


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("chart_generate", REPO / "charts" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


generate = load_generator()


# ----------------------------------------------------------------------------- running tools


def run(argv: list[str], *, env: dict[str, str] | None = None,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120,
                            env=env)
    if check:
        assert result.returncode == 0, f"{' '.join(argv)}:\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def helm_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Helm's cache, configuration and data in a directory of the test's own."""
    require_peers("helm", "kubectl")
    home = tmp_path_factory.mktemp("helm-home")
    return {**os.environ, "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data")}


def helm(env: dict[str, str], *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run([str(find_peer("helm")), *args], env=env, check=check)


def documents(text: str) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def write_values(directory: Path, values: Obj) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"values-{len(list(directory.glob('values-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def helm_template(env: dict[str, str], values: Obj, directory: Path,
                  *extra: str) -> list[Obj]:
    rendered = helm(env, "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                    "--kube-version", KUBE_VERSION, "--include-crds",
                    "--values", str(write_values(directory, values)), *extra)
    return documents(rendered.stdout)


def helm_template_fails(env: dict[str, str], values: Obj, directory: Path) -> str:
    rendered = helm(env, "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                    "--kube-version", KUBE_VERSION,
                    "--values", str(write_values(directory, values)), check=False)
    assert rendered.returncode != 0, "rendered, but should have failed"
    return rendered.stderr


def kustomize(directory: Path) -> list[Obj]:
    return documents(run([str(find_peer("kubectl")), "kustomize", str(directory)]).stdout)


def user_manifests(directory: Path, *components: str) -> Path:
    """A copy of manifests/ with `components` listed in its kustomization.yaml, as a user
    enables them (the base's labels then reach the components' objects too)."""
    manifests = directory / "manifests"
    if not manifests.exists():
        shutil.copytree(MANIFESTS, manifests,
                        ignore=shutil.ignore_patterns(certs.CA_BUNDLE_PATCH))
    kustomization = manifests / "kustomization.yaml"
    text = kustomization.read_text()
    assert "\ncomponents:" not in text
    if components:
        kustomization.write_text(text + "components:\n" + "".join(
            f"  - components/{name}\n" for name in components))
    return manifests


# ----------------------------------------------------------------------------- comparing


def key(obj: Obj) -> Key:
    metadata = obj["metadata"]
    return obj["kind"], metadata.get("namespace", ""), metadata["name"]


def without_helm_labels(obj: Obj) -> Obj:
    obj = copy.deepcopy(obj)
    holders = [obj["metadata"]]
    template = (obj.get("spec") or {}).get("template")
    if isinstance(template, dict) and "metadata" in template:
        holders.append(template["metadata"])
    for metadata in holders:
        for label in HELM_LABELS:
            (metadata.get("labels") or {}).pop(label, None)
    return obj


def decoded(obj: Obj) -> Obj:
    """A Secret's data as bytes: kustomize wraps long base64 lines, which the API server (Go's
    decoder) reads the same."""
    if obj["kind"] == "Secret" and "data" in obj:
        obj = {**obj, "data": {name: base64.b64decode(value)
                               for name, value in obj["data"].items()}}
    return obj


def by_key(objects: list[Obj]) -> dict[Key, Obj]:
    keyed = {key(obj): decoded(obj) for obj in objects}
    assert len(keyed) == len(objects), "two objects with one kind, namespace and name"
    return keyed


# The differences we chose, applied to what kustomize renders to get what Helm must render.
def no_namespace_object(objects: dict[Key, Obj]) -> None:
    """Helm stores the release in its namespace before it creates any object, so the namespace
    exists first (`kubectl create namespace`, or `helm install --create-namespace`): a chart
    that also made it would fail on it. docs/helm.md says how to label it `restricted`."""
    del objects[("Namespace", "", NAMESPACE)]


def ca_beside_the_tls_pair(objects: dict[Key, Obj]) -> None:
    """With tls.*, the chart has the CA too: it goes into the serving Secret as ca.crt, and the
    adapter's ServiceMonitor verifies against it, where certs-files leaves the user to create
    the Secret metricscale-serving-ca by hand."""
    secret = objects[("Secret", NAMESPACE, certs.SECRET_NAME)]
    secret["data"]["ca.crt"] = base64.b64decode(
        objects[("APIService", "", "v1beta1.external.metrics.k8s.io")]["spec"]["caBundle"])
    monitor = objects.get(("ServiceMonitor", NAMESPACE, "metricscale-adapter"))
    if monitor is not None:
        monitor["spec"]["endpoints"][0]["tlsConfig"]["ca"]["secret"]["name"] = certs.SECRET_NAME


INTENDED: dict[str, Callable[[dict[Key, Obj]], None]] = {
    "no Namespace object": no_namespace_object,
    "ca.crt in the tls Secret": ca_beside_the_tls_pair,
}


def assert_same_objects(kustomized: list[Obj], helmed: list[Obj], *intended: str) -> None:
    expected = by_key(kustomized)
    for name in ("no Namespace object", *intended):
        INTENDED[name](expected)
    actual = {k: without_helm_labels(obj) for k, obj in by_key(helmed).items()}
    assert sorted(actual) == sorted(expected), "the charts' objects are not kustomize's"
    for k, obj in expected.items():
        assert actual[k] == obj, f"{k} differs:\n{yaml.safe_dump(actual[k])}"


def validate(objects: list[Obj]) -> None:
    for obj in objects:
        if obj["apiVersion"].startswith(FOREIGN_GROUPS):
            continue
        kubernetes_validate.validate(obj, SCHEMA_VERSION, strict=True)


# ----------------------------------------------------------------------------- the object sets

COMPONENT_VALUES: list[tuple[str, tuple[str, ...], Obj]] = [
    ("default", (), {}),
    ("resource-metrics", ("resource-metrics",), {"resourceMetrics": {"enabled": True}}),
    ("servicemonitors", ("servicemonitors",), {"serviceMonitors": {"enabled": True}}),
    ("cert-manager", ("cert-manager",), {"certificates": {"mode": "cert-manager"}}),
    ("cert-manager as prometheus-adapter's chart says it", ("cert-manager",),
     {"certManager": {"enabled": True}}),
    ("all three", ("resource-metrics", "servicemonitors", "cert-manager"),
     {"resourceMetrics": {"enabled": True}, "serviceMonitors": {"enabled": True},
      "certificates": {"mode": "cert-manager"}}),
]


@pytest.mark.parametrize(("components", "values"), [(c, v) for _, c, v in COMPONENT_VALUES],
                         ids=[name for name, _, _ in COMPONENT_VALUES])
def test_chart_renders_what_kustomize_renders_with_the_same_components(
        helm_env: dict[str, str], tmp_path: Path, components: tuple[str, ...],
        values: Obj) -> None:
    kustomized = kustomize(user_manifests(tmp_path, *components))
    helmed = helm_template(helm_env, values, tmp_path)
    assert_same_objects(kustomized, helmed)
    validate(helmed)


@pytest.fixture
def certs_checkout(tmp_path: Path) -> Path:
    """manifests/ and a certs/ made by `metricscale certs`, as the certs-files user has them."""
    user_manifests(tmp_path)
    ensure_certificates(CertsOptions(directory=tmp_path / "certs",
                                     manifests=tmp_path / "manifests/components/certs-files"),
                        now=datetime.now(UTC))
    return tmp_path


@pytest.mark.parametrize("switch", [{"certificates": {"mode": "tls"}}, {"tls": {"enable": True}}],
                         ids=["certificates.mode", "tls.enable"])
def test_tls_values_render_what_the_certs_files_component_renders(
        helm_env: dict[str, str], certs_checkout: Path, switch: Obj) -> None:
    made = certs_checkout / "certs"
    components = ("resource-metrics", "servicemonitors", "certs-files")
    kustomized = kustomize(user_manifests(certs_checkout, *components))
    tls = {"ca": (made / certs.CA_CERT).read_text(),
           "certificate": (made / certs.SERVING_CERT).read_text(),
           "key": (made / certs.SERVING_KEY).read_text()}
    values = {"resourceMetrics": {"enabled": True}, "serviceMonitors": {"enabled": True},
              **switch}
    values["tls"] = {**values.get("tls", {}), **tls}
    helmed = helm_template(helm_env, values, certs_checkout)
    assert_same_objects(kustomized, helmed, "ca.crt in the tls Secret")
    validate(helmed)


def test_native_hpa_value_renders_the_commented_out_rbac_and_its_flag(
        helm_env: dict[str, str], tmp_path: Path) -> None:
    manifests = user_manifests(tmp_path)
    autoscaler = manifests / "autoscaler" / "kustomization.yaml"
    text = autoscaler.read_text()
    commented = "  # - native-hpa-rbac.yaml\n"
    assert commented in text
    autoscaler.write_text(text.replace(commented, commented.replace("# ", "")))
    flag = [{"op": "add", "path": "/spec/template/spec/containers/0/args/-",
             "value": "--enable-native-hpa"}]
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump({
        "resources": ["../manifests"],
        "patches": [{"target": {"kind": "Deployment", "name": "metricscale-autoscaler"},
                     "patch": json.dumps(flag)}]}))
    kustomized = kustomize(overlay)
    helmed = helm_template(helm_env, {"autoscaler": {"nativeHPA": True}}, tmp_path)
    assert_same_objects(kustomized, helmed)


# ----------------------------------------------------------------------------- lint, schemas


LINTED_VALUES: list[tuple[str, Obj]] = [
    ("default", {}),
    ("everything on", {"resourceMetrics": {"enabled": True}, "serviceMonitors": {"enabled": True},
                       "certificates": {"mode": "cert-manager"},
                       "autoscaler": {"nativeHPA": True}}),
    ("autoscaler off", {"autoscaler": {"enabled": False}}),
    ("the test bed's", {"replicas": 0, "autoscaler": {"replicas": 0},
                        "service": {"type": "ExternalName", "externalName": "localhost",
                                    "port": 16443}}),
]


@pytest.mark.parametrize("values", [v for _, v in LINTED_VALUES],
                         ids=[name for name, _ in LINTED_VALUES])
def test_helm_lint_strict_passes(helm_env: dict[str, str], tmp_path: Path, values: Obj) -> None:
    linted = helm(helm_env, "lint", "--strict", "--kube-version", KUBE_VERSION,
                  "--namespace", NAMESPACE, str(CHART),
                  "--values", str(write_values(tmp_path, values)))
    assert "0 chart(s) failed" in linted.stdout


@pytest.mark.parametrize("values", [v for _, v in LINTED_VALUES],
                         ids=[name for name, _ in LINTED_VALUES])
def test_every_rendered_object_is_valid_for_the_pinned_kubernetes(
        helm_env: dict[str, str], tmp_path: Path, values: Obj) -> None:
    validate(helm_template(helm_env, values, tmp_path))


def test_the_crd_is_the_manifests_crd_and_a_valid_crd(helm_env: dict[str, str],
                                                       tmp_path: Path) -> None:
    (crd,) = [obj for obj in helm_template(helm_env, {}, tmp_path)
              if obj["kind"] == "CustomResourceDefinition"]
    kubernetes_validate.validate(crd, SCHEMA_VERSION, strict=True)
    (kustomized,) = [obj for obj in kustomize(MANIFESTS)
                     if obj["kind"] == "CustomResourceDefinition"]
    assert crd == kustomized


# ----------------------------------------------------------------------------- generated files


def test_generated_files_are_what_make_chart_writes() -> None:
    for path, text in generate.generated().items():
        assert path.read_text() == text, f"{path.relative_to(REPO)} is stale: run `make chart`"


def test_default_rules_file_is_the_manifests_configmap_data() -> None:
    configmap = yaml.safe_load((MANIFESTS / "adapter" / "configmap.yaml").read_text())
    assert generate.DEFAULT_RULES.read_text() == configmap["data"]["config.yaml"]
    assert generate.DEFAULT_RULES.read_text() == DEFAULT_CONFIG_YAML


def test_values_table_has_a_row_for_every_key_a_user_sets() -> None:
    values = yaml.safe_load(generate.VALUES.read_text())
    documented = {row.key for row in generate.documented_rows(generate.VALUES.read_text())}

    def leaves(node: Any, path: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
        if isinstance(node, dict) and node and ".".join(path) not in documented:
            for name, child in node.items():
                yield from leaves(child, (*path, name))
        else:
            yield path

    undocumented = [".".join(path) for path in leaves(values, ())
                    if not any(".".join(path[:i]) in documented for i in range(1, len(path) + 1))]
    assert undocumented == []


def test_chart_version_is_the_projects_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"] == chart["version"] == project
    assert generate.kustomize_labels()["app.kubernetes.io/version"] == project


# ----------------------------------------------------------------------------- values


def configmap_config(objects: list[Obj]) -> Obj:
    (configmap,) = [obj for obj in objects if obj["kind"] == "ConfigMap"]
    text = configmap["data"]["config.yaml"]
    assert parse_config(text).warnings == ()
    parsed: Obj = yaml.safe_load(text)
    return parsed


CUSTOM_RULE = {"seriesQuery": '{__name__="jobs_waiting",namespace!=""}',
               "resources": {"overrides": {"namespace": {"resource": "namespace"}}},
               "name": {"matches": "", "as": "{{ .Release.Name }}_jobs_waiting"},
               "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)"}
EXTERNAL_RULE = {"seriesQuery": '{__name__="queue_depth",queue!=""}',
                 "resources": {"overrides": {"namespace": {"resource": "namespace"}}},
                 "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (queue)"}


def test_custom_and_external_rules_come_after_the_default_ones(
        helm_env: dict[str, str], tmp_path: Path) -> None:
    config = configmap_config(helm_template(helm_env, {"rules": {
        "custom": [CUSTOM_RULE], "external": [EXTERNAL_RULE]}}, tmp_path))
    defaults = yaml.safe_load(DEFAULT_CONFIG_YAML)
    templated = {**CUSTOM_RULE, "name": {"matches": "", "as": f"{RELEASE}_jobs_waiting"}}
    assert config["rules"] == [*defaults["rules"], templated]  # rules.custom is templated
    assert config["externalRules"] == [EXTERNAL_RULE]
    assert config["resourceRules"] == defaults["resourceRules"]


def test_without_default_rules_only_the_given_ones_are_served(
        helm_env: dict[str, str], tmp_path: Path) -> None:
    config = configmap_config(helm_template(helm_env, {"rules": {
        "default": False, "external": [EXTERNAL_RULE]}}, tmp_path))
    assert config == {"rules": [], "externalRules": [EXTERNAL_RULE]}


def test_resource_rules_replace_the_default_ones_and_need_resource_metrics_on(
        helm_env: dict[str, str], tmp_path: Path) -> None:
    resource = yaml.safe_load(DEFAULT_CONFIG_YAML)["resourceRules"]
    resource["window"] = "3m"
    error = helm_template_fails(helm_env, {"rules": {"resource": resource}}, tmp_path)
    assert "resourceMetrics.enabled=true" in error
    objects = helm_template(helm_env, {"rules": {"resource": resource},
                                       "resourceMetrics": {"enabled": True}}, tmp_path)
    assert configmap_config(objects)["resourceRules"] == resource
    assert "v1beta1.metrics.k8s.io" in {obj["metadata"]["name"] for obj in objects
                                        if obj["kind"] == "APIService"}


def test_an_existing_configmap_is_mounted_instead_of_the_charts(
        helm_env: dict[str, str], tmp_path: Path) -> None:
    objects = helm_template(helm_env, {"rules": {"existing": "my-rules"}}, tmp_path)
    assert not [obj for obj in objects if obj["kind"] == "ConfigMap"]
    pod = adapter_pod(objects)
    (config,) = [v for v in pod["volumes"] if v["name"] == "config"]
    assert config["configMap"]["name"] == "my-rules"


def test_no_rules_at_all_is_refused(helm_env: dict[str, str], tmp_path: Path) -> None:
    error = helm_template_fails(helm_env, {"rules": {"default": False}}, tmp_path)
    assert "would serve no metric" in error


@pytest.mark.parametrize("values", [
    {"tls": {"enable": True}, "certManager": {"enabled": True}},
    {"tls": {"enable": True}, "certificates": {"mode": "cert-manager"}},
    {"certificates": {"mode": "insecure"}},
], ids=["both switches", "switch against mode", "unknown mode"])
def test_contradictory_certificate_choices_are_refused(
        helm_env: dict[str, str], tmp_path: Path, values: Obj) -> None:
    assert "choose" in helm_template_fails(helm_env, values, tmp_path)


def adapter_pod(objects: list[Obj]) -> Obj:
    (deployment,) = [obj for obj in objects if obj["kind"] == "Deployment"
                     and obj["metadata"]["name"] == "metricscale-adapter"]
    spec: Obj = deployment["spec"]["template"]["spec"]
    return spec


def test_a_prometheus_adapter_values_file_works(helm_env: dict[str, str],
                                                tmp_path: Path) -> None:
    """The keys most values files of prometheus-community's chart set, as they set them."""
    values = {
        "prometheus": {"url": "http://prometheus-operated.{{ .Release.Namespace }}.svc",
                       "port": 9090, "path": "/prom"},
        "replicas": 3, "logLevel": 6, "metricsRelistInterval": "30s", "listenPort": 8443,
        "resources": {"requests": {"cpu": "50m"}},
        "nodeSelector": {"pool": "system"},
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        "priorityClassName": "high", "podAnnotations": {"team": "infra"},
        "podLabels": {"tier": "metrics"}, "extraArguments": ["--prometheus-verb=GET"],
        "rules": {"default": False, "custom": [CUSTOM_RULE], "external": [EXTERNAL_RULE]},
        "podDisruptionBudget": {"enabled": True, "minAvailable": None, "maxUnavailable": 1},
        "psp": {"create": False},
    }
    objects = helm_template(helm_env, values, tmp_path)
    validate(objects)
    pod = adapter_pod(objects)
    (container,) = pod["containers"]
    args = container["args"]
    assert f"--prometheus-url=http://prometheus-operated.{NAMESPACE}.svc:9090/prom" in args
    assert "--metrics-relist-interval=30s" in args and "--secure-port=8443" in args
    assert args[-1] == "--prometheus-verb=GET"
    assert container["ports"] == [{"name": "https", "containerPort": 8443, "protocol": "TCP"}]
    # Helm merges a map given with the chart's default (docs/helm.md: set a key to null to drop it).
    assert container["resources"] == {"requests": {"cpu": "50m", "memory": "128Mi"},
                                      "limits": {"memory": "512Mi"}}
    assert pod["nodeSelector"] == {"pool": "system", "kubernetes.io/os": "linux"}
    assert pod["priorityClassName"] == "high"
    assert pod["tolerations"] == values["tolerations"]
    (budget,) = [obj for obj in objects if obj["kind"] == "PodDisruptionBudget"
                 and obj["metadata"]["name"] == "metricscale-adapter"]
    assert budget["spec"] == {"maxUnavailable": 1, "selector": {
        "matchLabels": {"app.kubernetes.io/name": "metricscale-adapter"}}}


def test_an_external_name_service_points_the_apiservices_at_its_port(
        helm_env: dict[str, str], tmp_path: Path) -> None:
    objects = helm_template(helm_env, {"service": {"type": "ExternalName",
                                                   "externalName": "adapter.example",
                                                   "port": 16443}}, tmp_path)
    (service,) = [obj for obj in objects if key(obj) == ("Service", NAMESPACE,
                                                          "metricscale-adapter")]
    assert service["spec"] == {"type": "ExternalName", "externalName": "adapter.example",
                               "ports": [{"name": "https", "port": 16443, "protocol": "TCP"}]}
    for obj in objects:
        if obj["kind"] == "APIService":
            assert obj["spec"]["service"]["port"] == 16443
