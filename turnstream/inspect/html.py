"""`turnstream inspect --html OUT_DIR`: a page per step, every episode's tokens coloured by their advantage (green
above zero, red below, the strongest at the step's largest), details on hover; and an index of the steps. Plain HTML
and CSS: the pages open from disk in any browser."""
from __future__ import annotations

import math
from html import escape
from pathlib import Path

import numpy as np

from turnstream.inspect.step_page import STEP_FIGURES, EpisodeRow, StepPage
from turnstream.inspect.text import episode_cells
from turnstream.inspect.tokens import TokenText

# an importance weight outside this range is outlined: the run's default cap (learner.is_cap) and its inverse
WEIGHT_RANGE = (0.5, 2.0)

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: .5em 0 1em; }
td, th { padding: 2px 8px; border-bottom: 1px solid #ddd; text-align: right; font-variant-numeric: tabular-nums;
         white-space: nowrap; }
td.l, th.l { text-align: left; }
.episode { margin: 1em 0 2em; }
.turn { font-family: ui-monospace, monospace; white-space: pre-wrap; line-height: 1.7; margin: .3em 0 .3em 1em; }
.obs { color: #777; }
.tok { border-radius: 3px; padding: 1px 0; }
.far { outline: 2px solid #7a3cff; }
.meta { color: #555; font-size: 90%; }
.legend span { padding: 2px 6px; margin-right: 6px; border-radius: 3px; }
"""


def _fmt(x: float, spec: str = "+.3f") -> str:
    return "-" if not math.isfinite(x) else format(x, spec)


def _colour(adv: float, scale: float) -> str:
    if not math.isfinite(adv) or scale <= 0:
        return "transparent"
    alpha = 0.08 + 0.62 * min(1.0, abs(adv) / scale)
    return f"rgba(0,150,60,{alpha:.2f})" if adv >= 0 else f"rgba(210,30,30,{alpha:.2f})"


def _scale(page: StepPage) -> float:
    values = np.concatenate([np.abs(t.advantage) for row in page.episodes for t in row.turns] or [np.zeros(0)])
    values = values[np.isfinite(values)]
    return float(values.max()) if values.size else 0.0


def _episode(row: EpisodeRow, text: TokenText, scale: float, step: int) -> str:
    item = row.item
    parts = [f'<div class="episode" id="{escape(item.episode_id)}"><h3>{escape(item.episode_id)}</h3>',
             f'<div class="meta">prompt {escape(item.prompt_key)}, agent {item.agent_id}, return '
             f'{item.episode_return:.3f}' + (", truncated" if item.truncated else "")
             + (f", a segment ending at turn {item.bootstrap_turn}" if item.bootstrap_turn >= 0 else "") + "</div>"]
    for tr in row.turns:
        t = tr.turn
        parts.append(f'<div class="meta">turn {t.turn}: reward {t.reward:.3f}, seed {t.seed}, temperature '
                     f'{t.temperature:.3g}, mean advantage {_fmt(tr.mean_advantage)}</div>')
        tokens = []
        for i, token in enumerate(t.tokens.tolist()):
            w = float(tr.importance_weight[i])
            title = (f"token {token} {text.text([token])!r}\nsampling log-prob {t.logprobs[i]:.4f} (version "
                     f"{int(t.versions[i])}, staleness {int(tr.staleness[i])} at step {step})\nadvantage "
                     f"{_fmt(float(tr.advantage[i]))}\nlearner log-prob {_fmt(float(tr.learner_logprob[i]), '.4f')}, "
                     f"importance weight {_fmt(w, '.3f')}")
            far = math.isfinite(w) and not WEIGHT_RANGE[0] <= w <= WEIGHT_RANGE[1]
            tokens.append(f'<span class="tok{" far" if far else ""}" style="background:'
                          f'{_colour(float(tr.advantage[i]), scale)}" title="{escape(title)}">'
                          f'{escape(text.text([token]))}</span>')
        parts.append(f'<div class="turn"><span class="obs">{escape(text.text(t.observation))}</span>'
                     f'{"".join(tokens)}</div>')
    parts.append("</div>")
    return "\n".join(parts)


def step_html(page: StepPage, text: TokenText, neighbours: tuple[int | None, int | None]) -> str:
    s, b = page.step, page.step.batch
    scale = _scale(page)
    figures = "".join(f"<tr><td class=l>{k}</td><td>{page.figures[k]:.4g}</td></tr>" for k in STEP_FIGURES
                      if isinstance(page.figures.get(k), (int, float)))
    rows = "".join("<tr>" + "".join(_cell(i, c) for i, c in enumerate(episode_cells(row))) + "</tr>"
                   for row in page.episodes)
    prev, nxt = neighbours
    nav = " ".join(filter(None, [f'<a href="step-{prev:06d}.html">&larr; step {prev}</a>' if prev else "",
                                 '<a href="index.html">all steps</a>',
                                 f'<a href="step-{nxt:06d}.html">step {nxt} &rarr;</a>' if nxt else ""]))
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>step {s.version}</title><style>{STYLE}</style></head><body>
<p>{nav}</p>
<h1>Step {s.version}</h1>
<p>Trained at version {s.learner_version} on request {s.request_id}: {len(b.episode_ids)} episodes,
{int(np.asarray(b.action_mask).sum())} sampled tokens, {np.asarray(b.tokens).size} tokens.
Learner: {escape(page.learner)}.</p>
<table>{figures}</table>
<p class="legend"><span style="background:{_colour(1, 1)}">advantage &gt; 0</span>
<span style="background:{_colour(-1, 1)}">advantage &lt; 0</span>
<span class="far">importance weight outside {WEIGHT_RANGE[0]}&ndash;{WEIGHT_RANGE[1]}</span>
<span class="obs">observation</span> (strongest colour: |advantage| {scale:.3g}; hover a token for its numbers)</p>
<table><tr><th>#</th><th class=l>episode</th><th class=l>prompt</th><th>return</th><th>turns</th><th>tokens</th>
<th>staleness min/mean/max</th><th>IS weight</th><th class=l>advantage per turn</th></tr>{rows}</table>
{"".join(_episode(row, text, scale, s.version) for row in page.episodes)}
</body></html>
"""


def _cell(column: int, value: str) -> str:
    """A cell of the episode table: the episode links to its tokens below; names and turns align left."""
    if column == 1:
        return f'<td class=l><a href="#{escape(value)}">{escape(value)}</a></td>'
    return f"<td{' class=l' if column in (2, 8) else ''}>{escape(value)}</td>"


def index_html(pages: list[tuple[int, str]]) -> str:
    items = "".join(f'<li><a href="step-{v:06d}.html">step {v}</a> {escape(line)}</li>' for v, line in pages)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>recorded steps</title><style>{STYLE}</style></head><body>
<h1>Recorded steps</h1><ul>{items}</ul></body></html>
"""


def write_pages(out: Path, pages: list[StepPage], text: TokenText) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    versions = [p.version for p in pages]
    for i, page in enumerate(pages):
        neighbours = (versions[i - 1] if i else None, versions[i + 1] if i + 1 < len(versions) else None)
        (out / f"step-{page.version:06d}.html").write_text(step_html(page, text, neighbours))
    summaries = [(p.version, f"{len(p.episodes)} episodes, step_kl {p.figures.get('step_kl', float('nan')):.4g}, "
                  f"entropy {p.figures.get('entropy', float('nan')):.4g}") for p in pages]
    (out / "index.html").write_text(index_html(summaries))
    return out / "index.html"
