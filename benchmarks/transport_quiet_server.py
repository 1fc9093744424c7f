"""vLLM's OpenAI API server without its per-request Prometheus instrumentation (route d of `turnstream bench
transport`).

    python -m benchmarks.transport_quiet_server VLLM_SERVER_ARGS...

vLLM wraps every HTTP request of its API server in prometheus-fastapi-instrumentator's middleware (request
counts, sizes and latency histograms per route), and no command-line flag turns that off. This runs the same
server with that middleware left out; `/metrics` still serves vLLM's registry (the engine's `vllm:*` metrics,
recorded per engine step rather than per HTTP request, unless `--disable-log-stats`).
"""
from __future__ import annotations

import sys


def mount_engine_metrics_only(app) -> None:
    """In place of vLLM's `attach_router`: the `/metrics` page of vLLM's registry, and no HTTP middleware. Built
    from the names vLLM's module itself imported, so that the page is the one vLLM mounts."""
    import vllm.entrypoints.serve.instrumentator.metrics as vllm_metrics

    registry = vllm_metrics.get_prometheus_registry()
    route = vllm_metrics.Mount("/metrics", vllm_metrics.make_asgi_app(registry=registry))
    route.path_regex = vllm_metrics.re.compile("^/metrics(?P<path>.*)$")  # as vLLM's: no 307 to /metrics/
    app.routes.append(route)


def main(argv: list[str]) -> int:
    import vllm.entrypoints.serve.instrumentator.metrics as instrumented

    # read by name when the routers are registered, so replacing the module's function is enough
    instrumented.attach_router = mount_engine_metrics_only
    from vllm.entrypoints.launchers.api_server.entry import main as serve

    sys.argv = ["vllm-api-server", *argv]
    serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
