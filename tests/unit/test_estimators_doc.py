"""The worked examples of docs/estimators.md, recomputed by the learner's code from each table's own inputs.

Each example is a markdown table after a `<!-- check: NAME key=value ... -->` comment; the numbers are
printed to 4 decimals, so they must agree to half a unit of the last digit.
"""
from __future__ import annotations

import math
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from turnstream.learner.estimators.advantages import gae, grpo_advantages, rloo_advantages, whiten
from turnstream.learner.batch.tensors import logprobs_from_action_logits, max_entropy
from tests import estimator_compute as estimators
from turnstream.learner.batch.tensors import cut_positions
from turnstream.learner.step.loss import aggregation_weights, decoupled_ppo_loss, step_kl, value_loss
from turnstream.learner.estimators.spo import SpoTracker, fold_batch, normalize_advantages

DOC = Path(__file__).resolve().parents[2] / "docs" / "estimators.md"
TOLERANCE = 5e-5 + 1e-9


def _cell(text: str):
    text = text.strip().replace("\\|", "|")
    try:
        return float(text)
    except ValueError:
        return text


def _examples() -> dict[str, tuple[dict, list[dict]]]:
    """name -> (parameters of the comment, the table's rows as {header: cell})."""
    lines = DOC.read_text().splitlines()
    out = {}
    for i, line in enumerate(lines):
        m = re.fullmatch(r"<!-- check: (\w+)((?: \w+=\S+)*) -->", line.strip())
        if not m:
            continue
        params = {k: float(v) for k, v in (p.split("=") for p in m.group(2).split())}
        table = []
        for row in lines[i + 1:]:
            if not row.startswith("|"):
                break
            table.append([_cell(c) for c in re.split(r"(?<!\\)\|", row.strip())[1:-1]])
        header, body = table[0], table[2:]  # table[1] is the |---| line
        out[m.group(1)] = (params, [dict(zip(header, r)) for r in body])
    return out


EXAMPLES = _examples()


def close(actual, expected) -> None:
    np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64), rtol=0,
                               atol=TOLERANCE)


def column(rows: list[dict], name: str) -> np.ndarray:
    return np.array([r[name] for r in rows], np.float64)


def test_every_example_is_checked():
    source = Path(__file__).read_text()
    assert len(EXAMPLES) >= 16
    assert not [name for name in EXAMPLES if f'"{name}"' not in source]


def tracker(p: dict) -> SpoTracker:
    return SpoTracker(rho_min=p["rho_min"], rho_max=p["rho_max"], d_half=p["d_half"])


def test_spo_tracker():
    p, rows = EXAMPLES["spo_tracker"]
    t = tracker(p)
    for r in rows:
        key = r["prompt"]
        if (r["α"], r["β"]) != (0.5, 0.5):  # (0.5, 0.5): a prompt the tracker has not seen
            t.state[key] = (r["α"], r["β"])
        close(t.value(key), r["v"])
        close(2.0 ** (-r["D"] / p["d_half"]), r["2^(−D/d_half)"])
        close(t.update(key, r["r"], r["D"]), r["ρ"])
        close(t.state[key], (r["α′"], r["β′"]))
        close(t.value(key), r["v′"])


def test_spo_drift():
    p, rows = EXAMPLES["spo_drift"]
    _, (result,) = EXAMPLES["spo_drift_result"]
    log_mu, log_pi = column(rows, "log μ"), column(rows, "log π")
    close(np.abs(log_mu - log_pi), column(rows, "|log μ − log π|"))
    n = len(rows)
    tb = SimpleNamespace(behav_logp=torch.tensor(log_mu, dtype=torch.float32), act_episode=torch.zeros(n, dtype=torch.long),
                         act_versions=torch.zeros(n, dtype=torch.long), tokens_per_episode=np.array([n]), num_episodes=1)
    t = tracker(p)
    rho = fold_batch(t, ["x"], [1.0], tb, torch.tensor(log_pi, dtype=torch.float32))
    close(np.abs(log_mu - log_pi).mean(), result["D"])
    close(rho, result["ρ"])
    assert t.state["x"] == pytest.approx((rho * 0.5 + 1.0, rho * 0.5))


def test_spo_advantages():
    p, tracker_rows = EXAMPLES["spo_tracker"]
    _, rows = EXAMPLES["spo_advantages"]
    by_prompt = {r["prompt"]: r for r in tracker_rows}
    raw = np.array([by_prompt[r["prompt"]]["r"] - by_prompt[r["prompt"]]["α"] /
                    (by_prompt[r["prompt"]]["α"] + by_prompt[r["prompt"]]["β"]) for r in rows])
    close(raw, column(rows, "r − v"))
    n = column(rows, "n")
    close(normalize_advantages(raw, n, "token"), column(rows, "token measure"))
    close(normalize_advantages(raw, n, "sequence"), column(rows, "sequence measure"))
    text = DOC.read_text()
    assert f"{(n * raw).sum() / n.sum():.4f}" in text and f"{raw.mean():.4f}" in text  # the means in the prose


def _gae_table(name: str):
    p, rows = EXAMPLES[name]
    r, v = column(rows, "r"), column(rows, "V")
    bootstrap = p["bootstrap"]
    adv, targets = gae(r, v, p["gamma"], p["lam"], bootstrap=bootstrap)
    next_v = np.append(v[1:], bootstrap)
    close(r + p["gamma"] * next_v - v, column(rows, "δ"))
    close(adv, column(rows, "A"))
    close(targets, column(rows, "G"))
    return p, rows


def test_spo_curriculum():
    from turnstream.actors.tasks.curriculum import spo_weight

    params, rows = EXAMPLES["spo_curriculum"]
    weights = [spo_weight(v, params["epsilon"]) for v in column(rows, "v")]
    close(weights, column(rows, "w"))
    close(np.array(weights) / sum(weights), column(rows, "P"))


def test_turn_gae():
    _gae_table("turn_gae")


def test_token_gae():
    """One step per action token: the table's rows are the episode's action tokens, observation tokens left
    out; the estimator reads the same numbers from a batch whose turns hold two action tokens each."""
    p, rows = _gae_table("token_gae")
    turns = column(rows, "turn").astype(np.int64)
    batch, tb = _one_episode(turns, returns=float(column(rows, "r").sum()))
    adv = estimators.compute("token_gae", batch, tb, tracker=SpoTracker(), spo_normalize="token", gamma=p["gamma"],
                             lam=p["lam"], old_values=torch.tensor(column(rows, "V")))
    close(adv.value_targets.numpy(), column(rows, "G"))
    raw, _ = gae(column(rows, "r"), column(rows, "V"), p["gamma"], p["lam"])
    close(adv.token_adv.numpy(), whiten(raw))


def _one_episode(turn_of_token: np.ndarray, returns: float, truncated: bool = False):
    """What estimators.compute reads of a one-episode batch whose action tokens belong to these turns."""
    n = len(turn_of_token)
    batch = SimpleNamespace(returns=[returns], truncated=[truncated], episode_ids=["e"], prompt_keys=["p"],
                            turn_offsets=np.zeros(0, np.int64), turn_rewards=np.zeros(0, np.float32))
    tb = SimpleNamespace(act_trained=None, act_critic_only=None, act_episode=torch.zeros(n, dtype=torch.long), act_turn=torch.tensor(turn_of_token),
                         num_episodes=1, act_tokens=torch.zeros(n, dtype=torch.long))
    return batch, tb


def test_turn_gae_tokens():
    p, rows = EXAMPLES["turn_gae_tokens"]
    _, turns = EXAMPLES["turn_gae"]
    turn_of_token = column(rows, "turn").astype(np.int64)
    per_turn, _ = gae(column(turns, "r"), column(turns, "V"), p["gamma"], p["lam"])
    close(per_turn[turn_of_token], column(rows, "A of its turn"))
    # the estimator reads V at each turn's first action token; the others' values do not count
    values = np.full(len(rows), 9.0)
    first = np.unique(turn_of_token, return_index=True)[1]
    values[first] = column(turns, "V")
    batch, tb = _one_episode(turn_of_token, returns=float(column(turns, "r").sum()))
    adv = estimators.compute("turn_gae", batch, tb, tracker=SpoTracker(), spo_normalize="token", gamma=p["gamma"],
                             lam=p["lam"], old_values=torch.tensor(values))
    close(adv.token_adv.numpy(), column(rows, "whitened"))


def test_turn_gae_truncated():
    """The table, then the same turns as real chunks, the last of them the actor's closing chunk with the
    environment's reply and no action: the critic is read at the reply's last token, and its value there is the
    table's bootstrap."""
    from turnstream.buffer.store.episodes import Episode, flatten
    from turnstream.learner.batch.tensors import to_tensors
    from tests.unit.test_store import chunk

    p, rows = _gae_table("turn_gae_truncated")
    ep = Episode("e", ("a", 0), "p")
    for t, r in enumerate(rows):
        ep.add(chunk(seq=t, ep="e", turn=t, gen=(5,), reward=r["r"]))
    closing = chunk(seq=len(rows), ep="e", turn=len(rows), gen=(), obs=(7, 8), done=True)
    closing.truncated = True
    ep.add(closing)
    batch = flatten([ep], 1, 0, 0)
    tb = to_tensors(batch, 64)
    assert cut_positions(batch).tolist() == [int(tb.lengths[0]) - 1]
    adv = estimators.compute("turn_gae", batch, tb, tracker=SpoTracker(), spo_normalize="token", gamma=p["gamma"],
                             lam=p["lam"], old_values=torch.tensor(column(rows, "V")),
                             cut_values=torch.tensor([p["bootstrap"]]))
    close(adv.value_targets.numpy(), column(rows, "G"))


def test_turn_gae_closing():
    """The table's moves, then the same turns as real chunks (the closing one without tokens) through the buffer's
    flatten and the learner's `turn_gae`: the closing reward reaches the last move's target."""
    from turnstream.buffer.store.episodes import Episode, flatten
    from turnstream.learner.batch.tensors import to_tensors
    from tests.unit.test_store import chunk

    p, rows = EXAMPLES["turn_gae_closing"]
    moves = [r for r in rows if r["V"] != "closing"]
    closing = [r for r in rows if r["V"] == "closing"]
    step_r = column(moves, "r")
    for c in closing:  # each closing turn's reward on the last move before it, discounted by the turns between
        step_r[-1] += p["gamma"] ** (c["turn"] - moves[-1]["turn"]) * c["r"]
    close(step_r, column(moves, "r on the step"))
    v = column(moves, "V")
    adv, targets = gae(step_r, v, p["gamma"], p["lam"])
    close(step_r + p["gamma"] * np.append(v[1:], 0.0) - v, column(moves, "δ"))
    close(adv, column(moves, "A"))
    close(targets, column(moves, "G"))
    ep = Episode("g/a1", ("a", 0), "tictactoe/a1")
    for r in rows:
        gen = () if r["V"] == "closing" else (5,)
        ep.add(chunk(seq=int(r["turn"]), ep=ep.episode_id, turn=int(r["turn"]), gen=gen, reward=r["r"],
                     done=r is rows[-1], prompt=ep.prompt_key))
    batch = flatten([ep], 1, 0, 0)
    tb = to_tensors(batch, 64)
    out = estimators.compute("turn_gae", batch, tb, tracker=SpoTracker(), spo_normalize="token", gamma=p["gamma"],
                             lam=p["lam"], old_values=torch.tensor(v))
    close(out.value_targets.numpy(), column(moves, "G"))


@pytest.mark.parametrize("rows, fn", [(EXAMPLES["grpo"][1], grpo_advantages), (EXAMPLES["rloo"][1], rloo_advantages)])
def test_group_baselines(rows, fn):
    close(fn(column(rows, "r"), [r["prompt"] for r in rows]), column(rows, "A"))


def test_gigpo():
    """The table through the pure function, then through the estimator on a batch flattened by the buffer's code,
    whose observation labels are token ids and whose turns hold one or two action tokens."""
    from turnstream.buffer.store.episodes import Episode, flatten
    from turnstream.core.config_learner import GigpoSection
    from turnstream.learner.estimators.advantages import gigpo_advantages
    from turnstream.learner.batch.tensors import to_tensors
    from turnstream.protocol.messages import TurnChunk

    p, rows = EXAMPLES["gigpo"]
    episodes = sorted({int(r["episode"]) for r in rows})
    mine = [[r for r in rows if r["episode"] == e] for e in episodes]
    rewards = [column(m, "r") for m in mine]
    observations = [[r["observation"] for r in m] for m in mine]
    returns = [float(r.sum()) for r in rewards]
    for normalize, total in (("mean", "A"), ("std", "A, std")):
        terms = gigpo_advantages(returns, ["x"] * len(mine), rewards, observations, p["gamma"], p["omega"],
                                 divide_by_std=normalize == "std")
        close(terms.total, column(rows, total))
        if normalize == "mean":
            close(terms.step_returns, column(rows, "R"))
            close(terms.episode, column(rows, "A_E"))
            close(terms.step, column(rows, "A_S"))
        built, flat = [], []
        for e, m in enumerate(mine):
            ep = Episode(f"e{e}", ("a", 0), "x")
            for h, r in enumerate(m):
                n = 1 + h % 2
                ep.add(TurnChunk(actor_id="a", epoch=0, seq=h, episode_id=f"e{e}", turn=h, prompt_key="x",
                                 obs_tokens=np.array([1, 10 + int(r["observation"][1:])], np.int32),
                                 gen_tokens=np.full(n, 5, np.int32), gen_logprobs=np.full(n, -0.7, np.float32),
                                 gen_versions=np.zeros(n, np.int32), reward=r["r"], done=h == len(m) - 1))
                flat += [r[total]] * n  # each of the turn's action tokens gets the turn's advantage
            built.append(ep)
        batch = flatten(built, 1, 0, 0)
        adv = estimators.compute("gigpo", batch, to_tensors(batch, 64), tracker=SpoTracker(), spo_normalize="token",
                                 gamma=0.0, lam=0.0, old_values=None,
                                 gigpo=GigpoSection(gamma=p["gamma"], omega=p["omega"], normalize=normalize))
        close(adv.token_adv.numpy(), flat)


def test_decoupled_ppo():
    p, rows = EXAMPLES["decoupled_ppo"]
    for r in rows:
        mu, prox, theta, a = (torch.tensor([r[k]], dtype=torch.float64)
                              for k in ("log μ", "log π_prox", "log π_θ", "A"))
        close(math.exp(r["log π_prox"] - r["log μ"]), r["w"])
        close(math.exp(r["log π_θ"] - r["log π_prox"]), r["u"])
        for mode, cap, objective in (("truncate", math.inf, "objective"), ("truncate", p["cap"], "TIS objective"),
                                     ("mask_token", p["cap"], "masked objective")):
            logp = theta.clone().requires_grad_(True)
            loss, _ = decoupled_ppo_loss(logp, prox, mu, a, clip_low=p["clip"], clip_high=p["clip"], weight_cap=cap,
                                         mode=mode, mask_low=p["mask_low"], mask_high=p["mask_high"])
            close(-loss.item(), r[objective])
            loss.backward()
            assert (logp.grad.item() != 0.0) == (r["gradient"] == "yes")


def test_aggregation():
    _, rows = EXAMPLES["aggregation"]
    episode = torch.tensor(column(rows, "episode").astype(np.int64))
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
        w = aggregation_weights(episode, int(episode.max()) + 1, mode)
        close(w.numpy(), column(rows, mode))


def test_entropy_bonus():
    p, rows = EXAMPLES["entropy_bonus"]
    vocab = int(p["vocab"])
    restricted, free = rows
    probs = torch.tensor([float(x) for x in restricted["probabilities"].split(",")])
    allowed = torch.zeros((1, vocab), dtype=torch.bool)
    allowed[0, :len(probs)] = True
    logits = torch.full((2, vocab), 0.0)
    logits[0, :len(probs)] = probs.log()  # token 1 chooses among its allowed set; token 2 among the vocabulary
    mask_id = torch.tensor([0, -1])
    _, entropy = logprobs_from_action_logits(logits, torch.ones(2), mask_id, allowed, torch.zeros(2, dtype=torch.long))
    unit = max_entropy(SimpleNamespace(mask_id=mask_id, allowed=allowed, truncation=None), vocab)
    close(entropy.numpy(), column(rows, "H"))
    close(unit.numpy(), column(rows, "H_max"))
    close(np.exp(unit.numpy()), column(rows, "choices"))
    close((entropy / unit).numpy(), column(rows, "H / H_max"))
    close((-p["entropy_coef"] * entropy / unit).numpy(), column(rows, "loss term per unit weight"))
    assert free["probabilities"] == "uniform"


def test_value_loss():
    p, (row,) = EXAMPLES["value_loss"]
    v = torch.tensor([row["V"]], dtype=torch.float64, requires_grad=True)
    loss, _ = value_loss(v, torch.tensor([row["V_old"]], dtype=torch.float64),
                         torch.tensor([row["G"]], dtype=torch.float64), clip=p["clip"])
    close(loss.item(), row["loss"])
    loss.backward()
    assert v.grad.item() == 0.0


def test_step_kl():
    _, rows = EXAMPLES["step_kl"]
    _, (result,) = EXAMPLES["step_kl_result"]
    before, after = column(rows, "π_before"), column(rows, "π_after")
    rho = after / before
    close(rho, column(rows, "ρ"))
    close(rho - 1 - np.log(rho), column(rows, "(ρ − 1) − log ρ"))
    close(step_kl(torch.tensor(np.log(before)), torch.tensor(np.log(after))), result["step_kl"])


def test_positive_replay_kept():
    from turnstream.buffer.store.positive_replay import PositiveReplay

    p, rows = EXAMPLES["positive_replay_kept"]
    replay = PositiveReplay(share=0.5, hard_below=p["hard_below"], success_return=p["success_return"],
                            window=int(p["window"]), max_replays=1)
    for r in rows:
        earlier = int(r["earlier episodes"])
        for i in range(earlier):  # the earlier successes first, the failures after them
            won = i < r["earlier successes"]
            replay.completed(SimpleNamespace(prompt_key=r["task"], episode_return=1.0 if won else 0.0))
        ep = SimpleNamespace(episode_id=r["episode"], prompt_key=r["task"], episode_return=r["return"])
        replay.completed(ep)
        close(replay.pass_rates.of(r["task"]).rate, r["pass rate"])
        assert replay.worth_keeping(ep) == (r["kept"] == "yes"), r


def test_positive_replay_due():
    from turnstream.buffer.store.episodes import Replay
    from turnstream.buffer.store.positive_replay import PositiveReplay

    p, rows = EXAMPLES["positive_replay_due"]
    replay = PositiveReplay(share=p["share"], hard_below=0.25, success_return=1.0, window=8,
                            max_replays=int(p["max_replays"]))
    for r in rows:
        kept = Replay(SimpleNamespace(episode_id=r["kept"], behaviour_version=int(r["behaviour version"])),
                      uses=int(r["uses before"]))
        replay.kept[r["kept"]] = kept
        close(p["learner_version"] - r["behaviour version"], r["staleness"])
    due = replay.due(int(p["batch"]), int(p["learner_version"]), int(p["max_staleness"]))
    assert [d.episode_id for d in due] == [r["kept"] for r in rows if r["served again"] == "yes"]
    replay.replayed(due)
    for r in rows:
        kept = replay.kept.get(r["kept"])
        assert (kept is not None) == (r["kept after"] == "yes"), r
        if kept is not None:
            assert kept.uses == r["uses after"]


def test_mars():
    """The table's formulas, then the same turns as real chunks through the buffer's flatten and the learner's
    `mars` estimator: its token advantages are the table's whitened column."""
    from turnstream.buffer.store.episodes import Episode, flatten
    from turnstream.learner.estimators.advantages import discounted_returns, mars_advantages
    from turnstream.learner.batch.tensors import to_tensors
    from tests.unit.test_store import chunk

    p, rows = EXAMPLES["mars"]
    streams: dict[tuple, list[dict]] = {}
    for r in rows:
        streams.setdefault((r["game"], r["agent"]), []).append(r)
    trained = [r for r in rows if r["A"] != "closing"]
    for turns in streams.values():
        close(discounted_returns(column(turns, "r"), p["gamma"]), column(turns, "G"))
    per_turn = mars_advantages(column(trained, "G"), column(trained, "agent"))
    close(per_turn, column(trained, "A"))
    close(column(trained, "G") - per_turn, column(trained, "agent mean"))
    close(whiten(per_turn), column(trained, "whitened"))
    episodes = []
    for (game, agent), turns in streams.items():
        ep = Episode(f"g{game}/a{agent}", ("a", 0), f"tictactoe/a{agent}")
        for r in turns:
            gen = () if r["A"] == "closing" else (5,)
            c = chunk(seq=len(episodes) * 10 + int(r["turn"]), ep=ep.episode_id, turn=int(r["turn"]), gen=gen,
                      reward=r["r"], done=r is turns[-1], prompt=ep.prompt_key)
            c.agent_id = int(agent)
            ep.add(c)
        episodes.append(ep)
    batch = flatten(episodes, 1, 0, 0)
    tb = to_tensors(batch, 64)
    adv = estimators.compute("mars", batch, tb, tracker=SpoTracker(), spo_normalize="token", gamma=1.0, lam=1.0,
                             old_values=None, mars=SimpleNamespace(gamma=p["gamma"], normalize="mean", baseline="seat"))
    close(adv.token_adv.numpy(), column(trained, "whitened"))


def test_mars_group():
    """Both baselines of the table through the pure function, by seat (one label) and by game group."""
    from turnstream.learner.estimators.advantages import mars_advantages

    _, rows = EXAMPLES["mars_group"]
    g = column(rows, "G")
    close(mars_advantages(g, np.zeros(len(rows), np.int64)), column(rows, "A, seat"))
    close(g - column(rows, "A, seat"), column(rows, "seat mean"))
    groups = np.unique([r["game"] for r in rows], return_inverse=True)[1]
    close(mars_advantages(g, groups), column(rows, "A, group"))
    close(g - column(rows, "A, group"), column(rows, "group mean"))


def test_turn_td():
    """The table's one-step targets, then both episodes as real chunks through the buffer's flatten (the old one
    as a critic-only item) and the learner's `turn_td` estimator and update weights: targets on all five turns,
    whitened advantages on the fresh episode's alone, no policy weight on the critic-only tokens."""
    from turnstream.buffer.store.episodes import CriticReplay, Episode, flatten
    from turnstream.learner.batch.tensors import to_tensors
    from turnstream.learner.step.objective import update_weights
    from tests.unit.test_store import chunk

    p, rows = EXAMPLES["turn_td"]
    items = []
    for name in ("fresh", "old"):
        turns = [r for r in rows if r["episode"] == name]
        v = column(turns, "V")
        close(column(turns, "r") + p["gamma"] * np.append(v[1:], 0.0), column(turns, "G"))
        ep = Episode(name, ("a", 0), name)
        for r in turns:
            ep.add(chunk(seq=len(items) * 10 + int(r["turn"]), ep=name, turn=int(r["turn"]), gen=(5,), reward=r["r"],
                         done=r is turns[-1], prompt=name, versions=0 if name == "old" else 9))
        items.append(CriticReplay(ep) if turns[0]["critic only"] == "yes" else ep)
    fresh = [r for r in rows if r["critic only"] == "no"]
    close(column(fresh, "G") - column(fresh, "V"), column(fresh, "A"))
    close(whiten(column(fresh, "A")), column(fresh, "whitened"))

    batch = flatten(items, 1, 9, 0)
    assert batch.critic_only.tolist() == [False, True]
    tb = to_tensors(batch, 64)
    adv = estimators.compute("turn_td", batch, tb, tracker=SpoTracker(), spo_normalize="token", gamma=p["gamma"],
                             lam=0.9, old_values=torch.tensor(column(rows, "V")))  # turn_td's lambda is 0 whatever set
    close(adv.value_targets.numpy(), column(rows, "G"))
    assert adv.value_mask.all()
    close(adv.token_adv.numpy(), [*column(fresh, "whitened"), 0.0, 0.0])
    x = SimpleNamespace(tb=tb, advantages=adv)
    weights = update_weights(x, torch.arange(2), "seq-mean-token-mean")
    close(weights.policy.numpy(), [1 / 3, 1 / 3, 1 / 3, 0.0, 0.0])  # one policy episode: the old one is not counted
    # every critic position weighs 1/n, n the fresh episode's three: critic-only ones rescale no other term
    close(weights.value.numpy(), [1 / 3] * 5)
