"""The report's cooperation section: hc.cooperation's words for the covered heads, or the pair map above 32 heads
(a 4-head stand-in when neither fits), Shapley values and interactions where exact, head-to-head path patching,
composition scores; and what each of them costs, for the budget."""

from __future__ import annotations

import html
from collections.abc import Callable

import pandas as pd
import torch

from headcoop.analysis.engine.inputs import parse_heads
from headcoop.analysis.mechanisms.cooperation import ALL_PAIRS_UP_TO
from headcoop.analysis.vocabulary import PairMethod, head_name
from headcoop.display.pages import Figure
from headcoop.reporting.budget import depth
from headcoop.reporting.context import Context
from headcoop.reporting.sections import page_note, page_table

# hc.cooperation reads every pair up to ALL_PAIRS_UP_TO heads, above it the top pairs only: the report covers
# cooperation up to that many heads (one source for the limit: cooperation's)
MAX_REPORT_PAIRS_HEADS = ALL_PAIRS_UP_TO
STAND_IN_HEADS = 4  # above that, cooperation of this many heads, those with the largest patching effect


def section_cooperation(ctx: Context) -> tuple:
    """The mechanism of every pair of covered heads and each head's role (hc.cooperation), then Shapley values
    and pairwise interactions on accuracy (hc.interactions) where they are exact and fit the budget, then
    head-to-head path patching and composition scores. One overall verdict: hc.cooperation's.
    Long: the words, the pair map or its stand-in, Shapley values and the path views share one budget and fill
    one list of blocks in page order."""
    from headcoop.analysis.games.interactions import MAX_EXACT, interactions
    from headcoop.analysis.mechanisms.cooperation import MECHANISMS, cooperation

    model, k = ctx.model, len(ctx.heads)
    heads = None if ctx.all_heads else ctx.heads
    blocks: list = []
    cost = (lambda draws: _cooperation_forwards(ctx, draws)) if k >= 2 else (lambda draws: 0.0)  # noqa: E731
    draws = 4 if k <= 16 and cost(4) * ctx.budget.forward_s <= ctx.budget.remaining() else 1
    what = "hc.cooperation (the mechanism of every pair of heads)"
    if k < 2:
        blocks.append(page_note(f"This report covers {k} head: cooperation is a word about pairs of heads, so this section "
                            "is left out. <code>--heads</code> with two or more heads (or <code>hc.cooperation(model, "
                            "heads=['L0H1', 'L0H2'])</code>) runs it."))  # fmt: skip
        return tuple(blocks)
    if k > MAX_REPORT_PAIRS_HEADS:
        mapped = _pair_map_blocks(ctx)
        if mapped is not None:
            return mapped
        ranked, by = ctx.ranked_heads()
        note = (f"This report covers {k} heads: too many pairs for hc.cooperation's words on this page (at most "
                f"{MAX_REPORT_PAIRS_HEADS}), and the pair map of all {k} heads (<code>hc.pair_map</code>) did not fit "
                f"the budget ({_map_left_out(ctx)}). <code>hc.cooperation(model, heads=[...])</code> names the "
                "mechanism of the heads you choose; <code>--heads</code> picks them for the report.")  # fmt: skip
        if not by:
            return (page_note(note + " No ranking of the heads fit the budget, so nothing stands in here."),)
        top = ranked[:STAND_IN_HEADS]
        names = [head_name(*h) for h in top]
        return (page_note(note + f" <b>Standing in</b>: the {len(top)} heads with the largest effect by {by} (the "
                      f"patching section's), {', '.join(names)}: <code>hc.cooperation(model, inputs=clean, "
                      f"heads={names!r})</code>."), *section_cooperation(ctx.narrowed(top)))  # fmt: skip
    elif not ctx.budget.afford(
        what, cost(draws), f"hc.cooperation(model, inputs=clean, metric='accuracy', draws=1{ctx.heads_arg})"
    ):
        blocks.append(ctx.budget.note(what))
    else:
        coop = cooperation(model, inputs=ctx.clean, heads=heads, metric="accuracy", reference=ctx.clean,
                           max_exact=max(2, MAX_EXACT), draws=draws, progress=False)  # fmt: skip
        shown = coop.to_dataframe()
        order = {m: i for i, m in enumerate(MECHANISMS)}
        shown = shown.iloc[shown.mechanism.map(order).argsort(kind="stable")].head(12)
        roles = coop.head_table.reset_index()[["head", "role", "role_agreement", "total_effect", "total_low",
                                               "total_high", "direct_effect", "via", "backs_up"]]  # fmt: skip
        counts = ", ".join(f"{int(c * len(coop.pairs) + 0.5)} {m}" for m, c in coop.shares.items() if c > 0)
        flips = f" What flips it: {html.escape(coop.flips)}." if coop.flips else ""
        blocks += [
            page_note(f"<b>{html.escape(coop.summary)}</b>"),
            page_note(
                "Which <b>mechanism</b> joins each pair of heads (<code>hc.cooperation</code>), each word its source's "
                "defining property: <b>superposition</b> (the SkipPair post: what a head copies from the token it "
                "attends to depends on the tokens it does not attend to; both write several completions and meet "
                "only on the answer; sources distributed), <b>redundant</b> (either alone answers), <b>division</b> "
                "(one head alone on each input), <b>conjunction</b> (both needed: the Count01 paper's \"only solve "
                'the original task in conjunction"), <b>not testable</b> (a continuous metric additive over the '
                "two heads by construction), <b>competition</b> (one head's total effect opposes the answer) and "
                "<b>composition</b> (one head's effect runs through a later one); the model-level <b>same "
                "computation</b> axis reads the heads' per-input pushes without ablation. Each word is computed "
                f"under zero, mean and resample ablation (aligned by the answer position), {draws} reference "
                f"draw{'s' if draws > 1 else ''} each, every threshold at half and twice its default ("
                f"{len(coop.readings)} readings), each ablation kind one vote; an ablation that cannot see a pair "
                f"abstains. A word stands at {coop.agree:.0%} of the votes, else <b>undetermined</b>. <b>The "
                f"section's verdict: {html.escape(coop.mechanism)}</b> in {coop.agreement:.0%} of the votes.{flips} "
                f"Pairs: {html.escape(counts)}. Rules and thresholds: <code>headcoop/analysis/mechanisms/words.py</code>. "
                f"{html.escape(coop.method)}."
            ),
            Figure(coop.plot(), height=520),
            page_note(
                "Each head's <b>role</b> (supports / competes / inactive: the sign of its total effect on the "
                "accuracy, else of its isolated effect, else of the margin's, with a 95% interval that excludes "
                "0), the share of readings that agree, whether its support is direct or through later heads, "
                "and the heads whose answers it restores when they are ablated (<code>backs_up</code>):"
            ),
            page_table(roles, index=False, digits=4),
            page_note(
                f"Pairs, {len(shown)} of {len(coop.pairs)}, with the share of readings that agree and what flips "
                "the word:"
            ),
            page_table(
                shown[
                    [
                        "head_a",
                        "head_b",
                        "mechanism",
                        "agreement",
                        "flips_under",
                        "reason",
                        "matters",
                        "or",
                        "and",
                        "a_only",
                        "b_only",
                        "multi",
                        "only_answer",
                        "interaction",
                    ]
                ],
                index=False,
                digits=3,
            ),  # fmt: skip
        ]
        blocks += _map_where_words_cannot_see(ctx, coop)
    return (*blocks, *_shapley(ctx, heads, MAX_EXACT, interactions), *_head_to_head(ctx))


UNSEEN_SHARE = 0.5  # at least this share of the pairs undetermined or unseen: the words cannot see the structure


def _map_where_words_cannot_see(ctx: Context, coop) -> tuple:
    """Where most pair words are undetermined (no pair changes an answer, the readings disagree), the pair map on
    the logit difference (hc.pair_map), which reads a continuous metric and shows the structure the words
    cannot, with a sentence relating the two; nothing where the words see, or where the map does not fit."""
    words = coop.pairs.mechanism
    blind = int(words.isin(["undetermined", "unseen", "inactive"]).sum())
    if len(words) < 3 or blind < UNSEEN_SHARE * len(words):  # one or two pairs: their rows hold their interaction
        return ()
    why = (f"hc.cooperation's words are <b>{html.escape(coop.mechanism)}</b> at the model level and cannot name "
           f"{blind} of its {len(words)} pairs (undetermined, unseen or inactive: on accuracy no pair changes enough "
           "answers, or the readings disagree), so the pair map below reads every pair on the logit difference, "
           "which moves where answers do not")  # fmt: skip
    mapped = _pair_map_blocks(ctx, why=why)
    return () if mapped is None else mapped


PAIR_MAP_NAMED = 3  # pairs of the map the report names by hc.cooperation, as many as fit in the budget


def _pair_map_blocks(ctx: Context, why: str | None = None) -> tuple | None:
    """Every pair's interaction (hc.pair_map: exact where its predicted cost fits the budget, else its screen),
    the strongest pairs named by hc.cooperation as far as the budget allows; None when neither fits (the
    budget lists the map as left out). why: the sentence that says why the map is shown (default: too many
    heads for the words on every pair)."""
    from headcoop.analysis.pairs.compute import exact_passes, pair_map, screen_passes

    k, game, left = len(ctx.heads), _game(ctx), ctx.budget.remaining()
    exact, screen = exact_passes(game), screen_passes(game)
    call = f"hc.pair_map(model, clean, how='mean', reference=clean{ctx.heads_arg})"
    method: PairMethod
    if exact * ctx.budget.forward_s <= left:
        method = "exact"
    elif ctx.budget.afford(f"the pair map of all {k} heads", screen, call):
        method = "screen"
    else:
        return None
    result = pair_map(ctx.model, ctx.clean, metric="logit_diff", how="mean", reference=ctx.clean,
                      heads=None if ctx.all_heads else ctx.heads, method=method, named=0, progress=False)  # fmt: skip
    strongest = result.interacting().head(PAIR_MAP_NAMED)
    fits = 0
    for row in strongest.itertuples():  # each pair's words cost about one 2-head hc.cooperation
        pair = parse_heads(ctx.model, [row.head_a, row.head_b])
        if not ctx.budget.afford("hc.cooperation's words for the map's strongest pairs",
                                 _cooperation_forwards(ctx.narrowed(pair), 1), f"result.with_words(model, clean, clean, {PAIR_MAP_NAMED})"):  # fmt: skip
            break
        fits += 1
    if fits:
        result = result.with_words(ctx.model, ctx.clean, ctx.clean, fits)
    predicted = (exact if method == "exact" else screen) * ctx.budget.forward_s
    lines = "<br>".join(html.escape(line) for line in result.lines())
    computed = result.to_dataframe()
    frame = computed.head(12)
    shown = [c for c in ("head_a", "head_b", "interaction", "relative", "effect_a", "effect_b", "pair_effect", "word",
                         "agreement", "flips_under", "role_a", "role_b") if c in frame.columns]  # fmt: skip
    blocks: list = [
        page_note("<b>The pair map</b> (<code>hc.pair_map</code>): "
              + (why or f"this report covers {k} heads, too many for hc.cooperation's words on every pair (at most "
                 f"{MAX_REPORT_PAIRS_HEADS}), so every one of the {k * (k - 1) // 2:,} pairs gets its interaction "
                 "instead")
              + ": I = v(both removed) - v(first removed) - "
              "v(second removed) + v(none removed), on the logit difference, mean ablation over the clean inputs "
              f"({'exact, every pair' if result.exact else 'screened by second-order attribution, its top and a sample computed exactly'}; "
              f"predicted {predicted:.0f} s, took {result.cost['seconds']:.0f} s). I &lt; 0: removing both costs more "
              "than the two removals apart (backups); I &gt; 0: less (each needs the other). The strongest "
              f"interacting pairs are named by hc.cooperation's reading family ({fits} of them fit the budget).<br>{lines}"),
        Figure(result.plot(), height=720),
    ]  # fmt: skip
    if fits:
        blocks.append(Figure(result.graph(), height=460))
    blocks += [page_note(f"Pairs, the strongest {len(frame)} of {len(computed):,} computed exactly:"),
               page_table(frame[shown], index=False, digits=4)]  # fmt: skip
    return tuple(blocks)


def _map_left_out(ctx: Context) -> str:
    """Why the pair map is not on the page: its predicted time against the budget left."""
    row = next((r for r in ctx.budget.left_out if r[0].startswith("the pair map")), None)
    if row is None:
        return "not attempted"
    return f"its screen predicted {row[1]:.0f} s, {max(0.0, row[3]):.0f} s were left"


def _game(ctx: Context):
    """The coalition game the report's cooperation and Shapley calls play (mean ablation over the clean
    inputs, accuracy), for predicting their cost."""
    from headcoop.analysis.games.coalitions import CoalitionGame

    # built once per report (its mean ablation runs the reference batch once)
    return ctx.once("cost-game", lambda: CoalitionGame(ctx.model, ctx.heads, tokens=ctx.clean, metric="accuracy",
                                                       how="mean", reference=ctx.clean.tokens))  # fmt: skip


def _shapley_forwards(ctx: Context) -> float:
    """Forward passes (of the clean batch) exact Shapley values take: every coalition on the game's own path
    (timed on a sample where the path is linear), and the pairs' ablation interactions."""
    from headcoop.analysis.games.coalitions import all_masks, game_seconds

    def compute() -> float:
        k = len(ctx.heads)
        masks = all_masks(k)  # and the ablation interaction's 1 + k + k (k - 1) / 2 coalitions, on the same path
        extra = masks[
            torch.randint(0, len(masks), (1 + k + k * (k - 1) // 2,), generator=torch.Generator().manual_seed(0))
        ]
        return game_seconds(_game(ctx), torch.cat([masks, extra]), ctx.budget.forward_s) / ctx.budget.forward_s + 3

    return ctx.once("shapley-forwards", compute)  # the cooperation and Shapley sections both ask


def _cooperation_forwards(ctx: Context, draws: int) -> float:
    """Forward passes (of the clean batch) `hc.cooperation` takes as the report calls it: per ablation kind its
    coalitions (the draws stacked on the batch, so their rows count draws times), on the game's own path, and
    for mean and resample each pair's coalitions with one head zeroed; the
    exact interaction index; the reference runs; composition and backup (about two passes per cross-layer pair
    and kind); and the clean runs."""
    import itertools

    from headcoop.analysis.games.coalitions import game_seconds
    from headcoop.analysis.mechanisms.cooperation import coalition_masks
    from headcoop.analysis.mechanisms.words import THRESHOLDS, band

    k = len(ctx.heads)
    masks = coalition_masks(k, list(itertools.combinations(range(k), 2)))
    per_kind = ctx.once("cooperation-coalitions",  # asked for each number of draws: timed once
                        lambda: game_seconds(_game(ctx), masks, ctx.budget.forward_s) / ctx.budget.forward_s)  # fmt: skip
    cross = sum(1 for (a, _), (b, _) in itertools.combinations(ctx.heads, 2) if a != b)
    # the words read per pair and reading (Python, not the model): about 60 us each, and 0.2 s for the tables,
    # measured on the shipped Count01 and SkipPair models (benchmarks/report_predictions.py)
    readings = (1 + 2 * draws) * len(band(THRESHOLDS, (0.5, 2.0)))
    python_s = 0.2 + 6e-5 * readings * k * (k - 1) / 2
    # mean's and resample's coalitions with one head zeroed (`zeroed_coalitions`), in the same call as the
    # coalitions: on the layered path they add only the layer states they do not share with them
    zeroed = ctx.once("cooperation-zeroed", lambda: _zeroed_share(ctx, masks)) * per_kind * 2 * draws
    return (per_kind * (1 + 2 * draws) + zeroed + (_shapley_forwards(ctx) if k <= 16 else 0) + 2 * draws + 6 * cross
            + 4 + python_s / ctx.budget.forward_s + _edit_forwards(ctx))  # fmt: skip


def _zeroed_share(ctx: Context, masks) -> float:
    """What the zeroed coalitions add to one kind's coalition call, as a share of that call: the layer states
    they add on the layered path (`layered_passes` of both together), else their count over the coalitions'."""
    import itertools

    from headcoop.analysis.games.coalitions import layered_passes
    from headcoop.analysis.mechanisms.cooperation import zeroed_coalitions

    k = len(ctx.heads)
    _, zmasks, zeroed = zeroed_coalitions(k, list(itertools.combinations(range(k), 2)), "mean")
    game = _game(ctx)
    if game.linear or not game.layered:
        return len(zmasks) / len(masks) if not game.linear else 0.0
    both = torch.cat([masks.to(torch.int8), torch.where(zeroed, 2, zmasks.to(torch.int8)).to(torch.int8)])
    alone = layered_passes(ctx.model, ctx.heads, masks)
    return (layered_passes(ctx.model, ctx.heads, both) - alone) / max(alone, 1e-9)


def _edit_forwards(ctx: Context) -> float:
    """Forward passes (of the clean batch) of `hc.cooperation`'s counterfactual edits, as the call plans them
    before any run (`edits.plan_edits`: the task's declared features or a seeded sample; per condition the
    inputs' rows and each edit's rows from its position on, or whole edited inputs where the hooked path
    runs)."""
    from headcoop.analysis.mechanisms.edits import plan_edits

    features = ctx.task.features() if ctx.task is not None else None
    return plan_edits(ctx.model, ctx.clean, ctx.heads, features)["forwards"]


def _shapley(ctx: Context, heads, max_exact: int, interactions: Callable) -> tuple:
    """Shapley values and interaction indices (exact only: the report shows no sampled estimates)."""
    k = len(ctx.heads)
    what = "Shapley values and pairwise interactions (hc.interactions, exact)"
    if k > max_exact:
        return (page_note(f"Shapley values: exact up to {max_exact} heads (<code>hc.interactions</code>' "
                      f"<code>max_exact</code>; 2^{max_exact} coalitions), and this report covers {k}. "
                      "<code>hc.interactions(model, estimator=\"kernelshap\")</code> estimates them with standard errors."),)  # fmt: skip
    if not ctx.budget.afford(
        what, _shapley_forwards(ctx), f"hc.interactions(model, tokens=clean, metric='accuracy'{ctx.heads_arg})"
    ):
        return (ctx.budget.note(what),)
    result = interactions(ctx.model, ctx.clean, heads=heads, metric="accuracy", how="mean", reference=ctx.clean.tokens,
                          progress=False)  # fmt: skip
    pairs = result.to_dataframe()
    signs = pd.Series(result.verdicts).value_counts()
    pairs = pairs.reindex(pairs.interaction.abs().sort_values(ascending=False).index).head(12)
    return (
        page_note(
            "Each head's <b>Shapley value</b>: its average contribution to the accuracy over every coalition of "
            "the other heads (heads outside a coalition mean-ablated over these inputs); they sum to "
            f"v(all) &minus; v(none) = {result.v_full:.3f} &minus; {result.v_empty:.3f}. The <b>interaction "
            "index</b> of a pair is an average over coalitions: negative when the two substitute for each other on "
            "average, positive when the pair is worth more than its parts on average (a division of labour and "
            "superposition both can give it), within 5% of |v(all) &minus; v(none)|: independent. It names no "
            "mechanism on its own; the section's verdict above reads it with the other axes. Signs of the pairs: "
            + html.escape(", ".join(f"{n} {word}" for word, n in signs.items()))
            + f" ({html.escape(result.method)})."
        ),
        Figure(result.plot(title="Shapley values and pairwise interactions (accuracy)"), height=460),
        page_note(f"The {len(pairs)} strongest pairs of {len(result.to_dataframe())}:"),
        page_table(pairs, index=False, digits=4),
    )


def _head_to_head(ctx: Context) -> tuple:
    """For models with two or more layers: path patching (causal) beside composition scores (weights)."""
    from headcoop.analysis.edges.path_patching import path_patch
    from headcoop.analysis.weights.composition import composition

    model = ctx.model
    senders = [(lay, h) for lay, h in ctx.heads if any(r > lay for r, _ in ctx.heads)]
    if model.cfg.n_layers < 2 or not senders:
        return ()
    blocks: list = [page_note(
        "Head to head: <b>path patching</b> (<code>hc.path_patch</code>) patches only a sender head's clean output "
        "into a later receiver head's query, key or value input (the receiver's LayerNorm scale frozen), every "
        "other path as in the corrupt run: the share of the clean &minus; corrupt gap restored. <b>Composition "
        "scores</b> (<code>hc.composition</code>) are the weights-only evidence for the same pairs."
    )]  # fmt: skip
    edges = sum(3 * depth(model, r) for s, _ in ctx.heads for r, _ in ctx.heads if r > s)
    direct = sum(depth(model, s) for s, _ in senders)
    what = "path patching of every sender -> receiver pair (hc.path_patch)"
    subset = "" if ctx.all_heads else f", senders={ctx.names!r}, receivers={ctx.names!r}"
    if not ctx.budget.afford(what, 2 + edges + direct, f"hc.path_patch(model, clean, corrupt{subset})"):
        blocks.append(ctx.budget.note(what))
    else:
        try:
            paths = path_patch(model, clean=ctx.clean, corrupt=ctx.corrupt, metric=ctx.metric, progress=False,
                               senders=None if ctx.all_heads else senders, receivers=None if ctx.all_heads else ctx.heads)  # fmt: skip
            blocks.append(Figure(paths.plot(), height=460))
        except ValueError as err:  # a block layout path patching does not model: say so
            blocks.append(page_note(html.escape(str(err))))
    total = model.cfg.n_layers * model.cfg.n_heads  # hc.composition scores every pair of the model's heads
    if total <= MAX_REPORT_PAIRS_HEADS:
        blocks.append(Figure(composition(model).plot(), height=420))
    else:
        blocks.append(page_note(f"Composition scores: this model has {total} heads, too many pairs to score and draw here "
                            f"(at most {MAX_REPORT_PAIRS_HEADS} heads; 20 s for 144 on 2 CPU cores): "
                            "<code>hc.composition(model).to_dataframe()</code> holds them all."))  # fmt: skip
    return tuple(blocks)
