"""Assembling turn chunks into episodes, cutting segments of open ones, and flattening both into a learner batch.

A *segment* (buffer.segment_turns) is the next turns of an episode still being played: turns
[served, end) are trained, the turns before them ride along as context (outside the action mask), and the
first generated token of turn `end`, which has arrived, closes the segment: the learner reads the critic
there and bootstraps GAE from it (learner/estimators/) without training on it. Whatever is flattened,
each trained turn is served once: `Episode.served` moves past it when its segment leaves the store.

A turn whose context restarted (`TurnChunk.context_reset`, actor.context_turns) was sampled without the turns
before it, so an item is laid out from the last restart at or before its first trained turn, and each later
restart is named in `Batch.context_starts`: the learner's forward then sees what vLLM saw.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from turnstream.protocol.messages import Batch, TurnChunk

NO_VERSION = 2**31 - 1


def _min_version(chunk: TurnChunk) -> int:
    return int(chunk.gen_versions.min()) if chunk.gen_versions.size else NO_VERSION


@dataclass
class Episode:
    episode_id: str
    actor_key: tuple[str, int]  # (actor_id, epoch)
    prompt_key: str
    turns: dict[int, TurnChunk] = field(default_factory=dict)
    last_turn: int | None = None  # index of the turn that carried done=True
    last_seen: float = field(default_factory=time.monotonic)
    arrived: dict[int, float] = field(default_factory=dict)  # turn -> when its chunk came (turn-to-train latency)
    served: int = 0  # turns before this one were trained in segments
    contiguous: int = 0  # turns 0..contiguous-1 have all arrived
    # kept up to date by add(), so staleness checks and token budgets cost O(1) per episode
    num_tokens: int = 0  # what flatten() lays out for it now: the turns from layout_start on
    layout_start: int = 0  # the context start of its first turn not yet served
    min_version: int = NO_VERSION  # of the turns not yet served
    nbytes: int = 0
    resets: set[int] = field(default_factory=set)  # turns whose context restarted

    def add(self, chunk: TurnChunk) -> None:
        self.turns[chunk.turn] = chunk
        self.last_seen = self.arrived[chunk.turn] = time.monotonic()
        if chunk.context_reset:
            self.resets.add(chunk.turn)
        if chunk.context_reset and self.layout_start < chunk.turn <= self.served:
            self._lay_out()  # a restart that came after its turns were skipped: the layout starts later
        elif chunk.turn >= self.layout_start:
            self.num_tokens += chunk.obs_tokens.size + chunk.gen_tokens.size
        self.nbytes += chunk.obs_tokens.nbytes + chunk.gen_tokens.nbytes * 3 + chunk.allowed_tokens.nbytes
        self.min_version = min(self.min_version, _min_version(chunk))
        while self.contiguous in self.turns:
            self.contiguous += 1
        if chunk.done:
            self.last_turn = chunk.turn

    def context_start(self, turn: int) -> int:
        """The first turn of `turn`'s context: the last restart at or before it, else 0."""
        return max((t for t in self.resets if t <= turn), default=0)

    def serve_through(self, end: int) -> None:
        """Turns before `end` were served in a segment: they no longer count for staleness, nor for the token
        budget once no later turn's context holds them (a batch of last segments sized by whole episodes would
        be a fraction of learner.batch_max_tokens, and the learner would race ahead of the actors on them)."""
        self.served = max(self.served, end)
        self.min_version = min((_min_version(c) for t, c in self.turns.items() if t >= self.served),
                               default=NO_VERSION)
        self._lay_out()

    def _lay_out(self) -> None:
        self.layout_start = self.context_start(self.served)
        self.num_tokens = sum(c.obs_tokens.size + c.gen_tokens.size for t, c in self.turns.items()
                              if t >= self.layout_start)

    def stale_through(self, oldest_version: int) -> int:
        """The turn after the last not-yet-served one with a token older than `oldest_version` (`served` if
        none): the turns before it are past the bound, those from it on are not (versions only grow)."""
        old = [t for t, c in self.turns.items() if t >= self.served and _min_version(c) < oldest_version]
        return max(old) + 1 if old else self.served

    def segment_end(self) -> int | None:
        """The turn that would close a segment served now (the last arrived turn of the unbroken run after
        `served` that generated a token, for the critic's position), or None when no turn could be trained."""
        end = self.contiguous - 1
        while end > self.served and self.turns[end].gen_tokens.size == 0:
            end -= 1
        return end if end > self.served else None

    def beyond_final_turn(self, chunk: TurnChunk) -> bool:
        """A turn after the one marked done, or a done marker before turns already received."""
        if self.last_turn is not None and chunk.turn > self.last_turn:
            return True
        return chunk.done and any(t > chunk.turn for t in self.turns)

    @property
    def complete(self) -> bool:
        return self.last_turn is not None and len(self.turns) == self.last_turn + 1 and all(
            t in self.turns for t in range(self.last_turn + 1))

    @property
    def behaviour_version(self) -> int:
        """The oldest version that produced a token of its turns not yet served (0 if none was generated)."""
        return self.min_version if self.min_version != NO_VERSION else 0

    @property
    def episode_return(self) -> float:
        return float(sum(c.reward for c in self.turns.values()))

    @property
    def ready_at(self) -> float:
        """When a complete episode became ready: its last chunk's arrival."""
        return self.last_seen

    @property
    def span(self) -> tuple[Episode, int, int]:
        """(episode, first trained turn, bootstrap turn or -1): what flatten() lays out."""
        return self, self.served, -1


@dataclass
class OfEpisode:
    """An item served from an episode other than the episode itself: its id and prompt are the episode's."""
    episode: Episode

    @property
    def episode_id(self) -> str:
        return self.episode.episode_id

    @property
    def prompt_key(self) -> str:
        return self.episode.prompt_key


@dataclass
class Segment(OfEpisode):
    """Turns [first, end) of an open episode, closed by turn `end`'s first token (see above)."""
    first: int  # the episode's `served` when the segment was cut
    end: int
    ready_at: float  # when its serving condition was met (FIFO order among ready items)

    @property
    def num_tokens(self) -> int:
        turns = self.episode.turns
        start = self.episode.context_start(self.first)
        return sum(turns[t].obs_tokens.size + turns[t].gen_tokens.size for t in range(start, self.end)) + \
            turns[self.end].obs_tokens.size + 1

    @property
    def behaviour_version(self) -> int:
        turns = self.episode.turns
        versions = [_min_version(turns[t]) for t in range(self.first, self.end + 1)]
        return min(versions) if min(versions) != NO_VERSION else 0

    @property
    def episode_return(self) -> float:
        return float(sum(self.episode.turns[t].reward for t in range(self.end)))

    @property
    def span(self) -> tuple[Episode, int, int]:
        return self.episode, self.first, self.end


@dataclass
class ServedAgain(OfEpisode):
    """A complete episode served again after it left the store: laid out as when it was first served, never
    consumed or counted as fresh."""

    @property
    def num_tokens(self) -> int:
        return self.episode.num_tokens

    @property
    def behaviour_version(self) -> int:
        return self.episode.behaviour_version

    @property
    def episode_return(self) -> float:
        return self.episode.episode_return

    @property
    def span(self) -> tuple[Episode, int, int]:
        return self.episode.span


@dataclass
class Replay(ServedAgain):
    """A success on a hard task served again to the policy (buffer/store/positive_replay.py), within the staleness
    bound; the batch marks it (`Batch.replayed`)."""
    uses: int = 0  # times it was served again


@dataclass
class CriticReplay(ServedAgain):
    """An older episode served to the critic alone (buffer/store/critic_replay.py), within the critic's own bound;
    the batch marks it (`Batch.critic_only`) and the learner's policy loss never reads it."""


Item = Episode | Segment | Replay | CriticReplay


def flatten(items: list[Item], request_id: int, learner_version: int, dropped_stale: int) -> Batch:
    """Concatenate episodes (or segments) turn by turn: [obs_0, gen_0, obs_1, gen_1, ...] per item. The turns
    before an item's first trained turn are context: their generated tokens are outside the action mask. A
    segment ends with its bootstrap turn's observation and first generated token. An item starts at the context
    of its first trained turn (Episode.context_start); its turn rewards still count from turn 0."""
    spans = [item.span for item in items]
    # a batch none of whose turns was sampled under a top-p / top-k leaves both columns out (empty)
    truncated = any(c.top_p < 1 or c.top_k > 0 for ep, _, _ in spans for c in ep.turns.values())
    cols: dict[str, list[np.ndarray]] = {k: [] for k in ("tokens", "action", "logp", "ver", "turn", "temp", "mask",
                                                         *(("top_p", "top_k") if truncated else ()))}
    allowed_sets: list[list[int]] = []
    set_index: dict[tuple[int, ...], int] = {}
    offsets, turn_rewards, turn_seeds, turn_offsets, context_starts = [0], [], [], [0], []
    for ep, first, bootstrap in spans:
        last, length = (ep.last_turn if bootstrap < 0 else bootstrap), 0
        start = ep.context_start(first)
        turn_rewards += [ep.turns[t].reward for t in range(last + 1)]
        turn_seeds += [ep.turns[t].seed for t in range(last + 1)]
        for t in range(start, last + 1):
            c = ep.turns[t]
            if c.context_reset and t > start:
                context_starts.append(offsets[-1] + length)
            gen = slice(0, 1) if t == bootstrap else slice(None)  # the bootstrap turn's first token only
            gen_tokens = c.gen_tokens[gen]
            n_obs, n_gen = c.obs_tokens.size, gen_tokens.size
            mask_id = -1
            if c.allowed_tokens.size:
                key = tuple(int(x) for x in c.allowed_tokens)
                mask_id = set_index.setdefault(key, len(set_index))
                if mask_id == len(allowed_sets):
                    allowed_sets.append(list(key))
            trained = t >= first
            cols["tokens"] += [c.obs_tokens, gen_tokens]
            cols["action"] += [np.zeros(n_obs, np.uint8), np.full(n_gen, trained, np.uint8)]
            cols["logp"] += [np.zeros(n_obs, np.float32),
                             c.gen_logprobs[gen] if trained else np.zeros(n_gen, np.float32)]
            cols["ver"] += [np.full(n_obs, -1, np.int32),
                            c.gen_versions[gen] if trained else np.full(n_gen, -1, np.int32)]
            cols["turn"].append(np.full(n_obs + n_gen, t, np.int32))
            cols["temp"].append(np.full(n_obs + n_gen, c.temperature, np.float32))
            cols["mask"].append(np.full(n_obs + n_gen, mask_id, np.int32))
            if truncated:
                cols["top_p"].append(np.full(n_obs + n_gen, c.top_p, np.float32))
                cols["top_k"].append(np.full(n_obs + n_gen, c.top_k, np.int32))
            length += n_obs + n_gen
        offsets.append(offsets[-1] + length)
        turn_offsets.append(len(turn_rewards))
    # Token ids come as uint32 (protocol/SCHEMA.md); the batch carries int32: an id of 2**31 or more turns
    # negative, and the learner drops its episode as outside the vocabulary.
    cat = {k: (np.concatenate(v, dtype=np.int32 if k == "tokens" else None, casting="unsafe") if v
               else np.zeros(0)) for k, v in cols.items()}
    return Batch(
        request_id=request_id, learner_version=learner_version,
        episode_ids=[e.episode_id for e in items], prompt_keys=[e.prompt_key for e in items],
        returns=[e.episode_return for e in items],
        tokens=cat["tokens"], action_mask=cat["action"], behav_logprobs=cat["logp"], versions=cat["ver"],
        turn_index=cat["turn"], temperature=cat["temp"], mask_id=cat["mask"],
        episode_offsets=np.asarray(offsets, np.int64), allowed_sets=allowed_sets,
        dropped_stale=dropped_stale,
        agent_ids=np.array([ep.turns[0].agent_id for ep, _, _ in spans], np.int32),
        truncated=np.array([b < 0 and ep.turns[ep.last_turn].truncated for ep, _, b in spans], bool),
        turn_rewards=np.array(turn_rewards, np.float32), turn_offsets=np.array(turn_offsets, np.int64),
        first_turns=np.array([f for _, f, _ in spans], np.int32),
        bootstrap_turns=np.array([b for _, _, b in spans], np.int32),
        context_starts=np.array(context_starts, np.int64),
        top_p=cat.get("top_p", np.zeros(0, np.float32)), top_k=cat.get("top_k", np.zeros(0, np.int32)),
        turn_seeds=np.array(turn_seeds if max(turn_seeds, default=-1) >= 0 else [], np.int64),
        replayed=_marks(items, Replay), critic_only=_marks(items, CriticReplay),
    )


def _marks(items: list[Item], kind: type) -> np.ndarray:
    """[items] bool: which items are of `kind`; empty when none is (the wire's default)."""
    marks = np.array([isinstance(item, kind) for item in items], bool)
    return marks if marks.any() else np.zeros(0, bool)
