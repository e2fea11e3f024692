"""The autoscaler controller's settings: upstream's HPA flags, names and defaults."""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from datetime import timedelta
from typing import Any

from metricscale.core.durations import format_duration, go_duration_argument
from metricscale.core.errors import ConfigError

__all__ = [
    "FLAGS",
    "MAX_GO_DURATION",
    "MAX_SYNC_PERIOD",
    "SETTINGS_ANNOTATION",
    "Settings",
    "SettingsError",
    "add_arguments",
    "given_settings",
    "override_settings",
    "parse_settings",
    "parse_settings_annotation",
    "render_settings",
    "render_settings_annotation",
    "resolve_settings",
    "settings_from_arguments",
]


class SettingsError(ConfigError):
    """A setting that cannot be used; the message names the setting."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


@dataclass(frozen=True)
class Settings:
    """What kube-controller-manager's HPA controller is configured with (its defaults here).

    `tolerance` and the scale-up limit are float64 upstream, so they are floats here too.
    """

    sync_period: timedelta = timedelta(seconds=15)
    tolerance: float = 0.1
    cpu_initialization_period: timedelta = timedelta(minutes=5)
    initial_readiness_delay: timedelta = timedelta(seconds=30)
    downscale_stabilization_window: timedelta = timedelta(minutes=5)
    # Package variables in horizontal.go, not flags: only used when spec.behavior is absent.
    scale_up_limit_factor: float = 2.0
    scale_up_limit_minimum: float = 4.0
    # Upstream's HPAScaleToZero feature gate (alpha, off): minReplicas 0 with Object/External
    # metrics and the ScaledToZero condition.
    scale_to_zero: bool = False

    def __post_init__(self) -> None:
        # RecommendedDefaultHPAControllerConfiguration treats a zero tolerance as "unset".
        if self.tolerance == 0:
            object.__setattr__(self, "tolerance", 0.1)


# Setting name -> upstream flag (kube-controller-manager) or our own flag for non-flag knobs.
FLAGS: Mapping[str, str] = {
    "sync_period": "--horizontal-pod-autoscaler-sync-period",
    "tolerance": "--horizontal-pod-autoscaler-tolerance",
    "cpu_initialization_period": "--horizontal-pod-autoscaler-cpu-initialization-period",
    "initial_readiness_delay": "--horizontal-pod-autoscaler-initial-readiness-delay",
    "downscale_stabilization_window": "--horizontal-pod-autoscaler-downscale-stabilization",
    "scale_up_limit_factor": "--scale-up-limit-factor",
    "scale_up_limit_minimum": "--scale-up-limit-minimum",
    "scale_to_zero": "--scale-to-zero",
}

# Setting name -> key in a snapshot's `settings` block (snapshot.md).
_SNAPSHOT_KEYS: Mapping[str, str] = {
    "tolerance": "tolerance",
    "cpu_initialization_period": "cpuInitializationPeriodSeconds",
    "initial_readiness_delay": "initialReadinessDelaySeconds",
    "downscale_stabilization_window": "downscaleStabilizationWindowSeconds",
    "scale_up_limit_factor": "scaleUpLimitFactor",
    "scale_up_limit_minimum": "scaleUpLimitMinimum",
    "scale_to_zero": "scaleToZero",
    "sync_period": "syncPeriodSeconds",
}

def add_arguments(parser: argparse.ArgumentParser, *, with_defaults: bool = True) -> None:
    """The controller's flags, with upstream's names and defaults (for `metricscale autoscaler`).

    Without defaults (for `explain --live`) a flag not given stays None, so that what was given
    can override what the controller published."""
    defaults: Any = Settings() if with_defaults else _NoDefaults()
    group = parser.add_argument_group("HPA decision (upstream kube-controller-manager flags)")
    group.add_argument(FLAGS["sync_period"], dest="sync_period", type=go_duration_argument,
                       default=defaults.sync_period, metavar="DURATION",
                       help="how often each autoscaler is reconciled (default 15s; at most 1h, "
                            "as spec.behavior.syncPeriodSeconds)")
    group.add_argument(FLAGS["tolerance"], dest="tolerance", type=float,
                       default=defaults.tolerance, metavar="FLOAT",
                       help="minimum change of the usage ratio that causes scaling (default 0.1)")
    group.add_argument(FLAGS["cpu_initialization_period"], dest="cpu_initialization_period",
                       type=go_duration_argument, default=defaults.cpu_initialization_period,
                       metavar="DURATION",
                       help="after pod start, cpu samples may be skipped (default 5m0s)")
    group.add_argument(FLAGS["initial_readiness_delay"], dest="initial_readiness_delay",
                       type=go_duration_argument, default=defaults.initial_readiness_delay,
                       metavar="DURATION",
                       help="after pod start, readiness changes count as initial (default 30s)")
    group.add_argument(FLAGS["downscale_stabilization_window"],
                       dest="downscale_stabilization_window", type=go_duration_argument,
                       default=defaults.downscale_stabilization_window, metavar="DURATION",
                       help="how far back scale-down recommendations are considered (default 5m0s)")
    group.add_argument(FLAGS["scale_up_limit_factor"], dest="scale_up_limit_factor", type=float,
                       default=defaults.scale_up_limit_factor, metavar="FLOAT",
                       help="without spec.behavior: scale up to at most factor x current "
                            "(default 2, at most 1000)")
    group.add_argument(FLAGS["scale_up_limit_minimum"], dest="scale_up_limit_minimum", type=float,
                       default=defaults.scale_up_limit_minimum, metavar="FLOAT",
                       help="without spec.behavior: the scale-up limit is at least this "
                            "(default 4, at most 2147483647)")
    group.add_argument(FLAGS["scale_to_zero"], dest="scale_to_zero", action="store_true",
                       default=defaults.scale_to_zero,
                       help="upstream's HPAScaleToZero behaviour: minReplicas 0 with Object or "
                            "External metrics (off by default, as upstream)")


class _NoDefaults:
    """Every setting's default is None (flags not given are told apart from given ones)."""

    def __getattr__(self, name: str) -> None:
        return None


# The longest sync period: the longest period an autoscaler may ask for itself
# (spec.behavior.syncPeriodSeconds, KEP-6003, 1 to 3600 s), so that one setting has one range.
# A longer one would not autoscale in any useful sense: the metrics are read once a period.
MAX_SYNC_PERIOD = timedelta(hours=1)
# Go's longest time.Duration (2562047h47m16.854775807s, to the microsecond): kube-controller-
# manager refuses a longer duration flag when it starts ("invalid duration").
MAX_GO_DURATION = timedelta(microseconds=9_223_372_036_854_775)
_GO_DURATION_TEXT = "2562047h47m16.854775807s, Go's longest duration"

# Setting -> (the longest value, why), for the durations.
_UPPER_BOUNDS: Mapping[str, tuple[timedelta, str]] = {
    "sync_period": (MAX_SYNC_PERIOD, "1h0m0s, the longest spec.behavior.syncPeriodSeconds"),
    "cpu_initialization_period": (MAX_GO_DURATION, _GO_DURATION_TEXT),
    "initial_readiness_delay": (MAX_GO_DURATION, _GO_DURATION_TEXT),
    "downscale_stabilization_window": (MAX_GO_DURATION, _GO_DURATION_TEXT),
}
# The scale-up limit of the classic rules is int32(max(factor * current, minimum)): beyond
# int32 it turns into Go's int32 of an out-of-range float, math.MinInt32, and the target would
# be scaled to a negative size at every sync. So the minimum must be an int32, and the factor
# small enough that factor x current stays one for any real size: upstream's is 2 (8 in its
# tests); 1000 keeps the product an int32 up to 2 million replicas.
_INT32_MAX = 2**31 - 1
_NUMBER_UPPER_BOUNDS: Mapping[str, tuple[float, str]] = {
    "scale_up_limit_factor": (1000.0, "factor x current replicas must stay an int32"),
    "scale_up_limit_minimum": (float(_INT32_MAX), "the scale-up limit is an int32"),
}

# Setting -> (the smallest value that works, whether that value itself is allowed).
_LOWER_BOUNDS: Mapping[str, tuple[float, bool]] = {
    # A zero period would reconcile every autoscaler in a tight loop.
    "sync_period": (0.0, False),
    "tolerance": (0.0, True),
    "cpu_initialization_period": (0.0, True),
    "initial_readiness_delay": (0.0, True),
    "downscale_stabilization_window": (0.0, True),
    "scale_up_limit_factor": (0.0, True),
    "scale_up_limit_minimum": (0.0, True),
}


def _check_range(name: str, value: Any) -> None:
    bound, inclusive = _LOWER_BOUNDS[name]
    number = value.total_seconds() if isinstance(value, timedelta) else float(value)
    unit = "s" if isinstance(value, timedelta) else ""
    shown = format_duration(value) if isinstance(value, timedelta) else f"{number:g}"
    if not math.isfinite(number):
        raise SettingsError(FLAGS[name], f"must be a finite number, got {shown}")
    if number < bound or (number == bound and not inclusive):
        wanted = f">= {bound:g}{unit}" if inclusive else f"> {bound:g}{unit}"
        raise SettingsError(FLAGS[name], f"must be {wanted}, got {shown}")
    upper = _UPPER_BOUNDS.get(name)
    if upper is not None and isinstance(value, timedelta) and value > upper[0]:
        raise SettingsError(FLAGS[name], f"must be at most {upper[1]}, got {shown}")
    number_upper = _NUMBER_UPPER_BOUNDS.get(name)
    if number_upper is not None and number > number_upper[0]:
        raise SettingsError(FLAGS[name], f"must be at most {number_upper[0]:.0f} "
                                         f"({number_upper[1]}), got {shown}")


def settings_from_arguments(args: argparse.Namespace) -> Settings:
    """Settings from parsed `add_arguments` flags; SettingsError names a value out of range."""
    values = {f.name: getattr(args, f.name) for f in fields(Settings) if hasattr(args, f.name)}
    for name, value in values.items():
        if name in _LOWER_BOUNDS:
            _check_range(name, value)
    return Settings(**values)


def given_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings flags that were given (flags added with `with_defaults=False`)."""
    given = {f.name: getattr(args, f.name) for f in fields(Settings)
             if getattr(args, f.name, None) is not None}
    for name, value in given.items():
        if name in _LOWER_BOUNDS:
            _check_range(name, value)
    return given


def override_settings(base: Settings, given: Mapping[str, Any]) -> Settings:
    """`base` with the given settings (from `given_settings`) in place of its own."""
    return replace(base, **given)


def _number(raw: Any, path: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float):
        raise SettingsError(path, f"must be a number, not {type(raw).__name__}")
    if not math.isfinite(raw):
        raise SettingsError(path, "must be a finite number")
    return float(raw)


def parse_settings(raw: Any, path: str = "settings") -> Settings:
    """A snapshot's `settings` block (absent keys keep upstream's defaults)."""
    if raw is None:
        return Settings()
    if not isinstance(raw, Mapping):
        raise SettingsError(path, f"must be an object, not {type(raw).__name__}")
    known = {key: name for name, key in _SNAPSHOT_KEYS.items()}
    for key in raw:
        if key not in known:
            raise SettingsError(f"{path}.{key}",
                                f"unknown setting (known: {', '.join(sorted(known))})")
    settings = Settings()
    changes: dict[str, Any] = {}
    for key, value in raw.items():
        name = known[key]
        where = f"{path}.{key}"
        if name == "scale_to_zero":
            if not isinstance(value, bool):
                raise SettingsError(where, "must be true or false")
            changes[name] = value
        elif name in {"tolerance", "scale_up_limit_factor", "scale_up_limit_minimum"}:
            number = _number(value, where)
            if number < 0:
                raise SettingsError(where, "must not be negative")
            number_upper = _NUMBER_UPPER_BOUNDS.get(name)
            if number_upper is not None and number > number_upper[0]:
                raise SettingsError(where, f"must be at most {number_upper[0]:.0f} "
                                           f"({number_upper[1]})")
            changes[name] = number
        else:
            number = _number(value, where)
            if number < 0:
                raise SettingsError(where, "must not be negative")
            bound, why = _UPPER_BOUNDS[name]
            if number > bound.total_seconds():
                raise SettingsError(where, f"must be at most {int(bound.total_seconds())} "
                                           f"({why})")
            changes[name] = timedelta(seconds=number)
    return replace(settings, **changes)


def render_settings(settings: Settings) -> dict[str, Any]:
    """The snapshot form of settings (seconds as numbers)."""
    out: dict[str, Any] = {}
    for name, key in _SNAPSHOT_KEYS.items():
        value = getattr(settings, name)
        if isinstance(value, timedelta):
            seconds = value.total_seconds()
            out[key] = int(seconds) if seconds == int(seconds) else seconds
        else:
            out[key] = value
    return out


# The Lease annotation in which the leading controller publishes its effective settings (the
# snapshot form, as compact JSON), so that `explain --live` decides as the controller does.
SETTINGS_ANNOTATION = "metricscale.dev/decision-settings"


def render_settings_annotation(settings: Settings) -> str:
    """The value of SETTINGS_ANNOTATION for these settings."""
    return json.dumps(render_settings(settings), separators=(",", ":"))


def parse_settings_annotation(text: str) -> Settings:
    """Settings from a SETTINGS_ANNOTATION value; SettingsError says what is wrong with it."""
    try:
        raw = json.loads(text)
    except ValueError:
        raise SettingsError(SETTINGS_ANNOTATION, "is not JSON") from None
    return parse_settings(raw, SETTINGS_ANNOTATION)


def resolve_settings(*, published: str | None, given: Mapping[str, Any]) -> tuple[Settings, str]:
    """The settings to decide with as the controller does, for `explain --live` and `replay
    --live`: those it published on its Lease (`published`, the SETTINGS_ANNOTATION's text; one
    that cannot be read counts as none), with the settings flags `given` (`given_settings`) in
    their place, else upstream's defaults; and where they came from: "controller",
    "controller and flags", "flags" or "defaults"."""
    settings: Settings | None = None
    if published is not None:
        try:
            settings = parse_settings_annotation(published)
        except SettingsError:
            settings = None
    if settings is not None:
        source = "controller" + (" and flags" if given else "")
    else:
        source = "flags" if given else "defaults"
    return override_settings(settings or Settings(), given), source
