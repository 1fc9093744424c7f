"""The [launch] table: how `turnstream up` supervises the roles it starts (restarts, back-off, stopping)."""
from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from turnstream.core.config_fields import Section
from turnstream.core.configtools import require

RestartPolicy = Literal["on-failure", "never"]
LaunchedRole = Literal["vllm", "buffer", "learner", "actor"]


class LaunchSection(Section):
    restart: RestartPolicy = Field(
        "on-failure", description="what the launcher does when a role process fails (exits with an error or is "
        "killed): on-failure starts it again after a back-off (a buffer replays its write-ahead log, a learner "
        "resumes from its latest checkpoint, an actor gets a new epoch, a vLLM server is brought to the current "
        "weights before it serves); never stops the whole run, printing the role's last log lines")
    restart_roles: dict[LaunchedRole, RestartPolicy] = Field(
        default_factory=dict, description="per-role exceptions to `restart`, e.g. {learner = \"never\"}; roles: "
        "vllm, buffer, learner, actor")
    backoff_initial_s: float = Field(1.0, gt=0, description="wait before the first restart of a role in a window; "
                                     "it doubles with each further restart in the window")
    backoff_max_s: float = Field(30.0, gt=0, description="the longest wait before a restart; >= backoff_initial_s")
    max_restarts: int = Field(5, ge=0, description="a process restarted this many times within restart_window_s "
                              "and failing again stops the run (a role that cannot stay up is a bug, not bad luck)")
    restart_window_s: float = Field(600.0, gt=0, description="the sliding window max_restarts counts restarts in")
    learner_checkpoint_every: int = Field(
        10, ge=1, description="checkpoint interval used when learner.checkpoint_every is 0 and the learner restarts "
        "on failure: a restarted learner resumes from its latest checkpoint, and without one it would start over. "
        "Either interval is held to buffer.eta then: a learner resumed further behind the version the "
        "buffer last heard of finds admission closed (and beyond max_staleness, every server too stale)")
    drain_timeout_s: float = Field(30.0, gt=0, description="on a graceful stop (SIGTERM or Ctrl-C to the launcher) "
                                   "actors start no new episode and their open ones have this long to finish and "
                                   "be acked; the rest are abandoned (counted)")
    targets_dir: str = Field("", description="where the launcher also writes the run's Prometheus discovery files "
                             "(<run dir name>-turnstream.json, -vllm.json; removed when it stops), for "
                             "deploy/prometheus/prometheus.yml; empty: the run directory's parent")
    stop_timeout_s: float = Field(120.0, gt=0, description="on a graceful stop, how long the learner (its step, last "
                                  "push and checkpoint), then the buffer, then the vLLM servers each get before "
                                  "SIGKILL")

    @model_validator(mode="after")
    def _backoff_range(self) -> LaunchSection:
        require(self.backoff_max_s >= self.backoff_initial_s, "backoff_max_s",
                f"must be >= backoff_initial_s ({self.backoff_initial_s})")
        return self

    def policy(self, role: str) -> RestartPolicy:
        return self.restart_roles.get(role, self.restart)  # type: ignore[call-overload]

    def backoff_s(self, restarts_in_window: int) -> float:
        """The wait before a restart, given how many restarts of the process the window already holds."""
        return min(self.backoff_max_s, self.backoff_initial_s * 2.0 ** restarts_in_window)
