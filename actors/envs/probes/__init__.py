"""Test probes: environments that measure the actor rather than a policy (throughput, task orders), and ones
that misbehave on purpose (misbehaving.py: hangs, blocking code, crashes, slow tools, runaway memory)."""
