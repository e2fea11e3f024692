"""Reading metrics answers fast must read them exactly as the careful path does: quantities,
custom metric items (any shape, valid or not) and pod metrics sharing times and values."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.model import metrics as model
from autoscaler.model.fields import ModelError, Quantity
from autoscaler.model.metrics import MetricValueList, PodMetricsList, parse_metric_input
from metricscale.core.quantity import milli_value, parse_quantity

PROFILE = settings(max_examples=300, deadline=None)


@PROFILE
@given(number=st.integers(min_value=0, max_value=10**15 - 1),
       zeros=st.integers(min_value=0, max_value=2), milli=st.booleans())
def test_fast_quantity_parsing_gives_the_exact_value_and_milli_value(
        number: int, zeros: int, milli: bool) -> None:
    text = "0" * zeros + str(number) + ("m" if milli else "")
    text = text[-15:] if len(text) > 15 else text
    parsed = Quantity.parse(text)
    exact = parse_quantity(text)
    assert (str(parsed.value), parsed.milli, parsed.text) == (str(exact), milli_value(exact), text)


@pytest.mark.parametrize("text", ["1.5", "2Gi", "1e3", "-5", "+5", " 5", "5 ", "١٢", "10M"])
def test_other_quantities_take_the_general_parser(text: str) -> None:
    try:
        exact = parse_quantity(text)
    except ValueError:
        with pytest.raises(ValueError):
            Quantity.parse(text)
        return
    parsed = Quantity.parse(text)
    assert (str(parsed.value), parsed.milli) == (str(exact), milli_value(exact))


STAMPS = ["2026-11-21T10:00:00Z", "2026-11-21T10:00:00.5+01:00", "not a time", 7, None]
VALUES = ["10", "250m", "1.5", "2Gi", "x", 3, 2.5, True, None]
STRINGS = st.one_of(st.sampled_from(["Pod", "web-1", "shop", "/v1", ""]), st.none(),
                    st.integers(0, 3))
described = st.one_of(st.fixed_dictionaries({}, optional={
    "kind": STRINGS, "name": STRINGS, "namespace": STRINGS, "apiVersion": STRINGS}),
    st.none(), st.just("pod"))
item = st.one_of(
    st.fixed_dictionaries({}, optional={
        "describedObject": described,
        "metric": st.one_of(st.fixed_dictionaries({}, optional={"name": STRINGS}), st.none(),
                            st.just(["x"])),
        "metricName": STRINGS,
        "timestamp": st.sampled_from(STAMPS),
        "windowSeconds": st.one_of(st.none(), st.integers(-5, 120), st.just(2**63),
                                   st.just(60.0), st.just(True), st.just("60")),
        "value": st.sampled_from(VALUES),
    }),
    st.sampled_from([None, "item", 5]))


def careful(items: list[Any]) -> MetricValueList | str:
    try:
        return MetricValueList(items=tuple(model._metric_value(raw, f"m.items[{i}]")
                                           for i, raw in enumerate(items)))
    except ModelError as err:
        return str(err)


def parsed(items: list[Any]) -> MetricValueList | str:
    try:
        result = parse_metric_input({"kind": "MetricValueList", "items": items}, "m")
    except ModelError as err:
        return str(err)
    assert isinstance(result, MetricValueList)
    return result


@PROFILE
@given(items=st.lists(item, max_size=4))
def test_custom_metric_items_read_as_the_careful_path_reads_them(items: list[Any]) -> None:
    expected, got = careful(items), parsed(items)
    assert got == expected
    if isinstance(got, MetricValueList) and isinstance(expected, MetricValueList):
        for a, b in zip(got.items, expected.items, strict=True):
            assert (a.window, a.value.milli, a.value.text, a.timestamp.utcoffset()) == (
                b.window, b.value.milli, b.value.text, b.timestamp.utcoffset())


def pod_metrics(*pods: tuple[str, str, str]) -> dict[str, Any]:
    return {"kind": "PodMetricsList", "items": [
        {"metadata": {"name": name, "namespace": "shop"}, "timestamp": stamp, "window": "30s",
         "containers": [{"name": "app", "usage": {"cpu": cpu, "memory": "64Mi"}}]}
        for name, stamp, cpu in pods]}


def test_pod_metrics_sharing_times_and_values_read_as_each_alone() -> None:
    pods = [("a", "2026-11-21T10:00:00Z", "250m"), ("b", "2026-11-21T10:00:00Z", "250m"),
            ("c", "2026-11-21T10:00:05Z", "1")]
    together = parse_metric_input(pod_metrics(*pods), "m")
    alone = [parse_metric_input(pod_metrics(pod), "m") for pod in pods]
    assert isinstance(together, PodMetricsList)
    assert list(together.items) == [one.items[0] for one in alone
                                    if isinstance(one, PodMetricsList)]
    assert [p.containers[0].usage["cpu"].milli for p in together.items] == [250, 250, 1000]


def test_a_bad_pod_metrics_time_is_still_named_by_its_field() -> None:
    raw = pod_metrics(("a", "2026-11-21T10:00:00Z", "1"), ("b", "yesterday", "1"))
    with pytest.raises(ModelError, match=r"m\.items\[1\]\.timestamp"):
        parse_metric_input(raw, "m")
