"""Which complete episodes make the next batch: FIFO, freshest-first or group-complete, by token budget.

A batch is made of *units*: single episodes, or for "group" all `group_size` episodes of one prompt_key
(group baselines such as GRPO/RLOO need every sample of a prompt together). Units are taken in policy
order while the batch has room in episodes (`max_episodes`) and in tokens (`max_tokens`, 0 = no budget).
A batch is ready when the next unit does not fit (or `max_episodes` is reached); if the ready episodes
run out first, the request keeps waiting. A single unit larger than the whole token budget is served
alone rather than never (it is not dropped). A group still incomplete `buffer.group_timeout_s` after one of
its members completed (a sibling was abandoned) is dropped by ReplayStore.expire (`incomplete_groups`),
counted as `group_timeout`, instead of holding admission room until it goes stale. With
`buffer.drop_uniform_groups`, a complete group whose members all got the same return (`uniform_groups`) is
dropped before serving, counted as `uniform_group`: a group baseline gives it zero advantage everywhere.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Iterable, Iterator

from turnstream.buffer.store.episodes import Episode

POLICIES = ("fifo", "freshest", "group")


def select(policy: str, ready: "OrderedDict[str, Episode]", *, max_episodes: int, max_tokens: int = 0,
           group_size: int = 1) -> list[Episode] | None:
    if max_episodes < 1:
        return None
    if max_tokens <= 0 and policy != "group" and len(ready) < max_episodes:
        return None  # the common wait, decided in O(1)
    batch: list[Episode] = []
    tokens = 0
    for unit in _units(policy, ready, group_size):
        unit_tokens = sum(e.num_tokens for e in unit)
        fits_count = len(batch) + len(unit) <= max_episodes
        fits_tokens = max_tokens <= 0 or tokens + unit_tokens <= max_tokens
        if not (fits_count and fits_tokens):
            if not batch and fits_count:
                return list(unit)  # larger than the whole budget on its own
            return batch or None
        batch.extend(unit)
        tokens += unit_tokens
        if len(batch) == max_episodes:
            return batch
    return None


def _units(policy: str, ready: "OrderedDict[str, Episode]", group_size: int) -> Iterator[tuple[Episode, ...]]:
    if policy == "fifo":
        return ((e,) for e in ready.values())
    if policy == "freshest":
        # newest behaviour version first; among equals, the one that completed first (sort is stable)
        return ((e,) for e in sorted(ready.values(), key=lambda e: -e.behaviour_version))
    if policy == "group":
        return _complete_groups(ready.values(), group_size)
    raise ValueError(f"unknown sampling policy {policy!r}")


def _complete_groups(episodes: Iterable[Episode], n: int) -> Iterator[tuple[Episode, ...]]:
    """Groups of n episodes sharing a prompt_key, in the order in which each group became complete."""
    pending: dict[str, list[Episode]] = {}
    for ep in episodes:
        members = pending.setdefault(ep.prompt_key, [])
        members.append(ep)
        if len(members) == n:
            yield tuple(members)
            del pending[ep.prompt_key]


def incomplete_groups(ready: "OrderedDict[str, Episode]", group_size: int, cutoff: float) -> list[str]:
    """Ready episodes of a group that stayed short of group_size since before `cutoff` (a sibling was abandoned
    or dropped): group sampling would hold them until they go stale, blocking admission room."""
    by_prompt: dict[str, list[Episode]] = {}
    for ep in ready.values():
        by_prompt.setdefault(ep.prompt_key, []).append(ep)
    orphans = []
    for members in by_prompt.values():
        # groups form in completion order, so the incomplete one is the tail
        tail = members[len(members) - len(members) % group_size:]
        if tail and tail[0].last_seen < cutoff:
            orphans.extend(ep.episode_id for ep in tail)
    return orphans


def uniform_groups(ready: "OrderedDict[str, Episode]", group_size: int) -> list[str]:
    """Episodes of complete groups whose members all got the same return (zero variance)."""
    ids = []
    for group in _complete_groups(ready.values(), group_size):
        if len({ep.episode_return for ep in group}) == 1:
            ids.extend(ep.episode_id for ep in group)
    return ids
