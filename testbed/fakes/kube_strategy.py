"""Per-kind REST strategies: defaulting, fields create/update may not set, and validation.

Validations cover what our code can trip: names, labels, workloads, HPAs, Scale, Leases, Events,
APIServices and CRDs.
"""

from __future__ import annotations

import copy
import re
from typing import Any, TypeGuard

from testbed.fakes.kube_cel import schema_rule_problems
from testbed.fakes.kube_errors import (
    FieldError,
    forbidden,
    invalid_value,
    not_supported,
    required_value,
)
from testbed.fakes.kube_resources import ResourceType
from testbed.fakes.kube_selectors import (
    SelectorError,
    label_key_errors,
    label_selector_from_object,
    label_value_errors,
    labels_match,
)

JSONDict = dict[str, Any]

_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
SUBDOMAIN_MESSAGE = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
LABEL_MESSAGE = (
    "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
    "must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex "
    "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
)
DNS1035_MESSAGE = (
    "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
    "alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or "
    "'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
)


def subdomain_errors(value: str) -> list[str]:
    problems = []
    if len(value) > 253:
        problems.append("must be no more than 253 characters")
    if not _SUBDOMAIN.match(value):
        problems.append(SUBDOMAIN_MESSAGE)
    return problems


def label_errors(value: str) -> list[str]:
    problems = []
    if len(value) > 63:
        problems.append("must be no more than 63 characters")
    if not _LABEL.match(value):
        problems.append(LABEL_MESSAGE)
    return problems


def dns1035_errors(value: str) -> list[str]:
    problems = []
    if len(value) > 63:
        problems.append("must be no more than 63 characters")
    if not _DNS1035.match(value):
        problems.append(DNS1035_MESSAGE)
    return problems


def _get(obj: Any, *path: str) -> Any:
    for part in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def _int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


# --- defaults --------------------------------------------------------------------------------


def _image_pull_policy(image: str) -> str:
    if "@" in image:
        return "IfNotPresent"
    last = image.rsplit("/", 1)[-1]
    tag = last.split(":", 1)[1] if ":" in last else "latest"
    return "Always" if tag == "latest" else "IfNotPresent"


def _default_container(container: JSONDict) -> None:
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    container.setdefault("resources", {})
    if "image" in container:
        container.setdefault("imagePullPolicy", _image_pull_policy(str(container["image"])))
    for port in container.get("ports") or []:
        if isinstance(port, dict):
            port.setdefault("protocol", "TCP")


def _default_pod_spec(spec: JSONDict) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("enableServiceLinks", True)
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        if isinstance(container, dict):
            _default_container(container)


def _default_template(spec: JSONDict) -> None:
    template = spec.get("template")
    if isinstance(template, dict):
        template.setdefault("metadata", {})
        pod_spec = template.get("spec")
        if isinstance(pod_spec, dict):
            _default_pod_spec(pod_spec)


_SCALE_UP_DEFAULT: JSONDict = {
    "stabilizationWindowSeconds": 0, "selectPolicy": "Max",
    "policies": [{"type": "Pods", "value": 4, "periodSeconds": 15},
                 {"type": "Percent", "value": 100, "periodSeconds": 15}],
}
_SCALE_DOWN_DEFAULT: JSONDict = {
    "selectPolicy": "Max", "policies": [{"type": "Percent", "value": 100, "periodSeconds": 15}],
}


def _default_rules(rules: Any, defaults: JSONDict) -> JSONDict:
    out = copy.deepcopy(defaults)
    if isinstance(rules, dict):
        for key in ("selectPolicy", "stabilizationWindowSeconds", "policies", "tolerance"):
            if rules.get(key) is not None:
                out[key] = rules[key]
    return out


def apply_defaults(resource_type: ResourceType, obj: JSONDict) -> None:
    """SetDefaults_* for the kinds whose defaults our code reads (storage form, in place)."""
    key = (resource_type.group, resource_type.kind)
    spec = obj.get("spec")
    if key == ("", "Pod") and isinstance(spec, dict):
        _default_pod_spec(spec)
    elif key in (("apps", "Deployment"), ("apps", "StatefulSet"), ("apps", "ReplicaSet")) \
            and isinstance(spec, dict):
        spec.setdefault("replicas", 1)
        _default_template(spec)
        if key == ("apps", "Deployment"):
            spec.setdefault("revisionHistoryLimit", 10)
            spec.setdefault("progressDeadlineSeconds", 600)
            strategy = spec.setdefault("strategy", {})
            strategy.setdefault("type", "RollingUpdate")
            if strategy["type"] == "RollingUpdate":
                rolling = strategy.setdefault("rollingUpdate", {})
                rolling.setdefault("maxUnavailable", "25%")
                rolling.setdefault("maxSurge", "25%")
        elif key == ("apps", "StatefulSet"):
            spec.setdefault("podManagementPolicy", "OrderedReady")
            spec.setdefault("revisionHistoryLimit", 10)
            update = spec.setdefault("updateStrategy", {})
            update.setdefault("type", "RollingUpdate")
            if update["type"] == "RollingUpdate":
                update.setdefault("rollingUpdate", {}).setdefault("partition", 0)
            retention = spec.setdefault("persistentVolumeClaimRetentionPolicy", {})
            retention.setdefault("whenDeleted", "Retain")
            retention.setdefault("whenScaled", "Retain")
    elif key == ("autoscaling", "HorizontalPodAutoscaler") and isinstance(spec, dict):
        spec.setdefault("minReplicas", 1)
        if not spec.get("metrics"):
            spec["metrics"] = [{"type": "Resource", "resource": {"name": "cpu", "target": {
                "type": "Utilization", "averageUtilization": 80}}}]
        behavior = spec.get("behavior")
        if isinstance(behavior, dict):
            behavior["scaleUp"] = _default_rules(behavior.get("scaleUp"), _SCALE_UP_DEFAULT)
            behavior["scaleDown"] = _default_rules(behavior.get("scaleDown"), _SCALE_DOWN_DEFAULT)
    elif key == ("", "Service") and isinstance(spec, dict):
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        spec.setdefault("internalTrafficPolicy", "Cluster")
        for port in spec.get("ports") or []:
            if isinstance(port, dict):
                port.setdefault("protocol", "TCP")
                if "port" in port:
                    port.setdefault("targetPort", port["port"])
    elif key == ("", "Secret"):
        obj.setdefault("type", "Opaque")
    elif key == ("", "Namespace"):
        name = _get(obj, "metadata", "name")
        if name:
            labels = obj.setdefault("metadata", {}).setdefault("labels", {})
            labels["kubernetes.io/metadata.name"] = name
    elif key == ("apiregistration.k8s.io", "APIService") and isinstance(spec, dict):
        service = spec.get("service")
        if isinstance(service, dict):
            service.setdefault("port", 443)
    elif key == ("apiextensions.k8s.io", "CustomResourceDefinition") and isinstance(spec, dict):
        spec.setdefault("conversion", {"strategy": "None"})
        names = spec.get("names")
        if isinstance(names, dict) and names.get("kind"):
            names.setdefault("singular", str(names["kind"]).lower())
            names.setdefault("listKind", f"{names['kind']}List")


def qos_class(spec: JSONDict) -> str:
    """The pod's QoS class from its containers' requests and limits (v1qos.GetPodQOS)."""
    containers = [c for c in spec.get("containers") or [] if isinstance(c, dict)]
    requests = [c.get("resources", {}).get("requests") or {} for c in containers]
    limits = [c.get("resources", {}).get("limits") or {} for c in containers]
    if not any(requests) and not any(limits):
        return "BestEffort"
    guaranteed = all(
        all(lim.get(r) is not None and str(req.get(r, lim.get(r))) == str(lim.get(r))
            for r in ("cpu", "memory"))
        for req, lim in zip(requests, limits, strict=True))
    return "Guaranteed" if guaranteed else "Burstable"


def prepare_for_create(resource_type: ResourceType, obj: JSONDict, version: str) -> None:
    """What a create may not set: status (for kinds with a status subresource)."""
    if not resource_type.has_status(version):
        return
    key = (resource_type.group, resource_type.kind)
    if key == ("", "Pod"):
        obj["status"] = {"phase": "Pending", "qosClass": qos_class(obj.get("spec") or {})}
        spec = obj.setdefault("spec", {})
        spec.setdefault("serviceAccountName", "default")
        spec.setdefault("serviceAccount", spec["serviceAccountName"])
        spec.setdefault("priority", 0)
        spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
        tolerations = spec.setdefault("tolerations", [])
        for taint in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
            if not any(isinstance(t, dict) and t.get("key") == taint for t in tolerations):
                tolerations.append({"key": taint, "operator": "Exists", "effect": "NoExecute",
                                    "tolerationSeconds": 300})
    elif key == ("", "Namespace"):
        obj["status"] = {"phase": "Active"}
        obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
    elif key == ("", "Service"):
        obj["status"] = {"loadBalancer": {}}
    elif key == ("", "Node"):
        pass  # nodes register with their status
    else:
        obj.pop("status", None)


def prepare_for_update(resource_type: ResourceType, new: JSONDict, old: JSONDict,
                       version: str) -> None:
    """The main resource may not change status when a status subresource exists."""
    if resource_type.has_status(version):
        if "status" in old:
            new["status"] = copy.deepcopy(old["status"])
        else:
            new.pop("status", None)


def prepare_for_status_update(new: JSONDict, old: JSONDict) -> JSONDict:
    """A status update changes status and nothing else (metadata comes from the old object)."""
    out = copy.deepcopy(old)
    if "status" in new:
        out["status"] = copy.deepcopy(new["status"])
    else:
        out.pop("status", None)
    out["metadata"]["resourceVersion"] = (new.get("metadata") or {}).get(
        "resourceVersion", old["metadata"]["resourceVersion"])
    return out


# --- validation ------------------------------------------------------------------------------


def validate_metadata(resource_type: ResourceType, obj: JSONDict) -> list[FieldError]:
    metadata = obj.get("metadata") or {}
    problems: list[FieldError] = []

    def name_errors(value: str) -> list[str]:
        if resource_type.resource == "namespaces":
            return label_errors(value)
        if resource_type.resource == "services":
            return dns1035_errors(value)
        if resource_type.resource == "apiservices":
            return []
        return subdomain_errors(value)

    name = metadata.get("name", "")
    if name:
        problems += [invalid_value("metadata.name", name, c) for c in name_errors(name)]
    generate_name = metadata.get("generateName", "")
    if generate_name:
        # As ValidateObjectMeta: the prefix is checked as a name, a trailing '-' masked
        # (a trailing '.' is refused: "web." is not a prefix the server takes).
        masked = generate_name[:-1] + "a" if generate_name.endswith("-") else generate_name
        problems += [invalid_value("metadata.generateName", generate_name, c)
                     for c in name_errors(masked)]
    for key, value in (metadata.get("labels") or {}).items():
        for check in label_key_errors(key):
            problems.append(invalid_value("metadata.labels", key, check))
        for check in label_value_errors(str(value)):
            problems.append(invalid_value("metadata.labels", value, check))
    for key in metadata.get("annotations") or {}:
        for check in label_key_errors(key):
            problems.append(invalid_value("metadata.annotations", key, check))
    return problems


def _workload(obj: JSONDict, kind: str) -> list[FieldError]:
    spec = obj.get("spec") or {}
    problems: list[FieldError] = []
    replicas = spec.get("replicas")
    if _int(replicas) and replicas < 0:
        problems.append(invalid_value("spec.replicas", replicas,
                                      "must be greater than or equal to 0"))
    selector = spec.get("selector")
    template_labels = _get(spec, "template", "metadata", "labels") or {}
    if selector is None:
        problems.append(required_value("spec.selector"))
    else:
        try:
            requirements = label_selector_from_object(selector)
        except SelectorError as error:
            problems.append(invalid_value("spec.selector", selector, str(error)))
            requirements = None
        if requirements is not None:
            if not requirements:
                problems.append(invalid_value("spec.selector", selector,
                                              f"empty selector is invalid for {kind}"))
            elif not labels_match(requirements, template_labels):
                problems.append(invalid_value("spec.template.metadata.labels", template_labels,
                                              "`selector` does not match template `labels`"))
    problems += _pod_spec(_get(spec, "template", "spec") or {}, "spec.template.spec")
    return problems


def _pod_spec(spec: JSONDict, path: str) -> list[FieldError]:
    problems: list[FieldError] = []
    containers = spec.get("containers") or []
    if not containers:
        problems.append(required_value(f"{path}.containers"))
    seen: set[str] = set()
    for index, container in enumerate(containers):
        where = f"{path}.containers[{index}]"
        name = container.get("name", "")
        if not name:
            problems.append(required_value(f"{where}.name"))
        else:
            problems += [invalid_value(f"{where}.name", name, c) for c in label_errors(name)]
            if name in seen:
                problems.append(FieldError("Duplicate", f"{where}.name", "", name))
            seen.add(name)
        if not container.get("image"):
            problems.append(required_value(f"{where}.image"))
    return problems


_METRIC_SOURCES = {"Object": "object", "Pods": "pods", "Resource": "resource",
                   "ContainerResource": "containerResource", "External": "external"}


def _hpa(obj: JSONDict) -> list[FieldError]:
    spec = obj.get("spec") or {}
    problems: list[FieldError] = []
    ref = spec.get("scaleTargetRef") or {}
    if not ref.get("kind"):
        problems.append(required_value("spec.scaleTargetRef.kind"))
    if not ref.get("name"):
        problems.append(required_value("spec.scaleTargetRef.name"))
    minimum = spec.get("minReplicas", 1)
    maximum = spec.get("maxReplicas", 0)
    if _int(minimum) and minimum < 1:
        problems.append(invalid_value("spec.minReplicas", minimum,
                                      "must be greater than or equal to 1"))
    if _int(maximum) and maximum < 1:
        problems.append(invalid_value("spec.maxReplicas", maximum, "must be greater than 0"))
    if _int(minimum) and _int(maximum) and maximum < minimum:
        problems.append(invalid_value("spec.maxReplicas", maximum,
                                      "must be greater than or equal to `minReplicas`"))
    for index, metric in enumerate(spec.get("metrics") or []):
        where = f"spec.metrics[{index}]"
        kind = metric.get("type", "")
        source = _METRIC_SOURCES.get(kind)
        if source is None:
            problems.append(not_supported(f"{where}.type", kind, list(_METRIC_SOURCES)))
            continue
        if not isinstance(metric.get(source), dict):
            problems.append(required_value(f"{where}.{source}",
                                           "must populate information for the given metric "
                                           "source"))
            continue
        target = metric[source].get("target") or {}
        target_type = target.get("type", "")
        if target_type not in ("Utilization", "Value", "AverageValue"):
            problems.append(required_value(f"{where}.{source}.target.type",
                                           "must specify a metric target type"))
    behavior = spec.get("behavior") or {}
    for direction in ("scaleUp", "scaleDown"):
        rules = behavior.get(direction) or {}
        where = f"spec.behavior.{direction}"
        window = rules.get("stabilizationWindowSeconds")
        if _int(window) and not 0 <= window <= 3600:
            problems.append(invalid_value(f"{where}.stabilizationWindowSeconds", window,
                                          "must be less than or equal to 3600" if window > 0
                                          else "must be greater than or equal to zero"))
        policy = rules.get("selectPolicy")
        if policy is not None and policy not in ("Max", "Min", "Disabled"):
            problems.append(not_supported(f"{where}.selectPolicy", policy,
                                          ["Disabled", "Max", "Min"]))
        for index, rule in enumerate(rules.get("policies") or []):
            at = f"{where}.policies[{index}]"
            if rule.get("type") not in ("Pods", "Percent"):
                problems.append(not_supported(f"{at}.type", rule.get("type"),
                                              ["Percent", "Pods"]))
            value = rule.get("value", 0)
            if _int(value) and value <= 0:
                problems.append(invalid_value(f"{at}.value", value, "must be greater than zero"))
            period = rule.get("periodSeconds", 0)
            if _int(period) and period <= 0:
                problems.append(invalid_value(f"{at}.periodSeconds", period,
                                              "must be greater than zero"))
            elif _int(period) and period > 1800:
                problems.append(invalid_value(f"{at}.periodSeconds", period,
                                              "must be less than or equal to 1800"))
    problems += _hpa_status(obj)
    return problems


def _hpa_status(obj: JSONDict) -> list[FieldError]:
    status = obj.get("status") or {}
    problems = []
    for key in ("currentReplicas", "desiredReplicas"):
        value = status.get(key)
        if _int(value) and value < 0:
            problems.append(invalid_value(f"status.{key}", value,
                                          "must be greater than or equal to 0"))
    for index, condition in enumerate(status.get("conditions") or []):
        if not condition.get("type"):
            problems.append(required_value(f"status.conditions[{index}].type"))
        if condition.get("status") not in ("True", "False", "Unknown"):
            problems.append(not_supported(f"status.conditions[{index}].status",
                                          condition.get("status"), ["False", "True", "Unknown"]))
    return problems


# pkg/apis/core/validation/events.go: the limits of the reporting fields.
_REPORTING_INSTANCE_LIMIT = _ACTION_LIMIT = _REASON_LIMIT = 128
_NOTE_LIMIT = 1024


def _legacy_event(obj: JSONDict, *, request_group: str) -> list[FieldError]:
    """legacyValidateEvent: every Event, whatever API version writes it. With an eventTime it
    is a "new" Event and needs its reporting fields (lengths are Go byte lengths)."""
    problems: list[FieldError] = []
    namespace = _get(obj, "metadata", "namespace") or ""
    involved = obj.get("involvedObject") or {}
    involved_namespace = involved.get("namespace") or ""
    if not obj.get("eventTime"):
        if involved_namespace and namespace and involved_namespace != namespace:
            problems.append(invalid_value("involvedObject.namespace", involved_namespace,
                                          "does not match event.namespace"))
        return problems
    if not involved_namespace and namespace not in ("default", "kube-system"):
        problems.append(invalid_value("involvedObject.namespace", involved_namespace,
                                      "does not match event.namespace"))
    controller_field = "reportingComponent" if request_group == "" else "reportingController"
    controller = obj.get("reportingComponent") or ""
    if not controller:
        problems.append(required_value(controller_field))
    problems += [invalid_value(controller_field, controller, c)
                 for c in label_key_errors(controller)]
    for key, limit in (("reportingInstance", _REPORTING_INSTANCE_LIMIT),
                       ("action", _ACTION_LIMIT), ("reason", _REASON_LIMIT)):
        value = obj.get(key) or ""
        if not value:
            problems.append(required_value(key))
        if len(value.encode()) > limit:
            problems.append(invalid_value(key, "", f"can have at most {limit} characters"))
    if len((obj.get("message") or "").encode()) > _NOTE_LIMIT:
        problems.append(invalid_value("message", "",
                                      f"can have at most {_NOTE_LIMIT} characters"))
    return problems


def _event(obj: JSONDict, old: JSONDict | None, *, request_group: str) -> list[FieldError]:
    """ValidateEventCreate / ValidateEventUpdate: the legacy rules always; creation through
    events.k8s.io/v1 adds the strict ones, an update through it keeps what is immutable."""
    problems = _legacy_event(obj, request_group=request_group)
    if request_group != "events.k8s.io":
        return problems  # core/v1 keeps the legacy rules only, for compatibility
    if old is not None:
        for key, path in (("involvedObject", "involvedObject"), ("reason", "reason"),
                          ("type", "type"), ("action", "action"),
                          ("reportingComponent", "reportingController"),
                          ("reportingInstance", "reportingInstance"),
                          ("eventTime", "eventTime")):
            if obj.get(key) != old.get(key):
                problems.append(invalid_value(path, obj.get(key), "field is immutable"))
        return problems
    if not obj.get("eventTime"):
        problems.append(required_value("eventTime"))
    if obj.get("type") not in ("Normal", "Warning"):
        problems.append(invalid_value("type", "", f"has invalid value: {obj.get('type', '')}"))
    for legacy in ("firstTimestamp", "lastTimestamp"):
        if obj.get(legacy):
            problems.append(invalid_value(f"deprecated{legacy[0].upper()}{legacy[1:]}", "",
                                          "needs to be unset"))
    if obj.get("count"):
        problems.append(invalid_value("deprecatedCount", "", "needs to be unset"))
    if obj.get("source"):
        problems.append(invalid_value("deprecatedSource", "", "needs to be unset"))
    return problems


def _lease(obj: JSONDict) -> list[FieldError]:
    spec = obj.get("spec") or {}
    problems = []
    duration = spec.get("leaseDurationSeconds")
    if _int(duration) and duration <= 0:
        problems.append(invalid_value("spec.leaseDurationSeconds", duration,
                                      "must be greater than 0"))
    transitions = spec.get("leaseTransitions")
    if _int(transitions) and transitions < 0:
        problems.append(invalid_value("spec.leaseTransitions", transitions,
                                      "must be greater than or equal to 0"))
    return problems


def validate_apiservice(obj: JSONDict) -> list[FieldError]:
    spec = obj.get("spec") or {}
    name = _get(obj, "metadata", "name") or ""
    group, version = spec.get("group", ""), spec.get("version", "")
    problems: list[FieldError] = []
    expected = f"{version}.{group}" if group else version
    if name != expected:
        problems.append(invalid_value("metadata.name", name,
                                      'must be `spec.version+"."+spec.group`'))
    if not group and version != "v1":
        problems.append(invalid_value("spec.group", group, "only v1 may have an empty group "
                                                           "and it better be legacy kube"))
    if group:
        problems += [invalid_value("spec.group", group, c) for c in subdomain_errors(group)]
    if not version:
        problems.append(required_value("spec.version"))
    else:
        problems += [invalid_value("spec.version", version, c) for c in label_errors(version)]
    group_priority = spec.get("groupPriorityMinimum", 0)
    if not _int(group_priority) or not 0 < group_priority <= 20000:
        problems.append(invalid_value("spec.groupPriorityMinimum", group_priority,
                                      "must be positive and less than 20000"))
    version_priority = spec.get("versionPriority", 0)
    if not _int(version_priority) or not 0 < version_priority <= 1000:
        problems.append(invalid_value("spec.versionPriority", version_priority,
                                      "must be positive and less than 1000"))
    service = spec.get("service")
    if service is None:
        if spec.get("caBundle"):
            problems.append(invalid_value("spec.caBundle", spec["caBundle"],
                                          "local APIServices may not have a caBundle"))
        if spec.get("insecureSkipTLSVerify"):
            problems.append(invalid_value("spec.insecureSkipTLSVerify", True,
                                          "local APIServices may not have "
                                          "insecureSkipTLSVerify"))
    else:
        if not service.get("namespace"):
            problems.append(required_value("spec.service.namespace"))
        if not service.get("name"):
            problems.append(required_value("spec.service.name"))
        port = service.get("port", 443)
        if not _int(port) or not 0 < port <= 65535:
            problems.append(invalid_value("spec.service.port", port,
                                          "must be a valid port number"))
    if spec.get("insecureSkipTLSVerify") and spec.get("caBundle"):
        problems.append(invalid_value("spec.insecureSkipTLSVerify", True,
                                      "may not be true if caBundle is present"))
    return problems


def validate_crd(obj: JSONDict) -> list[FieldError]:
    spec = obj.get("spec") or {}
    names = spec.get("names") or {}
    group = spec.get("group", "")
    plural = names.get("plural", "")
    problems: list[FieldError] = []
    name = _get(obj, "metadata", "name") or ""
    if name != f"{plural}.{group}":
        problems.append(invalid_value("metadata.name", name,
                                      'must be spec.names.plural+"."+spec.group'))
    if not group:
        problems.append(required_value("spec.group"))
    elif "." not in group:
        problems.append(invalid_value("spec.group", group,
                                      "should be a domain with at least one dot"))
    if not plural:
        problems.append(required_value("spec.names.plural"))
    if not names.get("kind"):
        problems.append(required_value("spec.names.kind"))
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        problems.append(not_supported("spec.scope", spec.get("scope", ""),
                                      ["Cluster", "Namespaced"]))
    versions = spec.get("versions") or []
    if not versions:
        problems.append(required_value("spec.versions", "must have exactly one version marked "
                                                        "as storage version"))
    elif sum(1 for v in versions if v.get("storage")) != 1:
        problems.append(invalid_value("spec.versions", versions,
                                      "must have exactly one version marked as storage "
                                      "version"))
    for index, version in enumerate(versions):
        where = f"spec.versions[{index}]"
        if not _get(version, "schema", "openAPIV3Schema"):
            problems.append(required_value(f"{where}.schema.openAPIV3Schema",
                                           "schemas are required"))
        for text in schema_rule_problems(_get(version, "schema", "openAPIV3Schema"),
                                         f"{where}.schema.openAPIV3Schema"):
            # apiextensions compiles every rule at CRD creation and refuses what does not.
            path, _, detail = text.partition(": ")
            problems.append(invalid_value(path, "", detail))
        scale = _get(version, "subresources", "scale")
        if isinstance(scale, dict):
            for key, prefix in (("specReplicasPath", ".spec."),
                                ("statusReplicasPath", ".status.")):
                path = scale.get(key, "")
                if not path:
                    problems.append(required_value(f"{where}.subresources.scale.{key}"))
                elif not path.startswith(prefix):
                    problems.append(invalid_value(f"{where}.subresources.scale.{key}", path,
                                                  f"should be a json path under {prefix[:-1]}"))
    return problems


def validate(resource_type: ResourceType, obj: JSONDict, old: JSONDict | None, *,
             request_group: str) -> list[FieldError]:
    """Kind validation on the storage form; `old` is set for updates."""
    problems = validate_metadata(resource_type, obj)
    key = (resource_type.group, resource_type.kind)
    if key in (("apps", "Deployment"), ("apps", "StatefulSet"), ("apps", "ReplicaSet")):
        problems += _workload(obj, resource_type.kind.lower())
        if old is not None and (old.get("spec") or {}).get("selector") != \
                (obj.get("spec") or {}).get("selector"):
            problems.append(invalid_value("spec.selector", (obj.get("spec") or {}).get(
                "selector"), "field is immutable"))
    elif key == ("", "Pod"):
        problems += _pod_spec(obj.get("spec") or {}, "spec")
    elif key == ("autoscaling", "HorizontalPodAutoscaler"):
        problems += _hpa(obj)
    elif resource_type.kind == "Event" and resource_type.group in ("", "events.k8s.io"):
        # events.k8s.io Events are stored as core Events: one validation for both groups.
        problems += _event(obj, old, request_group=request_group)
    elif key == ("coordination.k8s.io", "Lease"):
        problems += _lease(obj)
    elif key == ("apiregistration.k8s.io", "APIService"):
        problems += validate_apiservice(obj)
    elif key == ("apiextensions.k8s.io", "CustomResourceDefinition"):
        problems += validate_crd(obj)
        if old is not None and _get(old, "spec", "group") != _get(obj, "spec", "group"):
            problems.append(invalid_value("spec.group", _get(obj, "spec", "group"),
                                          "field is immutable"))
    if old is not None and _get(old, "metadata", "name") != _get(obj, "metadata", "name"):
        problems.append(forbidden("metadata.name", "field is immutable"))
    return problems


def validate_scale(scale: JSONDict) -> list[FieldError]:
    replicas = _get(scale, "spec", "replicas")
    if _int(replicas) and replicas < 0:
        return [invalid_value("spec.replicas", replicas, "must be greater than or equal to 0")]
    return []
