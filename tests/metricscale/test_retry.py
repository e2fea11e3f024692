"""Backoff (metricscale.kube.retry): the capped exponential step, whatever the failure count."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from metricscale.kube.retry import Backoff


def test_the_step_doubles_up_to_the_cap() -> None:
    backoff = Backoff(initial=0.5, factor=2.0, cap=30.0)
    assert [backoff.delay(n, jitter=1.0) for n in (1, 2, 3, 7, 8)] == [0.5, 1.0, 2.0, 30.0, 30.0]
    assert backoff.delay(1, jitter=0.0) == 0.25


def test_hours_of_failures_stay_at_the_cap() -> None:
    # 2.0 ** 1100 overflows a float: an informer failing all night once ended on it.
    for backoff in (Backoff(), Backoff(initial=0.01, cap=0.02)):
        assert backoff.delay(1100, jitter=1.0) == backoff.cap
        assert backoff.delay(10**9, jitter=0.0) == backoff.cap / 2


@given(failures=st.integers(min_value=1, max_value=10**12),
       initial=st.floats(min_value=0.001, max_value=60),
       factor=st.floats(min_value=0.5, max_value=10),
       cap=st.floats(min_value=0.001, max_value=600),
       jitter=st.floats(min_value=0, max_value=0.999))
def test_any_count_gives_a_step_within_the_cap(failures: int, initial: float, factor: float,
                                               cap: float, jitter: float) -> None:
    delay = Backoff(initial=initial, factor=factor, cap=cap).delay(failures, jitter=jitter)
    assert 0 < delay <= cap
