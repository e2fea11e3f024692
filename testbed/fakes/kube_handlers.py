"""The fake's REST layer: verbs, decoding, status/scale subresources, lists, watches, Tables.

Paths are split as RequestInfoFactory splits them; discovery of local group/versions is here too.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import hashlib
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import yaml
from aiohttp import web
from multidict import MultiMapping

from testbed.fakes import kube_errors as errors
from testbed.fakes.kube_errors import ApiError, GroupResource
from testbed.fakes.kube_patch import (
    PatchError,
    apply_json_patch,
    apply_merge_patch,
    apply_strategic_merge_patch,
)
from testbed.fakes.kube_resources import ResourceRegistry, ResourceType, ScaleSpec
from testbed.fakes.kube_schema import DecodeError, builtin_schemas
from testbed.fakes.kube_selectors import (
    SelectorError,
    format_label_selector,
    label_selector_from_object,
)
from testbed.fakes.kube_store import ObjectStore, StoreEvent, compile_selectors, matches
from testbed.fakes.kube_strategy import (
    apply_defaults,
    prepare_for_create,
    prepare_for_status_update,
    prepare_for_update,
    validate,
    validate_scale,
)

JSONDict = dict[str, Any]
log = logging.getLogger(__name__)

__all__ = ["ApiPath", "RestHandlers", "json_response", "parse_api_path"]

# The fake decodes JSON and YAML bodies; protobuf (which kube-apiserver also takes) gets 415.
JSON_TYPES = ("application/json", "application/yaml")
PATCH_TYPES_BUILTIN = ("application/json-patch+json", "application/merge-patch+json",
                       "application/strategic-merge-patch+json", "application/apply-patch+yaml")
PATCH_TYPES_CUSTOM = ("application/json-patch+json", "application/merge-patch+json",
                      "application/apply-patch+yaml")
CONTINUE_TOO_OLD = (
    "The provided continue parameter is too old to display a consistent list result. You can "
    "start a new list without the continue parameter, or use the continue token in this "
    "response to retrieve the remainder of the results. Continuing with the provided token "
    "results in an inconsistent list - objects that were created, modified, or deleted between "
    "the time the first chunk was returned and now may show up in the list."
)
# Resources whose strategy allows PUT to create a missing object.
CREATE_ON_UPDATE = {("", "events"), ("", "endpoints"), ("coordination.k8s.io", "leases")}
# customresource/strategy.go hasBlockingErr: schema errors after which CEL rules are skipped.
BLOCKING_ERROR_TYPES = {"NotSupported", "Required", "TooLong", "TooMany", "TypeInvalid"}
RULES_NOT_CHECKED = ("some validation rules were not checked because the object was invalid; "
                     "correct the existing errors to complete validation")
BOOKMARK_PRE_TIMEOUT = 2.0  # the watch cache sends its last bookmark 2 s before the deadline
DRY_RUN_VALUES = ("All",)  # metav1.DryRunAll, the one value kube-apiserver accepts
FIELD_VALIDATION_VALUES = ("", "Ignore", "Strict", "Warn")
_GO_JSON_TYPES = ((bool, "bool"), (str, "string"), ((int, float), "number"), (dict, "object"),
                  (list, "array"))


def json_response(body: Any, *, status: int = 200,
                  headers: Mapping[str, str] | None = None) -> web.Response:
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    response = web.Response(status=status, text=text + "\n", content_type="application/json")
    for key, value in (headers or {}).items():
        response.headers.add(key, value)
    return response


def status_response(error: ApiError) -> web.Response:
    return json_response(error.status, status=error.code, headers=error.headers)


@dataclass(frozen=True)
class ApiPath:
    """A resource path, split as RequestInfoFactory splits it."""

    group: str
    version: str
    namespace: str | None
    resource: str
    name: str
    subresource: str

    @property
    def is_collection(self) -> bool:
        return not self.name


def parse_api_path(path: str) -> tuple[str, str, list[str]] | None:
    """("group", "version", rest) for /api/v1/... and /apis/g/v/...; None otherwise."""
    parts = [p for p in path.split("/") if p]
    if len(parts) >= 2 and parts[0] == "api":
        return "", parts[1], parts[2:]
    if len(parts) >= 3 and parts[0] == "apis":
        return parts[1], parts[2], parts[3:]
    return None


def split_resource_path(group: str, version: str, rest: list[str]) -> ApiPath | None:
    if not rest:
        return None
    namespace: str | None = None
    if rest[0] == "namespaces" and len(rest) > 2 and rest[2] not in ("status", "finalize"):
        namespace = rest[1]
        rest = rest[2:]
    if len(rest) > 3:
        return None
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else ""
    subresource = rest[2] if len(rest) > 2 else ""
    return ApiPath(group, version, namespace, resource, name, subresource)


def option_problems(query: MultiMapping[str], *, apply: bool = False
                    ) -> list[errors.FieldError]:
    """What ValidateCreateOptions, ValidateUpdateOptions and ValidatePatchOptions find in a
    request's query, in their order: fieldManager (required for apply), dryRun (only "All"),
    fieldValidation."""
    problems: list[errors.FieldError] = []
    if apply and not query.get("fieldManager"):
        problems.append(errors.required_value("fieldManager", "is required for apply patch"))
    problems += dry_run_problems(query.getall("dryRun", []))
    validation = query.get("fieldValidation", "")
    if validation not in FIELD_VALIDATION_VALUES:
        problems.append(errors.not_supported("fieldValidation", validation,
                                             FIELD_VALIDATION_VALUES))
    return problems


def dry_run_problems(values: list[str]) -> list[errors.FieldError]:
    """ValidateDryRun: every value must be "All" (an empty one too is refused)."""
    if all(value in DRY_RUN_VALUES for value in values):
        return []
    return [errors.not_supported("dryRun", list(values), DRY_RUN_VALUES)]


def check_options(kind: str, problems: list[errors.FieldError]) -> None:
    if problems:
        raise errors.invalid(errors.GroupKind("meta.k8s.io", kind), "", problems)


def is_dry_run(query: MultiMapping[str]) -> bool:
    """dryrun.IsDryRun, once the values are checked: any dryRun value asks for a dry run."""
    return bool(query.getall("dryRun", []))


def delete_options(body: bytes, query: MultiMapping[str]) -> JSONDict:
    """The DeleteOptions of a DELETE: its body when it has one (the query is then not read, as
    the handler decodes one or the other), else its query. Checked (422) before anything."""
    if body:
        try:
            options = json.loads(body)
        except ValueError as error:
            raise errors.bad_request(f"error decoding DeleteOptions: {error}") from None
        if not isinstance(options, dict):
            options = {}
        dry_run = options.get("dryRun")
        if dry_run is not None:
            if not isinstance(dry_run, list):
                raise errors.bad_request(
                    f"json: cannot unmarshal {_go_json_type(dry_run)} into Go struct field "
                    "DeleteOptions.dryRun of type []string")
            for value in dry_run:
                if not isinstance(value, str):
                    raise errors.bad_request(
                        f"json: cannot unmarshal {_go_json_type(value)} into Go struct field "
                        "DeleteOptions.dryRun of type string")
    else:
        options = {"dryRun": query.getall("dryRun", [])}
    check_options("DeleteOptions", dry_run_problems(options.get("dryRun") or []))
    return options


def _go_json_type(value: Any) -> str:
    return next((name for kind, name in _GO_JSON_TYPES if isinstance(value, kind)), "null")


def _truthy(value: str | None) -> bool:
    return (value or "").lower() in ("true", "1")


def _kube_version_key(version: str) -> tuple[int, int, int, str]:
    """kube-aware version ordering: GA > beta > alpha, higher numbers first; others last."""
    import re

    match = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if match is None:
        return (3, 0, 0, version)
    stability = {None: 0, "beta": 1, "alpha": 2}[match.group(2)]
    return (stability, -int(match.group(1)), -int(match.group(3) or 0), version)


def sort_versions(versions: list[str]) -> list[str]:
    return sorted(versions, key=_kube_version_key)


def _age(created: str | None, now: datetime) -> str:
    """duration.HumanDuration, as the server-side printers render AGE."""
    if not created:
        return "<unknown>"
    seconds = int((now - datetime.fromisoformat(created.replace("Z", "+00:00"))).total_seconds())
    if seconds < 0:
        return "<invalid>"
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        rest = seconds % 60
        return f"{minutes}m{rest}s" if rest else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h{rest}m" if rest else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    if days < 8:
        rest = hours % 24
        return f"{days}d{rest}h" if rest else f"{days}d"
    if days < 365 * 2:
        return f"{days}d"
    return f"{days // 365}y"


@dataclass
class WatchSettings:
    bookmark_interval: float = 60.0
    default_timeout: float = 1800.0


class RestHandlers:
    """Serves /api and /apis for the locally stored kinds."""

    def __init__(self, *, store: ObjectStore, registry: ResourceRegistry,
                 clock: Callable[[], datetime], watch: WatchSettings,
                 closing: asyncio.Event, enforce_namespaces: Callable[[], bool],
                 reviews: Mapping[str, Callable[[JSONDict, JSONDict, Any],
                                                Awaitable[JSONDict]]]) -> None:
        self.store = store
        self.registry = registry
        self.clock = clock
        self.watch = watch
        self.closing = closing
        self.enforce_namespaces = enforce_namespaces
        self.reviews = reviews
        self._watch_queues: set[asyncio.Queue[StoreEvent | None]] = set()

    def wake_watchers(self) -> None:
        """Let every open watch notice that the server is closing."""
        for queue in self._watch_queues:
            queue.put_nowait(None)

    # --- entry point ------------------------------------------------------------------------

    async def serve(self, request: web.Request, path: ApiPath, identity: Any,
                    stall: bool = False) -> web.StreamResponse:
        resource_type = self.registry.resolve(path.group, path.version, path.resource)
        if resource_type is None:
            raise errors.route_not_found()
        method = request.method
        query = request.query
        gr = GroupResource(path.group, path.resource)
        if path.namespace is not None and not resource_type.namespaced:
            raise errors.route_not_found()
        namespace = path.namespace or ""
        if resource_type.namespaced and path.namespace is None and path.name:
            raise errors.route_not_found()
        if resource_type.virtual:
            if method != "POST" or path.name:
                raise errors.method_not_allowed()
            return await self._review(request, resource_type, path, identity)
        if path.subresource:
            return await self._subresource(request, resource_type, path, gr, namespace)
        if path.is_collection:
            if method == "GET":
                if _truthy(query.get("watch")):
                    return await self._watch(request, resource_type, path, stall=stall)
                return json_response(self._list(resource_type, path, query,
                                                      request.headers.get("Accept", "")))
            if method == "POST":
                if resource_type.namespaced and path.namespace is None:
                    raise errors.method_not_allowed()
                return await self._create(request, resource_type, path, gr)
            if method == "DELETE" and "deletecollection" in resource_type.verbs:
                return json_response(await self._delete_collection(request, resource_type, path,
                                                                   gr))
            raise errors.method_not_allowed()
        if method == "GET":
            stored = self.store.require(resource_type, namespace, path.name, gr)
            accept = request.headers.get("Accept", "")
            if self._wants_table(accept):
                return json_response(self._table(
                    resource_type, path.version, [stored], {
                        "resourceVersion": stored["metadata"].get("resourceVersion", "")},
                    query.get("includeObject", "Metadata")))
            return json_response(resource_type.convert_to(stored, path.version))
        if method == "PUT":
            return await self._update(request, resource_type, path, gr)
        if method == "PATCH":
            return await self._patch(request, resource_type, path, gr)
        if method == "DELETE":
            return await self._delete(request, resource_type, path, gr)
        raise errors.method_not_allowed()

    # --- request bodies ---------------------------------------------------------------------

    async def _body(self, request: web.Request, *, options: str,
                    accepted: tuple[str, ...] = JSON_TYPES) -> Any:
        """The decoded body of a write whose query holds `options` (CreateOptions,
        UpdateOptions): the media type is checked first, then the options, then the body."""
        content_type = request.content_type
        raw = await request.read()
        if content_type in ("application/json", ""):
            parser: Callable[[bytes], Any] = json.loads
        elif content_type == "application/yaml":
            parser = yaml.safe_load
        else:
            raise errors.unsupported_media_type(accepted)
        check_options(options, option_problems(request.query))
        try:
            return parser(raw) if raw else None
        except (ValueError, yaml.YAMLError) as error:
            raise errors.bad_request(f"couldn't get version/kind; json parse error: {error}") \
                from None

    def _decode(self, resource_type: ResourceType, version: str, body: Any,
                query: MultiMapping[str], *, kind: str | None = None,
                group: str | None = None) -> tuple[JSONDict, list[str], list[Any]]:
        """Decode a versioned body: (object, warnings, CR validation errors)."""
        kind = kind or resource_type.kind
        group = resource_type.group if group is None else group
        api_version = f"{group}/{version}" if group else version
        if not isinstance(body, dict):
            raise errors.bad_request(f"{kind} in version \"{version}\" cannot be handled as a "
                                     f"{kind}: body must be a JSON object")
        if body.get("kind") not in (None, "", kind) or \
                body.get("apiVersion") not in (None, "", api_version):
            raise errors.bad_request(
                f"the API version in the data ({body.get('apiVersion', '')}) does not match the "
                f"expected API version ({api_version})"
                if body.get("kind") in (None, "", kind) else
                f"{body.get('kind')} in version \"{version}\" cannot be handled as a {kind}: no "
                f"kind \"{body.get('kind')}\" is registered for version \"{api_version}\"")
        body = {**body, "apiVersion": api_version, "kind": kind}
        cr_problems: list[Any] = []
        if resource_type.builtin or kind == "Scale":
            root = builtin_schemas().root(group, version, kind)
            if root is None:
                decoded, unknown = copy.deepcopy(body), []
            else:
                try:
                    result = builtin_schemas().decode(body, root)
                except DecodeError as error:
                    raise errors.bad_request(f"{kind} in version \"{version}\" cannot be handled "
                                             f"as a {kind}: {error}") from None
                decoded, unknown = result.value, result.unknown_fields
        else:
            schema = resource_type.versions[version].schema
            assert schema is not None
            try:
                decoded, unknown, cr_problems = schema.decode(body)
            except DecodeError as error:
                raise errors.bad_request(str(error)) from None
        # Checked with the other options (option_problems); empty means Warn.
        validation = query.get("fieldValidation") or "Warn"
        warnings: list[str] = []
        if unknown and validation == "Strict":
            detail = "strict decoding error: " + ", ".join(
                f'unknown field "{path}"' for path in unknown)
            if resource_type.builtin or kind == "Scale":
                detail = f'{kind} in version "{version}" cannot be handled as a {kind}: {detail}'
            raise errors.bad_request(detail)
        if validation == "Warn":
            warnings = [f'unknown field "{path}"' for path in unknown]
        return decoded, warnings, cr_problems

    @staticmethod
    def _with_warnings(response: web.Response, warnings: list[str]) -> web.Response:
        for warning in warnings:
            response.headers.add("Warning", f"299 - {json.dumps(warning)}")
        return response

    def _check_target(self, obj: JSONDict, path: ApiPath, resource_type: ResourceType) -> None:
        metadata = obj.setdefault("metadata", {})
        if resource_type.namespaced:
            if path.namespace is not None:
                body_namespace = metadata.get("namespace")
                if body_namespace and body_namespace != path.namespace:
                    raise errors.bad_request("the namespace of the provided object does not "
                                             "match the namespace sent on the request")
                metadata["namespace"] = path.namespace
        else:
            metadata.pop("namespace", None)
        if path.name and metadata.get("name") and metadata["name"] != path.name:
            raise errors.bad_request(f"the name of the object ({metadata['name']}) does not match "
                                     f"the name on the URL ({path.name})")
        if path.name and not metadata.get("name"):
            metadata["name"] = path.name

    def _require_namespace(self, resource_type: ResourceType, namespace: str) -> None:
        if resource_type.namespaced and self.enforce_namespaces():
            namespaces = self.registry.resolve("", "v1", "namespaces")
            assert namespaces is not None
            if self.store.lookup(namespaces, "", namespace) is None:
                raise errors.not_found(GroupResource("", "namespaces"), namespace)

    def _problems(self, resource_type: ResourceType, stored: JSONDict, old: JSONDict | None,
                  cr_problems: list[Any], path: ApiPath, name: str) -> None:
        if old is not None and not resource_type.builtin:
            # An update is validated as the object it makes (a status write keeps the old
            # spec), ratcheting against the old object (kube_schema.StructuralSchema.decode).
            schema = resource_type.versions[path.version].schema
            assert schema is not None
            cr_problems = schema.decode(stored, old)[2]
        problems = list(cr_problems) + validate(resource_type, stored, old,
                                                request_group=path.group)
        if not resource_type.builtin:
            problems += self._rules_unless_blocked(resource_type, path.version, stored, old,
                                                   problems)
        if problems:
            raise errors.invalid(resource_type.group_kind, name, problems)

    @classmethod
    def _rules_unless_blocked(cls, resource_type: ResourceType, version: str, stored: JSONDict,
                              old: JSONDict | None, problems: list[Any]) -> list[Any]:
        """customresource/strategy.go hasBlockingErr: after a type, enum, required, length or
        count error the CEL rules are not run, and one error says so."""
        schema = resource_type.versions[version].schema
        if schema is None or not schema.has_rules:
            return []  # no rules, no CEL validator: nothing to block either
        if any(getattr(p, "type", "") in BLOCKING_ERROR_TYPES for p in problems):
            return [errors.FieldError("Invalid", "<nil>", RULES_NOT_CHECKED, "null")]
        return cls._rule_errors(resource_type, version, stored, old)

    @staticmethod
    def _rule_errors(resource_type: ResourceType, version: str, stored: JSONDict,
                     old: JSONDict | None) -> list[Any]:
        """The CRD's CEL rules over the object as its version's schema sees it."""
        schema = resource_type.versions[version].schema
        return [] if schema is None else schema.rule_errors(stored, old)

    # --- create / update / patch / delete ---------------------------------------------------

    async def _create(self, request: web.Request, resource_type: ResourceType, path: ApiPath,
                      gr: GroupResource) -> web.Response:
        body = await self._body(request, options="CreateOptions")
        obj, warnings, cr_problems = self._decode(resource_type, path.version, body,
                                                  request.query)
        self._check_target(obj, path, resource_type)
        metadata = obj["metadata"]
        for key in ("uid", "resourceVersion", "creationTimestamp", "generation",
                    "deletionTimestamp", "deletionGracePeriodSeconds", "managedFields"):
            metadata.pop(key, None)
        self._require_namespace(resource_type, metadata.get("namespace", ""))
        if not metadata.get("name") and metadata.get("generateName"):
            metadata["name"] = self.store.generate_name(metadata["generateName"])
        stored = resource_type.convert_from(obj, path.version)
        apply_defaults(resource_type, stored)
        prepare_for_create(resource_type, stored, path.version)
        self._problems(resource_type, stored, None, cr_problems, path,
                       metadata.get("name", ""))
        created = self.store.insert(resource_type, stored, gr=gr,
                                    dry_run=is_dry_run(request.query))
        response = json_response(resource_type.convert_to(created, path.version), status=201)
        return self._with_warnings(response, warnings)

    async def _update(self, request: web.Request, resource_type: ResourceType, path: ApiPath,
                      gr: GroupResource) -> web.Response:
        body = await self._body(request, options="UpdateOptions")
        dry_run = is_dry_run(request.query)
        obj, warnings, cr_problems = self._decode(resource_type, path.version, body,
                                                  request.query)
        self._check_target(obj, path, resource_type)
        namespace = path.namespace or ""
        old = self.store.lookup(resource_type, namespace, path.name)
        if old is None:
            if (resource_type.group, resource_type.resource) in CREATE_ON_UPDATE:
                return await self._create_from(obj, warnings, cr_problems, resource_type,
                                               path, gr, dry_run=dry_run)
            raise errors.not_found(gr, path.name)
        result = self._write_update(resource_type, path, gr, obj, old, cr_problems,
                                    dry_run=dry_run)
        return self._with_warnings(json_response(resource_type.convert_to(result, path.version)),
                                   warnings)

    async def _create_from(self, obj: JSONDict, warnings: list[str], cr_problems: list[Any],
                           resource_type: ResourceType, path: ApiPath,
                           gr: GroupResource, *, dry_run: bool) -> web.Response:
        obj["metadata"].pop("resourceVersion", None)
        stored = resource_type.convert_from(obj, path.version)
        apply_defaults(resource_type, stored)
        prepare_for_create(resource_type, stored, path.version)
        self._problems(resource_type, stored, None, cr_problems, path, path.name)
        created = self.store.insert(resource_type, stored, gr=gr, dry_run=dry_run)
        return self._with_warnings(
            json_response(resource_type.convert_to(created, path.version), status=201), warnings)

    def _write_update(self, resource_type: ResourceType, path: ApiPath, gr: GroupResource,
                      obj: JSONDict, old: JSONDict, cr_problems: list[Any],
                      *, dry_run: bool, status_only: bool = False) -> JSONDict:
        wanted = obj["metadata"].get("resourceVersion")
        if not wanted and not resource_type.builtin:
            # Custom resources allow no unconditional update (customResourceStrategy's
            # AllowUnconditionalUpdate is false): the generic store refuses it, with the
            # uint64 zero it parsed printed as Go's %#v prints it.
            raise errors.invalid(resource_type.group_kind, path.name, [errors.invalid_value(
                "metadata.resourceVersion", errors.GoLiteral("0x0"),
                "must be specified for an update")])
        if wanted and wanted != old["metadata"]["resourceVersion"]:
            raise errors.conflict(gr, path.name)
        stored = resource_type.convert_from(obj, path.version)
        apply_defaults(resource_type, stored)
        if status_only:
            stored = prepare_for_status_update(stored, old)
        else:
            prepare_for_update(resource_type, stored, old, path.version)
            for key in ("generation", "managedFields"):
                stored["metadata"].pop(key, None)
        self._problems(resource_type, stored, old, cr_problems, path, path.name)
        return self.store.replace(resource_type, stored, gr=gr, dry_run=dry_run)

    def _patch_object(self, content_type: str, current: JSONDict, patch: Any,
                      resource_type: ResourceType, *, kind: str, group: str, version: str,
                      strategic_allowed: bool) -> JSONDict:
        try:
            if content_type == "application/json-patch+json":
                patched = apply_json_patch(current, patch)
            elif content_type == "application/merge-patch+json":
                patched = apply_merge_patch(current, patch)
            elif content_type == "application/strategic-merge-patch+json":
                if not strategic_allowed:
                    raise errors.unsupported_media_type(PATCH_TYPES_CUSTOM)
                root = builtin_schemas().root(group, version, kind)
                patched = apply_strategic_merge_patch(current, patch, root)
            elif content_type == "application/apply-patch+yaml":
                # Approximation of server-side apply: a merge by the list-map keys, no field
                # ownership, no conflicts (see the module docs of kube_api).
                if strategic_allowed:
                    root = builtin_schemas().root(group, version, kind)
                    patched = apply_strategic_merge_patch(current, patch, root)
                else:
                    patched = apply_merge_patch(current, patch)
            else:
                raise errors.unsupported_media_type(
                    PATCH_TYPES_BUILTIN if strategic_allowed else PATCH_TYPES_CUSTOM)
        except PatchError as error:
            if error.code == 400:
                raise errors.bad_request(str(error)) from None
            if error.code == 500:
                raise errors.internal_error(str(error)) from None
            # NewGenericServerResponse(422, ...) keeps no trace of the JSON patch error text.
            raise ApiError(errors.status(
                code=422, reason="Invalid",
                message="the server rejected our request due to an error in our request",
                details={})) from None
        if not isinstance(patched, dict):
            raise errors.bad_request("the patched object is not a JSON object")
        return patched

    async def _patch_body(self, request: web.Request, resource_type: ResourceType) -> Any:
        """The patch, once its media type (415) and then its PatchOptions (422) are checked."""
        content_type = request.content_type
        accepted = PATCH_TYPES_BUILTIN if resource_type.builtin else PATCH_TYPES_CUSTOM
        if content_type not in accepted:
            raise errors.unsupported_media_type(accepted)
        check_options("PatchOptions", option_problems(
            request.query, apply=content_type == "application/apply-patch+yaml"))
        raw = await request.read()
        try:
            if content_type == "application/apply-patch+yaml":
                return yaml.safe_load(raw)
            return json.loads(raw)
        except (ValueError, yaml.YAMLError) as error:
            raise errors.bad_request(f"error decoding patch: {error}") from None

    async def _patch(self, request: web.Request, resource_type: ResourceType, path: ApiPath,
                     gr: GroupResource, *, status_only: bool = False) -> web.Response:
        patch = await self._patch_body(request, resource_type)
        dry_run = is_dry_run(request.query)
        namespace = path.namespace or ""
        old = self.store.lookup(resource_type, namespace, path.name)
        if old is None:
            if request.content_type == "application/apply-patch+yaml" and not status_only:
                obj, warnings, cr_problems = self._decode(resource_type, path.version, patch,
                                                          request.query)
                self._check_target(obj, path, resource_type)
                return await self._create_from(obj, warnings, cr_problems, resource_type, path,
                                               gr, dry_run=dry_run)
            raise errors.not_found(gr, path.name)
        current = resource_type.convert_to(old, path.version)
        patched = self._patch_object(request.content_type, current, patch, resource_type,
                                     kind=resource_type.kind, group=resource_type.group,
                                     version=path.version,
                                     strategic_allowed=resource_type.builtin)
        obj, warnings, cr_problems = self._decode(resource_type, path.version, patched,
                                                  request.query)
        self._check_target(obj, path, resource_type)
        result = self._write_update(resource_type, path, gr, obj, old, cr_problems,
                                    dry_run=dry_run, status_only=status_only)
        return self._with_warnings(json_response(resource_type.convert_to(result, path.version)),
                                   warnings)

    async def _delete(self, request: web.Request, resource_type: ResourceType, path: ApiPath,
                      gr: GroupResource) -> web.Response:
        options = delete_options(await request.read(), request.query)
        preconditions = options.get("preconditions") or {}
        obj, deleted = self.store.remove(
            resource_type, path.namespace or "", path.name, gr=gr,
            precondition_uid=preconditions.get("uid"),
            precondition_resource_version=preconditions.get("resourceVersion"),
            dry_run=bool(options.get("dryRun")))
        if resource_type.return_deleted_object or not deleted:
            return json_response(resource_type.convert_to(obj, path.version))
        metadata = obj["metadata"]
        return json_response(errors.success_status(details={
            "name": metadata["name"], **({"group": gr.group} if gr.group else {}),
            "kind": gr.resource, "uid": metadata["uid"]}))

    async def _delete_collection(self, request: web.Request, resource_type: ResourceType,
                                 path: ApiPath, gr: GroupResource) -> JSONDict:
        """registry/store.go DeleteCollection: the matching objects are listed, each is
        deleted, and the answer is the list as it was listed."""
        options = delete_options(await request.read(), request.query)
        query = request.query
        labels, fields = compile_selectors(resource_type, query.get("labelSelector"),
                                           query.get("fieldSelector"))
        listed_at = self.store.resource_version
        listed = [obj for obj in self.store.items(resource_type, path.namespace)
                  if matches(resource_type, obj, labels, fields)]
        for obj in listed:
            metadata = obj["metadata"]
            self.store.remove(resource_type, metadata.get("namespace", ""), metadata["name"],
                              gr=gr, dry_run=bool(options.get("dryRun")))
        return self._list_body(resource_type, path.version, listed, {
            "resourceVersion": str(listed_at)})

    # --- lists ------------------------------------------------------------------------------

    def _list_body(self, resource_type: ResourceType, version: str, items: list[JSONDict],
                   metadata: JSONDict) -> JSONDict:
        converted = []
        for item in items:
            out = resource_type.convert_to(item, version)
            if resource_type.builtin:
                # Typed lists carry no apiVersion/kind on their items; unstructured ones do.
                out.pop("apiVersion", None)
                out.pop("kind", None)
            converted.append(out)
        return {"kind": resource_type.list_kind or f"{resource_type.kind}List",
                "apiVersion": resource_type.api_version(version),
                "metadata": metadata, "items": converted}

    def _list(self, resource_type: ResourceType, path: ApiPath, query: MultiMapping[str],
              accept: str = "") -> JSONDict:
        labels, fields = compile_selectors(resource_type, query.get("labelSelector"),
                                           query.get("fieldSelector"))
        current = self.store.resource_version
        requested = query.get("resourceVersion", "")
        match = query.get("resourceVersionMatch", "")
        _validate_list_options(query)
        if requested and query.get("continue"):
            raise errors.bad_request("specifying resource version is not allowed when using "
                                     "continue")
        if requested not in ("", "0"):
            try:
                wanted = int(requested)
            except ValueError:
                raise errors.bad_request(f"invalid resource version: {requested}") from None
            if wanted > current:
                raise errors.resource_version_too_large(wanted, current)
            if match == "Exact" and wanted != current:
                if wanted < self.store.compacted_resource_version:
                    raise errors.expired(f"too old resource version: {wanted} "
                                         f"({self.store.compacted_resource_version})")
                raise errors.bad_request("the fake kube-apiserver serves "
                                         "resourceVersionMatch=Exact only at the current "
                                         "resourceVersion")
        list_rv = current
        start = ""
        token = query.get("continue", "")
        if token:
            try:
                decoded = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
                list_rv = int(decoded["rv"])
                start = str(decoded["start"])
            except (ValueError, KeyError, TypeError):
                raise errors.bad_request("continue key is not valid: incorrect encoded start "
                                         "resourceVersion (version meta.k8s.io/v1)") from None
            if 0 <= list_rv < self.store.compacted_resource_version:
                # etcd3 store: a compacted continue is 410 with a token that goes on from the
                # same key at the newest revision (rv -1), an inconsistent list.
                expired = errors.expired(CONTINUE_TOO_OLD)
                expired.status["metadata"] = {"continue": _continue_token(-1, start)}
                raise expired
            if list_rv < 0:
                list_rv = current
        limit_text = query.get("limit", "")
        limit = int(limit_text) if limit_text.isdigit() else 0
        # Read the stored objects in place and copy only the page: a paged LIST of a large
        # collection would otherwise copy all of it for every page.
        page: list[JSONDict] = []
        following: str | None = None
        # Later pages read the snapshot of the first (etcd reads at the token's revision).
        source = (self.store.entries_at(resource_type, path.namespace, resource_version=list_rv,
                                        start=start)
                  if token and list_rv < current else
                  self.store.entries(resource_type, path.namespace, start=start))
        for key, obj in source:
            if not matches(resource_type, obj, labels, fields):
                continue
            if limit and len(page) == limit:
                following = key
                break
            page.append(obj)
        items = [copy.deepcopy(obj) for obj in page]
        metadata: JSONDict = {"resourceVersion": str(list_rv)}
        if following is not None:
            metadata["continue"] = _continue_token(list_rv, following)
            if not labels and not fields:
                metadata["remainingItemCount"] = sum(
                    1 for _ in self.store.entries(resource_type, path.namespace,
                                                  start=following))
        if self._wants_table(accept):
            return self._table(resource_type, path.version, items, metadata,
                               query.get("includeObject", "Metadata"))
        return self._list_body(resource_type, path.version, items, metadata)

    @staticmethod
    def _wants_table(accept: str) -> bool:
        first = accept.split(",")[0]
        return "as=Table" in first and "g=meta.k8s.io" in first

    # --- Tables (kubectl's human-readable output) ------------------------------------------

    def _table(self, resource_type: ResourceType, version: str, items: list[JSONDict],
               metadata: JSONDict, include: str) -> JSONDict:
        now = self.clock()
        columns: list[JSONDict] = [{"name": "Name", "type": "string", "format": "name",
                                    "description": "Name must be unique within a namespace.",
                                    "priority": 0}]
        key = (resource_type.group, resource_type.kind)
        if not resource_type.builtin:
            return self._custom_table(resource_type, version, items, metadata, include)
        rows = []
        for item in items:
            obj = resource_type.convert_to(item, version)
            meta = obj.get("metadata") or {}
            status = obj.get("status") or {}
            spec = obj.get("spec") or {}
            cells: list[Any] = [meta.get("name", "")]
            if key == ("", "Pod"):
                statuses = status.get("containerStatuses") or []
                ready = sum(1 for s in statuses if s.get("ready"))
                restarts = sum(int(s.get("restartCount", 0)) for s in statuses)
                cells += [f"{ready}/{len(spec.get('containers') or [])}",
                          status.get("phase", ""), restarts, _age(meta.get("creationTimestamp"),
                                                                 now)]
            elif key == ("apps", "Deployment"):
                cells += [f"{status.get('readyReplicas', 0)}/{spec.get('replicas', 0)}",
                          status.get("updatedReplicas", 0), status.get("availableReplicas", 0),
                          _age(meta.get("creationTimestamp"), now)]
            else:
                cells.append(meta.get("creationTimestamp", ""))
            row: JSONDict = {"cells": cells}
            if include == "Object":
                row["object"] = obj
            elif include != "None":
                row["object"] = {"kind": "PartialObjectMetadata",
                                 "apiVersion": "meta.k8s.io/v1", "metadata": meta}
            rows.append(row)
        if key == ("", "Pod"):
            columns += [
                {"name": "Ready", "type": "string", "format": "",
                 "description": "The aggregate readiness state of this pod for accepting "
                                "traffic.", "priority": 0},
                {"name": "Status", "type": "string", "format": "",
                 "description": "The aggregate status of the containers in this pod.",
                 "priority": 0},
                {"name": "Restarts", "type": "string", "format": "",
                 "description": "The number of times the containers in this pod have been "
                                "restarted and when the last container in this pod has "
                                "restarted.", "priority": 0},
                {"name": "Age", "type": "string", "format": "",
                 "description": "CreationTimestamp is a timestamp representing the server time "
                                "when this object was created.", "priority": 0},
            ]
        elif key == ("apps", "Deployment"):
            columns += [
                {"name": "Ready", "type": "string", "format": "",
                 "description": "Number of the pod with ready state", "priority": 0},
                {"name": "Up-to-date", "type": "string", "format": "",
                 "description": "Total number of non-terminated pods targeted by this "
                                "deployment that have the desired template spec.",
                 "priority": 0},
                {"name": "Available", "type": "string", "format": "",
                 "description": "Total number of available pods (ready for at least "
                                "minReadySeconds) targeted by this deployment.", "priority": 0},
                {"name": "Age", "type": "string", "format": "",
                 "description": "CreationTimestamp is a timestamp representing the server time "
                                "when this object was created.", "priority": 0},
            ]
        else:
            columns.append({"name": "Created At", "type": "date", "format": "",
                            "description": "CreationTimestamp is a timestamp representing the "
                                           "server time when this object was created.",
                            "priority": 0})
        return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": metadata,
                "columnDefinitions": columns, "rows": rows}

    def _custom_table(self, resource_type: ResourceType, version: str, items: list[JSONDict],
                      metadata: JSONDict, include: str) -> JSONDict:
        """apiextensions' tableconvertor: Name, then the version's additionalPrinterColumns
        (or an Age column when it has none), each cell by its JSONPath and type."""
        now = self.clock()
        printer = list(resource_type.versions[version].printer_columns) or [
            {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]
        columns: list[JSONDict] = [{"name": "Name", "type": "string", "format": "name",
                                    "description": "Name must be unique within a namespace. "
                                                   "Is required when creating resources, "
                                                   "although some resources may allow a client "
                                                   "to request the generation of an "
                                                   "appropriate name automatically. Name is "
                                                   "primarily intended for creation idempotence "
                                                   "and configuration definition. Cannot be "
                                                   "updated. More info: https://kubernetes.io/"
                                                   "docs/concepts/overview/working-with-objects/"
                                                   "names#names", "priority": 0}]
        for column in printer:
            columns.append({"name": column.get("name", ""), "type": column.get("type", ""),
                            "format": column.get("format", ""),
                            "description": column.get("description", ""),
                            "priority": int(column.get("priority", 0))})
        rows = []
        for item in items:
            obj = resource_type.convert_to(item, version)
            meta = obj.get("metadata") or {}
            cells: list[Any] = [meta.get("name", "")]
            for column in printer:
                value = _json_path(obj, str(column.get("jsonPath", "")))
                cells.append(_printer_cell(str(column.get("type", "")), value, now))
            row: JSONDict = {"cells": cells}
            if include == "Object":
                row["object"] = obj
            elif include != "None":
                row["object"] = {"kind": "PartialObjectMetadata",
                                 "apiVersion": "meta.k8s.io/v1", "metadata": meta}
            rows.append(row)
        return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": metadata,
                "columnDefinitions": columns, "rows": rows}

    # --- subresources: status and scale -----------------------------------------------------

    async def _subresource(self, request: web.Request, resource_type: ResourceType,
                           path: ApiPath, gr: GroupResource, namespace: str) -> web.Response:
        method = request.method
        if path.subresource == "status" and resource_type.has_status(path.version):
            if method == "GET":
                stored = self.store.require(resource_type, namespace, path.name, gr)
                return json_response(resource_type.convert_to(stored, path.version))
            if method == "PUT":
                body = await self._body(request, options="UpdateOptions")
                obj, warnings, cr_problems = self._decode(resource_type, path.version, body,
                                                          request.query)
                self._check_target(obj, path, resource_type)
                old = self.store.require(resource_type, namespace, path.name, gr)
                result = self._write_update(resource_type, path, gr, obj, old, cr_problems,
                                            dry_run=is_dry_run(request.query),
                                            status_only=True)
                return self._with_warnings(
                    json_response(resource_type.convert_to(result, path.version)), warnings)
            if method == "PATCH":
                return await self._patch(request, resource_type, path, gr, status_only=True)
            raise errors.method_not_allowed()
        scale = resource_type.scale(path.version) if path.subresource == "scale" else None
        if scale is not None:
            return await self._scale(request, resource_type, path, gr, namespace, scale)
        raise errors.route_not_found()

    def _scale_of(self, resource_type: ResourceType, stored: JSONDict, version: str,
                  spec: ScaleSpec) -> JSONDict:
        obj = resource_type.convert_to(stored, version)
        metadata = obj["metadata"]

        def read(path: str) -> Any:
            value: Any = obj
            for part in path.lstrip(".").split("."):
                value = value.get(part) if isinstance(value, dict) else None
            return value

        replicas = read(spec.spec_replicas_path)
        status_replicas = read(spec.status_replicas_path) if spec.status_replicas_path else None
        selector = ""
        if spec.label_selector_path:
            raw = read(spec.label_selector_path)
            if spec.selector_is_object:
                try:
                    requirements = label_selector_from_object(raw)
                except SelectorError as error:
                    raise errors.internal_error(str(error)) from None
                selector = format_label_selector(requirements or ())
            elif isinstance(raw, str):
                selector = raw
        scale_metadata = {k: metadata[k] for k in ("name", "namespace", "uid", "resourceVersion",
                                                   "creationTimestamp") if k in metadata}
        status: JSONDict = {"replicas": status_replicas if isinstance(status_replicas, int)
                            else 0}
        if selector:
            status["selector"] = selector
        scale_spec: JSONDict = {}
        if isinstance(replicas, int) and replicas:
            scale_spec["replicas"] = replicas
        return {"kind": "Scale", "apiVersion": "autoscaling/v1", "metadata": scale_metadata,
                "spec": scale_spec, "status": status}

    async def _scale(self, request: web.Request, resource_type: ResourceType, path: ApiPath,
                     gr: GroupResource, namespace: str, spec: ScaleSpec) -> web.Response:
        method = request.method
        if method not in ("GET", "PUT", "PATCH"):
            raise errors.method_not_allowed()
        # A write's media type and options are checked before the object is read.
        if method == "PUT":
            body = await self._body(request, options="UpdateOptions")
        elif method == "PATCH":
            patch = await self._patch_body(request, resource_type)
        stored = self.store.require(resource_type, namespace, path.name, gr)
        current = self._scale_of(resource_type, stored, path.version, spec)
        if method == "GET":
            return json_response(current)
        if method == "PATCH":
            body = self._patch_object(request.content_type, current, patch, resource_type,
                                      kind="Scale", group="autoscaling", version="v1",
                                      strategic_allowed=resource_type.builtin)
        scale, warnings, _ = self._decode(resource_type, "v1", body, request.query,
                                          kind="Scale", group="autoscaling")
        self._check_target(scale, path, resource_type)
        problems = validate_scale(scale)
        if problems:
            raise errors.invalid(errors.GroupKind("autoscaling", "Scale"), path.name, problems)
        wanted = scale["metadata"].get("resourceVersion")
        if wanted and wanted != stored["metadata"]["resourceVersion"]:
            raise errors.conflict(gr, path.name)
        replicas = (scale.get("spec") or {}).get("replicas", 0)
        obj = resource_type.convert_to(stored, path.version)
        target: JSONDict = obj
        parts = spec.spec_replicas_path.lstrip(".").split(".")
        for part in parts[:-1]:
            target = target.setdefault(part, {})
        target[parts[-1]] = replicas
        if wanted:
            obj["metadata"]["resourceVersion"] = wanted
        if not resource_type.builtin:
            # A custom resource's scale write is an update of the object: its schema (the
            # replicas' minimum and maximum) and its CEL rules apply.
            schema = resource_type.versions[path.version].schema
            assert schema is not None
            before = resource_type.convert_to(stored, path.version)
            _, _, problems = schema.decode(obj, before)
            problems += self._rules_unless_blocked(resource_type, path.version, obj, before,
                                                   problems)
            if problems:
                raise errors.invalid(resource_type.group_kind, path.name, problems)
        result = self.store.replace(resource_type, resource_type.convert_from(obj, path.version),
                                    gr=gr, dry_run=is_dry_run(request.query))
        response = json_response(self._scale_of(resource_type, result, path.version, spec))
        return self._with_warnings(response, warnings)

    # --- reviews (TokenReview, SubjectAccessReview, ...) -------------------------------------

    async def _review(self, request: web.Request, resource_type: ResourceType, path: ApiPath,
                      identity: Any) -> web.Response:
        body = await self._body(request, options="CreateOptions")
        obj, warnings, _ = self._decode(resource_type, path.version, body, request.query)
        handler = self.reviews[resource_type.resource]
        result = await handler(body, obj, identity)
        return self._with_warnings(json_response(result, status=201), warnings)

    # --- watch ------------------------------------------------------------------------------

    def _translate(self, event: StoreEvent, resource_type: ResourceType, path: ApiPath,
                   labels: Any, fields: Any) -> tuple[str, JSONDict] | None:
        """cacheWatcher.convertToWatchEvent: selector transitions become ADDED/DELETED."""
        def passes(obj: JSONDict | None) -> bool:
            if obj is None:
                return False
            if path.namespace is not None and event.namespace != path.namespace:
                return False
            return matches(resource_type, obj, labels, fields)

        current = event.type != "DELETED" and passes(event.object)
        previous = passes(event.previous)
        if not current and not previous:
            return None
        if current and not previous:
            kind, obj = "ADDED", event.object
        elif current:
            kind, obj = "MODIFIED", event.object
        else:
            kind = "DELETED"
            source = event.object if event.type == "DELETED" else event.previous
            assert source is not None
            obj = copy.deepcopy(source)
            obj["metadata"]["resourceVersion"] = str(event.resource_version)
        return kind, resource_type.convert_to(obj, path.version)

    def _bookmark(self, resource_type: ResourceType, version: str, *,
                  initial_events_end: bool = False) -> JSONDict:
        metadata: JSONDict = {"resourceVersion": str(self.store.resource_version)}
        if resource_type.builtin:
            metadata["creationTimestamp"] = None
        if initial_events_end:
            metadata["annotations"] = {"k8s.io/initial-events-end": "true"}
        return {"kind": resource_type.kind, "apiVersion": resource_type.api_version(version),
                "metadata": metadata}

    async def _watch(self, request: web.Request, resource_type: ResourceType, path: ApiPath,
                     *, stall: bool = False) -> web.StreamResponse:
        query = request.query
        labels, fields = compile_selectors(resource_type, query.get("labelSelector"),
                                           query.get("fieldSelector"))
        requested = query.get("resourceVersion", "")
        bookmarks = _truthy(query.get("allowWatchBookmarks"))
        send_initial = query.get("sendInitialEvents")
        timeout_text = query.get("timeoutSeconds", "")
        try:
            timeout = float(timeout_text) if timeout_text else self.watch.default_timeout
        except ValueError:
            raise errors.bad_request(f"invalid timeoutSeconds: {timeout_text}") from None
        if send_initial is not None and (
                not bookmarks or query.get("resourceVersionMatch") != "NotOlderThan"):
            raise errors.invalid(errors.GroupKind("meta.k8s.io", "ListOptions"), "", [
                errors.forbidden("sendInitialEvents", "sendInitialEvents requires "
                                 "allowWatchBookmarks=true and "
                                 "resourceVersionMatch=NotOlderThan")])
        deadline = time.monotonic() + timeout
        queue: asyncio.Queue[StoreEvent | None] = asyncio.Queue()
        key = resource_type.storage_key
        unsubscribe = self.store.subscribe(
            lambda event: queue.put_nowait(event) if event.key == key else None)
        self._watch_queues.add(queue)
        try:
            initial: list[tuple[str, JSONDict]] = []
            expired: ApiError | None = None
            newer_than = 0
            if requested in ("", "0") or _truthy(send_initial):
                for obj in self.store.items(resource_type, path.namespace):
                    if matches(resource_type, obj, labels, fields):
                        initial.append(("ADDED", resource_type.convert_to(obj, path.version)))
            else:
                try:
                    wanted = int(requested)
                except ValueError:
                    raise errors.bad_request(f"invalid resource version: {requested}") from None
                if wanted < self.store.compacted_resource_version:
                    expired = errors.expired(f"too old resource version: {wanted} "
                                             f"({self.store.compacted_resource_version})")
                else:
                    # A version the server has not reached yet opens the watch as any other:
                    # the cacher's watcher sends only events newer than it (cacheWatcher).
                    newer_than = wanted
                    for event in self.store.history_after(wanted):
                        if event.key != key or event.resource_version > \
                                self.store.resource_version:
                            continue
                        translated = self._translate(event, resource_type, path, labels, fields)
                        if translated is not None:
                            initial.append(translated)
                    # Everything up to now is in `initial`; the queue only holds newer events.
                    while not queue.empty():
                        queue.get_nowait()
            response = web.StreamResponse(status=200, headers={
                "Content-Type": "application/json", "Cache-Control": "no-cache, private"})
            response.enable_chunked_encoding()
            await response.prepare(request)
            if stall:
                await self._stall(request)
                return response

            as_table = self._wants_table(request.headers.get("Accept", ""))
            headers_sent = False

            async def send(kind: str, obj: JSONDict) -> None:
                nonlocal headers_sent
                if as_table and kind in ("ADDED", "MODIFIED", "DELETED"):
                    # Each event carries a one-row Table; only the first has the column
                    # definitions (the watch handler sets TableOptions.NoHeaders after it).
                    obj = self._table(resource_type, path.version,
                                      [resource_type.convert_from(obj, path.version)],
                                      {"resourceVersion": obj["metadata"].get(
                                          "resourceVersion", "")},
                                      query.get("includeObject", "Metadata"))
                    if headers_sent:
                        obj["columnDefinitions"] = []
                    headers_sent = True
                line = json.dumps({"type": kind, "object": obj}, separators=(",", ":"))
                await response.write(line.encode() + b"\n")

            def hung_up() -> bool:
                transport = request.transport
                return transport is None or transport.is_closing()

            try:
                if expired is not None:
                    await send("ERROR", expired.status)
                    return response
                for kind, obj in initial:
                    await send(kind, obj)
                if _truthy(send_initial) and bookmarks:
                    await send("BOOKMARK", self._bookmark(resource_type, path.version,
                                                          initial_events_end=True))
                next_bookmark = self._next_bookmark(deadline) if bookmarks else None
                while not self.closing.is_set() and not hung_up():
                    now = time.monotonic()
                    if now >= deadline:
                        break
                    if next_bookmark is not None and now >= next_bookmark:
                        await send("BOOKMARK", self._bookmark(resource_type, path.version))
                        next_bookmark = self._next_bookmark(deadline)
                        continue
                    wake = min(deadline, next_bookmark or deadline, now + 0.5) - now
                    try:
                        incoming = await asyncio.wait_for(queue.get(), timeout=max(wake, 0.0))
                    except TimeoutError:
                        continue
                    if incoming is None or incoming.resource_version <= newer_than:
                        continue
                    translated = self._translate(incoming, resource_type, path, labels, fields)
                    if translated is not None and not hung_up():
                        await send(*translated)
            except ConnectionResetError:
                pass  # the watcher went away while an event was on its way: its watch is over
            return response
        finally:
            unsubscribe()
            self._watch_queues.discard(queue)

    def _next_bookmark(self, deadline: float) -> float | None:
        now = time.monotonic()
        heartbeat = now + self.watch.bookmark_interval
        heartbeat = min(heartbeat, deadline - BOOKMARK_PRE_TIMEOUT)
        return heartbeat if heartbeat >= now else None

    async def _stall(self, request: web.Request) -> None:
        """Hold the connection open and send nothing until the client or the server gives up."""
        while not self.closing.is_set():
            transport = request.transport
            if transport is None or transport.is_closing():
                return
            try:
                await asyncio.wait_for(self.closing.wait(), timeout=0.2)
            except TimeoutError:
                continue

    # --- discovery --------------------------------------------------------------------------

    def resource_list(self, group: str, version: str) -> JSONDict | None:
        types = self.registry.in_group_version(group, version)
        if not types:
            return None
        resources: list[JSONDict] = []
        for resource_type in sorted(types, key=lambda t: t.resource):
            entry: JSONDict = {"name": resource_type.resource,
                               "singularName": resource_type.singular,
                               "namespaced": resource_type.namespaced,
                               "kind": resource_type.kind, "verbs": list(resource_type.verbs)}
            if resource_type.short_names:
                entry["shortNames"] = list(resource_type.short_names)
            if resource_type.categories:
                entry["categories"] = list(resource_type.categories)
            resources.append(entry)
            if resource_type.has_status(version):
                resources.append({"name": f"{resource_type.resource}/status",
                                  "singularName": "", "namespaced": resource_type.namespaced,
                                  "kind": resource_type.kind, "verbs": list(
                                      ("get", "patch", "update"))})
            if resource_type.scale(version) is not None:
                resources.append({"name": f"{resource_type.resource}/scale", "singularName": "",
                                  "namespaced": resource_type.namespaced, "group": "autoscaling",
                                  "version": "v1", "kind": "Scale",
                                  "verbs": ["get", "patch", "update"]})
        return {"kind": "APIResourceList", "apiVersion": "v1",
                "groupVersion": f"{group}/{version}" if group else version,
                "resources": resources}

    # --- OpenAPI v3 (just enough for kubectl's fieldValidation support check) -------------

    @staticmethod
    def openapi_key(group: str, version: str) -> str:
        return f"apis/{group}/{version}" if group else f"api/{version}"

    def openapi_root(self) -> JSONDict:
        """/openapi/v3: one entry per served local group/version."""
        paths: JSONDict = {}
        for group, versions in sorted(self.registry.group_versions().items()):
            for version in versions:
                document = self.openapi_document(group, version)
                digest = hashlib.sha512(json.dumps(document, sort_keys=True).encode()).hexdigest()
                key = self.openapi_key(group, version)
                paths[key] = {"serverRelativeURL": f"/openapi/v3/{key}?hash={digest.upper()}"}
        return {"paths": paths}

    def openapi_document(self, group: str, version: str) -> JSONDict:
        """Operations with their GVK and query parameters; no schemas (kubectl then validates
        on the server with fieldValidation, and computes patches from its compiled-in types)."""
        prefix = f"/apis/{group}/{version}" if group else f"/api/{version}"
        parameters = [{"name": name, "in": "query", "schema": {"type": "string", "uniqueItems":
                                                                 True}}
                      for name in ("dryRun", "fieldManager", "fieldValidation")]
        paths: JSONDict = {}
        for resource_type in self.registry.in_group_version(group, version):
            base = (f"{prefix}/namespaces/{{namespace}}/{resource_type.resource}"
                    if resource_type.namespaced else f"{prefix}/{resource_type.resource}")
            gvk = {"group": group, "version": version, "kind": resource_type.kind}

            def operation(action: str, kind: JSONDict = gvk) -> JSONDict:
                return {"x-kubernetes-action": action, "x-kubernetes-group-version-kind": kind,
                        "parameters": parameters,
                        "responses": {"200": {"description": "OK"}}}

            if resource_type.virtual:
                paths[base] = {"post": operation("post")}
                continue
            paths[base] = {"get": operation("list"), "post": operation("post")}
            paths[f"{base}/{{name}}"] = {"get": operation("get"), "put": operation("put"),
                                         "patch": operation("patch"),
                                         "delete": operation("delete")}
            if resource_type.has_status(version):
                paths[f"{base}/{{name}}/status"] = {"get": operation("get"),
                                                    "put": operation("put"),
                                                    "patch": operation("patch")}
            if resource_type.scale(version) is not None:
                scale = {"group": "autoscaling", "version": "v1", "kind": "Scale"}
                paths[f"{base}/{{name}}/scale"] = {"get": operation("get", scale),
                                                   "put": operation("put", scale),
                                                   "patch": operation("patch", scale)}
        return {"openapi": "3.0.0",
                "info": {"title": "Kubernetes", "version": "v1.36.0-fake"},
                "paths": paths, "components": {}}


def _continue_token(resource_version: int, start: str) -> str:
    """storage.EncodeContinue: the revision to read at (-1: the newest) and the next key."""
    text = json.dumps({"v": "meta.k8s.io/v1", "rv": resource_version, "start": start},
                      separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _validate_list_options(query: MultiMapping[str]) -> None:
    """ValidateListOptions (apimachinery meta/internalversion/validation) for a LIST: 422."""
    problems: list[errors.FieldError] = []
    match = query.get("resourceVersionMatch", "")
    if match:
        if not query.get("resourceVersion"):
            problems.append(errors.forbidden("resourceVersionMatch", "resourceVersionMatch is "
                                             "forbidden unless resourceVersion is provided"))
        if query.get("continue"):
            problems.append(errors.forbidden("resourceVersionMatch", "resourceVersionMatch is "
                                             "forbidden when continue is provided"))
        if match not in ("Exact", "NotOlderThan"):
            problems.append(errors.not_supported("resourceVersionMatch", match,
                                                 ["Exact", "NotOlderThan", ""]))
        if match == "Exact" and query.get("resourceVersion") == "0":
            problems.append(errors.forbidden("resourceVersionMatch", 'resourceVersionMatch '
                                             '"exact" is forbidden for resourceVersion "0"'))
    if query.get("sendInitialEvents") is not None:
        problems.append(errors.forbidden("sendInitialEvents",
                                         "sendInitialEvents is forbidden for list"))
    if problems:
        raise errors.invalid(errors.GroupKind("meta.k8s.io", "ListOptions"), "", problems)


_PATH_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]|\[\?\(@\.([^=]+)==[\"']([^\"']*)[\"']\)\]")


def _json_path(obj: Any, path: str) -> Any:
    """The first result of a printer column's JSONPath (fields, `[n]` and `[?(@.k=="v")]`)."""
    text = path.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    position = 0
    current: Any = obj
    while position < len(text):
        step = _PATH_STEP.match(text, position)
        if step is None or current is None:
            return None
        position = step.end()
        field, index, key, wanted = step.groups()
        if field is not None:
            current = current.get(field) if isinstance(current, dict) else None
        elif index is not None:
            current = current[int(index)] if isinstance(current, list) and \
                int(index) < len(current) else None
        else:
            current = next((item for item in current if isinstance(item, dict)
                            and str(item.get(key)) == wanted), None) \
                if isinstance(current, list) else None
    return current


def _printer_cell(column_type: str, value: Any, now: datetime) -> Any:
    """tableconvertor's cellForJSONValue: a cell of the column's type, else None."""
    if value is None:
        return None
    if column_type == "integer" and isinstance(value, (int, float)) and \
            not isinstance(value, bool):
        return int(value)
    if column_type == "number" and isinstance(value, (int, float)) and \
            not isinstance(value, bool):
        return float(value)
    if column_type == "boolean" and isinstance(value, bool):
        return value
    if column_type == "string":
        return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    if column_type == "date" and isinstance(value, str):
        try:
            return _age(value, now)
        except ValueError:
            return "<invalid>"
    return None
