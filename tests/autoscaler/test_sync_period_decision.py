"""KEP-6003's spec.behavior.syncPeriodSeconds in the decision: explained, nothing else changes."""

from __future__ import annotations

import pytest

from autoscaler.model.fields import ModelError
from autoscaler.model.spec import parse_spec
from tests.autoscaler import builders as b
from tests.autoscaler.reconcile_support import scenario


def test_explain_names_the_autoscalers_own_sync_period_and_the_decision_is_unchanged() -> None:
    common = {"min_replicas": 1, "max_replicas": 10, "spec_replicas": 3,
              "metrics": [b.pods_metric("10")], "levels": [20000, 20000, 20000]}
    own = scenario(behavior={"syncPeriodSeconds": 60}, **common)  # type: ignore[arg-type]
    plain = scenario(behavior={}, **common)  # type: ignore[arg-type]
    assert any("reconciled every 60 s (spec.behavior.syncPeriodSeconds)" in line
               for line in own.explanation)
    assert not any("syncPeriodSeconds" in line for line in plain.explanation)
    assert (own.desired_replicas, own.status) == (plain.desired_replicas, plain.status)


@pytest.mark.parametrize(("period", "explained"), [
    (None, None),
    (1, "reconciled every 1 s (spec.behavior.syncPeriodSeconds), not every 15 s"),
    (60, "reconciled every 60 s (spec.behavior.syncPeriodSeconds), not every 15 s"),
    (3600, "reconciled every 3600 s (spec.behavior.syncPeriodSeconds), not every 15 s"),
])
def test_each_period_is_explained_and_changes_no_decision(period: int | None,
                                                          explained: str | None) -> None:
    common = {"min_replicas": 1, "max_replicas": 10, "spec_replicas": 3,
              "metrics": [b.pods_metric("10")], "levels": [5000, 5000, 5000]}
    behavior = {} if period is None else {"syncPeriodSeconds": period}
    decision = scenario(behavior=behavior, **common)  # type: ignore[arg-type]
    plain = scenario(behavior={}, **common)  # type: ignore[arg-type]
    lines = [line for line in decision.explanation if "syncPeriodSeconds" in line]
    assert len(lines) == (0 if explained is None else 1)
    if explained is not None:
        assert explained in lines[0]
    assert (decision.desired_replicas, decision.status, decision.limits) == \
        (plain.desired_replicas, plain.status, plain.limits)


@pytest.mark.parametrize("period", [0, -1, 3601])
def test_a_period_out_of_range_is_refused_naming_the_field(period: int) -> None:
    with pytest.raises(ModelError, match=r"spec\.behavior\.syncPeriodSeconds"):
        parse_spec({"scaleTargetRef": {"kind": "Deployment", "name": "web"}, "maxReplicas": 3,
                    "behavior": {"syncPeriodSeconds": period}}, "spec")
