"""Typed wire messages (protocol/SCHEMA.md, version 2).

Array-valued fields are numpy arrays and travel as separate zero-copy frames; everything else goes in
the msgpack header. New fields must be optional (have defaults) so that older peers keep decoding.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np


def _i32(values=()) -> np.ndarray:
    return np.asarray(values, dtype=np.int32)


def _f32(values=()) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


@dataclass
class Message:
    TYPE: ClassVar[str] = ""
    # field name -> its numpy dtype on the wire; these fields travel as separate frames
    ARRAYS: ClassVar[dict[str, str]] = {}


@dataclass
class TurnChunk:
    """One finished turn of one episode: what an actor streams and the buffer keeps. It travels in a
    `TurnChunkBatch` (protocol/chunk_batch.py), alone or with the chunks that queued up with it."""

    actor_id: str
    epoch: int  # a restarted actor starts a new epoch, so (actor_id, epoch, seq) stays unique
    seq: int
    episode_id: str
    turn: int
    prompt_key: str
    obs_tokens: np.ndarray  # tokens appended to the context before this turn's generation
    gen_tokens: np.ndarray
    gen_logprobs: np.ndarray  # sampling log-probs (temperature, allowed-token mask, top-k and top-p applied)
    gen_versions: np.ndarray  # weight version that produced each generated token
    reward: float
    done: bool
    agent_id: int = 0
    temperature: float = 1.0
    allowed_tokens: np.ndarray = field(default_factory=_i32)  # empty: whole vocabulary
    truncated: bool = False
    t_start: float = 0.0  # unix seconds
    t_end: float = 0.0
    # the context restarted before this turn (actor.context_turns): obs_tokens hold the whole prompt the turn was
    # sampled from, and no earlier turn is in it
    context_reset: bool = False
    top_p: float = 1.0  # the turn's nucleus truncation; 1: none
    top_k: int = 0  # the turn's top-k truncation; 0: none
    # vLLM's per-request sampling seed of the turn (0 <= seed < 2**63), with which its tokens can be sampled again
    # (turnstream regenerate); -1: unknown (an unseeded request, or a peer that predates seeds)
    seed: int = -1


@dataclass
class TurnChunkBatch(Message):
    """The wire form of turn chunks: one or more chunks of one actor epoch, column-wise. Per-chunk scalars are
    lists in the header; token arrays are concatenated, each chunk's share given by the `*_len` lists. Token
    ids are unsigned, as they are by nature, so a receiver has no sign to check."""

    TYPE: ClassVar[str] = "turn_chunks"
    ARRAYS: ClassVar[dict[str, str]] = {
        "obs_tokens": "uint32", "gen_tokens": "uint32", "gen_logprobs": "float32", "gen_versions": "int32",
        "allowed_tokens": "uint32",
    }
    actor_id: str
    epoch: int
    seq: list[int]
    episode_ids: list[str]
    prompt_keys: list[str]
    turn: list[int]
    agent_id: list[int]
    reward: list[float]
    done: list[bool]
    truncated: list[bool]
    temperature: list[float]
    t_start: list[float]
    t_end: list[float]
    obs_len: list[int]
    gen_len: list[int]
    allowed_len: list[int]
    obs_tokens: np.ndarray
    gen_tokens: np.ndarray
    gen_logprobs: np.ndarray
    gen_versions: np.ndarray
    allowed_tokens: np.ndarray
    context_reset: list[bool] = field(default_factory=list)  # empty: no chunk restarts its context
    # empty: no chunk was sampled under a top-p / top-k truncation
    top_p: list[float] = field(default_factory=list)
    top_k: list[int] = field(default_factory=list)
    seed: list[int] = field(default_factory=list)  # empty: no chunk's seed is known


@dataclass
class AckBatch(Message):
    """The buffer's acks to one actor: every chunk of that actor in one ack group (buffer/acks.py)."""

    TYPE: ClassVar[str] = "acks"
    ARRAYS: ClassVar[dict[str, str]] = {"seq": "int64", "status": "uint8"}
    STATUSES: ClassVar[tuple[str, ...]] = ("ok", "duplicate", "rejected")  # status codes index this
    seq: np.ndarray
    status: np.ndarray
    reasons: list[str] = field(default_factory=list)  # one per "rejected" entry, in order


@dataclass
class CreditRequest(Message):
    """Level-triggered: "I can run `slots` episodes at once". Doubles as the actor's heartbeat."""

    TYPE: ClassVar[str] = "credit_request"
    actor_id: str
    epoch: int
    slots: int


@dataclass
class CreditGrant(Message):
    """The buffer's answer to every CreditRequest (credits may be 0): doubles as its heartbeat/welcome."""

    TYPE: ClassVar[str] = "credit_grant"
    credits: int
    learner_version: int = 0
    server_id: str = ""  # changes when the buffer restarts: the actor then resends its unacked window


@dataclass
class BatchRequest(Message):
    TYPE: ClassVar[str] = "batch_request"
    request_id: int
    learner_version: int
    max_episodes: int
    max_tokens: int = 0  # token budget of the batch (observation + generated tokens); 0: no budget
    timeout_s: float = 0.0  # answer with status "timeout" after this long; 0: wait until data is there


@dataclass
class Batch(Message):
    """Complete episodes (or segments of open ones) flattened into token arrays; `episode_offsets` delimits them."""

    TYPE: ClassVar[str] = "batch"
    ARRAYS: ClassVar[dict[str, str]] = {
        "tokens": "int32", "action_mask": "uint8", "behav_logprobs": "float32", "versions": "int32",
        "turn_index": "int32", "temperature": "float32", "mask_id": "int32", "episode_offsets": "int64",
        "agent_ids": "int32", "truncated": "bool", "turn_rewards": "float32", "turn_offsets": "int64",
        "first_turns": "int32", "bootstrap_turns": "int32", "context_starts": "int64", "top_p": "float32",
        "top_k": "int32", "turn_seeds": "int64", "replayed": "bool",
        "critic_only": "bool",
    }
    request_id: int
    learner_version: int
    episode_ids: list[str]
    prompt_keys: list[str]
    returns: list[float]
    tokens: np.ndarray
    action_mask: np.ndarray  # 1 where the token was generated by the policy
    behav_logprobs: np.ndarray  # 0 on observation tokens
    versions: np.ndarray  # behaviour version per token, -1 on observation tokens
    turn_index: np.ndarray
    temperature: np.ndarray
    mask_id: np.ndarray  # index into allowed_sets, -1 for the whole vocabulary
    episode_offsets: np.ndarray
    allowed_sets: list[list[int]] = field(default_factory=list)
    dropped_stale: int = 0
    status: str = "ok"  # "ok" | "timeout" | "cancelled" (the last two carry no episodes)
    # per episode (empty from a peer that predates them): its agent, and whether it was cut off
    agent_ids: np.ndarray = field(default_factory=_i32)
    truncated: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    # the reward after each turn, episode after episode; turn_offsets delimits episodes (n_episodes + 1)
    turn_rewards: np.ndarray = field(default_factory=_f32)
    turn_offsets: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # per item (empty from a peer that predates them): its first trained turn (the turns before it are context,
    # outside the action mask), and its bootstrap turn, -1 for an item that ends its episode: a segment of an
    # open episode ends with that turn's first generated token, read by the critic and not trained on
    first_turns: np.ndarray = field(default_factory=_i32)
    bootstrap_turns: np.ndarray = field(default_factory=_i32)
    # offsets into `tokens` where a context restarts inside an item (a turn with context_reset): the tokens from
    # there on do not see the item's earlier ones, and their positions count from 0 again
    context_starts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # per token, as `temperature` (empty when no token of the batch was sampled under a truncation): the top-p
    # (1: none) and top-k (0: none) of the token's turn, which the learner applies to its log-probs as vLLM did
    top_p: np.ndarray = field(default_factory=_f32)
    top_k: np.ndarray = field(default_factory=_i32)
    # per turn, laid out as turn_rewards (empty when no turn of the batch has a known seed): vLLM's sampling seed
    # of each turn, -1 where unknown
    turn_seeds: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # per episode (empty when the batch holds no replay): whether it is a success served again (buffer.positive_replay),
    # which the learner trains on but does not count as a new episode
    replayed: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    # per episode (empty when the batch holds none): whether it is an older episode served to the critic alone
    # (buffer.critic_replay), outside the policy loss and the staleness bound, within the critic's own
    critic_only: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))


@dataclass
class VersionAnnouncement(Message):
    TYPE: ClassVar[str] = "version"
    version: int
    weights_path: str = ""
    # SPO tracker values v of the prompt keys this version's step folded in (parallel lists): the actors'
    # curriculum (tasks.order = spo) reads them; only what changed travels, so a late subscriber fills up as
    # tasks are trained again
    prompt_keys: list[str] = field(default_factory=list)
    prompt_values: list[float] = field(default_factory=list)


MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.TYPE: cls for cls in (TurnChunkBatch, AckBatch, CreditRequest, CreditGrant, BatchRequest, Batch,
                              VersionAnnouncement)
}
