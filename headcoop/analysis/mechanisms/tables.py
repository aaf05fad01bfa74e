"""The tables and summary of a `Cooperation`: one row per pair and per head, the same-computation axis, and
the first line that states the sources' answers (same computation or not, whether any pair matters in the
full model, how many heads answer alone)."""

from __future__ import annotations

from collections import Counter

import pandas as pd
import torch

from headcoop.analysis.mechanisms.assemble import Run, read_all
from headcoop.analysis.mechanisms.edits import function_table
from headcoop.analysis.mechanisms.evidence import same_computation_axis
from headcoop.analysis.mechanisms.repair import BACKUP_COLUMNS, redundant_readers, share_or_nan
from headcoop.analysis.mechanisms.result import Cooperation
from headcoop.analysis.mechanisms.words import (
    ABSTAIN,
    CLASSES,
    INPUT_CLASSES,
    MECHANISMS,
    by_ablation,
    knife_edges,
    stand,
)


def pair_table(run: Run, r: dict, by_kind: dict, primary: str, th: dict, agree: float, inter) -> tuple:
    """(one row per pair, input classes [pair, batch], superposed and multi [pair, batch]) under the primary
    reading, with the word that stands over every reading."""
    readings = r["readings"]
    first = next(x for x, rd in enumerate(readings) if rd.how == primary and rd.draw == 0 and rd.threshold is None)
    ev0 = by_kind[primary]["draws"][0][0]
    nec0 = ev0.necessity(th)
    rows, codes, sup, multi = [], [], [], []
    full_by_kind = torch.stack([k["draws"][0][0].necessity(th)["full"]["matters"] for k in by_kind.values()])
    write_shares = {c: run.writes.shares(th["floor"], "floor", nec0[c]["mask"]) for c in ("full", "isolated")}
    for m, (i, j) in enumerate(run.pairs):
        words = [w[m] for w in r["words"]]
        why = [x[m] for x in r["reasons"]]
        word, share, flip = stand(words, readings, agree, why)
        seen = [w for w in words if w != ABSTAIN]
        if not seen:  # every reading abstains: say why (the first reading's reason)
            reason = f"no reading can see it: {r['reasons'][first][m]}"
        elif word == r["words"][first][m]:
            reason = r["reasons"][first][m]
        else:
            reason = f"readings disagree: {share:.0%} of votes give {Counter(seen).most_common(1)[0][0]}"
        context = "full" if bool(nec0["use_full"][m]) else "isolated"
        e = nec0[context]
        code = torch.full((len(run.answer),), INPUT_CLASSES.index("other"), dtype=torch.int8)
        for c, label in zip(CLASSES, ("or", "and", "a_only", "b_only", "shared")):
            code[e["classes"][c][m]] = INPUT_CLASSES.index(label)
        codes.append(code.masked_fill_(~e["mask"][m], 0))
        at = run.writes.at(th["floor"])[m]
        sup.append(at["only"])
        multi.append(at["multi"])
        sp = write_shares[context][m]
        rank_a, rank_b = run.writes.ranks(m)
        f = ev0.full
        full_matters = float(full_by_kind[:, m].max())
        rows.append(dict(head_a=run.names[i], head_b=run.names[j], mechanism=word, agreement=share, flips_under=flip,
                         reason=reason, primary_word=r["words"][first][m], by_ablation=by_ablation(words, readings, why),
                         knife_edge=knife_edges(words, readings, agree),
                         context=context, matters=float(e["matters"][m]), unseen=float(e["unseen"][m]),
                         **{c: float(e[c][m]) for c in CLASSES},
                         additive_ld=float(e["additive"][m]), multi=sp["multi"], only_answer=sp["only"],
                         conditional_a=sp["cond_a"], conditional_b=sp["cond_b"], shown_a=sp["shown_a"],
                         shown_b=sp["shown_b"], distributed=sp["distributed"],
                         rank_a=rank_a, rank_b=rank_b,
                         composition=share_or_nan(by_kind[primary]["composition"].get(m), ev0, th, r["held"][primary]),
                         interaction=float(inter[i, j]), interaction_full=float((f[0][m] - f[1][m] - f[2][m] + f[3][m]).mean()),
                         full_matters=full_matters, **{f"full_matters_{h}": float(full_by_kind[x, m]) for x, h in enumerate(by_kind)},
                         isolated_matters=float(nec0["isolated"]["matters"][m])))  # fmt: skip
    frame = pd.DataFrame(rows).rename(columns={"i_only": "a_only", "j_only": "b_only"})
    return frame, torch.stack(codes), torch.stack(sup), torch.stack(multi)


def head_table(run: Run, r: dict, by_kind: dict, primary: str, agree: float, frame: pd.DataFrame, th: dict) -> tuple:
    """(one row per head, {head: role}): the role that stands, effects with intervals, the share of inputs
    each head answers alone under each ablation (first draw), via, self-repair and whom it backs up."""
    ev0 = by_kind[primary]["draws"][0][0]
    rows, roles = [], {}
    for i, name in enumerate(run.names):
        role, share, flip = stand([x[i] for x in r["roles"]], r["readings"], agree)
        roles[name] = role
        tot, tlo, thi = (float(x[i]) for x in ev0.total_ci)
        dir_i = float(run.direct[i])
        later = [c for c in frame.itertuples() if name in (c.head_a, c.head_b) and c.composition == c.composition
                 and c.composition >= th["composition"]
                 and run.players[run.names.index(c.head_b if c.head_a == name else c.head_a)][0] > run.players[i][0]]  # fmt: skip
        via = "later heads" if later and role == "supports" else \
            ("direct" if role == "supports" and run.no_dla is None and dir_i >= 0.5 * tot else "")  # fmt: skip
        alone = {f"alone_{h}": float(k["draws"][0][0].alone[i].double().mean()) for h, k in by_kind.items()}
        rows.append(dict(head=name, role=role, role_agreement=share, role_flips_under=flip, total_effect=tot,
                         total_low=tlo, total_high=thi, isolated_effect=float(ev0.isolated_ci[0][i]), direct_effect=dir_i,
                         via=via, self_repair=dir_i - tot if run.no_dla is None else float("nan"), **alone))  # fmt: skip
    table = pd.DataFrame(rows).set_index("head")
    backers: dict[str, list] = {name: [] for name in run.names}
    repair = by_kind[primary]["backup"]
    for row in repair[0] if repair else []:
        if row["backs_up"]:
            backers[row["backup"]].append(row["of"])
    table["backs_up"] = [", ".join(backers[name]) for name in run.names]
    return table, roles


def agree_with_roles(frame: pd.DataFrame, roles: dict) -> pd.DataFrame:
    """The pair table with no word that contradicts the role table of the same call: a pair called "inactive"
    whose heads the role table both calls "supports" or "competes" (each changes the metric somewhere: a head
    whose effect shows only with another head removed, as a redundant feeder's) is "undetermined" in its
    2 x 2 game, with why."""
    frame = frame.copy()
    for m, row in frame.iterrows():
        ra, rb = roles[row.head_a], roles[row.head_b]
        if row.mechanism == "inactive" and ra in ("supports", "competes") and rb in ("supports", "competes"):
            frame.loc[m, "reason"] = (f"the role table has {row.head_a} {ra} and {row.head_b} {rb}, but within this "
                                      f"pair's 2 x 2 game one changes the metric neither with the other present nor "
                                      f"without it: its effect shows only with another head removed (e.g. a head "
                                      f"it is redundant with); pair readings: {row.reason}")  # fmt: skip
            frame.loc[m, "mechanism"] = "undetermined"
    return frame


def pushes(run: Run, by_kind: dict, primary: str) -> tuple[torch.Tensor, str]:
    """([head, batch, output] each head's per-input push on the completion logits, which push): the direct
    push (DLA) where nothing reads the heads later, else the total (the logits with every head minus
    without it, the primary ablation's first draw)."""
    if run.no_dla is None and not run.later:
        return torch.stack([run.heads_dla[:, i][:, run.outs] for i in range(run.k)]), "direct"
    lg = by_kind[primary]["draws"][0][3]  # [mask, batch, vocab], as computed: float64 of it is exact
    full = lg[0][:, run.outs].double()
    return torch.stack(
        [full - lg[2 + 2 * i][:, run.outs].double() for i in range(run.k)]
    ), f"total ({primary} ablation)"


def same_table(run: Run, by_kind: dict, primary: str, th: dict, factors) -> tuple[pd.DataFrame, str, str, dict]:
    """(one row per head of the same-computation axis, its word, the sentence with its numbers). The word at
    each setting of `same` (default and the band): "same computation (pseudo-ensemble)" where the active
    heads' pushes correlate at r >= 1 - same pairwise and 1 - same of their variance lies on one direction;
    "different subtasks" where not; it stands where every setting agrees."""
    push, which = pushes(run, by_kind, primary)
    axis = same_computation_axis(push, run.shares, th["floor"])
    active = axis["active"]
    names = [run.names[i] for i in range(run.k)]
    table = pd.DataFrame(dict(head=names, push_std=push.double().std((1, 2)).numpy(), active=active.numpy()))
    idx = active.nonzero().flatten()
    table["r_min_active"] = [float(axis["r"][i, idx[idx != i]].min()) if len(idx) > 1 and bool(active[i]) else float("nan")
                             for i in range(run.k)]  # fmt: skip
    labels = [("other" if t == -1 else run.batch.vocab[t] if run.batch.vocab and t < len(run.batch.vocab) else str(t))
              for t in run.share_ids]  # fmt: skip
    if axis["weights"] is not None:
        for c, label in enumerate(labels):
            table[f"weight[{label}]"] = axis["weights"][:, c].numpy()
    table = table.set_index("head")
    numbers = dict(active=len(idx), r_min=axis["r_min"], r_median=axis["r_median"], share=axis["share"], push=which)
    if len(idx) < 2:
        return table, "not measurable", f"fewer than 2 heads push the completions ({len(idx)} of {run.k})", numbers
    words = []
    for f in (1.0,) + tuple(factors):
        tol = min(th["same"] * f, 0.5)
        words.append("same computation (pseudo-ensemble)" if axis["r_min"] >= 1 - tol and axis["share"] >= 1 - tol
                     else "different subtasks")  # fmt: skip
    word = words[0] if len(set(words)) == 1 else "undetermined"
    sentence = (f"{len(idx)} of {run.k} heads push the completions ({which} push); they correlate pairwise at "
                f"r >= {axis['r_min']:.3f} (median {axis['r_median']:.3f}) and {axis['share']:.2%} of their push "
                f"variance lies on one direction")  # fmt: skip
    if word == "undetermined":
        sentence += f" (the word flips with the tolerance {th['same']:g} x{factors[0]:g} / x{factors[1]:g})"
    if axis["weights"] is not None and axis["weights"].shape[1] >= 2:
        w = axis["weights"][idx]  # [active, class]
        size = w.abs().mean(0)
        size = torch.round(size / size.max().clamp(min=1e-30) * 1e6)  # float noise does not break a tie
        top = size.argsort(descending=True, stable=True)[:2].tolist()  # a tie: the first class
        x, y = w[:, top[0]], w[:, top[1]]
        name = [labels[c] for c in top]
        if bool((x * y < 0).all()):
            ratio = float(torch.maximum(x.abs() / y.abs(), y.abs() / x.abs()).max())
            sentence += (f"; every one weighs the share of '{name[0]}' against the share of '{name[1]}' (opposite "
                         f"signs, within a factor {ratio:.2f})")  # fmt: skip
        else:
            sentence += f"; they weigh '{name[0]}' and '{name[1]}' differently (same.weight[...] per head)"
    return table, word, sentence, numbers


def summary_line(run: Run, frame: pd.DataFrame, heads: pd.DataFrame, by_kind: dict, same: tuple[str, str],
                 function: tuple[str, str], mechanism: str, agreement: float, th: dict) -> str:  # fmt: skip
    """What the heads do, first: the same function or not (by counterfactual edits), the pushes on the task's
    inputs beside it, whether any pair matters in the full model (with the margins), how many heads answer
    alone under each ablation, the model's word."""
    parts = [
        f"Same function (counterfactual edits, by feature): {function[0]}: {function[1]}.",
        f"On the task's inputs alone: {same[0]}: {same[1]}.",
    ]
    margin = (
        run.logits_clean[run.rows, run.answer]
        - run.logits_clean.scatter(-1, run.answer[:, None], float("-inf")).max(-1).values
    )
    quiet = [h for h in by_kind if float(frame[f"full_matters_{h}"].max()) < th["min_share"]]
    if quiet:
        loud = [
            f"{h} ({int((frame[f'full_matters_{h}'] >= th['min_share']).sum())} pairs)"
            for h in by_kind
            if h not in quiet
        ]
        parts.append(f"No pair matters in the full model under {' and '.join(quiet)} ablation (at most "
                     f"{max(float(frame[f'full_matters_{h}'].max()) for h in quiet):.1%} of inputs; the answer's margin "
                     f"is >= {float(margin.min()):.3g} logits, mean {float(margin.mean()):.3g})"
                     + (f"; under {', '.join(loud)} some do" if loud else "")
                     + ": where a pair does not matter in the full model its word is read with every other head "
                     "ablated (isolated).")  # fmt: skip
    if run.binary:
        counts = {h: sorted({int((ev.alone.mean(-1) >= 0.9).sum()) for ev, *_ in by_kind[h]["draws"]}) for h in by_kind}
        alone = "; ".join(f"{h}: {c[0]}" if len(c) == 1 else f"{h}: {c[0]}-{c[-1]} over its {len(by_kind[h]['draws'])} draws"
                          for h, c in counts.items())  # fmt: skip
        parts.append(f"Heads that alone answer >= 90% of inputs: {alone}.")
    parts.append(f"Pair word: {mechanism} ({agreement:.0%} of votes).")
    return " ".join(parts)


def result(model, run: Run, by_kind: dict, hows, primary: str, th: dict, factors, agree: float, inter,
           pairs_note: str, edits: dict) -> Cooperation:  # fmt: skip
    """The `Cooperation` of every reading (module docstring); model: for the readers of redundant pairs."""
    r = read_all(run, by_kind, hows, th, factors)
    readings = r["readings"]
    frame, codes, sup, multi = pair_table(run, r, by_kind, primary, th, agree, inter)
    heads, roles = head_table(run, r, by_kind, primary, agree, frame, th)
    frame = agree_with_roles(frame, roles)
    frame["reader"] = ""
    for m, (reader, restored) in redundant_readers(model, run, frame, th).items():
        frame.loc[m, "reader"] = reader
        frame.loc[m, "reason"] += (f"; redundant into {reader}: holding {reader} at its clean output while both are "
                                   f"zeroed restores {restored:.0%} of what their removal loses")  # fmt: skip
    same, same_word, same_sentence, same_numbers = same_table(run, by_kind, primary, th, factors)
    overall, share, flip = stand(r["model"], readings, agree)
    counts = frame["mechanism"].value_counts()
    labels = [x.label for x in readings]
    words = pd.DataFrame(r["words"], index=labels, columns=[f"{run.names[i]}&{run.names[j]}" for i, j in run.pairs]).T
    reading_rows = [dict(reading=x.label, how=x.how, draw=x.draw, threshold=x.threshold or "", factor=x.factor,
                         model_word=mw, **{w: ws.count(w) for w in MECHANISMS + (ABSTAIN,)})
                    for x, mw, ws in zip(readings, r["model"], r["words"])]  # fmt: skip
    n_draws = {h: len(k["draws"]) for h, k in by_kind.items()}
    method = (f"{len(run.masks)} coalitions per input and reading; {len(readings)} readings ("
              + ", ".join(f"{h}: {d} distinct draw{'s' if d > 1 else ''}" for h, d in n_draws.items())
              + f", x {len(readings) // max(sum(n_draws.values()), 1)} threshold readings); each ablation kind one "
              f"vote; a word stands at {agree:.0%} of votes; " + "; ".join(f"{h}: {k['method']}" for h, k in by_kind.items())
              + pairs_note + ("" if run.no_dla is None else f"; no direct effects ({run.no_dla}): writes not measured, "
              "superposition cannot be said"))  # fmt: skip
    backup_rows = [row for k in by_kind.values() if k["backup"] for row in k["backup"][0]]
    compensation = by_kind[primary]["backup"][1] if by_kind[primary]["backup"] else torch.zeros(run.k, run.k)
    function, function_word, function_sentence, function_numbers = function_table(
        edits, run.names, run.batch.vocab, th["floor"], th["same"], factors, edits.get("features")
    )
    summary = summary_line(run, frame, heads, by_kind, (same_word, same_sentence), (function_word, function_sentence),
                           overall, share, th)  # fmt: skip
    return Cooperation(heads=run.names, pairs=frame, head_table=heads, backup=pd.DataFrame(backup_rows, columns=BACKUP_COLUMNS),
                       readings=pd.DataFrame(reading_rows), words=words, compensation=compensation.float(), roles=roles,
                       mechanism=overall, agreement=share, flips=flip, by_ablation=by_ablation(r["model"], readings),
                       shares={m: float(counts.get(m, 0)) / len(frame) for m in MECHANISMS}, metric=str(run.metric),
                       how=primary, hows=tuple(hows), method=method, thresholds=th, agree=agree,
                       v_full=float(by_kind[primary]["draws"][0][0].v[0].mean()),
                       v_empty=float(by_kind[primary]["draws"][0][0].v[1].mean()), input_class=codes,
                       input_superposed=sup, input_multi=multi, summary=summary, same=same, same_word=same_word,
                       same_numbers=same_numbers, function=function, function_word=function_word,
                       function_numbers=function_numbers)  # fmt: skip


__all__ = ["pair_table", "head_table", "agree_with_roles", "pushes", "same_table", "summary_line", "result"]
