"""Per-turn sampling seeds without a server: every request the fleet sends carries one (the same on its retries),
the wire, the buffer's log and its batches carry each turn's seed to the learner's batch, laid out as the turn
rewards. Against a real vLLM (the same seed samples the same tokens): tests/e2e/test_regenerate_vllm.py."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from turnstream.actors.inference.fleet import InferenceFleet
from turnstream.actors.inference.seeds import SEED_LIMIT, RequestSeeds
from turnstream.buffer.store.validate import rejections
from turnstream.learner.step.packing import subset
from turnstream.protocol.chunk_batch import BatchError, pack, unpack
from turnstream.protocol.codec import decode, encode
from tests.unit.fake_vllm import FakeVllm
from tests.unit.test_buffer_wal import ingest_logged, open_store
from tests.unit.test_codec import sample_turn_chunk
from tests.unit.test_store import chunk


def _draws(run_seed: int, *identity) -> list[int]:
    seeds = RequestSeeds(run_seed, *identity)
    return [seeds.draw() for _ in range(3)]


def test_seed_streams_repeat_for_one_identity_and_differ_between_identities():
    assert _draws(7, "actor-0", 1, "policy") == _draws(7, "actor-0", 1, "policy")
    streams = [("actor-0", 1, "policy"), ("actor-1", 1, "policy"), ("actor-0", 2, "policy"), ("actor-0", 1, "frozen")]
    seeds = {s for identity in streams for s in _draws(7, *identity)}
    assert len(seeds) == 3 * len(streams) and all(0 <= s < SEED_LIMIT for s in seeds)
    assert _draws(7, "actor-0", 1, "policy") != _draws(8, "actor-0", 1, "policy")


async def test_every_request_carries_its_own_seed_and_a_retry_the_same_one():
    good, failing = await FakeVllm("good").start(), await FakeVllm("failing").start()
    failing.fail_status = 500
    try:
        async with InferenceFleet([failing.url, good.url], health_interval_s=0,
                                  seeds=RequestSeeds(0, "actor-0", 1, "policy")) as fleet:
            gens = [await fleet.generate([1, 2], max_tokens=2, temperature=1.0) for _ in range(3)]
    finally:
        await good.stop()
        await failing.stop()
    expected = RequestSeeds(0, "actor-0", 1, "policy")
    assert [g.seed for g in gens] == [expected.draw() for _ in range(3)]
    assert [p["seed"] for p in good.sampling_params] == [g.seed for g in gens]
    # the first request went to the failing server first, and its retry kept the seed
    assert [p["seed"] for p in failing.sampling_params] == [gens[0].seed]


def test_chunks_carry_their_seeds_and_unseeded_ones_send_nothing():
    plain, seeded = sample_turn_chunk(), dataclasses.replace(sample_turn_chunk(), seq=18, seed=2**62 + 5)
    assert pack([plain]).seed == []
    back = unpack(decode([bytes(f) for f in encode(pack([plain, seeded]))]))
    assert [c.seed for c in back] == [-1, 2**62 + 5]
    batch = pack([plain, seeded])
    batch.seed = batch.seed[:1]
    with pytest.raises(BatchError, match="seed"):
        unpack(batch)


@pytest.mark.parametrize("seed", [-2, 2**63])
def test_a_chunk_with_a_seed_vllm_would_not_take_is_rejected(seed):
    chunks = [dataclasses.replace(sample_turn_chunk(), seed=3),
              dataclasses.replace(sample_turn_chunk(), seq=18, seed=seed)]
    batch = decode([bytes(f) for f in encode(pack(chunks))])
    assert rejections(batch, unpack(batch)) == ["", "bad_scalar"]


def test_the_buffer_serves_each_turns_seed_also_after_a_restart_and_a_compaction(tmp_path):
    from turnstream.buffer.store.episodes import flatten

    path = tmp_path / "wal.log"
    store, journal = open_store(path, eta=5, max_staleness=5)
    turns = [chunk(seq=0, ep="a", turn=0, reward=0.5), chunk(seq=1, ep="b", turn=0, done=True, reward=1.0),
             chunk(seq=2, ep="a", turn=1, done=True, reward=2.0)]
    seeds = {("a", 0): 11, ("b", 0): -1, ("a", 1): 2**62}  # b's turn was not seeded (an older actor)
    for c in turns:
        assert ingest_logged(store, journal, dataclasses.replace(c, seed=seeds[c.episode_id, c.turn])) == ("ok", "")
    journal.compact(store)  # the open episodes are rewritten from the store's chunks
    journal.close()
    again, journal2 = open_store(path, eta=5, max_staleness=5)
    episodes, dropped = again.take_batch(0, 2)
    batch = decode(encode(flatten(episodes, request_id=1, learner_version=0, dropped_stale=dropped)))
    journal2.close()
    order = batch.episode_ids
    expected = {"a": [11, 2**62], "b": [-1]}
    assert batch.turn_seeds.dtype == np.int64
    assert batch.turn_seeds.tolist() == [s for e in order for s in expected[e]]
    assert batch.turn_rewards.tolist() == [r for e in order for r in {"a": [0.5, 2.0], "b": [1.0]}[e]]
    # a data-parallel share keeps each of its episodes' seeds
    one = subset(batch, np.array([order.index("a")]))
    assert one.turn_seeds.tolist() == [11, 2**62]


def test_a_batch_of_unseeded_turns_leaves_the_seeds_out():
    from turnstream.buffer.store.episodes import Episode, flatten

    ep = Episode("a", ("a0", 0), "p")
    ep.add(chunk(seq=0, ep="a", done=True))
    assert flatten([ep], request_id=0, learner_version=0, dropped_stale=0).turn_seeds.size == 0
