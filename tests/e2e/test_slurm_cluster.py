"""deploy/slurm/turnstream.sbatch submitted with `sbatch` to a real Slurm cluster of three nodes
(tests/slurm_cluster.py), as a user submits it: the head node runs the buffer and learner rank 0, the second
learner node rank 1 (learner.parallel = "fsdp2" over gloo, torchrun's c10d rendezvous on the head), the
worker node a vLLM server and an actor. Each role's process is found in its node's network namespace and its
/metrics read from another node; the learner's process, killed, is started again by supervise.sh (a new PID,
both learner nodes meet again, from the latest checkpoint), and the run trains the demo task to its target;
`scancel` then stops every process of the job on every node. Skipped, saying why, without root, network
namespaces or Slurm's binaries."""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from tests.helpers import poll_until
from tests.slurm_cluster import SlurmCluster, slurm_unavailable
from turnstream.core.config import Config
from turnstream.launch.processes import tail
from turnstream.reports.run_log import read_steps, rolling_success

pytestmark = [pytest.mark.e2e, pytest.mark.vllm,
              pytest.mark.skipif(bool(reason := slurm_unavailable()), reason=reason or "")]

ROOT = Path(__file__).resolve().parents[2]
HEAD, LEARNER_NODE, WORKER = "node0", "node1", "node2"  # the order the template gives the allocation's nodes
VLLM_PORT, BUFFER_METRICS, LEARNER_METRICS, ACTOR_METRICS = 8000, 9101, 9102, 9103  # the template's ports
ROLES = ("buffer", "learner", "actor")


def role_of(argv: list[str]) -> str | None:
    """The role a process runs, from its command line: vllm, buffer, learner (a rank, not its torchrun
    agent), actor; None for anything else (supervise.sh, srun, slurmstepd, torchrun)."""
    if not argv or not Path(argv[0]).name.startswith("python") or "torch.distributed.run" in argv:
        return None
    if "vllm.entrypoints.openai.api_server" in argv:
        return "vllm"
    for i, arg in enumerate(argv[:-1]):  # `turnstream ROLE` (console script) or `-m turnstream.cli ROLE`
        if Path(arg).name in ("turnstream", "turnstream.cli") and argv[i + 1] in ROLES:
            return argv[i + 1]
    return None


def roles_on(slurm: SlurmCluster, node: str) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {}
    for pid in slurm.processes(node):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
        except (FileNotFoundError, ProcessLookupError):
            continue  # gone since it was listed
        if role := role_of(argv):
            found.setdefault(role, set()).add(pid)
    return found


def still_runs(pid: int) -> bool:
    """Whether `pid` still runs: a zombie has exited (init reaps what outlived its parent in its own time)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_the_slurm_template_trains_survives_a_killed_learner_and_is_cancelled(tmp_path):
    with SlurmCluster(tmp_path, nodes=3) as slurm:
        run_dir = tmp_path / "run"  # every node's files: this machine's filesystem is the shared one
        env = {"TURNSTREAM": str(Path(sys.executable).with_name("turnstream")), "PYTHON": sys.executable,
               "RUN_DIR": str(run_dir), "LEARNER_NODES": "2", "ACTORS_PER_NODE": "1"}
        job = slurm.sbatch(["--nodes=3", f"--cpus-per-task={slurm.cpus}", f"--output={tmp_path}/job.out",
                            "deploy/slurm/turnstream.sbatch"], env, cwd=ROOT)

        def context() -> str:
            logs = sorted((run_dir / "logs").glob("*.log")) if (run_dir / "logs").exists() else []
            return "\n".join(f"--- {path.name}\n{tail(path, 15)}" for path in [tmp_path / "job.out", *logs]
                             if path.exists())

        def job_running() -> None:
            assert job in slurm.jobs(), f"job {job} ended\n{context()}"

        def steps() -> list[dict]:
            return read_steps(run_dir)

        poll_until(lambda: len(steps()) >= 4, "the learner's first steps", 300, context=context, check=job_running)

        # every role where the template puts it, each reached at its node's address from another node
        placement = {node: roles_on(slurm, node) for node in (HEAD, LEARNER_NODE, WORKER)}
        assert {node: set(roles) for node, roles in placement.items()} == {
            HEAD: {"buffer", "learner"}, LEARNER_NODE: {"learner"}, WORKER: {"vllm", "actor"}}, placement
        head, worker = slurm.node_address(HEAD), slurm.node_address(WORKER)
        reader, other = slurm.cluster[WORKER], slurm.cluster[LEARNER_NODE]
        assert "turnstream_buffer_" in reader.get(f"http://{head}:{BUFFER_METRICS}/metrics")
        assert "turnstream_learner_" in reader.get(f"http://{head}:{LEARNER_METRICS}/metrics")
        assert "turnstream_actor_" in other.get(f"http://{worker}:{ACTOR_METRICS}/metrics")
        assert "vllm:" in other.get(f"http://{worker}:{VLLM_PORT}/metrics")

        # rank 0 killed on the head node: supervise.sh starts it again, rank 1's node joins it again
        (rank0,) = placement[HEAD]["learner"]
        (rank1,) = placement[LEARNER_NODE]["learner"]
        os.kill(rank0, signal.SIGKILL)
        poll_until(lambda: not still_runs(rank0), "the killed rank gone", 10)
        trained = len(steps())  # what it wrote: any line from now on is the new rank 0's

        def restarted() -> bool:
            now = {node: roles_on(slurm, node).get("learner", set()) for node in (HEAD, LEARNER_NODE)}
            return (len(now[HEAD]) == 1 and rank0 not in now[HEAD] and len(now[LEARNER_NODE]) == 1
                    and rank1 not in now[LEARNER_NODE] and len(steps()) > trained)

        poll_until(restarted, "both learner ranks with new PIDs, and a step after the kill", 180,
                   context=context, check=job_running)
        assert "supervise:" in (run_dir / "logs" / f"learner-{HEAD}.log").read_text()
        window = Config().run.rolling_episodes
        poll_until(lambda: rolling_success(steps(), window) >= 0.9, "rolling success 0.9", 400, context=context,
                   check=job_running)

        # scancel stops every process of the job on every node; only each node's slurmd is left
        seen = set().union(*(slurm.processes(node) for node in slurm.node_names))
        slurm.run(["scancel", str(job)])
        poll_until(lambda: not slurm.jobs(), "the job gone from squeue", 90, context=context)
        poll_until(lambda: not any(slurm.processes(node) for node in slurm.node_names),
                   "no process of the job left on any node", 30,
                   context=lambda: str({node: slurm.processes(node) for node in slurm.node_names}))
        assert not [pid for pid in seen if still_runs(pid)]
