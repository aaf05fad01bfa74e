"""Same function per feature by counterfactual edits (issues 59, 71): what each head's push does when its
input is edited, read on the features the task's question is about.

The Count01 paper asks "whether the attention heads behave as a pseudo-ensemble, all solving the same subtask,
or they perform different subtasks", and answers "on the semantics of the counting task". A function is what
changes under an edit, so two heads compute the same function on a task's semantics where their responses to
the edits that move its semantic features are proportional, not where their pushes happen to co-vary on the
task's own inputs (a counter and a first-digit reader agree on inputs whose first digit is the majority one).

The edits (`edit_inputs`): every single-token substitution at each editable position before the read row of
the first inputs, within the tokens the inputs hold there, and where the task's lengths vary every insertion
and deletion of a token its features count (Count01: a '1' inserted moves the count of 1s alone). Each edit
carries its change of every declared feature (`headcoop.tasks.features`). A head's response to an edit is the
change of its push on the centred completion logits: its total effect (the logits with the head minus with its
z zeroed) where something later reads it, else its direct push (DLA; equal to the total effect there).

The reading (`feature_responses`, `function_table`): per input, a local linear fit of each head's responses on
the feature changes of that input's edits; where the other features (the noise token) can be told from the
semantic ones (the edits' changes have full rank: the lengths vary), their fitted part is taken out, so what
is compared is each head's response to the semantics alone, with its dependence on where an edit is made kept.
Where they cannot be told apart (one length: the count of 2s is the length less the counts) the responses are
compared as they are, and the result says so. Two heads compute the same function on the semantics where
their responses to the semantic edits are proportional input by input (|cos| and the share of the response on
one direction, each input weighted by its response energy; a gain that varies from input to input is allowed:
a head's normalisation by the noise and the length). Tasks that declare no features read every edit alike.
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Int
from torch import Tensor

from headcoop.analysis.mechanisms import pushes
from headcoop.analysis.mechanisms.axes import response_features, same_computation, same_function
from headcoop.tasks.features import Features

FUNCTION_KINDS = ("same", "agree", "different", "undetermined", "not measurable")
EDIT_INPUTS = 64  # inputs edited; every edit of each
MAX_EDITS = 2048  # above, the inputs are cut to the first ones whose edits fit (stated in the result)
EDIT_SAMPLE = 256  # a task that declares no features: a seeded sample of this many substitutions (stated)
READS = 0.5  # a head counts one semantic feature where its response to each other one alone is at most this share


def function_words(scope: str | None) -> dict[str, str]:
    """{kind: the model-level word} of the function axis, scoped to the task's semantics ("the counts")."""
    on = f" on {scope}" if scope else ""
    return {"same": f"same function{on} (pseudo-ensemble)",
            "agree": f"different functions{on} that agree on the task's inputs",
            "different": f"different functions{on}", "undetermined": "undetermined",
            "not measurable": "not measurable"}  # fmt: skip


FUNCTION_WORDS = tuple(function_words(None).values())


def _edits_of(row: Tensor, read: int, vocab: list, features: Features | None, width: int) -> list[tuple]:
    """[(kind, position, old, new, tokens, read)] every edit of one input (kind 0 substitution, 1 insertion,
    2 deletion; old -1 for an insertion, new -1 for a deletion)."""
    out = []
    start = features.start if features is not None else 0
    for p in range(start, read):
        for t in vocab[p]:
            if t != int(row[p]):
                edited = row.clone()
                edited[p] = t
                out.append((0, p, int(row[p]), t, edited, read))
    if features is None or features.lengths is None:
        return out
    length, (shortest, longest) = read - start, features.lengths
    if length < longest and read + 1 < width:
        for p in range(start, read + 1):
            for t in features.alphabet:
                out.append((1, p, -1, t, torch.cat([row[:p], row.new_tensor([t]), row[p:-1]]), read + 1))
    if length > shortest:
        for p in range(start, read):
            if int(row[p]) in features.alphabet:
                out.append((2, p, int(row[p]), -1, torch.cat([row[:p], row[p + 1 :], row[-1:]]), read - 1))
    return out


def edit_inputs(tokens: Int[Tensor, "batch pos"], pos: Int[Tensor, " batch"], features: Features | None = None,
                n_inputs: int = EDIT_INPUTS, max_edits: int = MAX_EDITS, sample: int | None = None,
                seed: int = 0) -> dict:  # fmt: skip
    """The counterfactual edits of the first inputs: {tokens [edit, pos], read [edit] (the edited input's read
    row), source [edit] (the input edited), kind [edit] (0 substitution, 1 insertion, 2 deletion), position,
    old, new [edit], delta [edit, feature] (each declared feature's change; None without features), inputs (how
    many were edited), sampled (fewer than `n_inputs` because their edits would pass `max_edits`), total (the
    edits of all `n_inputs`)}. At each position p from `features.start` before an input's read row, every token
    the inputs hold before their read rows at p, other than the one there; where the task's lengths vary,
    every insertion of a token its features count (at each position up to the read row) and every deletion of
    one, within the declared lengths. With `sample` (a task that declares no features, whose substitutions
    mostly mean nothing to it: issue 72), each input keeps a seeded random `sample // inputs` of its edits
    (`how` says which: "every edit" or "a sample of N")."""
    tokens, pos = tokens.cpu(), pos.cpu()
    before = torch.arange(tokens.shape[1])[None, :] < pos[:, None]
    vocab = [sorted(set(tokens[before[:, p], p].tolist())) for p in range(tokens.shape[1])]
    per_input = [_edits_of(tokens[b], int(pos[b]), vocab, features, tokens.shape[1])
                 for b in range(min(n_inputs, len(tokens)))]  # fmt: skip
    total = sum(len(e) for e in per_input)
    how = "every edit"
    if sample is not None and total > sample:
        each = max(1, sample // max(len(per_input), 1))
        gen = torch.Generator().manual_seed(seed)
        per_input = [[found[i] for i in sorted(torch.randperm(len(found), generator=gen)[:each].tolist())]
                     for found in per_input]  # fmt: skip
        how = f"a seeded sample of {sum(len(e) for e in per_input):,} of the {total:,} substitutions (seed {seed})"
    kept: list[tuple] = []
    used = 0
    for b, found in enumerate(per_input):
        if kept and used + len(found) > max_edits:
            break
        kept += [(b, *e) for e in found]
        used += len(found)
    inputs = (max(b for b, *_ in kept) + 1) if kept else len(per_input)
    if not kept:
        empty = torch.zeros(0, dtype=torch.long)
        return dict(tokens=tokens[:0], read=empty, source=empty, kind=empty, position=empty, old=empty, new=empty,
                    delta=None, inputs=inputs, sampled=False, total=0, how=how)  # fmt: skip
    source, kind, position, old, new, rows, read = (list(x) for x in zip(*kept))
    out: dict = dict(tokens=torch.stack(rows), read=torch.tensor(read), source=torch.tensor(source), kind=torch.tensor(kind),
               position=torch.tensor(position), old=torch.tensor(old), new=torch.tensor(new), delta=None,
               inputs=inputs, sampled=inputs < min(n_inputs, len(tokens)), total=total, how=how)  # fmt: skip
    if features is not None:
        out["delta"] = features.values(out["tokens"], out["read"]) - features.values(tokens, pos)[out["source"]]
    return out


def read_later(model, players) -> list[bool]:
    """Per head, whether something after it reads its output (a later layer, an MLP, a norm before the
    unembedding): its total effect can differ from its direct push."""
    cfg = model.cfg
    return [not cfg.attn_only or cfg.normalization_type is not None or lay < cfg.n_layers - 1 for lay, _ in players]


def no_direct_push(model) -> str | None:
    """Why no head's direct push is exact here (no exact DLA, or hooks installed), None where it is."""
    from headcoop.analysis.engine.inputs import check_decomposable
    from headcoop.models.bridge import user_hooks

    try:
        check_decomposable(model, "cooperation's direct effects")
    except ValueError:
        return "no exact DLA for this model"
    hooks = user_hooks(model)
    return f"the hooks installed at {', '.join(hooks[:4])} make DLA inexact" if hooks else None


def plan_edits(model, batch, players, features: Features | None = None, n_inputs: int = EDIT_INPUTS,
               sample: int = EDIT_SAMPLE, seed: int = 0) -> dict:  # fmt: skip
    """The function axis's edits and their cost, before any run: {edits (`edit_inputs`: every edit of the
    task's declared features, or a seeded sample of `sample` substitutions where it declares none), total [head]
    (read by its total effect), no_direct (why none is read directly, or None), path ("prefix-shared" or why the
    reference runs), rows (block rows), forwards (those rows as forward passes of `batch`)}."""
    edits = edit_inputs(batch.tokens, batch.answer_pos, features, n_inputs, sample=None if features else sample,
                        seed=seed)  # fmt: skip
    later = read_later(model, players)
    why = no_direct_push(model) if not all(later) else None
    total = [lat or why is not None for lat in later]
    n = edits["inputs"]
    stood = pushes.fast_path(model)
    width = torch.cat([batch.answer_pos[:n].cpu(), edits["read"]]) + 1
    first = torch.cat([torch.zeros(n, dtype=torch.long), edits["position"]])
    starts = [0] + [lay for (lay, _), t in zip(players, total) if t]
    rows = pushes.push_rows(width, first, n, starts, model.cfg.n_layers, stood is None) if len(edits["source"]) else 0
    full = batch.tokens.shape[0] * batch.tokens.shape[1]
    return dict(
        edits=edits,
        total=total,
        no_direct=why,
        path="prefix-shared" if stood is None else stood,
        rows=rows,
        forwards=rows / max(full, 1),
    )


@torch.no_grad()
def edit_responses(model, batch, players, outs: Tensor, features: Features | None = None,
                   n_inputs: int = EDIT_INPUTS, memory_budget_mb: float = 256, sample: int = EDIT_SAMPLE,
                   seed: int = 0, plan: dict | None = None) -> dict:  # fmt: skip
    """The edits and each head's pushes (`pushes`): {edits (`edit_inputs`), original [head, input, out], response
    [head, edit, out], push [head] ("direct" or "total"), later [head], no_direct (why no direct push, or
    None), path, forwards (`plan_edits`)}. A head something later reads is measured by its total effect, the
    others by their direct push; every head by its total effect where there is no direct push."""
    plan = plan if plan is not None else plan_edits(model, batch, players, features, n_inputs, sample, seed)
    edits, total = plan["edits"], plan["total"]
    bar = pushes.RowCounter(batch.tokens.shape[0] * batch.tokens.shape[1])  # the edits in forward passes of the batch
    n = edits["inputs"]
    tokens, pos = batch.tokens[:n].cpu(), batch.answer_pos[:n].cpu()
    found: dict = dict(edits=edits, later=read_later(model, players), no_direct=plan["no_direct"], push=[],
                       original=None, response=None, path=plan["path"], forwards=plan["forwards"])  # fmt: skip
    if len(edits["source"]) == 0:
        return found
    if plan["path"] == "prefix-shared":
        push = pushes.prefix_pushes(model, tokens, pos, edits, players, total, outs, memory_budget_mb, bar)
    else:
        push = pushes.reference_pushes(model, torch.cat([tokens, edits["tokens"]]), torch.cat([pos, edits["read"]]),
                                       players, total, outs, memory_budget_mb, bar)  # fmt: skip
    bar.close(math.ceil(plan["forwards"]))  # the runs announced for the edits, whatever the rounding
    found.update(push=["total" if t else "direct" for t in total], original=push[:, :n],
                 response=push[:, n:] - push[:, edits["source"]])  # fmt: skip
    return found


# --- the reading ------------------------------------------------------------------------------------------
def feature_responses(response: Tensor, edits: dict, features: Features | None) -> dict:
    """Each head's response to the semantics: {semantic [head, edit', out] (the responses to the edits that move
    a semantic feature, the fitted part of the other features taken out where it can be told apart), source
    [edit'] and delta [edit', feature] of those edits, other [head, input, other feature, out] (the fitted response
    per unit of each other feature; NaN where it cannot be told apart), separable [input] (the edits' feature
    changes have full rank there), position [head] (the share of each head's semantic response that changes with
    where an edit is made, all feature changes equal)}."""
    response = response.double()
    k, n_edits, n_out = response.shape
    source = edits["source"]
    inputs = int(source.max()) + 1 if n_edits else 0
    if features is None:  # every edit a semantic one, nothing to take out
        keep = torch.ones(n_edits, dtype=torch.bool)
        delta = torch.stack([edits["old"], edits["new"]], 1)
        return dict(semantic=response, source=source, delta=delta, other=None, separable=torch.zeros(inputs, dtype=torch.bool),
                    position=_position_share(response, source, delta), keep=keep)  # fmt: skip
    sem = torch.tensor(features.semantic)
    delta = edits["delta"].double()
    keep = delta[:, sem].abs().sum(1) > 0
    semantic = response.clone()
    other = torch.full((k, inputs, int((~sem).sum()), n_out), float("nan"), dtype=torch.float64)
    separable = torch.zeros(inputs, dtype=torch.bool)
    if bool((~sem).any()):
        for b in range(inputs):
            at = (source == b).nonzero().flatten()
            d = delta[at]
            if len(at) == 0 or int(torch.linalg.matrix_rank(d)) < d.shape[1]:
                continue
            fit = torch.linalg.lstsq(d, response[:, at].permute(1, 0, 2).reshape(len(at), -1)).solution
            fit = fit.reshape(d.shape[1], k, n_out)  # [feature, head, out]
            semantic[:, at] -= torch.einsum("ef,fho->heo", d[:, ~sem], fit[~sem])
            other[:, b] = fit[~sem].permute(1, 0, 2)
            separable[b] = True
    return dict(semantic=semantic[:, keep], source=source[keep], delta=delta[keep], other=other, separable=separable,
                position=_position_share(semantic[:, keep], source[keep], delta[keep]), keep=keep)  # fmt: skip


def _position_share(resp: Tensor, source: Tensor, delta: Tensor) -> Tensor:
    """[head] the share of each head's response energy that is deviation from the mean response of its group of
    edits (one input, one change of every feature): what changes with where the edit is made."""
    keys: dict[tuple, int] = {}
    group = torch.tensor([keys.setdefault((int(s), *d.tolist()), len(keys)) for s, d in zip(source, delta)],
                         dtype=torch.long)  # fmt: skip
    if len(group) == 0:
        return torch.zeros(resp.shape[0], dtype=torch.float64)
    sums = torch.zeros(resp.shape[0], len(keys), resp.shape[2], dtype=resp.dtype).index_add_(1, group, resp)
    counts = torch.bincount(group, minlength=len(keys)).to(resp.dtype)
    deviation = resp - (sums / counts[None, :, None])[:, group]
    return deviation.pow(2).sum((1, 2)) / resp.pow(2).sum((1, 2)).clamp(min=1e-30)


def per_input_alike(resp: Tensor, source: Tensor) -> dict:
    """How proportional heads' responses are input by input: {cos [head, head] (|cos| of each input's responses,
    averaged with each input weighted by its response energy), share (of each input's response energy on one
    direction, averaged the same way), cos_min, cos_median (over pairs)}. resp: [head, edit, out].
    All inputs at once from each input's Gram matrix of the heads' responses (its trace the energy, its diagonal
    the norms, its largest eigenvalue the top singular value squared): `per_input_alike_reference`'s numbers."""
    k = resp.shape[0]
    inputs, at = source.unique(return_inverse=True)
    r = resp.double()
    gram = torch.zeros(len(inputs), k, k, dtype=torch.float64).index_add_(0, at, torch.einsum("keo,jeo->ekj", r, r))
    energy = gram.diagonal(dim1=1, dim2=2).sum(-1)  # [input]
    live = energy > 0
    gram, energy = gram[live], energy[live]
    norm = gram.diagonal(dim1=1, dim2=2).clamp(min=0).sqrt().clamp(min=1e-30)  # [input, head]
    cos_each = (gram / (norm[:, :, None] * norm[:, None, :])).abs()
    top = torch.linalg.eigvalsh(gram)[:, -1].clamp(min=0)
    weight = float(energy.sum())
    cos = (energy[:, None, None] * cos_each).sum(0) / max(weight, 1e-30)
    share = float((energy * top / energy.clamp(min=1e-30)).sum()) / max(weight, 1e-30)
    upper = cos[torch.triu(torch.ones(k, k, dtype=torch.bool), 1)]
    return dict(cos=cos, share=share,
                cos_min=float(upper.min()) if len(upper) else float("nan"),
                cos_median=float(upper.median()) if len(upper) else float("nan"))  # fmt: skip


def per_input_alike_reference(resp: Tensor, source: Tensor) -> dict:
    """`per_input_alike` input by input: each input's responses [head, edit * out], their |cos| and singular
    values (the obviously-correct loop the batched version is tested against)."""
    k = resp.shape[0]
    cos_sum = torch.zeros(k, k, dtype=torch.float64)
    share_sum, weight_sum = 0.0, 0.0
    for b in source.unique().tolist():
        m = resp[:, source == b].reshape(k, -1).double()
        energy = float(m.pow(2).sum())
        if energy <= 0:
            continue
        norm = m.norm(dim=1).clamp(min=1e-30)
        cos_sum += energy * ((m @ m.T) / (norm[:, None] * norm[None, :])).abs()
        values = torch.linalg.svdvals(m) ** 2
        share_sum += energy * float(values[0] / values.sum().clamp(min=1e-30))
        weight_sum += energy
    cos = cos_sum / max(weight_sum, 1e-30)
    upper = cos[torch.triu(torch.ones(k, k, dtype=torch.bool), 1)]
    return dict(cos=cos, share=share_sum / max(weight_sum, 1e-30),
                cos_min=float(upper.min()) if len(upper) else float("nan"),
                cos_median=float(upper.median()) if len(upper) else float("nan"))  # fmt: skip


def semantic_reads(resp: Tensor, delta: Tensor, features: Features | None) -> Tensor | None:
    """[head, semantic feature] each head's root-mean-square response to the edits that move that semantic
    feature alone (of the semantic ones), as a share of its largest such response (NaN where no edit moves it
    alone); None without features."""
    if features is None:
        return None
    sem = torch.tensor(features.semantic)
    d = delta[:, sem]
    out = []
    for f in range(d.shape[1]):
        alone = (d[:, f] != 0) & ((d != 0).sum(1) == 1)
        out.append(resp[:, alone].pow(2).mean((1, 2)).sqrt() if bool(alone.any()) else
                   torch.full((resp.shape[0],), float("nan"), dtype=torch.float64))  # fmt: skip
    reads = torch.stack(out, 1)
    return reads / torch.nan_to_num(reads, nan=0.0).amax(1, keepdim=True).clamp(min=1e-30)


def stood_function_word(kinds: dict) -> str:
    """The kind over every (floor, tolerance) reading: "same" where every reading says so; "different" where none
    does ("agree" where every reading says that); else "undetermined"."""
    kinds = {key: w for key, w in kinds.items() if w != "not measurable"}  # too few heads at that floor
    if not kinds:
        return "not measurable"
    same = [w == "same" for w in kinds.values()]
    if all(same):
        return "same"
    if any(same):
        return "undetermined"
    return "agree" if all(w == "agree" for w in kinds.values()) else "different"


def reading_kinds(fr: dict, original: Tensor, floor: float, same: float, factors) -> dict:
    """{reading label: kind} over the readings of the function axis: the defaults, then the activity floor and
    the tolerance each at each factor (one at a time, as the pair words' band). A reading with fewer than 2
    deciding heads gives "not measurable"."""
    out = {}
    readings = (
        [("", 1.0, 1.0)] + [(f"floor x{f:g}", f, 1.0) for f in factors] + [(f"same x{f:g}", 1.0, f) for f in factors]
    )
    resp = fr["semantic"]
    for label, ff, tf in readings:
        idx = same_function(resp.flatten(1), floor * ff)["active"].nonzero().flatten()
        tol = min(same * tf, 0.5)
        if len(idx) < 2:
            out[label] = "not measurable"
            continue
        alike = per_input_alike(resp[idx], fr["source"])
        dist = same_computation((original[idx] - original[idx].mean(1, keepdim=True)).flatten(1), 0.0)
        if alike["cos_min"] >= 1 - tol and alike["share"] >= 1 - tol:
            out[label] = "same"
        else:
            out[label] = "agree" if dist["r_min"] >= 1 - tol and dist["share"] >= 1 - tol else "different"
    return out


def specialised(reads: Tensor | None, names: list[str], features: Features | None) -> str:
    """How the deciding heads split the semantic features, where at least two of them each respond mostly to a
    different one (to every other semantic feature alone at most `READS` of that): "L0H0 counts 0s (the other
    counts at most 0.37 of that); L0H1 counts 1s (0.44)"; "" where they do not. reads: [head, semantic feature]
    (`semantic_reads`; under softmax averaging a head counting one token still responds to the others through
    the length it divides by, so "mostly", not "only")."""
    if reads is None or features is None or reads.shape[1] < 2:
        return ""
    short = [s for s, sem in zip(features.short, features.semantic) if sem]
    mostly = {}
    for h in range(len(names)):
        r = torch.nan_to_num(reads[h], nan=0.0)
        top = int(r.argmax())
        rest = float(torch.cat([r[:top], r[top + 1 :]]).max())
        if rest <= READS:
            mostly[h] = (top, rest)
    if len({top for top, _ in mostly.values()}) < 2:
        return ""
    parts = [f"{names[h]} counts {short[top]} ({'its response to the other counts alone at most ' if i == 0 else ''}"
             f"{rest:.2f}{' of that' if i == 0 else ''})" for i, (h, (top, rest)) in enumerate(mostly.items())]  # fmt: skip
    return "; ".join(parts)


def other_features(response: Tensor, edits: dict, fr: dict, idx: Tensor, names: list[str],
                   features: Features | None, floor: float, same: float) -> tuple[list[str], dict]:  # fmt: skip
    """(sentences, numbers) on each other feature over the deciding heads `idx`: how alike their responses are to
    the edits that move it (input by input, as for the semantics; those edits may move a semantic feature too:
    the reading is of the feature as the task's inputs carry it), and whether it could be taken out of the
    semantic comparison (`feature_responses`: separable inputs)."""
    if features is None or edits["delta"] is None:
        return [], {}
    sentences, numbers = [], {}
    separable = float(fr["separable"].double().mean()) if len(fr["separable"]) else 0.0
    for o, (name, sem) in enumerate(zip(features.names, features.semantic)):
        if sem:
            continue
        moves = edits["delta"][:, o] != 0
        entry: dict = dict(edits=int(moves.sum()), separable=separable)
        numbers[name] = entry
        if not bool(moves.any()):
            sentences.append(f"no edit moves {name}")
            continue
        resp = response[idx][:, moves].double()
        rms = resp.pow(2).mean((1, 2)).sqrt()
        on = (rms >= floor * rms.max().clamp(min=1e-30)).nonzero().flatten()
        entry["heads"] = len(on)
        if len(on) < 2:
            sentences.append(f"{len(on)} of the {len(idx)} deciding heads respond to the edits of {name}")
            continue
        alike = per_input_alike(resp[on], edits["source"][moves])
        entry.update(cos_min=alike["cos_min"], cos_median=alike["cos_median"], share=alike["share"])
        verb = "alike" if alike["cos_min"] >= 1 - same and alike["share"] >= 1 - same else "differently"
        told = (f"taken out of the comparison on {separable:.0%} of the inputs" if separable > 0 else
                f"not separable from {features.scope} here (one length: no edit moves it alone), so the responses "
                f"compared on {features.scope} include it")  # fmt: skip
        sentences.append(f"the heads weigh {name} {verb}: on the {int(moves.sum()):,} edits that move it |cos| >= "
                         f"{alike['cos_min']:.2f} (median {alike['cos_median']:.2f}), {alike['share']:.1%} on one "
                         f"direction, over the {len(on)} deciding heads that respond to it; {told}")  # fmt: skip
    return sentences, numbers


def function_table(found: dict, names, vocab, floor: float, same: float, factors,
                   features: Features | None = None) -> tuple:  # fmt: skip
    """(one row per head, the word, its sentence, numbers). The heads whose response to the semantic edits
    (`feature_responses`) reaches `floor` of the most responsive head's decide. The kind at each reading
    (`reading_kinds`: the floor and the tolerance `same` each at x1 and x `factors`): responses proportional
    input by input (|cos| >= 1 - tol pairwise, 1 - tol of the response on one direction) give "same"; else,
    where the pushes on the task's inputs correlate as one (r and one direction at the same tolerance), "agree";
    else "different". It stands where every reading agrees, else "undetermined" with what flips it; beside it
    each other feature (`other_features`), the share of each head's response that depends on where an edit is
    made, and how the heads split the semantic features (`specialised`)."""
    import pandas as pd

    edits = found["edits"]
    k = len(names)
    words = function_words(features.scope if features is not None else None)
    empty = pd.DataFrame(index=pd.Index(list(names), name="head"))
    if found["response"] is None:
        why = "no input has a position to edit before its read row" if len(edits["source"]) == 0 else found["no_direct"]
        return empty, words["not measurable"], why or "no measure", dict(kind="not measurable")
    label = lambda t: vocab[t] if vocab and 0 <= t < len(vocab) else str(t)  # noqa: E731
    fr = feature_responses(found["response"], edits, features)
    resp = fr["semantic"]
    if resp.shape[1] == 0:
        return empty, words["not measurable"], f"no edit moves {features.scope if features else 'a feature'}", \
            dict(kind="not measurable")  # fmt: skip
    axis = same_function(resp.flatten(1), floor)
    reads = semantic_reads(resp, fr["delta"], features)
    table = pd.DataFrame(dict(push=found["push"], response=axis["rms"].numpy(), decides=axis["active"].numpy(),
                              position_share=fr["position"].numpy()), index=pd.Index(list(names), name="head"))  # fmt: skip
    if reads is not None:
        for f, short in enumerate(s for s, sem in zip(features.short, features.semantic) if sem):  # type: ignore[union-attr]
            table[f"reads[{short}]"] = reads[:, f].numpy()
    idx = axis["active"].nonzero().flatten()
    chosen = [names[i] for i in idx.tolist()]
    scope = features.scope if features is not None else "every edit"
    numbers = dict(deciding=chosen, edits=len(edits["source"]), semantic_edits=resp.shape[1], inputs=edits["inputs"],
                   edits_total=edits["total"], sampled=edits["sampled"], scope=scope, how=edits.get("how", "every edit"),
                   path=found.get("path"), forwards=found.get("forwards"),
                   push=sorted(set(found["push"])), semantic=[n for n, s in zip(features.names, features.semantic) if s]
                   if features is not None else [])  # fmt: skip
    raw = response_features(found["response"], edits["old"], edits["new"], edits["position"])
    columns = {
        _feature_label(kind, what, label): pd.Series(value.numpy(), index=list(names))
        for (kind, what), value in raw.items()
    }
    table = pd.concat([table, pd.DataFrame(columns, index=table.index)], axis=1)
    if len(idx) < 2:
        numbers["kind"] = "not measurable"
        return table, words["not measurable"], (f"fewer than 2 heads respond to the edits of {scope} ({len(idx)} of "
                                                f"{k})"), numbers  # fmt: skip
    alike = per_input_alike(resp[idx], fr["source"])
    pooled = same_function(resp[idx].flatten(1), 0.0)
    original = found["original"]
    dist = same_computation((original[idx] - original[idx].mean(1, keepdim=True)).flatten(1), 0.0)
    table.loc[chosen, "sign"] = pooled["sign"].numpy()
    numbers.update(cos_min=alike["cos_min"], cos_median=alike["cos_median"], share=alike["share"],
                   pooled_cos_min=pooled["cos_min"], pooled_share=pooled["share"], r_min=dist["r_min"],
                   r_median=dist["r_median"], share_inputs=dist["share"],
                   position_max=float(fr["position"][idx].max()))  # fmt: skip
    kinds = reading_kinds(fr, original, floor, same, factors)
    kind = stood_function_word(kinds)
    numbers["kind"] = kind
    split = specialised(reads[idx] if reads is not None else None, chosen, features)
    numbers["specialised"] = split
    other_sentences, numbers["other"] = other_features(
        found["response"], edits, fr, idx, list(names), features, floor, same
    )
    sentence = _sentence(numbers, fr, idx, list(names), edits, same, other_sentences)
    if len(set(kinds.values())) > 1:
        flips = sorted({f"{words[w]} under {r or 'the default'}" for r, w in kinds.items()})
        sentence += " (the readings disagree: " + "; ".join(flips) + ")"
    return table, words[kind], sentence, numbers


def _sentence(numbers: dict, fr: dict, idx: Tensor, names: list[str], edits: dict, same: float,
              other_sentences: list[str]) -> str:  # fmt: skip
    """The function axis's sentence: who decides and by which push, the numbers that decide, how the heads split
    the semantics, where an edit is made, the other features apart, and the edits' cut."""
    scope, chosen, n = numbers["scope"], numbers["deciding"], numbers["semantic_edits"]
    sentence = (f"{len(idx)} of {len(names)} heads respond to {scope} ({', '.join(chosen[:8])}"
                f"{', ...' if len(idx) > 8 else ''}; each by its {' or '.join(numbers['push'])} push); over {n:,} edits "
                f"{'' if scope == 'every edit' else f'of {scope} '}in {edits['inputs']} inputs their responses are proportional input by input at |cos| >= "
                f"{numbers['cos_min']:.3f} (median {numbers['cos_median']:.3f}) with {numbers['share']:.2%} on one "
                f"direction (pooled over inputs |cos| >= {numbers['pooled_cos_min']:.3f}; on the task's inputs the "
                f"pushes correlate at r >= {numbers['r_min']:.3f})")  # fmt: skip
    if numbers["specialised"]:
        sentence += f"; specialised: {numbers['specialised']}"
    moving = [(names[i], float(fr["position"][i])) for i in idx.tolist() if float(fr["position"][i]) >= same]
    if moving:
        sentence += "; the response changes with where the edit is made for " + ", ".join(
            f"{h} ({s:.0%} of its response)" for h, s in moving)  # fmt: skip
    else:
        sentence += (f"; where an edit is made changes at most {numbers['position_max']:.1%} of any deciding head's "
                     f"response")  # fmt: skip
    if other_sentences:
        sentence += "; apart from " + scope + ": " + "; ".join(other_sentences)
    if numbers.get("how", "every edit") != "every edit":
        sentence += f" (the edits: {numbers['how']}; the task declares no features)"
    if edits["sampled"]:
        sentence += (
            f" (the edits of the first {edits['inputs']} inputs: {len(edits['source']):,} of {edits['total']:,})"
        )
    return sentence


def _feature_label(kind: str, what, label) -> str:
    if kind == "position":
        return f"resp[pos {what}]"
    old, new = what
    if old < 0:
        return f"resp[+{label(new)}]"
    if new < 0:
        return f"resp[-{label(old)}]"
    return f"resp[{label(old)}->{label(new)}]"


__all__ = ["FUNCTION_KINDS", "FUNCTION_WORDS", "EDIT_INPUTS", "MAX_EDITS", "EDIT_SAMPLE", "READS", "function_words",
           "edit_inputs", "read_later", "no_direct_push", "plan_edits", "edit_responses", "feature_responses", "per_input_alike",
           "per_input_alike_reference",
           "semantic_reads", "stood_function_word", "reading_kinds", "specialised", "other_features",
           "function_table"]  # fmt: skip
