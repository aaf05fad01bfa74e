"""The SkipPair runs: which models to train, training them with train_many, and the per-model measurements
(one row of runs.csv per trained model)."""

from __future__ import annotations

import pandas as pd
import torch
from transformer_lens import HookedTransformer

import headcoop as hc
from experiments.skip_pair.common import MAIN_SHAPES, SHIPPED
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


def correct_up_both(contrib: torch.Tensor) -> int:
    """Pair types whose correct completion every head pushes up (centered: above the head's mean over the 10
    completions), from pair contributions [pair, head, 10]."""
    own = torch.arange(len(PAIRS))
    return int(M.pushed_up(contrib, centered=True)[own, :, own].all(1).sum())


def covered_pairs(orders: list[tuple[int, ...]], split: torch.Tensor) -> tuple[int, int]:
    """Of the 6 pairs of distinct signal tokens {a, b} (`DISTINCT_PAIRS`): in how many do the heads' preferred
    tokens cover both a and b (some head prefers a, another b: both are attended to), and in how many also
    fully (every head gives its preferred token more than 1 - SPLIT_THRESHOLD of the pair's attention)."""
    covered = fully = 0
    for k, (a, b) in enumerate(M.DISTINCT_PAIRS):
        preferred = {a if order.index(a) < order.index(b) else b for order in orders}
        both = preferred == {a, b}
        covered += both
        fully += both and bool((split[:, k] <= SPLIT_THRESHOLD).all())
    return covered, fully


def least_favourite_alone(orders: list[tuple[int, ...]], contrib: torch.Tensor) -> int:
    """Heads whose own OV effect, when attending to their least favourite signal token x (the only signal
    token of an (x, x) context), ranks the completion of (x, x) first of the 10 completions: the head alone
    guesses the answer of that context ([head, 4, 10] conditional contributions)."""
    hits = 0
    for h, order in enumerate(orders):
        x = order[-1]
        hits += int(contrib[h, SIGNAL.index(x)].argmax()) == PAIRS.index((x, x))
    return hits


@torch.no_grad()
def value_cos_max(model: HookedTransformer) -> float:
    """The largest |cosine| between the value vectors (W_E[t] @ W_V[h] + b_V[h]) of two distinct signal tokens,
    over the heads of layer 0: 0 when every head stores the 4 signal tokens orthogonally; 1 at d_head 1."""
    values = model.W_E[list(SIGNAL)] @ model.W_V[0] + model.b_V[0][:, None, :]  # [head, 4, d_head]
    unit = values / values.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    cos = (unit @ unit.transpose(1, 2)).abs()
    off = ~torch.eye(len(SIGNAL), dtype=torch.bool)
    return float(cos[:, off].max())


def measure(model: HookedTransformer, n_heads: int, d_head: int, seed: int) -> dict:
    """Exact accuracy, noise loss, QK orderings, split attention and (2 heads) interference for one model."""
    row = dict(n_heads=n_heads, d_head=d_head, seed=seed)
    row.update(M.exact_evaluate(model).as_dict())
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
    if n_heads > 1:
        row["pairs_covered"], row["pairs_covered_fully"] = covered_pairs(orders, split)
    contrib_ov = M.conditional_contributions(model)  # [head, 4, 10]
    row["least_favourite_alone"] = least_favourite_alone(orders, contrib_ov)
    row["value_cos_max"] = value_cos_max(model)
    if n_heads == 2:
        row["relation"] = M.compare_orderings(*orders)
        row["kendall_tau"] = M.kendall_tau(*orders)
        row["top_differ"] = orders[0][0] != orders[1][0]
        contrib = M.pair_contributions(model)
        row["constructive_centered"] = int(M.constructive_pairs(contrib, centered=True).sum())
        row["constructive_raw"] = int(M.constructive_pairs(contrib, centered=False).sum())
        row["correct_up_both"] = correct_up_both(contrib)
        own = torch.arange(len(PAIRS))
        # pair types whose completion tops the heads' summed contribution but neither head's own
        top_alone = contrib.argmax(-1) == own[:, None]  # [pair, head]
        row["needs_both"] = int(((contrib.sum(1).argmax(-1) == own) & ~top_alone.any(1)).sum())
        hits, total = specificity(model, orders)
        row["specific_rows"], row["specific_total"] = hits, total
    return row


def plan(setup: dict) -> list[tuple[int, int, int]]:
    """(n_heads, d_head, seed) of every model to train: the grid, plus extra seeds of the main shapes."""
    runs = [(h, d, s) for h in setup["heads"] for d in setup["d_heads"] for s in setup["grid_seeds"]]
    for h, d in MAIN_SHAPES:
        runs += [(h, d, s) for s in setup["main_seeds"] if (h, d, s) not in runs]
    return runs


def train_and_measure(task: hc.SkipPair, runs: list[tuple[int, int, int]], recipe: dict) -> pd.DataFrame:
    """Train the runs with train_many, one call per set of shapes sharing the same seeds, and measure them.

    (One call per seed set because train_many, as of this commit, feeds a group whose seeds are
    0..k-1 all the streams of the call when the call has more seeds: see the report of issue 5.)
    """
    seeds_of: dict[tuple[int, int], list[int]] = {}
    for h, d, s in runs:
        seeds_of.setdefault((h, d), []).append(s)
    calls: dict[tuple[int, ...], list[tuple[int, int]]] = {}
    for shape, seeds in seeds_of.items():
        calls.setdefault(tuple(seeds), []).append(shape)
    rows = []
    for seeds, shapes in calls.items():
        part = [(h, d, s) for h, d in shapes for s in seeds]
        items = [dict(n_heads=h, d_head=d) for h, d, _ in part]
        models = hc.train_many(task, items, seeds=[s for _, _, s in part], progress=False, **recipe)
        rows += [measure(m, h, d, s) for m, (h, d, s) in zip(models, part)]
    return pd.DataFrame(rows).sort_values(["n_heads", "d_head", "seed"]).reset_index(drop=True)


TYPICAL_METRICS = ("noise_loss", "constructive_centered", "specific_rows", "split_max")


def typical_seed(runs: pd.DataFrame, n_heads: int, d_head: int) -> tuple[int, str]:
    """The seed of a typical model of this shape and the reason: among seeds right on every signal input
    whose heads' orderings relate in the most common way, the one closest to the middle on every measure
    of TYPICAL_METRICS (smallest sum of |percentile rank - 0.5| within that pool; ties: lowest seed)."""
    rows = runs[(runs.n_heads == n_heads) & (runs.d_head == d_head)]
    solved = rows[rows.signal_all == 1.0]
    pool = solved if len(solved) else rows
    modal = pool.relation.value_counts().idxmax()
    pool = pool[pool.relation == modal].sort_values("seed")
    distance = sum((pool[m].rank(pct=True) - 0.5).abs() for m in TYPICAL_METRICS)
    pick = pool.loc[distance.idxmin()]
    medians = ", ".join(f"{m} {pick[m]:g} (median {pool[m].median():g})" for m in TYPICAL_METRICS)
    why = (
        f"{len(solved)}/{len(rows)} seeds are right on every signal input; among them the orderings are most often "
        f"'{modal}' ({len(pool)} seeds); of those, seed {int(pick.seed)} is the closest to the median on "
        f"{', '.join(TYPICAL_METRICS)}: {medians}"
    )
    return int(pick.seed), why


def shipped_rows() -> pd.DataFrame:
    """The shipped checkpoints, measured like the trained runs, with their recipe seed."""
    rows = []
    for name, (h, d) in SHIPPED.items():
        model = hc.load(name)
        meta = model.checkpoint_meta
        row = measure(model, h, d, int(meta.get("model_seed", -1)))
        row["name"] = name
        row["train_seed"] = (meta.get("train") or {}).get("seed")
        row["train_steps"] = (meta.get("train") or {}).get("steps")
        rows.append(row)
    return pd.DataFrame(rows)
