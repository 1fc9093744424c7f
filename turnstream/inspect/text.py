"""`turnstream inspect` as text: a line per recorded step, a step's episode table, an episode token by token."""
from __future__ import annotations

import math

import numpy as np

from turnstream.inspect.step_page import STEP_FIGURES, EpisodeRow, StepPage
from turnstream.inspect.tokens import TokenText
from turnstream.learner.record.reader import Record


def _num(x: float, fmt: str = "+.3f") -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, fmt)


def _range(values: np.ndarray) -> str:
    return f"{values.min()}/{values.mean():.1f}/{values.max()}" if values.size else "-"


def _quoted(s: str) -> str:
    return repr(s)[1:-1] if s else ""


def record_lines(record: Record, log: dict[int, dict]) -> list[str]:
    """A line per step of the run's lineage: what it trained on and the learner's figures."""
    lines = [f"{len(record.versions)} recorded steps ({record.describe_range()}), "
             f"{len(record.incarnations)} learner start(s), lost: {record.lost() or 'none'}, superseded: "
             f"{[s.version for s in record.superseded()] or 'none'}",
             f"{'step':>6} {'episodes':>8} {'act_tok':>8} {'return':>7} {'stale':>9} {'step_kl':>9} {'entropy':>8}"]
    for step in record.steps():
        if step.lost:
            lines.append(f"{step.version:>6} lost: the learner took this step but could not record it")
            continue
        b, fig = step.batch, log.get(step.version, {})
        act = np.asarray(b.action_mask).astype(bool)
        stale = step.learner_version - np.asarray(b.versions)[act].astype(np.int64)
        ret = float(np.mean(b.returns)) if len(b.returns) else float("nan")
        lines.append(f"{step.version:>6} {len(b.episode_ids):>8} {int(act.sum()):>8} {_num(ret, '.3f'):>7} "
                     f"{_range(stale):>9} {_num(fig.get('step_kl', float('nan')), '.4f'):>9} "
                     f"{_num(fig.get('entropy', float('nan')), '.3f'):>8}")
    return lines


def step_lines(page: StepPage) -> list[str]:
    s, b = page.step, page.step.batch
    lines = [f"step {s.version}: trained at version {s.learner_version}, request {s.request_id}, "
             f"{len(b.episode_ids)} episodes, {int(np.asarray(b.action_mask).sum())} sampled tokens, "
             f"{np.asarray(b.tokens).size} tokens, {b.dropped_stale} dropped as stale before it"]
    figures = [f"{k} {page.figures[k]:.4g}" for k in STEP_FIGURES if isinstance(page.figures.get(k), (int, float))]
    lines.append("  " + ("  ".join(figures) if figures else "no learner.jsonl line for this step"))
    lines.append(f"  learner: {page.learner}")
    id_width = max([len("episode"), *(len(r.item.episode_id) for r in page.episodes)])
    key_width = max([len("prompt"), *(len(r.item.prompt_key) for r in page.episodes)])
    lines.append(f"  {'#':>3} {'episode':<{id_width}} {'prompt':<{key_width}} {'return':>7} {'turns':>7} "
                 f"{'tokens':>6} {'stale min/mean/max':>18} {'IS w':>6}  advantage per turn")
    for row in page.episodes:
        lines.append("  " + episode_summary(row, id_width, key_width))
    return lines


def episode_cells(row: EpisodeRow) -> list[str]:
    """#, episode, prompt, return, turns, sampled tokens, staleness min/mean/max, mean importance weight, mean
    advantage per turn: one episode's row of a step's table (text and HTML)."""
    item = row.item
    w = row.importance_weights()
    w = w[np.isfinite(w)]
    return [str(item.index), item.episode_id, item.prompt_key, f"{item.episode_return:.3f}",
            f"{item.turns[0].turn}-{item.turns[-1].turn}" if item.turns else "-", str(item.action_tokens),
            _range(row.staleness()), _num(float(w.mean()) if w.size else float("nan"), ".3f"),
            " ".join(_num(t.mean_advantage, "+.2f") for t in row.turns)]


def episode_summary(row: EpisodeRow, id_width: int, key_width: int) -> str:
    index, episode, prompt, ret, turns, tokens, stale, weight, adv = episode_cells(row)
    return (f"{index:>3} {episode:<{id_width}} {prompt:<{key_width}} {ret:>7} {turns:>7} {tokens:>6} {stale:>18} "
            f"{weight:>6}  {adv}")


def episode_lines(page: StepPage, row: EpisodeRow, text: TokenText) -> list[str]:
    item = row.item
    lines = [f"episode {item.episode_id} in step {page.version}: prompt {item.prompt_key}, agent {item.agent_id}, "
             f"return {item.episode_return:.3f}"
             + (f", a segment ending at turn {item.bootstrap_turn}" if item.bootstrap_turn >= 0 else "")
             + (", truncated" if item.truncated else "")
             + (f", turns before {item.first_turn} are context" if item.first_turn else "")]
    for tr in row.turns:
        t = tr.turn
        lines.append(f"  turn {t.turn}: reward {t.reward:.3f}, seed {t.seed}, temperature {t.temperature:.3g}"
                     + (f", top-p {t.top_p:.3g}" if t.top_p < 1 else "") + (f", top-k {t.top_k}" if t.top_k else "")
                     + (f", {len(t.allowed)} allowed tokens" if t.allowed else "")
                     + f", advantage {_num(tr.mean_advantage)}")
        lines.append(f"    observation: {_quoted(text.text(t.observation))}")
        lines.append(f"    {'token':<16} {'logprob':>8} {'version':>7} {'stale':>5} {'advantage':>9} "
                     f"{'learner lp':>10} {'IS w':>6}")
        for i, token in enumerate(t.tokens.tolist()):
            lines.append(f"    {_quoted(text.text([token]))!s:<16.16} {t.logprobs[i]:>8.3f} {int(t.versions[i]):>7} "
                         f"{int(tr.staleness[i]):>5} {_num(tr.advantage[i]):>9} "
                         f"{_num(tr.learner_logprob[i], '.3f'):>10} {_num(tr.importance_weight[i], '.3f'):>6}")
    return lines
