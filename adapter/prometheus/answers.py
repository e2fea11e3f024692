"""What Prometheus answers, read: the client's errors (safe to show, the backend's words in
`detail`), the form body of a query, instant query results, and how each response code and
body is read (2xx, 400, 422 and 503 as Prometheus JSON, as upstream does)."""

from __future__ import annotations

import math
import string
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_FLOOR, Decimal
from typing import Any, NamedTuple

import msgspec
import orjson

__all__ = [
    "PrometheusError",
    "PrometheusQueryError",
    "PrometheusUnavailable",
    "QueryResult",
    "Scalar",
    "UnexpectedResultType",
    "Vector",
    "VectorSample",
    "encode_form",
    "format_time",
    "parse_query_response",
]

# Codes whose bodies Prometheus' own Go client reads as API JSON (prometheus-adapter does too).
_API_JSON_CODES = frozenset({400, 422, 503})
# Prometheus' errorType values that mean "try again later" rather than "this query is wrong".
_TRANSIENT_ERROR_TYPES = frozenset({"timeout", "canceled", "unavailable", "internal"})
_KNOWN_ERROR_TYPES = frozenset(
    {"bad_data", "execution", "timeout", "canceled", "unavailable", "internal", "not_found",
     "not_acceptable"})
_MILLISECOND = Decimal("0.001")
_MISSING = object()
_NO_LABELS: dict[str, str] = {}  # a sample without "metric" (never changed)
# tuple.__new__ builds a VectorSample without the Python-level __new__ of a NamedTuple.
_new_tuple = tuple.__new__


# ---------------------------------------------------------------------------------------------
# Errors


class PrometheusError(Exception):
    """Base: `str()` is safe for API clients; `detail` holds backend text for logs only."""

    def __init__(self, message: str, *, reason: str, detail: str = "",
                 status: int | None = None, error_type: str | None = None) -> None:
        super().__init__(message)
        self.reason = reason          # bounded vocabulary, also the metrics label
        self.detail = detail
        self.status = status          # HTTP status from the backend, if one answered
        self.error_type = error_type  # Prometheus' errorType, if it sent one


class PrometheusUnavailable(PrometheusError):
    """Prometheus could not answer now: transport error, timeout, 429, 5xx, transient errorType."""


class PrometheusQueryError(PrometheusError):
    """Prometheus answered that the request is wrong (4xx, bad_data, execution) or sent bad data."""


class UnexpectedResultType(PrometheusQueryError):
    """An instant query answered with a matrix or a string: no metric value can come from it."""


_FORM_CONTENT_TYPE = "application/x-www-form-urlencoded"
# quote_plus for ASCII text in one str.translate: a 100-pod query is ~850 characters, and
# aiohttp's FormData (urlencode, one quote per character class lookup) costs ~50 µs a request.
_FORM_UNRESERVED = frozenset(string.ascii_letters + string.digits + "_.-~")
_FORM_ASCII = {code: chr(code) if chr(code) in _FORM_UNRESERVED else "+" if code == 0x20
               else f"%{code:02X}" for code in range(0x80)}


_FORM_REPLACEMENTS = {chr(code): quoted for code, quoted in _FORM_ASCII.items()
                      if quoted != chr(code)}


def _form_text(text: str) -> str:
    if not text.isascii():
        return urllib.parse.quote_plus(text)
    # A query holds few distinct characters to escape, many times each (`|` between names):
    # one str.replace per distinct character is much cheaper than a translate per character.
    unsafe = set(text).difference(_FORM_UNRESERVED)
    if len(unsafe) > 24:
        return text.translate(_FORM_ASCII)
    if "%" in unsafe:  # first: the escapes written below hold `%`
        text = text.replace("%", "%25")
        unsafe.discard("%")
    space = " " in unsafe
    unsafe.discard(" ")
    for char in unsafe:
        text = text.replace(char, _FORM_REPLACEMENTS[char])
    return text.replace(" ", "+") if space else text  # last: `+` itself is escaped above


def encode_form(params: Sequence[tuple[str, str]]) -> bytes:
    """An `application/x-www-form-urlencoded` body: the bytes `urllib.parse.urlencode` makes."""
    return "&".join(_form_text(name) + "=" + _form_text(value)
                    for name, value in params).encode("ascii")


# ---------------------------------------------------------------------------------------------
# Results


class VectorSample(NamedTuple):
    """One sample of an instant vector (a tuple: a 100-pod answer builds 100 of them)."""

    labels: Mapping[str, str]
    timestamp: Decimal           # Unix seconds, exactly as Prometheus wrote it
    value: str                   # Prometheus' string: "1.5", "NaN", "+Inf"


@dataclass(frozen=True)
class Vector:
    samples: tuple[VectorSample, ...]
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Scalar:
    timestamp: Decimal
    value: str
    warnings: tuple[str, ...] = ()


QueryResult = Vector | Scalar


def format_time(seconds: float | Decimal) -> str:
    """Unix seconds as Prometheus takes them: milliseconds, the rest cut off."""
    value = seconds if isinstance(seconds, Decimal) else Decimal(repr(float(seconds)))
    return str(value.quantize(_MILLISECOND, rounding=ROUND_FLOOR))


# The two helpers below run once per sample (100s per request): exact type checks (what
# json.loads makes: never a subclass; `bool` is not an `int` here) rather than isinstance chains.


def _sample_pair(raw: object) -> tuple[Decimal, str]:
    if type(raw) is list and len(raw) == 2:
        stamp, value = raw
        if type(value) is str:
            if type(stamp) is float:
                return _exact_time(stamp), value
            if type(stamp) is int:
                return Decimal(stamp), value
    raise _bad_response("a sample that is not [time, \"value\"]")


def _exact_time(stamp: float) -> Decimal:
    """A sample time as Prometheus wrote it.

    Prometheus writes the shortest text that reads back as the same float64 (Go's
    FormatFloat(t, 'f', -1, 64)), and Python's repr is the shortest such text too: the same
    digits, so the Decimal is exact without a parse_float hook on every number.
    """
    if not math.isfinite(stamp):
        raise _bad_response(f"a sample time that is not a finite number ({stamp!r})")
    return Decimal(repr(stamp))


def _labels(raw: object) -> dict[str, str]:
    # JSON object keys are always strings: only the values need checking.
    if type(raw) is dict and all(type(value) is str for value in raw.values()):
        return raw
    raise _bad_response("a sample whose metric is not a map of strings")


def _bad_response(detail: str, *, status: int | None = None) -> PrometheusQueryError:
    return PrometheusQueryError("Prometheus sent an answer that cannot be read",
                                reason="bad_response", detail=detail, status=status)


# The answer of a successful instant query, decoded by msgspec straight into these types: no
# dict per sample, no list per value, the shape checked in C (callgrind: 1.04 M -> ~0.6 M
# instructions for a 100-sample answer). Anything else (an error, a matrix, a sample that is
# not [time, "value"], a native histogram) fails to decode and takes the general path below,
# which says why: both paths give the same values and the same errors.


class _TypedSample(msgspec.Struct, gc=False):
    value: tuple[float | int, str]
    metric: dict[str, str] = {}


class _TypedVector(msgspec.Struct, tag_field="resultType", tag="vector", gc=False):
    result: list[_TypedSample]


class _TypedScalar(msgspec.Struct, tag_field="resultType", tag="scalar"):
    result: tuple[float | int, str]


class _TypedAnswer(msgspec.Struct):
    status: str
    data: _TypedVector | _TypedScalar
    warnings: list[str] = []


_TYPED_ANSWER = msgspec.json.Decoder(_TypedAnswer)


def _typed_result(body: bytes) -> QueryResult | None:
    """The answer decoded by msgspec, or None when it is not a plain successful vector or
    scalar (the general path then reads it, or says what is wrong with it)."""
    try:
        answer = _TYPED_ANSWER.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if answer.status != "success":
        return None
    data = answer.data
    warnings = tuple(answer.warnings)
    if type(data) is _TypedScalar:
        raw_time, value = data.result
        if type(raw_time) is float:
            if not math.isfinite(raw_time):
                return None
            return Scalar(timestamp=Decimal(repr(raw_time)), value=value, warnings=warnings)
        return Scalar(timestamp=Decimal(raw_time), value=value, warnings=warnings)
    assert type(data) is _TypedVector
    samples: list[VectorSample] = []
    append = samples.append
    times: dict[float, Decimal] = {}  # the samples of an instant query share one time
    for item in data.result:
        raw_time, value = item.value
        if type(raw_time) is float:
            stamp = times.get(raw_time)
            if stamp is None:
                if not math.isfinite(raw_time):
                    return None
                stamp = times[raw_time] = Decimal(repr(raw_time))
        else:  # a whole second is written without a fraction: exact, never cached with floats
            stamp = Decimal(raw_time)
        append(_new_tuple(VectorSample, (item.metric, stamp, value)))
    return Vector(samples=tuple(samples), warnings=warnings)


def parse_query_response(status: int, body: bytes) -> QueryResult:
    """Turn one /api/v1/query response into a value or a typed error (pure: tests drive it)."""
    if 200 <= status < 300:
        typed = _typed_result(body)
        if typed is not None:
            return typed
    return _general_result(status, body)


def _general_result(status: int, body: bytes) -> QueryResult:
    """Any answer, read as JSON and checked step by step: the value, or the error saying what
    is wrong with it."""
    payload = _read_api_json(status, body)
    data = payload.get("data")
    if not isinstance(data, dict):
        raise _bad_response("no data object", status=status)
    warnings = _warnings(payload)
    kind = data.get("resultType")
    result = data.get("result")
    if kind == "vector":
        if not isinstance(result, list):
            raise _bad_response("a vector that is not a list", status=status)
        samples: list[VectorSample] = []
        append = samples.append
        times: dict[float, Decimal] = {}  # the samples of an instant query share one time
        for item in result:
            # The shape of every sample Prometheus sends, checked inline (this loop runs for
            # each of 100s of samples); anything else goes through the helpers that say why.
            if type(item) is dict:
                pair = item.get("value")
                metric = item.get("metric", _NO_LABELS)
                if type(pair) is list and len(pair) == 2 and type(metric) is dict:
                    raw_time, value = pair
                    if type(value) is str and type(raw_time) is float:
                        stamp = times.get(raw_time)
                        if stamp is None:
                            stamp = times[raw_time] = _exact_time(raw_time)  # NaN never kept
                        for label in metric.values():
                            if type(label) is not str:
                                break
                        else:
                            append(_new_tuple(VectorSample, (metric, stamp, value)))
                            continue
            if type(item) is not dict:
                raise _bad_response("a vector sample that is not an object", status=status)
            pair = item.get("value", _MISSING)
            if pair is _MISSING:
                raise _bad_response("a vector sample without a value (a native histogram?)",
                                    status=status)
            append(VectorSample(_labels(item.get("metric", _NO_LABELS)), *_sample_pair(pair)))
        return Vector(samples=tuple(samples), warnings=warnings)
    if kind == "scalar":
        timestamp, value = _sample_pair(result)
        return Scalar(timestamp=timestamp, value=value, warnings=warnings)
    if kind in ("matrix", "string"):
        raise UnexpectedResultType(
            f"the query returned a {kind}; a metric needs an instant vector or a scalar",
            reason="unexpected_result_type", detail=f"resultType {kind}", status=status)
    raise _bad_response(f"unknown resultType {kind!r}", status=status)


def _warnings(payload: Mapping[str, Any]) -> tuple[str, ...]:
    raw = payload.get("warnings")
    return tuple(str(w) for w in raw) if isinstance(raw, list) else ()


def _read_api_json(status: int, body: bytes) -> Mapping[str, Any]:
    """Check the status code and the API envelope; returns the successful payload."""
    if not (200 <= status < 300 or status in _API_JSON_CODES):
        raise _error_for_code(status, body)
    try:
        # orjson: a third of json.loads' time on a 100-sample answer, the same values for
        # everything Prometheus writes (its JSONDecodeError is a ValueError).
        payload = orjson.loads(body)
    except (ValueError, UnicodeDecodeError):
        if status == 503:
            raise PrometheusUnavailable("Prometheus is unavailable", reason="unavailable",
                                        detail="503 without a JSON body", status=status) from None
        raise _bad_response(f"HTTP {status} with a body that is not JSON", status=status) from None
    if not isinstance(payload, dict):
        raise _bad_response("the answer is not a JSON object", status=status)
    if payload.get("status") == "success" and 200 <= status < 300:
        return payload
    error_type = payload.get("errorType")
    error_type = error_type if isinstance(error_type, str) else None
    detail = f"{error_type}: {payload.get('error')}"
    reason = error_type if error_type in _KNOWN_ERROR_TYPES else "error"
    if status == 503 or error_type in _TRANSIENT_ERROR_TYPES:
        raise PrometheusUnavailable("Prometheus could not evaluate the query now", reason=reason,
                                    detail=detail, status=status, error_type=error_type)
    raise PrometheusQueryError("Prometheus rejected the query", reason=reason, detail=detail,
                               status=status, error_type=error_type)


def _error_for_code(status: int, body: bytes) -> PrometheusError:
    snippet = body[:200].decode("utf-8", "replace")
    detail = f"unknown response code {status}: {snippet}"
    if status == 429 or status >= 500:
        return PrometheusUnavailable("Prometheus is unavailable", reason=f"http_{status // 100}xx",
                                     detail=detail, status=status)
    return PrometheusQueryError("Prometheus refused the request", reason=f"http_{status // 100}xx",
                                detail=detail, status=status)
