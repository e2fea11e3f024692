"""The HPA decision as pure code: replicas, behavior, conditions, the decision and its history."""
