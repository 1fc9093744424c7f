"""`env.name = "verifiers"`: `player` plays each episode as a rollout in a harness worker, `harness` is the
actor's side of that worker (a subprocess), `worker` the standalone script it runs in the Python that has
verifiers."""
