"""Real programs for tests and the demo: the control plane, the kubelet stand-in, the peers."""
