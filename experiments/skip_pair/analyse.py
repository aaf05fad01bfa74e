"""Per-model measurements for the SkipPair reproduction (one row of runs.csv per trained model)."""

from __future__ import annotations

import torch
from transformer_lens import HookedTransformer

from headcoop.studies import skip_pair as M
from headcoop.tasks.skip_pair import PAIRS, SIGNAL

SPLIT_THRESHOLD = 0.1  # a head "splits" a pair when the less-attended token gets > 10% of the pair's attention


def fmt_order(order: tuple[int, ...]) -> str:
    return ">".join(str(t) for t in order)


def specificity(model: HookedTransformer, orders: list[tuple[int, ...]]) -> tuple[int, int]:
    """(rows matching, rows) over (head, attended token): does the head's OV effect put exactly the
    completions consistent with its ordering (`consistent_completions`) on top of the 10 completions?"""
    contrib = M.conditional_contributions(model)  # [head, 4, 10]
    hits = 0
    for h, order in enumerate(orders):
        for i, token in enumerate(SIGNAL):
            want = set(M.consistent_completions(order, token))
            top = set(contrib[h, i].argsort(descending=True)[: len(want)].tolist())
            hits += top == want
    return hits, len(orders) * len(SIGNAL)


def measure(model: HookedTransformer, n_heads: int, d_head: int, seed: int) -> dict:
    """Exact accuracy, noise loss, QK orderings, split attention and (2 heads) interference for one model."""
    row = dict(n_heads=n_heads, d_head=d_head, seed=seed)
    row.update(M.exact_evaluate(model))
    scores = M.read_off_scores(model)
    orders = [M.preference_order(model, h) for h in range(n_heads)]
    for h in range(n_heads):
        row[f"order_h{h}"] = fmt_order(orders[h])
        row[f"scores_h{h}"] = " ".join(f"{v:.3f}" for v in scores[h].tolist())
        # smallest gap between consecutive preferences: how strict the ordering is
        row[f"min_gap_h{h}"] = float(scores[h].sort(descending=True).values.diff().neg().min())
    split = M.split_attention(model)  # [head, 6]
    row["split_max"] = float(split.max())
    row["split_mean"] = float(split.mean())
    is_split = split > SPLIT_THRESHOLD
    row["split_heads"] = int(is_split.any(1).sum())
    row["split_pairs"] = float(is_split.sum(1).float().mean())  # pairs split per head, of 6
    row["split_shared"] = int(is_split.all(0).sum()) if n_heads > 1 else None  # pairs every head splits
    if n_heads == 2:
        row["relation"] = M.compare_orderings(*orders)
        row["kendall_tau"] = M.kendall_tau(*orders)
        row["top_differ"] = orders[0][0] != orders[1][0]
        contrib = M.pair_contributions(model)
        row["constructive_centered"] = int(M.constructive_pairs(contrib, centered=True).sum())
        row["constructive_raw"] = int(M.constructive_pairs(contrib, centered=False).sum())
        # the correct completion gets a positive (centered) push from at least one head / from both
        up = M.pushed_up(contrib, centered=True)  # [pair, head, 10]
        own = torch.arange(len(PAIRS))
        row["correct_up_both"] = int(up[own, :, own].all(1).sum())
        # pair types whose completion tops the heads' summed contribution but neither head's own
        top_alone = contrib.argmax(-1) == own[:, None]  # [pair, head]
        row["needs_both"] = int(((contrib.sum(1).argmax(-1) == own) & ~top_alone.any(1)).sum())
        hits, total = specificity(model, orders)
        row["specific_rows"], row["specific_total"] = hits, total
    return row
