"""The local launcher: every role as a process of this machine (`turnstream up`, the demo), started, watched,
restarted and stopped by PID.

    stack.py           LocalStack: resolves the configuration, starts the vLLM servers, buffer, learner and
                       actors, and stops exactly them in dependency order
    up.py              `turnstream up`: the stack run until the learner finishes or the time limit
    demo.py            `turnstream demo`: the stack run until the tiny model succeeds, then one JSON line
    processes.py       child processes in their own sessions, free ports, log tails
    peak_memory.py     each process's peak memory over its process tree, read at the stop: memory.json
    supervisor.py      the restart policy: which failed process starts again, when, and when the run stops
    vllm_server.py     a vLLM server's command line and readiness (also `turnstream vllm`)
    vllm_restart.py    a restarted policy server brought back on a new port, serving only current weights
    metrics.py         the launcher's own /metrics and /healthz
    scrape_targets.py  the run's Prometheus file-discovery targets
"""
