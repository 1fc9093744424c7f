"""Test probes: environments that measure the actor rather than a policy (throughput, task orders)."""
