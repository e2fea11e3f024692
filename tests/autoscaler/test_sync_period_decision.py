"""KEP-6003's spec.behavior.syncPeriodSeconds in the decision: explained, nothing else changes."""

from __future__ import annotations

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
