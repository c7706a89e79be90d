"""Traces → things to look at: highlighted token spans, Plotly figures, display tables.

Pure functions of `GenerationResult`s (and a tokenizer where draft text must be decoded),
so they are tested without a browser. Colours are defined once here, in `ORIGIN_STYLES`
and `METHOD_COLORS`; the page, the legend and the charts all read them.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import pandas as pd
import plotly.graph_objects as go

from ..bench.measure import acceptance, acceptance_charts
from ..bench.measure.tables import summary_frame, tokens_frame
from ..engine.methods import METHODS, REFERENCE, is_lossless
from ..engine.divergence import describe_margin
from ..models.precision import mismatch_reading
from ..models.torch_copy import TORCH_COPY, TORCH_COPY_AR
from ..engine.trace import (ACCEPTANCE_LABEL, ACCEPTED, ALPHA_LABEL, BONUS, COPIED, CORRECTED, REJECTED, TARGET,
                            DraftDecision, GenerationResult, Round, StopNote)


@dataclass(frozen=True)
class OriginStyle:
    label: str
    background: str
    foreground: str
    meaning: str


# What a token's colour means, everywhere on the page.
ORIGIN_STYLES: dict[str, OriginStyle] = {
    ACCEPTED: OriginStyle("accepted draft", "#d1fae5", "#065f46", "drafted, then kept by the target"),
    REJECTED: OriginStyle("rejected draft", "#fee2e2", "#b91c1c", "drafted, refused by the target (not in the output)"),
    CORRECTED: OriginStyle("correction", "#ffedd5", "#9a3412", "the target's own token where it refused a draft"),
    BONUS: OriginStyle("bonus", "#dbeafe", "#1e40af", "the target's extra token after every draft was kept"),
    TARGET: OriginStyle("target", "#eef2f7", "#1f2937", "the target alone, nothing drafted (AR, NASD without a match)"),
}

# One colour per method for panel headers and chart lines; unknown methods cycle FALLBACK_COLORS.
METHOD_COLORS: dict[str, str] = {name: method.color for name, method in METHODS.items() if method.color}
FALLBACK_COLORS = ("#0f766e", "#9333ea", "#b45309", "#be123c", "#1d4ed8")

TOKEN_CLASS = "sd-tok"
DIVERGES_CLASS = "sd-diverges"  # the first output token unlike AR's (engine.divergence)
SPECIAL_CLASS = "sd-special"  # a special token's marker inside a token's span

# Styles for the spans this module writes. Scoped by class names only, so the same string
# works as page-wide CSS and as a component's own stylesheet.
TOKEN_CSS = "\n".join(
    [
        ".sd-panel{border:1px solid var(--border-color-primary,#e5e7eb);border-radius:10px;"
        "background:var(--block-background-fill,#fff);overflow:hidden;height:100%;}",
        ".sd-panel-head{display:flex;align-items:baseline;gap:.6em;flex-wrap:wrap;padding:.55em .8em;"
        "border-bottom:1px solid var(--border-color-primary,#e5e7eb);border-left:6px solid var(--sd-method);}",
        ".sd-panel-name{font-weight:700;font-size:1.05em;color:var(--sd-method);}",
        ".sd-panel-desc{color:var(--body-text-color-subdued,#6b7280);font-size:.85em;}",
        ".sd-panel-meta{margin-left:auto;font-size:.85em;font-variant-numeric:tabular-nums;"
        "color:var(--body-text-color-subdued,#4b5563);}",
        ".sd-panel-state{font-size:.75em;padding:.05em .5em;border-radius:999px;background:#e5e7eb;color:#374151;}",
        ".sd-panel-state.running{background:#fef3c7;color:#92400e;}",
        ".sd-panel-state.done{background:#d1fae5;color:#065f46;}",
        ".sd-panel-state.error{background:#fee2e2;color:#991b1b;}",
        ".sd-text{padding:.7em .8em;white-space:pre-wrap;word-break:break-word;line-height:1.9;font-size:.95em;"
        "max-height:26em;overflow-y:auto;font-family:ui-sans-serif,system-ui,sans-serif;}",
        ".sd-empty{color:var(--body-text-color-subdued,#9ca3af);font-style:italic;}",
        ".sd-error{color:#b91c1c;}",
        f".{TOKEN_CLASS}{{border-radius:3px;padding:.1em 0;box-decoration-break:clone;"
        "-webkit-box-decoration-break:clone;cursor:help;}",
        ".sd-nl{opacity:.45;font-size:.8em;}",
        # A special token (<|im_start|>, </s>): a small chip, not its raw markup.
        f".{SPECIAL_CLASS}{{font-family:ui-monospace,monospace;font-size:.78em;padding:0 .3em;margin:0 .1em;"
        "border:1px solid currentColor;border-radius:4px;opacity:.75;}",
        # The first token unlike AR's: its title says whether AR's choice there was a near-tie.
        f".{TOKEN_CLASS}.{DIVERGES_CLASS}{{outline:2px dashed #b91c1c;outline-offset:1px;}}",
        *(
            f".{TOKEN_CLASS}.sd-{origin}{{background:{style.background};color:{style.foreground};}}"
            for origin, style in ORIGIN_STYLES.items()
        ),
        f".{TOKEN_CLASS}.sd-{REJECTED}{{text-decoration:line-through;text-decoration-thickness:1.5px;opacity:.6;"
        "font-size:.9em;}",
        ".sd-legend{display:flex;flex-wrap:wrap;gap:.5em 1.1em;align-items:center;font-size:.9em;}",
        ".sd-legend-item{display:inline-flex;align-items:center;gap:.4em;}",
        f".sd-legend .{TOKEN_CLASS}{{padding:.1em .45em;cursor:default;font-size:1em;}}",
        f".sd-legend .{TOKEN_CLASS}.sd-{REJECTED}{{opacity:.85;}}",
        ".sd-legend-note{color:var(--body-text-color-subdued,#6b7280);}",
    ]
)


def method_color(method: str) -> str:
    if method in METHOD_COLORS:
        return METHOD_COLORS[method]
    return FALLBACK_COLORS[sum(map(ord, method)) % len(FALLBACK_COLORS)]


def method_capped(method: str) -> bool:
    """Whether the method cuts max_new_tokens (AR without a cache)."""
    return method in METHODS and METHODS[method].new_tokens_cap is not None


def method_label(method: str) -> str:
    return METHODS[method].label if method in METHODS else method


# ---------------------------------------------------------------------------------------
# Highlighted tokens


def placeholder_figure(lines: Sequence[str]) -> go.Figure:
    """A chart with no axes that says, in `lines`, what will be drawn in its place."""
    fig = go.Figure()
    fig.add_annotation(text="<br>".join(f"<i>{html.escape(line)}</i>" for line in lines), showarrow=False,
                       x=0.5, y=0.5, xref="paper", yref="paper", font=dict(size=13, color="#64748b"))
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    fig.update_layout(height=110, margin=dict(l=10, r=10, t=10, b=10), template="plotly_white")
    return fig


def legend_html() -> str:
    """Chips explaining each colour; the hover text says what a coloured token carries."""
    items = []
    for origin in (ACCEPTED, REJECTED, CORRECTED, BONUS, TARGET):
        style = ORIGIN_STYLES[origin]
        items.append(
            f'<span class="sd-legend-item" title="{html.escape(style.meaning)}">'
            f'<span class="{TOKEN_CLASS} sd-{origin}">{html.escape(style.label)}</span></span>'
        )
    note = ('<span class="sd-legend-note">hover a token: its round, γ, drafter entropy, drafts accepted, and what '
            'decided a draft: its q (drafter) and p (target) and the probability it was kept; a round\'s last '
            'draft says why drafting stopped there, when a policy stopped it early. AR\'s "quality" cell says '
            'what greedy output promises against AR on the target as loaded: bit-exact; exact at float32; or, '
            'at a precision whose verification rounds unlike AR\'s step (a GPU\'s bfloat16, int4), up to '
            'near-ties, where a difference from AR is not lossless at that precision rather than a fault</span>')
    return f'<div class="sd-legend">{"".join(items)}{note}</div>'


def special_tokens(tokenizer) -> tuple[str, ...]:
    """The texts of the tokenizer's special tokens (its named ones and the added tokens marked special),
    longest first, so that a marker replaces the whole of `<|im_start|>` and never a part of it."""
    if tokenizer is None:
        return ()
    texts = set(getattr(tokenizer, "all_special_tokens", None) or [])
    for added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(added, "special", False):
            texts.add(str(added))
    return tuple(sorted((t for t in texts if t), key=lambda t: (-len(t), t)))


def special_marker(token: str) -> str:
    """A special token as the page writes it: `<|im_start|>` → ⟨im_start⟩, `</s>` → ⟨/s⟩."""
    name = token.strip("<>|").strip() or token
    return f"⟨{name}⟩"


def marked_text(text: str, specials: Sequence[str]) -> str:
    """`text` as plain text (a chart's labels), each special token in it written as its marker."""
    for token in specials:  # longest first, so a longer special is never cut by a shorter one
        text = text.replace(token, special_marker(token))
    return text


def _marked_body(text: str, specials: Sequence[str]) -> str:
    """`text` as escaped HTML, each special token in it a marker chip rather than its raw markup."""
    pieces, rest = [], text
    while rest:
        found = min(((rest.find(t), t) for t in specials if t in rest), default=None, key=lambda f: (f[0], -len(f[1])))
        if found is None:
            pieces.append(html.escape(rest))
            break
        at, token = found
        pieces.append(html.escape(rest[:at]))
        pieces.append(f'<span class="{SPECIAL_CLASS}">{html.escape(special_marker(token))}</span>')
        rest = rest[at + len(token):]
    return "".join(pieces)


def _token_span(text: str, origin: str, title: str, extra_class: str = "", specials: Sequence[str] = ()) -> str:
    # Newlines stay real newlines (the container is pre-wrap) with a faint marker, so a
    # token that is only "\n" is still visible and hoverable.
    body = _marked_body(text, specials).replace("\n", '<span class="sd-nl">↵</span>\n')
    if not body:
        body = "∅"
    classes = f"{TOKEN_CLASS} sd-{origin}" + (f" {extra_class}" if extra_class else "")
    return f'<span class="{classes}" title="{html.escape(title, quote=True)}">{body}</span>'


def _fmt_entropy(value: float | None) -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.2f}"


def _round_title(r: Round, what: str, entropy: float | None) -> str:
    drafted = len(r.drafted)
    accepted = f"{r.accepted}/{drafted} drafts accepted" if drafted else "nothing drafted"
    if r.source == COPIED:
        accepted += " (copied from the context)"
    return f"round {r.index} · γ={r.gamma} · drafter entropy {_fmt_entropy(entropy)} · {accepted} · {what}"


def _prob(value: float) -> str:
    return f"{value:.2f}" if value >= 0.005 or value == 0 else f"{value:.0e}"


def decision_text(decision: DraftDecision, greedy: bool, source: str = "", correction_text: str | None = None) -> str:
    """What decided a drafted token, as its tooltip says it: "q 0.81 → p 0.64, kept with
    probability 0.79"; a refused one adds the target's choice: "…; the target chose 'the' (p 0.71)"."""
    if decision.point_mass:
        what = "copied from the context" if source == COPIED else "the n-gram table's draft"
        q = f"q 1 (a point mass: {what})"
    else:
        q = f"q {_prob(decision.q)}"
    if not decision.decided:
        return f"{q}, p {_prob(decision.p)} → not judged: an earlier draft was refused"
    if greedy:
        rule = "the target's top token, so kept" if decision.accept_prob >= 1.0 else "not the target's top token"
    else:
        rule = f"kept with probability {_prob(decision.accept_prob)}"
    if decision.accepted:
        return f"{q} → p {_prob(decision.p)}, {rule}"
    text = f"{q}, p {_prob(decision.p)} → {rule}"
    if decision.correction is not None:
        chosen = repr(correction_text) if correction_text is not None else f"#{decision.correction}"
        text += f"; the target chose {chosen} (p {_prob(decision.correction_p)})"
    return text


def stop_text(note: StopNote) -> str:
    """Why a round stopped drafting early, as its last draft's tooltip says it: "stopped before
    draft 3: entropy 0.62 > 0.25" (a rule that stops when its value falls reads "… 0.41 < 0.50")."""
    value, threshold = _stop_number(note.value, note.threshold), _stop_number(note.threshold, note.value)
    crossed = ">" if note.value > note.threshold else "<"
    return f"stopped before draft {note.position + 1}: {note.rule} {value} {crossed} {threshold}"


def _stop_number(value: float, other: float) -> str:
    # Two decimals, or as many as it takes to tell the value from the threshold it crossed.
    for digits in (2, 4, 6):
        if f"{value:.{digits}f}" != f"{other:.{digits}f}":
            return f"{value:.{digits}f}"
    return f"{value:.6g}"


def rejected_texts(result: GenerationResult, r: Round, output_before: Sequence[int], tokenizer=None) -> list[str]:
    """Text of each rejected draft of round r, decoded after the tokens that precede it."""
    rejected = r.rejected
    if not rejected:
        return []
    if tokenizer is None:
        return [f"#{t}" for t in rejected]
    from ..engine.tokens import token_text

    kept = r.drafted[: r.accepted]
    sequence = list(result.output_context) + list(output_before) + kept + rejected
    first = len(sequence) - len(rejected)
    return [token_text(tokenizer, sequence, first + i, floor=len(result.output_context)) for i in range(len(rejected))]


def divergence_title(margin: float) -> str:
    """The line a diverging token's tooltip adds: "first token unlike AR's: near-tie (margin 0.12)"."""
    return f"first token unlike AR's: {describe_margin(margin)}"


def render_tokens(result: GenerationResult, tokenizer=None, cache: dict | None = None,
                  divergence: tuple[int | None, float] | None = None) -> str:
    """The output as coloured spans, each round's rejected drafts struck through after its
    accepted ones (where the target's correction then takes over).

    `cache` (any dict kept by the caller across calls on the same result) saves decoding a
    round's rejected drafts again when the panel is re-rendered after every round.
    `divergence` ((first_divergence, divergence_margin) against AR, `engine.divergence`): the token there
    is outlined, and its tooltip says whether AR's choice there was a near-tie.
    """
    diverges_at, margin = divergence if divergence is not None else (None, math.nan)
    specials = special_tokens(tokenizer)
    parts: list[str] = []
    position = 0
    ids = result.token_ids
    greedy = result.params.get("temperature", 0.0) == 0.0
    for r in result.rounds:
        count = len(r.new_tokens)
        records = result.tokens[position : position + count]
        entropies = list(r.draft_entropies)

        def why(k: int, correction_text: str | None = None) -> str:
            text = ""
            if k < len(r.decisions):
                text += "\n" + decision_text(r.decisions[k], greedy, r.source, correction_text)
            if r.early_stop is not None and k == len(r.drafted) - 1:  # why no draft followed the round's last
                text += "\n" + stop_text(r.early_stop)
            return text

        for i, record in enumerate(records):
            is_next = r.next_token is not None and i == count - 1
            if is_next and r.rejected:
                key = (id(result), r.index)
                texts = cache.get(key) if cache is not None else None
                if texts is None:
                    texts = rejected_texts(result, r, ids[:position], tokenizer)
                    if cache is not None:
                        cache[key] = texts
                for j, text in enumerate(texts):
                    k = r.accepted + j
                    entropy = entropies[k] if k < len(entropies) else None
                    title = _round_title(r, f"rejected draft {k + 1} (not in the output)", entropy)
                    parts.append(_token_span(text, REJECTED, title + why(k, marked_text(record.text, specials) if j == 0 else None),
                                             specials=specials))
            if record.origin == ACCEPTED:
                entropy = entropies[i] if i < len(entropies) else None
                what = f"accepted draft {i + 1}" + why(i)
            else:
                entropy = r.entropy
                what = ORIGIN_STYLES.get(record.origin, ORIGIN_STYLES[TARGET]).label + " (target)"
                if is_next and r.next_p is not None:
                    what += f"\nthe target's p {_prob(r.next_p)}"
            title = _round_title(r, what, entropy)
            if diverges_at == position + i:
                title += "\n" + divergence_title(margin)
            parts.append(_token_span(record.text, record.origin, title, DIVERGES_CLASS if diverges_at == position + i
                                     else "", specials))
        position += count
    return "".join(parts)


def _panel_meta(result: GenerationResult) -> str:
    stats = result.stats
    bits = [f"{stats['new_tokens']} tokens", f"{stats['rounds']} rounds"]
    if stats["seconds"] > 0:
        bits.append(f"{stats['tokens_per_s']:.1f} tok/s")
    if stats["drafted"]:
        bits.append(f"acceptance {stats['acceptance_rate']:.0%}")
    if result.note and method_capped(result.method):  # it ran fewer tokens than asked; the title says why
        bits.append(f"capped at {result.params['max_new_tokens']} tokens")
    if result.lesson is not None:  # OSD: which request of its head's stream this was; the title says more
        bits.append(f"stream request {result.lesson.request}")
    return " · ".join(bits)


def render_panel(
    method: str,
    result: GenerationResult | None = None,
    tokenizer=None,
    state: str | None = None,
    message: str | None = None,
    cache: dict | None = None,
    divergence: tuple[int | None, float] | None = None,
) -> str:
    """One method's panel: header (name, live numbers, state) and the highlighted text.

    state: "waiting", "running", "done", "stopped" or "error" (default: from result.done);
    divergence: where its output first left AR's, and AR's margin there (`render_tokens`).
    """
    color = method_color(method)
    description = METHODS[method].description if method in METHODS else ""
    if state is None:
        state = "waiting" if result is None else "done" if result.done else "running"
    meta = html.escape(_panel_meta(result)) if result is not None else ""
    if message:
        body = f'<span class="sd-error">{html.escape(message)}</span>' if state == "error" else html.escape(message)
    elif result is None or not result.tokens:
        body = '<span class="sd-empty">waiting for the first round…</span>'
    else:
        body = render_tokens(result, tokenizer, cache, divergence)
    return (
        f'<div class="sd-panel" data-method="{html.escape(method)}" style="--sd-method:{color}">'
        f'<div class="sd-panel-head"><span class="sd-panel-name">{html.escape(method_label(method))}</span>'
        f'<span class="sd-panel-desc">{html.escape(description)}</span>'
        f'<span class="sd-panel-meta" title="{html.escape(result.note if result is not None else "", quote=True)}">'
        f'{meta}</span>'
        f'<span class="sd-panel-state {state}">{state}</span></div>'
        f'<div class="sd-text">{body}</div></div>'
    )


# ---------------------------------------------------------------------------------------
# Figures: one trace per method (entropy: per method that drafts with a model), round
# number on x for the per-round charts, seconds for the race.


_AXIS = dict(gridcolor="#e8edf3", linecolor="#cbd5e1", zeroline=False, rangemode="tozero", automargin=True,
             title=dict(font=dict(size=12)))


def plain_figure(traces: list[dict], title: str, x_title: str, y_title: str, **layout) -> go.Figure:
    # Plain dicts without plotly's validation: building validated figures after every
    # round cost ~30 ms each, more than a round of the small models.
    base = dict(
        title=dict(text=title, x=0.01, xanchor="left", font=dict(size=15)),
        height=320,
        margin=dict(l=55, r=15, t=50, b=45),
        paper_bgcolor="rgba(0,0,0,0)",
        plot_bgcolor="#ffffff",
        legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0, font=dict(size=11)),
        hovermode="closest",
        font=dict(family="ui-sans-serif, system-ui, sans-serif", size=12, color="#334155"),
        xaxis={**_AXIS, "title": dict(text=x_title)},
        yaxis={**_AXIS, "title": dict(text=y_title)},
    )
    for key, value in layout.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return go.Figure(data=traces, layout=base, _validate=False)


def hover_with_label(label: str, body: str) -> str:
    return body + "<extra>" + html.escape(label) + "</extra>"


def gamma_figure(results: Sequence[GenerationResult]) -> go.Figure:
    """γ of each round: EGAG's follows the drafter's entropy, SD's and NASD's stay fixed."""
    traces = []
    for result in results:
        rounds = result.rounds
        label = method_label(result.method)
        traces.append(dict(
            type="scatter", x=[r.index for r in rounds], y=[r.gamma for r in rounds], name=label,
            legendgroup=result.method, mode="lines",
            line=dict(color=method_color(result.method), shape="hv", width=2, dash=_dash(result.method)),
            customdata=[[len(r.drafted), r.accepted] for r in rounds],
            hovertemplate=hover_with_label(label, "round %{x}<br>γ=%{y}<br>drafted %{customdata[0]}, accepted %{customdata[1]}"),
        ))
    return plain_figure(traces, "Draft length γ per round", "round", "γ")


def entropy_figure(results: Sequence[GenerationResult]) -> go.Figure:
    """Drafter entropy: a line per round (what EGAG sets γ from, or the mean over the round's
    drafts) and a dot per drafted token, placed inside its round."""
    traces = []
    for result in results:
        rounds = [r for r in result.rounds if r.draft_entropies or r.entropy is not None]
        if not rounds:
            continue  # AR and NASD draft without a distribution
        color = method_color(result.method)
        label = method_label(result.method)
        per_round = [
            r.entropy if r.entropy is not None else sum(r.draft_entropies) / len(r.draft_entropies) for r in rounds
        ]
        traces.append(dict(
            type="scatter", x=[r.index for r in rounds], y=per_round, name=label, legendgroup=result.method,
            mode="lines", line=dict(color=color, width=2, dash=_dash(result.method)),
            hovertemplate=hover_with_label(label, "round %{x}<br>entropy %{y:.3f}"),
        ))
        xs, ys, texts = [], [], []
        for r in rounds:
            n = len(r.draft_entropies)
            for i, entropy in enumerate(r.draft_entropies):
                xs.append(r.index + (i + 1) / (n + 1) - 0.5)
                ys.append(entropy)
                texts.append(f"round {r.index}, draft {i + 1}/{n}, {'accepted' if i < r.accepted else 'rejected'}")
        traces.append(dict(
            type="scatter", x=xs, y=ys, name=f"{label} per token", legendgroup=result.method, showlegend=False,
            mode="markers", marker=dict(color=color, size=4, opacity=0.4), text=texts,
            hovertemplate=hover_with_label(label, "%{text}<br>entropy %{y:.3f}"),
        ))
    return plain_figure(traces, "Drafter entropy (line: per round · dots: per drafted token)", "round",
                   "normalised entropy", yaxis=dict(range=[0, 1.02], rangemode="normal"))


def accepted_figure(results: Sequence[GenerationResult]) -> go.Figure:
    """Drafts kept by the target each round, out of those drafted."""
    traces = []
    for result in results:
        rounds = result.rounds
        label = method_label(result.method)
        traces.append(dict(
            type="scatter", x=[r.index for r in rounds], y=[r.accepted for r in rounds], name=label,
            legendgroup=result.method, mode="lines+markers",
            line=dict(color=method_color(result.method), width=1.5, dash=_dash(result.method)), marker=dict(size=4),
            customdata=[len(r.drafted) for r in rounds],
            hovertemplate=hover_with_label(label, "round %{x}<br>accepted %{y} of %{customdata}"),
        ))
    return plain_figure(traces, "Accepted drafts per round", "round", "accepted tokens")


def race_figure(results: Sequence[GenerationResult]) -> go.Figure:
    """Tokens generated against wall time, all methods from the same start: the race."""
    traces = []
    for result in results:
        xs, ys, total = [0.0], [0], 0
        if result.rounds:
            xs.append(result.prefill_seconds)
            ys.append(0)
        for r in result.rounds:
            total += len(r.new_tokens)
            xs.append(r.end_seconds)
            ys.append(total)
        label = method_label(result.method)
        traces.append(dict(
            type="scatter", x=xs, y=ys, name=label, legendgroup=result.method, mode="lines",
            line=dict(color=method_color(result.method), shape="hv", width=2.5, dash=_dash(result.method)),
            hovertemplate=hover_with_label(label, "%{x:.2f} s<br>%{y} tokens"),
        ))
    return plain_figure(traces, "The race: tokens generated over time", "seconds since the start (prefill included)",
                   "tokens")


def _dash(method: str) -> str:
    # A table's drafts (NASD) share SD's fixed γ, so its line would hide SD's exactly; dashes keep both visible.
    spec = METHODS.get(method)
    return "dash" if spec is not None and spec.drafts and not spec.needs_draft else "solid"


def entropy_acceptance_figure(results: Sequence[GenerationResult]) -> go.Figure:
    """Acceptance against the drafter's entropy, binned, with a 95 % band; AUC per method."""
    tokens = tokens_frame(results)
    aucs = {m: acceptance.entropy_auc(part) for m, part in tokens.groupby("method", sort=False)} if len(tokens) else {}
    return acceptance_charts.entropy_acceptance_figure(
        acceptance.entropy_bins(tokens), {m: v for m, v in aucs.items() if v[1]}, label=method_label,
        color=method_color)


def position_acceptance_figure(results: Sequence[GenerationResult]) -> go.Figure:
    """Acceptance at draft position 1 … γ_max, one line per method."""
    positions = acceptance.position_acceptance(tokens_frame(results))
    return acceptance_charts.position_acceptance_figure(positions, label=method_label, color=method_color)


def break_even_figure(results: Sequence[GenerationResult]) -> go.Figure:
    """Predicted speedup against α (Leviathan, per token: the summary's `alpha`) at each drafting method's
    measured costs, with the run's point; the table's acceptance is accepted ÷ drafted, another quantity."""
    return acceptance_charts.break_even_figure(acceptance.comparison_break_evens(summary_frame(results)), label=method_label,
                                               color=method_color)


FIGURES = {"gamma": gamma_figure, "entropy": entropy_figure, "accepted": accepted_figure, "race": race_figure,
           "entropy_acceptance": entropy_acceptance_figure, "position_acceptance": position_acceptance_figure,
           "break_even": break_even_figure}


def all_figures(results: Sequence[GenerationResult]) -> dict[str, go.Figure]:
    return {name: make(results) for name, make in FIGURES.items()}


# ---------------------------------------------------------------------------------------
# Tables


DISPLAY_COLUMNS = [
    "method", "drafter", "tokens", "tokens/s", "speedup vs AR", "TTFT (s)", ACCEPTANCE_LABEL, ALPHA_LABEL,
    "tokens per round",
    "target forwards / token", "mean γ", "nodes / round", "KV cache peak (target / draft)", "first divergence",
    "quality",
]


def _num(value, fmt: str, missing: str = "–") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return missing
    return format(value, fmt)


def _quality(row: pd.Series) -> str:
    exactness = _text(row.get("exactness"))
    if row["method"] == REFERENCE and row["matches_ar"] is not None and not _isnan(row["matches_ar"]):
        # What "identical to AR" can promise on this target: bit-exact, exact at float32, or up to near-ties.
        return f"reference ({exactness})" if exactness else "reference"
    if row["matches_ar"] is not None and not _isnan(row["matches_ar"]):
        if _on_torch_copy(row) and bool(row["matches_ar"]):
            return f"identical to AR ({TORCH_COPY})"
        return "identical to AR" if bool(row["matches_ar"]) else mismatch_reading(exactness)
    ppl = row.get("perplexity")
    if ppl is not None and not _isnan(ppl):
        return f"target perplexity {ppl:.2f}"
    if not is_lossless(row["method"]):
        return "its own text (not meant to match AR)"
    return "–"


def byte_size(count) -> str:
    """A byte count as people read it: 950 B, 73.7 kB, 12.3 MB, 1.40 GB (decimal units)."""
    if count is None or _isnan(count):
        return "–"
    count = float(count)
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.3g} {unit}" if count < 100 * size else f"{count / size:.0f} {unit}"
    return f"{count:.0f} B"


def _kv_cell(row: pd.Series) -> str:
    """The most bytes each model's KV cache held (the draft's only where it keeps one: a draft LM or a head)."""
    draft = row.get("draft_kv_bytes_peak")
    return byte_size(row.get("target_kv_bytes_peak")) + (f" / {byte_size(draft)}" if draft and not _isnan(draft) else "")


def _divergence_cell(row: pd.Series) -> str:
    """Where the output first left AR's and AR's margin there: "token 12: near-tie (margin 0.12)"; "–" where equal."""
    index, margin = row.get("first_divergence"), row.get("divergence_margin")
    if index is None or pd.isna(index):
        return "–"
    return f"token {int(index)}: {describe_margin(math.nan if margin is None or pd.isna(margin) else float(margin))}"


def divergences(summary: pd.DataFrame) -> dict[str, tuple[int | None, float]]:
    """Each method's (first_divergence, divergence_margin) from a comparison's summary, for its panel."""
    if summary.empty or "first_divergence" not in summary:
        return {}
    return {row["method"]: (int(row["first_divergence"]), float(row["divergence_margin"]))
            for _, row in summary.iterrows() if not pd.isna(row["first_divergence"])}


def _on_torch_copy(row: pd.Series) -> bool:
    """Whether the row's method ran on the torch copy of a runtime target (its ratio is over that copy's AR)."""
    return row.get("runtime") == TORCH_COPY and row["method"] != TORCH_COPY_AR


def _isnan(value) -> bool:
    return isinstance(value, float) and math.isnan(value)


# Shown where a model ran below float32 (the summary's vs-fp32 columns hold numbers): each row's
# precision, and its speed and output against AR of the target's weights at float32 (bench.vs_float32).
VS_FLOAT32_DISPLAY = ["precision (target / draft)", "speedup vs fp32 AR", "token match vs fp32 AR",
                      "chrF vs fp32 AR"]


def display_table(summary: pd.DataFrame) -> pd.DataFrame:
    """The comparison table as the page shows it: AR first, rounded, ratios spelt out; where a
    float32 AR reference ran, "speedup vs AR" says AR's precision and the vs-fp32 columns follow."""
    if summary.empty:
        return pd.DataFrame(columns=DISPLAY_COLUMNS)
    against_float32 = "speedup_vs_fp32_ar" in summary and summary.speedup_vs_fp32_ar.notna().any()
    ordered = summary.sort_values("method", key=lambda s: s != REFERENCE, kind="stable")
    rows = []
    for _, row in ordered.iterrows():
        rows.append({
            "method": row["label"],
            "drafter": row.get("drafter", ""),
            "tokens": int(row["new_tokens"]),
            "tokens/s": _num(row["tokens_per_s"], ".1f"),
            "speedup vs AR": _num(row["speedup_vs_ar"], ".2f") + ("×" if not _isnan(row["speedup_vs_ar"]) else "")
                             + (f" over AR ({TORCH_COPY})" if _on_torch_copy(row) else ""),
            "TTFT (s)": _num(row["ttft_s"], ".3f"),
            ACCEPTANCE_LABEL: _num(row["acceptance_rate"], ".0%"),
            ALPHA_LABEL: _num(row.get("alpha"), ".2f"),
            "tokens per round": _num(row["mean_accepted_tokens"], ".2f"),
            "target forwards / token": _num(row["target_forwards_per_token"], ".3f"),
            "mean γ": _num(row["mean_gamma"], ".2f"),
            # Drafts a round offers the target: a tree's nodes, a chain's tokens.
            "nodes / round": _num(row["mean_drafted"], ".2f"),
            "KV cache peak (target / draft)": _kv_cell(row),
            "first divergence": _divergence_cell(row),
            "quality": _quality(row),
            **(_vs_float32_cells(row) if against_float32 else {}),
        })
    frame = pd.DataFrame(rows, columns=DISPLAY_COLUMNS + (VS_FLOAT32_DISPLAY if against_float32 else []))
    if against_float32:  # the two speeds are over two different models' AR: say whose
        own = summary.target_dtype.dropna().iloc[0] if summary.target_dtype.notna().any() else "its own precision"
        frame = frame.rename(columns={"speedup vs AR": f"speedup vs {own} AR"})
    return frame


# The comparison as the page lays it out: FIRST_COLUMNS in one table that fits a 1,280 px window (the verdict
# against AR's text, where the output first left AR's, beside the speed), every other column of `display_table`
# in a details table below it. The CSV download is the summary itself, every column in full.
FIRST_COLUMNS = ["method", "tokens/s", "speedup vs AR", ACCEPTANCE_LABEL, "tokens per round", "quality"]


def _first(column: str) -> bool:
    # "speedup vs AR" is renamed after AR's precision where a float32 AR ran ("speedup vs bfloat16 AR").
    return column in FIRST_COLUMNS or (column.startswith("speedup vs ") and column.endswith(" AR")
                                       and "fp32" not in column)


def split_table(table: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """`display_table`'s frame as the page's two tables: the first columns, whose quality cell also says where
    the output first left AR's ("differs from AR at token 12: near-tie (margin 0.12)"), and the details
    (method, then every column not among the first)."""
    first = [c for c in table.columns if _first(c)]
    details = ["method", *(c for c in table.columns if not _first(c))]
    shown = table[first].copy()
    if "first divergence" in table and "quality" in table:
        shown["quality"] = [quality if where in ("–", "", None) else f"{quality}{', at' if ':' in quality else ' at'} {where}"
                            for quality, where in zip(table["quality"], table["first divergence"])]
    return shown, table[details].copy()


def _vs_float32_cells(row: pd.Series) -> dict[str, str]:
    draft = row.get("draft_dtype")
    return {"precision (target / draft)": f"{row.get('target_dtype')}" + (f" / {draft}" if _text(draft) else ""),
            "speedup vs fp32 AR": _num(row["speedup_vs_fp32_ar"], ".2f")
                                  + ("×" if not _isnan(row["speedup_vs_fp32_ar"]) else ""),
            "token match vs fp32 AR": _num(row["token_match_vs_fp32"], ".0%"),
            "chrF vs fp32 AR": _num(row["chrf_vs_fp32"], ".1f")}


def explain(summary: pd.DataFrame) -> str:
    """A sentence per method on why it was fast or slow, from the summary's numbers (Markdown)."""
    if summary.empty:
        return ""
    lines = []
    evens = acceptance.comparison_break_evens(summary) if "rounds" in summary else {}
    for _, row in summary.iterrows():
        label = row["label"]
        if row["method"] == REFERENCE:
            lines.append(f"- **{label}**: one target forward per token — the baseline "
                         f"({_num(row['tokens_per_s'], '.1f')} tok/s).")
            continue
        if row["method"] == TORCH_COPY_AR:
            lines.append(f"- **{label}**: {_times_ar(row)}{_num(row['tokens_per_s'], '.1f')} tok/s — AR on the torch "
                         "copy of the target, timed after the methods: the reference of the rows that ran there.")
            continue
        if row["method"] in METHODS and METHODS[row["method"]].reading:
            lines.append(f"- **{label}**: {_baseline_reading(row)}")
            continue
        speed = row["speedup_vs_ar"]
        verdict = (
            "" if _isnan(speed) else
            f"{speed:.2f}× AR — " if speed >= 1.0 else f"slower than AR ({speed:.2f}×) — "
        )
        per_forward = row["target_forwards_per_token"]
        tokens_per_forward = 1.0 / per_forward if per_forward and not _isnan(per_forward) else math.nan
        if not row["mean_drafted"] or _isnan(row["mean_drafted"]):
            reason = "it drafted nothing, so every round cost a full target forward for one token"
        else:
            reason = (
                f"{_num(row['acceptance_rate'], '.0%')} of its drafts were kept, so each target forward produced "
                f"{_num(tokens_per_forward, '.2f')} tokens (γ ≈ {_num(row['mean_gamma'], '.1f')})"
            )
            if row["draft_forwards"]:
                reason += f"; the drafter ran {int(row['draft_forwards'])} forwards on top"
            copied = row.get("copied_rounds")
            if copied and not _isnan(copied):
                reason += f"; {int(copied)} of its {int(row['target_forwards'])} rounds were copied from the context"
            if row.get("entropy_auc_n"):
                reason += "; " + acceptance.describe_auc(row["entropy_auc"], int(row["entropy_auc_n"]))
        even = evens.get(row["method"])
        if even is not None:
            reason += f". {even[0].sentence()[0].upper()}{even[0].sentence()[1:]}"
        lines.append(f"- **{label}**: {verdict}{reason}.")
    return "\n".join(lines)


def _text(value) -> str:
    return value if isinstance(value, str) else ""


def _times_ar(row: pd.Series) -> str:
    speed = row["speedup_vs_ar"]
    return "" if _isnan(speed) else f"{speed:.2f}× AR, "


def _baseline_reading(row: pd.Series) -> str:
    """A baseline's line: its numbers and what they are for (its registry entry's reading)."""
    note = _text(row.get("note"))
    return (f"{_times_ar(row)}{_num(row['tokens_per_s'], '.1f')} tok/s — {METHODS[row['method']].reading}"
            + (f" ({note.split(':')[0]})." if note else "."))


def records(frame: pd.DataFrame) -> pd.DataFrame:
    """NaN → None, so a frame travels as JSON (Gradio components, the API)."""
    return frame.astype(object).where(frame.notna(), None)


def method_order(methods: Iterable[str]) -> list[str]:
    """AR first, then the registry's order, then anything unregistered as given."""
    names = list(dict.fromkeys(methods))
    registry = list(METHODS)
    return sorted(names, key=lambda m: (m != REFERENCE, registry.index(m) if m in registry else len(registry)))
