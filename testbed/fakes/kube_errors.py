"""metav1.Status error bodies exactly as kube-apiserver writes them (k8s.io/apimachinery errors)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

JSONDict = dict[str, Any]


@dataclass(frozen=True)
class GroupResource:
    """schema.GroupResource: prints as `pods` or `deployments.apps`."""

    group: str
    resource: str

    def __str__(self) -> str:
        return f"{self.resource}.{self.group}" if self.group else self.resource


@dataclass(frozen=True)
class GroupKind:
    """schema.GroupKind: prints as `Pod` or `Deployment.apps`."""

    group: str
    kind: str

    def __str__(self) -> str:
        return f"{self.kind}.{self.group}" if self.group else self.kind


# field.ErrorType -> (text in messages, StatusCause reason)
_FIELD_ERROR_TYPES: dict[str, tuple[str, str]] = {
    "Invalid": ("Invalid value", "FieldValueInvalid"),
    "TypeInvalid": ("Invalid value", "FieldValueTypeInvalid"),
    "Required": ("Required value", "FieldValueRequired"),
    "NotSupported": ("Unsupported value", "FieldValueNotSupported"),
    "Forbidden": ("Forbidden", "FieldValueForbidden"),
    "Duplicate": ("Duplicate value", "FieldValueDuplicate"),
    "TooLong": ("Too long", "FieldValueTooLong"),
    "TooMany": ("Too many", "FieldValueTooMany"),
    "NotFound": ("Not found", "FieldValueNotFound"),
}
_NO_VALUE_TYPES = {"Required", "Forbidden"}
_NO_VALUE = object()


class GoLiteral(str):
    """A bad value printed verbatim, as Go's %#v prints it (`0x0` for a uint64 zero,
    `map[string]interface {}{"type":"A"}` for a map)."""


OMIT_VALUE = object()  # field.OmitValueType: the message carries no value at all


def go_map_literal(value: dict[str, Any]) -> GoLiteral:
    """`%#v` of a map[string]interface{} from JSON (keys sorted, as fmt prints maps)."""
    parts = ",".join(f"{json.dumps(k)}:{_go_value(v)}" for k, v in sorted(value.items()))
    return GoLiteral(f"map[string]interface {{}}{{{parts}}}")


def _go_value(value: Any) -> str:
    # field.Error prints strings quoted (%q) and other values as Go would (%v / JSON-ish).
    if isinstance(value, GoLiteral):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


@dataclass(frozen=True)
class FieldError:
    """field.Error: one validation failure at a JSON path such as `spec.replicas`."""

    type: str
    field: str
    detail: str = ""
    value: Any = dataclass_field(default=_NO_VALUE, compare=False)

    def body(self) -> str:
        text, _ = _FIELD_ERROR_TYPES[self.type]
        if self.type not in _NO_VALUE_TYPES and self.value is not _NO_VALUE \
                and self.value is not OMIT_VALUE:
            text = f"{text}: {_go_value(self.value)}"
        if self.detail:
            text = f"{text}: {self.detail}"
        return text

    def __str__(self) -> str:
        return f"{self.field}: {self.body()}"

    def cause(self) -> JSONDict:
        return {"reason": _FIELD_ERROR_TYPES[self.type][1], "message": self.body(),
                "field": self.field}


def invalid_value(path: str, value: Any, detail: str) -> FieldError:
    return FieldError("Invalid", path, detail, value)


def required_value(path: str, detail: str = "") -> FieldError:
    return FieldError("Required", path, detail)


def not_supported(path: str, value: Any, supported: Sequence[str]) -> FieldError:
    quoted = ", ".join(json.dumps(s) for s in supported)
    return FieldError("NotSupported", path, f"supported values: {quoted}", value)


def forbidden(path: str, detail: str) -> FieldError:
    return FieldError("Forbidden", path, detail)


def duplicate(path: str, value: Any) -> FieldError:
    return FieldError("Duplicate", path, "", value)


class ApiError(Exception):
    """An error that leaves the fake as a `Status` body with the status's code."""

    def __init__(self, status: JSONDict, *, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(status.get("message", ""))
        self.status = status
        self.headers: dict[str, str] = dict(headers or {})

    @property
    def code(self) -> int:
        return int(self.status["code"])

    @property
    def reason(self) -> str:
        return str(self.status.get("reason", ""))


def status(*, code: int, reason: str = "", message: str = "",
           details: JSONDict | None = None) -> JSONDict:
    """A failure `Status` in Go's field order; empty message/reason/details are omitted."""
    body: JSONDict = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
    if message:
        body["message"] = message
    if reason:
        body["reason"] = reason
    if details is not None:
        body["details"] = details
    body["code"] = code
    return body


def success_status(*, details: JSONDict) -> JSONDict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
            "details": details}


def _details(*, name: str = "", group: str = "", kind: str = "", uid: str = "",
             causes: list[JSONDict] | None = None, retry_after: int = 0) -> JSONDict:
    details: JSONDict = {}
    if name:
        details["name"] = name
    if group:
        details["group"] = group
    if kind:
        details["kind"] = kind
    if uid:
        details["uid"] = uid
    if causes:
        details["causes"] = causes
    if retry_after:
        details["retryAfterSeconds"] = retry_after
    return details


def not_found(gr: GroupResource, name: str) -> ApiError:
    return ApiError(status(code=404, reason="NotFound", message=f'{gr} "{name}" not found',
                           details=_details(name=name, group=gr.group, kind=gr.resource)))


def route_not_found() -> ApiError:
    """What a served group/version says for a path it has no route for."""
    return ApiError(status(code=404, reason="NotFound",
                           message="the server could not find the requested resource",
                           details={}))


def already_exists(gr: GroupResource, name: str) -> ApiError:
    return ApiError(status(code=409, reason="AlreadyExists",
                           message=f'{gr} "{name}" already exists',
                           details=_details(name=name, group=gr.group, kind=gr.resource)))


OBJECT_MODIFIED = ("the object has been modified; please apply your changes to the latest "
                   "version and try again")


def conflict(gr: GroupResource, name: str, reason: str = OBJECT_MODIFIED) -> ApiError:
    return ApiError(status(code=409, reason="Conflict",
                           message=f'Operation cannot be fulfilled on {gr} "{name}": {reason}',
                           details=_details(name=name, group=gr.group, kind=gr.resource)))


def invalid(gk: GroupKind, name: str, errors: Sequence[FieldError]) -> ApiError:
    if len(errors) == 1:
        aggregate = str(errors[0])
    else:
        aggregate = "[" + ", ".join(str(e) for e in errors) + "]"
    return ApiError(status(code=422, reason="Invalid",
                           message=f'{gk} "{name}" is invalid: {aggregate}',
                           details=_details(name=name, group=gk.group, kind=gk.kind,
                                            causes=[e.cause() for e in errors])))


def bad_request(message: str) -> ApiError:
    return ApiError(status(code=400, reason="BadRequest", message=message))


def method_not_supported(gr: GroupResource, action: str) -> ApiError:
    return ApiError(status(code=405, reason="MethodNotAllowed",
                           message=f'{action} is not supported on resources of kind "{gr}"',
                           details=_details(group=gr.group, kind=gr.resource)))


def method_not_allowed() -> ApiError:
    return ApiError(status(code=405, reason="MethodNotAllowed",
                           message="the server does not allow this method on the requested "
                                   "resource", details={}))


def unsupported_media_type(accepted: Sequence[str]) -> ApiError:
    return ApiError(status(code=415, reason="UnsupportedMediaType",
                           message="the body of the request was in an unknown format - "
                                   "accepted media types include: " + ", ".join(accepted)))


def not_acceptable(accepted: Sequence[str]) -> ApiError:
    return ApiError(status(code=406, reason="NotAcceptable",
                           message="only the following media types are accepted: "
                                   + ", ".join(accepted)))


def expired(message: str) -> ApiError:
    """410 as the watch cache sends it for a resourceVersion older than its history."""
    return ApiError(status(code=410, reason="Expired", message=message))


def gone(message: str) -> ApiError:
    return ApiError(status(code=410, reason="Gone", message=message))


def too_many_requests(retry_after: int) -> ApiError:
    return ApiError(
        status(code=429, reason="TooManyRequests",
               message="Too many requests, please try again later.",
               details=_details(retry_after=retry_after)),
        headers={"Retry-After": str(retry_after)},
    )


def internal_error(message: str) -> ApiError:
    return ApiError(status(code=500, reason="InternalError",
                           message=f"Internal error occurred: {message}",
                           details=_details(causes=[{"message": message}])))


def service_unavailable(message: str, *, retry_after: int = 0) -> ApiError:
    headers = {"Retry-After": str(retry_after)} if retry_after else None
    return ApiError(status(code=503, reason="ServiceUnavailable", message=message,
                           details=_details(retry_after=retry_after) if retry_after else None),
                    headers=headers)


def server_timeout(message: str, *, retry_after: int = 0, causes: list[JSONDict] | None = None
                   ) -> ApiError:
    details = _details(retry_after=retry_after, causes=causes)
    return ApiError(status(code=504, reason="Timeout", message=message,
                           details=details or None))


def resource_version_too_large(requested: int, current: int) -> ApiError:
    message = f"Too large resource version: {requested}, current: {current}"
    return server_timeout(f"Timeout: {message}", retry_after=1,
                          causes=[{"reason": "ResourceVersionTooLarge", "message": message}])


def unauthorized() -> ApiError:
    return ApiError(status(code=401, reason="Unauthorized", message="Unauthorized"))


def forbidden_error(message: str, *, name: str = "", group: str = "", kind: str = "") -> ApiError:
    return ApiError(
        status(code=403, reason="Forbidden", message=message,
               details=_details(name=name, group=group, kind=kind)),
        headers={"X-Content-Type-Options": "nosniff"},
    )


def generic_server_error(code: int, message: str = "") -> ApiError:
    """A 5xx Status for fault injection, shaped as apimachinery shapes each code."""
    if code == 500:
        return internal_error(message or "injected fault")
    if code == 503:
        return service_unavailable(message or "injected fault")
    if code == 504:
        return server_timeout(message or "Timeout: request did not complete within the allowed "
                                         "duration")
    return ApiError(status(code=code, reason="", message=message or "injected fault"))
