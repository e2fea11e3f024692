"""The status an autoscaler with an unusable spec gets: ScalingActive False, InvalidSpec."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from autoscaler.controller.reconciler import invalid_spec_status

NOW = datetime(2026, 3, 1, tzinfo=UTC)
ERROR = "spec.maxReplicas: must be an integer"


def test_a_fresh_object_gets_the_condition_and_the_required_desired_replicas() -> None:
    status = invalid_spec_status({}, error=ERROR, generation=3, now=NOW)
    assert status == {
        "conditions": [{"type": "ScalingActive", "status": "False",
                        "lastTransitionTime": "2026-03-01T00:00:00Z", "reason": "InvalidSpec",
                        "message": f"the autoscaler cannot be used: {ERROR}"}],
        "desiredReplicas": 0, "observedGeneration": 3}


def test_other_conditions_and_fields_are_kept_and_scaling_active_replaced() -> None:
    current = {"desiredReplicas": 4, "currentReplicas": 4, "observedGeneration": 2,
               "conditions": [{"type": "AbleToScale", "status": "True"},
                              {"type": "ScalingActive", "status": "True"}]}
    status = invalid_spec_status(current, error=ERROR, generation=3, now=NOW)
    assert status is not None
    assert status["desiredReplicas"] == 4 and status["currentReplicas"] == 4
    assert [c["type"] for c in status["conditions"]] == ["AbleToScale", "ScalingActive"]
    assert status["conditions"][1]["reason"] == "InvalidSpec"


def test_an_object_that_already_says_so_is_not_written_again() -> None:
    status = invalid_spec_status({}, error=ERROR, generation=3, now=NOW)
    assert status is not None
    assert invalid_spec_status(status, error=ERROR, generation=3,
                               now=NOW + timedelta(minutes=5)) is None
