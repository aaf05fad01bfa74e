"""Same function by counterfactual edits (issue 59): what each head's push does when one input token is changed.

The Count01 paper asks "whether the attention heads behave as a pseudo-ensemble, all solving the same subtask,
or they perform different subtasks". A function is what changes under an edit, so two heads compute the same
function where their responses to every edit are proportional, not where their pushes happen to co-vary on the
task's own inputs (a counter and a first-digit reader agree on inputs whose first digit is the majority one).

The edits: every single-token substitution at each position before the read row of a sample of inputs, within
the tokens the task puts at that position (the inputs' own vocabulary there: Count01's 0 / 1 / 2, SkipPair's
signal tokens); each edit is named by its substitution (the feature it moves: '0'->'1' is one more '1' and one
fewer '0') and its position. A head's response to an edit is the change of its push on the centred completion
logits: its direct push (DLA, the final norm's scale frozen) and, for heads later layers read, its total effect
(the logits with the head minus with it zeroed). `axes.same_function` turns the responses into numbers,
`function_table` into the model-level word.
"""

from __future__ import annotations

from typing import cast

import torch
from jaxtyping import Int
from torch import Tensor

from headcoop.analysis.mechanisms.axes import response_features, same_computation, same_function
from headcoop.analysis.mechanisms.evidence import head_dla
from headcoop.analysis.mechanisms.repair import run_with
from headcoop.tasks.base import generator

FUNCTION_WORDS = ("same function (pseudo-ensemble)", "different functions that agree on the task's inputs",
                  "different functions", "undetermined", "not measurable")  # fmt: skip
EDIT_INPUTS = 64  # inputs edited; every substitution of each
MAX_EDITS = 2048  # above, a seeded sample of the edits (stated in the result)


def edit_inputs(tokens: Int[Tensor, "batch pos"], pos: Int[Tensor, " batch"], n_inputs: int = EDIT_INPUTS,
                max_edits: int = MAX_EDITS, seed: int = 0) -> dict:  # fmt: skip
    """The counterfactual edits of the first `n_inputs` inputs: {tokens [edit, pos], source [edit] (the input
    edited), position, old, new [edit], sampled (whether the edits were cut to `max_edits` by a seeded
    draw), total (the edits before any cut)}. At each position p before an input's read row, every token the
    inputs hold before their read rows at p, other than the one there."""
    tokens, pos = tokens.cpu(), pos.cpu()
    before = torch.arange(tokens.shape[1])[None, :] < pos[:, None]
    vocab = [sorted(set(tokens[before[:, p], p].tolist())) for p in range(tokens.shape[1])]
    source, position, old, new = [], [], [], []
    for b in range(min(n_inputs, len(tokens))):
        for p in range(int(pos[b])):
            for t in vocab[p]:
                if t != int(tokens[b, p]):
                    source.append(b)
                    position.append(p)
                    old.append(int(tokens[b, p]))
                    new.append(t)
    total = len(source)
    keep = torch.arange(total)
    if total > max_edits:
        keep = torch.randperm(total, generator=generator(seed))[:max_edits].sort().values
    source_t = torch.tensor(source, dtype=torch.long)[keep]
    position_t = torch.tensor(position, dtype=torch.long)[keep]
    edited = tokens[source_t].clone()
    edited[torch.arange(len(keep)), position_t] = torch.tensor(new, dtype=torch.long)[keep]
    return dict(tokens=edited, source=source_t, position=position_t, old=torch.tensor(old, dtype=torch.long)[keep],
                new=torch.tensor(new, dtype=torch.long)[keep], sampled=total > max_edits, total=total)  # fmt: skip


def _centred(values: Tensor, outs: Tensor) -> Tensor:
    """[..., out] the values on the completions, less their mean over them (a shift common to every completion
    changes no answer)."""
    v = values[..., outs]
    return v - v.mean(-1, keepdim=True)


def direct_pushes(model, tokens: Tensor, pos: Tensor, players, outs: Tensor) -> Tensor | str:
    """[head, batch, out] each head's direct push on the centred completion logits at the read rows, or why
    there is none (`evidence.head_dla`)."""
    dla = head_dla(model, tokens.to(model.cfg.device), pos.to(model.cfg.device))
    if isinstance(dla, str):
        return dla
    return torch.stack([_centred(dla[:, lay, h], outs) for lay, h in players])


def total_pushes(model, tokens: Tensor, pos: Tensor, players, outs: Tensor) -> Tensor:
    """[head, batch, out] each head's total effect on the centred completion logits at the read rows: the
    logits with every head minus the logits with the head's z zeroed (plain hooks on hook_z)."""
    tokens, pos = tokens.to(model.cfg.device), pos.to(model.cfg.device)
    full, _ = run_with(model, tokens, pos, {})
    out = []
    for lay, h in players:
        zero = torch.zeros(*tokens.shape, model.cfg.d_head)
        without, _ = run_with(model, tokens, pos, {(lay, h): zero})
        out.append(_centred(full - without, outs))
    return torch.stack(out)


def read_later(model, players) -> list[bool]:
    """Per head, whether something after it reads its output (a later layer, an MLP, a norm before the
    unembedding): its total effect can differ from its direct push."""
    cfg = model.cfg
    return [not cfg.attn_only or cfg.normalization_type is not None or lay < cfg.n_layers - 1 for lay, _ in players]


def edit_responses(model, batch, players, outs: Tensor, seed: int = 0, n_inputs: int = EDIT_INPUTS) -> dict:
    """The edits and each measure's pushes: {edits (`edit_inputs`), measures {"direct" | "total": (original
    pushes [head, input, out], responses [head, edit, out])}, later [head], no_direct (why no direct push,
    or None)}. Two forward passes for the direct push; one per head more for the total effect, only where
    a head is read later."""
    n = min(n_inputs, len(batch.tokens))
    tokens, pos = batch.tokens[:n].cpu(), batch.answer_pos[:n].cpu()
    edits = edit_inputs(batch.tokens, batch.answer_pos, n_inputs, seed=seed)
    both = torch.cat([tokens, edits["tokens"]])
    both_pos = torch.cat([pos, pos[edits["source"]]])
    later = read_later(model, players)
    measures: dict = {}
    no_direct = None
    if len(edits["source"]) == 0:
        return dict(edits=edits, measures=measures, later=later, no_direct=None)
    direct = direct_pushes(model, both, both_pos, players, outs)
    if isinstance(direct, str):
        no_direct = direct
    else:
        measures["direct"] = (direct[:, :n], direct[:, n:] - direct[:, edits["source"]])
    if any(later) or no_direct is not None:
        total = total_pushes(model, both, both_pos, players, outs)
        measures["total"] = (total[:, :n], total[:, n:] - total[:, edits["source"]])
    return dict(edits=edits, measures=measures, later=later, no_direct=no_direct)


def function_word(edit_same: bool, on_inputs_same: bool) -> str:
    """The model-level word of one reading: the same function where the responses to edits are proportional;
    else different functions, which agree on the task's inputs where the pushes there co-vary as one."""
    if edit_same:
        return FUNCTION_WORDS[0]
    return FUNCTION_WORDS[1] if on_inputs_same else FUNCTION_WORDS[2]


def stood_function_word(words: dict) -> str:
    """The word over every (measure, tolerance) reading: the same function where every reading says so;
    different functions where none does (that agree on the task's inputs where every reading says that);
    else "undetermined"."""
    words = {key: w for key, w in words.items() if w != "not measurable"}  # too few heads at that floor
    if not words:
        return "not measurable"
    same = [w == FUNCTION_WORDS[0] for w in words.values()]
    if all(same):
        return FUNCTION_WORDS[0]
    if any(same):
        return "undetermined"
    return FUNCTION_WORDS[1] if all(w == FUNCTION_WORDS[1] for w in words.values()) else FUNCTION_WORDS[2]


def deciders(axes: dict, later: list[bool], k: int) -> Tensor:
    """[head] whether each head decides: active on its direct push and, where later layers read it (or there
    is no direct push), on its total effect. axes: {measure: `same_function` at one floor}."""
    decides = torch.ones(k, dtype=torch.bool)
    for m in axes:
        applies = torch.tensor([m == "direct" or later[i] or "direct" not in axes for i in range(k)])
        decides &= axes[m]["active"] | ~applies
    return decides


def reading_words(measures: dict, later: list[bool], k: int, floor: float, same: float, factors) -> dict:
    """{(measure, reading label): word} over the readings of the function axis: the defaults, then the activity
    floor and the tolerance each at each factor (one at a time, as the pair words' band). A reading with fewer
    than 2 deciding heads gives "not measurable"."""
    out = {}
    readings = (
        [("", 1.0, 1.0)] + [(f"floor x{f:g}", f, 1.0) for f in factors] + [(f"same x{f:g}", 1.0, f) for f in factors]
    )
    for label, ff, tf in readings:
        at = {m: same_function(resp.flatten(1), floor * ff) for m, (_, resp) in measures.items()}
        idx = deciders(at, later, k).nonzero().flatten()
        tol = min(same * tf, 0.5)
        for m, (orig, resp) in measures.items():
            if len(idx) < 2:
                out[(m, label)] = "not measurable"
                continue
            sub = same_function(resp[idx].flatten(1), 0.0)
            dist = same_computation((orig[idx] - orig[idx].mean(1, keepdim=True)).flatten(1), 0.0)
            out[(m, label)] = function_word(sub["cos_min"] >= 1 - tol and sub["share"] >= 1 - tol,
                                            dist["r_min"] >= 1 - tol and dist["share"] >= 1 - tol)  # fmt: skip
    return out


def function_table(found: dict, names, vocab, floor: float, same: float, factors) -> tuple:
    """(one row per head, the word, its sentence, numbers). Per measure, the heads whose responses reach
    `floor` of the most responsive head's are active; a head is decided on its direct push and, where later
    layers read it, also on its total effect; one within the floor on either does not decide (`deciders`).
    The word at each measure and reading (`reading_words`: the floor and the tolerance `same` each at x1 and x
    `factors`): proportional responses (|cos| >= 1 - tol pairwise, 1 - tol of the response on one direction)
    give "same function (pseudo-ensemble)"; else, where the pushes on the task's inputs correlate as one (r and
    one direction at the same tolerance), "different functions that agree on the task's inputs"; else
    "different functions". It stands where every reading agrees on same or not (`stood_function_word`), else
    "undetermined", with what flips it; beside it, each measure over every head active on it alone."""
    import pandas as pd

    measures, later, edits = found["measures"], found["later"], found["edits"]
    k = len(names)
    if not measures:
        why = ("no input has a position to edit before its read row" if len(edits["source"]) == 0
               else found["no_direct"] or "no measure")  # fmt: skip
        return pd.DataFrame(index=pd.Index(list(names), name="head")), "not measurable", why, {}
    label = lambda t: vocab[t] if vocab and 0 <= t < len(vocab) else str(t)  # noqa: E731
    axes = {m: same_function(resp.flatten(1), floor) for m, (_, resp) in measures.items()}
    table = pd.DataFrame({col: val for m, a in axes.items() for col, val in
                          ((f"response_{m}", a["rms"].numpy()), (f"active_{m}", a["active"].numpy()))},
                         index=pd.Index(list(names), name="head"))  # fmt: skip
    decides = deciders(axes, later, k)
    table["decides"] = decides.numpy()
    idx = decides.nonzero().flatten()
    chosen = [names[i] for i in idx.tolist()]
    numbers = dict(deciding=chosen, edits=len(edits["source"]), edits_total=edits["total"], sampled=edits["sampled"],
                   measures=list(measures))  # fmt: skip
    if len(idx) < 2:
        active = {m: int(a["active"].sum()) for m, a in axes.items()}
        return (
            table,
            "not measurable",
            (
                f"fewer than 2 heads respond to the edits on every measure that applies "
                f"to them ({', '.join(f'{m}: {c} of {k}' for m, c in active.items())})"
            ),
            numbers,
        )
    parts = []
    for m, (orig, resp) in measures.items():
        sub = same_function(resp[idx].flatten(1), 0.0)
        dist = same_computation((orig[idx] - orig[idx].mean(1, keepdim=True)).flatten(1), 0.0)
        numbers[m] = dict(cos_min=sub["cos_min"], cos_median=sub["cos_median"], share=sub["share"],
                          r_min=dist["r_min"], r_median=dist["r_median"], share_inputs=dist["share"])  # fmt: skip
        table.loc[chosen, f"sign_{m}"] = sub["sign"].numpy()
        parts.append(f"{m} push: |cos| >= {sub['cos_min']:.3f} over {len(edits['source']):,} edits with "
                     f"{sub['share']:.2%} of the response on one direction (on the task's inputs r >= "
                     f"{dist['r_min']:.3f}, {dist['share']:.2%} on one direction)")  # fmt: skip
        alone = axes[m]["active"].nonzero().flatten()  # beside it: every head active on this measure alone
        if len(alone) > len(idx):
            sub = same_function(resp[alone].flatten(1), 0.0)
            numbers[m]["active_alone"] = dict(heads=len(alone), cos_min=sub["cos_min"], share=sub["share"])
            parts.append(f"over the {len(alone)} heads active on the {m} push alone: |cos| >= {sub['cos_min']:.3f}, "
                         f"{sub['share']:.2%} on one direction")  # fmt: skip
    features = response_features(measures[next(iter(measures))][1][idx], edits["old"], edits["new"], edits["position"])
    columns = {(f"resp[{label(cast(tuple, what)[0])}->{label(cast(tuple, what)[1])}]" if kind == "substitution" else f"resp[pos {what}]"):
               pd.Series(value.numpy(), index=chosen) for (kind, what), value in features.items()}  # fmt: skip
    table = pd.concat([table, pd.DataFrame(columns, index=table.index)], axis=1)
    words = reading_words(measures, later, k, floor, same, factors)
    word = stood_function_word(words)
    sentence = (f"{len(idx)} of {k} heads decide ({', '.join(chosen[:8])}{', ...' if len(idx) > 8 else ''}; decided "
                f"on {' and '.join(measures)}); " + "; ".join(parts))  # fmt: skip
    if edits["sampled"]:
        sentence += f" (a seeded sample of {len(edits['source']):,} of {edits['total']:,} edits)"
    if len(set(words.values())) > 1:
        flips = sorted({f"{w} under {m}" + (f", {r}" if r else "") for (m, r), w in words.items()})
        sentence += " (the readings disagree: " + "; ".join(flips) + ")"
    return table, word, sentence, numbers


__all__ = ["FUNCTION_WORDS", "EDIT_INPUTS", "MAX_EDITS", "edit_inputs", "direct_pushes", "total_pushes", "read_later",
           "edit_responses", "function_word", "stood_function_word", "deciders", "reading_words", "function_table"]  # fmt: skip
