"""Restarting a vLLM server the launcher started, so that it serves only the current weights.

A fresh server holds the checkpoint it was started from, not the learner's latest version. So a restarted
policy server comes up on a new port, is paused (`/pause?mode=keep`: requests sent to it wait) as soon as it
answers, and only then replaces the dead server's URL in the run's URL file (and the resolved config the
roles read on a restart). The learner sees a server it never pushed to, pushes it the latest weights
(its re-sync, learner/sync/base.py) and resumes it; the actors see it too, and their requests wait
for that push. A new URL (rather than the old port) is what makes the learner treat it as behind: a server
that died and came back between two pushes at the same address would look up to date.

The fixed opponent's server (`vllm-frozen`) never gets pushes: it restarts on its own port and serves as
soon as it answers.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Callable

from turnstream.core.config import Config
from turnstream.core.urls_file import read_urls_file, write_urls_file
from turnstream.launch.processes import Child, ProcessGroup, free_port
from turnstream.launch.vllm_server import answers, vllm_command

log = logging.getLogger("turnstream.launcher")
FROZEN = "vllm-frozen"


class VllmRestarts:
    def __init__(self, cfg: Config, procs: ProcessGroup, publish: Callable[[], None]):
        self.cfg, self.procs, self.publish = cfg, procs, publish
        self.starting: dict[str, tuple[str, float]] = {}  # name -> (its new URL, start-up deadline)

    def url_of(self, child: Child) -> str:
        port = child.argv[child.argv.index("--port") + 1]
        return f"http://{self.cfg.network.host}:{port}"

    def relaunch(self, child: Child) -> Child:
        v, host = self.cfg.vllm, self.cfg.network.host
        if child.name == FROZEN:
            new = self.procs.restart(child)
        else:
            argv, _ = vllm_command(self.cfg.model.path, host, free_port(host), v, self.cfg.learner.lora)
            new = self.procs.restart(child, argv)
        self.starting[new.name] = (self.url_of(new), time.monotonic() + v.startup_timeout_s)
        return new

    def ready(self, child: Child) -> bool | None:
        """None while the restarted server does not answer yet; True once it serves (a policy server: paused
        and announced); False when it did not answer within vllm.startup_timeout_s."""
        url, deadline = self.starting[child.name]
        if not answers(f"{url}/health"):
            if time.monotonic() < deadline:
                return None
            log.error("%s (%s) not healthy after %.0f s", child.name, url, self.cfg.vllm.startup_timeout_s)
            del self.starting[child.name]
            return False
        del self.starting[child.name]
        if child.name == FROZEN:
            log.info("%s is back at %s", child.name, url)
            return True
        if not answers(f"{url}/pause?mode=keep&clear_cache=false", method="POST"):
            log.warning("%s: could not pause %s before announcing it; it may serve its start-up weights until "
                        "the learner's next push", child.name, url)
        self._replace_url(child.name, url)
        return True

    def _replace_url(self, name: str, url: str) -> None:
        v = self.cfg.vllm
        index = int(name.split("-", 1)[1])
        old = v.urls[index]
        v.urls[index] = url
        path = Path(v.urls_file)
        listed = read_urls_file(path) or []
        kept = [u for u in listed if u.rstrip("/") != old.rstrip("/")]
        write_urls_file(path, [*kept, url])
        self.publish()
        log.info("%s is back at %s (was %s), paused until the learner brings it to the current weights", name, url,
                 old)

