"""Strict Interchange Intervention Training (SIIT; Gupta et al. 2024, InterpBench) of dense transformers on the
committed Tracr programs: the high-level model is the compiled program (`experiments/tracr/checkpoints`, a
HookedTransformer, no jax), each of its non-empty heads and MLPs is aligned with the head or MLP at the same
place of a dense low-level model, and the low-level model is trained with three losses on each batch:

- the task loss: its outputs match the compiled program's on the base inputs;
- the interchange loss: with one aligned node's output taken from a source input (in both models), its
  outputs match the compiled program's under the same intervention (IIT_NODES nodes, one at a time, per batch);
- the strictness loss: with a random half of the non-aligned nodes (every head and MLP the program leaves
  empty) taken from the source input, its outputs still match the program's on the base inputs;
- the edge strictness loss (ours, beyond InterpBench's node-level SIIT): with every edge the program lacks
  carrying the writer's output on the source input (the true circuit alone, `hc.faithfulness`'s ablated run),
  its outputs still match the program's on the base inputs. Node-level strictness alone left false edges between
  aligned nodes free: the first models routed reverse's tokens through L0H0 -> L3H0 (v) beside the true embed ->
  L3H0 (v), and its true circuit recovered 0.004 of the metric under corrupt ablation; a random half of the
  false edges resampled let the model read them redundantly (reverse's L0H0 interchange accuracy 0.33).

Inputs: BOS, then n tokens drawn uniformly, then `compiler_pad` to the full length, n uniform in 1..max_seq_len
(half the batches at the full length); sort_unique's tokens are drawn without repeats (its program assumes unique
keys; 8 tokens at length 4). The compiled program reads a padded input as Tracr does (every key at a
pad position masked); the dense model has no mask and learns to ignore the pads. Half the sources share their
base's length, half have their own (`draw_source`), so an interchange at a node of the length moves the program's
output; an interchange's outputs are read where base and source both hold tokens. Outputs are read at the token
positions (not BOS, not the pads), against the program's output as soft targets (`loss_and_hits`).

    python -m experiments.groundtruth.siit [--programs reverse hist ...] [--max-steps 20000]

Issue 63's recipe (`Recipe`, every switch recorded): the source run keeps its gradient, hard targets, sources
chosen so that half the pairs change the program's output, node and edge strictness, separate steps; trained
until the gate (`gate`, `GATE`) passes, checked every 500 steps. A run saves its state every 2 minutes and the
same command resumes it (`resume.py`). Writes `experiments/groundtruth/gated/NAME` once the gate passes, else
`NAME.unpassed` (hc.save: the truth, the training record, the gate); the bench and its page read them. The
recipe before issue 63 (the source run detached, soft targets, one source as drawn, one joint step, a one-cycle
learning rate, 800-3,000 steps) left models whose nodes do not compute the program where the output changes;
one is kept in `detached/reverse` as the near-miss the gate must fail. `--detach-source --soft-targets
--candidates 0 --joint-step` comes closest to that recipe.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from headcoop.checks import check_float

HERE = Path(__file__).resolve().parent
DETACHED = HERE / "detached"  # reverse as the recipe before issue 63 trained it: the near-miss the gate fails
GATED = HERE / "gated"  # models of issue 63's recipe, each saved as NAME once its gate passes (NAME.unpassed if not)
PROGRAMS = ("reverse", "hist", "sort_unique", "shuffle_dyck", "xproportion")
WIDTH = dict(d_model=64, d_head=16, d_mlp=128)
WIDER_MLP = {"shuffle_dyck": 256}
SEED = 0
IIT_NODES = 2  # aligned nodes intervened on per batch (drawn afresh each batch)
IIT_NODES_OF: dict[str, int] = {}  # per program (0: every aligned node, every batch)


# --- the compiled program as the high-level model ------------------------------------------------------------
def pad_mask_hooks(tokens: torch.Tensor, pad: int, n_layers: int) -> list:
    """Hooks that mask every key at a pad position in every layer (Tracr's own attention mask)."""
    masked = (tokens == pad)[:, None, None, :]  # [batch, 1, 1, key]

    def hook(scores, hook):
        return scores.masked_fill(masked, -1e9)

    return [(f"blocks.{layer}.attn.hook_attn_scores", hook) for layer in range(n_layers)]


def node_hook_name(node: str) -> tuple[str, int | None]:
    """("blocks.L.attn.hook_z", head) for "LxHy", ("blocks.L.hook_mlp_out", None) for "MLPx"."""
    if node.startswith("MLP"):
        return f"blocks.{int(node[3:])}.hook_mlp_out", None
    layer, head = node[1:].split("H")
    return f"blocks.{int(layer)}.attn.hook_z", int(head)


def components(cfg) -> list[str]:
    return [f"L{lay}H{h}" for lay in range(cfg.n_layers) for h in range(cfg.n_heads)] + [
        f"MLP{lay}" for lay in range(cfg.n_layers)
    ]


def run(model, tokens, nodes: dict | None = None, extra: list | None = None) -> torch.Tensor:
    """The model's logits with each node of `nodes` ({name: its activation from another run}) set."""
    hooks = list(extra or [])
    for name, value in (nodes or {}).items():
        point, head = node_hook_name(name)

        def setter(act, hook, value=value, head=head):
            act = act.clone()
            if head is None:
                act[:] = value
            else:
                act[:, :, head] = value
            return act

        hooks.append((point, setter))
    return model.run_with_hooks(tokens, fwd_hooks=hooks) if hooks else model(tokens)


def activations(
    model, tokens, nodes: list[str], extra: list | None = None, grad: bool = False
) -> dict[str, torch.Tensor]:
    """Each node's activation (a head's z, an MLP's output) on `tokens`; with `grad`, still attached to the
    run's graph (the source run trains too: issue 63), else detached."""
    store = {}
    hooks = list(extra or [])
    for name in nodes:
        point, head = node_hook_name(name)

        def keep(act, hook, name=name, head=head):
            value = act if head is None else act[:, :, head]
            store[name] = value.clone() if grad else value.detach().clone()

        hooks.append((point, keep))
    with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
        model.run_with_hooks(tokens, fwd_hooks=hooks)
    return store


# --- inputs -------------------------------------------------------------------------------------------------
UNIQUE = ("sort_unique",)  # programs defined on inputs without repeated tokens (Tracr's make_sort_unique: unique keys)


def longest(info: dict) -> int:
    """The longest input of the program's domain: max_seq_len, or the vocabulary's size where tokens are unique."""
    return min(info["max_seq_len"], len(info["vocab"])) if info["program"] in UNIQUE else info["max_seq_len"]


def draw(info: dict, n: int, gen: torch.Generator, lengths: torch.Tensor | None = None,
         balanced: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(tokens [n, max_seq_len + 1], lengths [n]): BOS, `lengths` tokens drawn uniformly (without repeats for a
    program of UNIQUE), then pads; lengths drawn (half at the longest, half uniform in 1..longest) unless given."""
    enc, vocab, full = info["encoding"], info["vocab"], info["max_seq_len"]
    ids = torch.tensor([enc[v] for v in vocab])
    top = longest(info)
    if lengths is None:
        lengths = torch.where(torch.rand(n, generator=gen) < 0.5, top, torch.randint(1, top + 1, (n,), generator=gen))
    if info["program"] in UNIQUE:
        order = torch.rand(n, len(ids), generator=gen).argsort(-1)
        body = (
            torch.cat([ids[order], ids[order[:, :1]].expand(n, full - len(ids))], 1)[:, :full]
            if full > len(ids)
            else ids[order][:, :full]
        )
    else:
        body = ids[torch.randint(len(ids), (n, full), generator=gen)]
    if balanced and info["program"] == "shuffle_dyck":  # a share of the rows balanced up to their length
        rows = (torch.rand(n, generator=gen) < balanced).nonzero().flatten().tolist()
        for row in rows:
            body[row] = _balanced(info, full, int(lengths[row]), gen)
    body[torch.arange(full)[None, :] >= lengths[:, None]] = enc["compiler_pad"]
    return torch.cat([torch.full((n, 1), enc["BOS"]), body], 1), lengths


def _balanced(info: dict, full: int, length: int, gen: torch.Generator) -> torch.Tensor:
    """`full` token ids whose first `length` form a balanced sequence of shuffle_dyck's two bracket kinds
    (the last token random where `length` is odd): each step opens a random kind or closes the newest open one."""
    enc = info["encoding"]
    pairs = [("(", ")"), ("{", "}")]
    out, stack = [], []
    even = length - length % 2
    for position in range(even):
        left = even - position
        if stack and (len(stack) >= left or torch.rand((), generator=gen) < 0.5):
            out.append(pairs[stack.pop()][1])
        else:
            kind = int(torch.randint(2, (), generator=gen))
            stack.append(kind)
            out.append(pairs[kind][0])
    vocab = info["vocab"]
    while len(out) < full:
        out.append(vocab[int(torch.randint(len(vocab), (), generator=gen))])
    return torch.tensor([enc[t] for t in out])


def draw_source(info: dict, lengths: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Source inputs for base inputs of `lengths`: half of them of the same length, half of an independent one,
    so that an interchange at a node of the length (reverse's L0H0) changes what the program computes."""
    own = draw(info, len(lengths), gen)[1]
    same = torch.rand(len(lengths), generator=gen) < 0.5
    return draw(info, len(lengths), gen, torch.where(same, lengths, own))[0]


def token_mask(tokens: torch.Tensor, info: dict) -> torch.Tensor:
    """[batch, pos]: True at the positions whose output counts (not BOS, not a pad)."""
    keep = tokens != info["encoding"]["compiler_pad"]
    keep[:, 0] = False
    return keep


SHARPNESS = 5.0  # soft targets softmax(5 * the program's logits): a one-hot output gives its answer p ~ 0.98


def loss_and_hits(logits, target_logits, mask, numerical: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, per-position hit [k]) at the masked positions: cross-entropy against the program's output as soft
    targets, softmax(SHARPNESS * its logits) (hit: the same answer), or for a numerical output the squared error
    (hit: within 0.02). Soft targets pin the logits' margins, not only their argmax, so an intervention the program
    ignores must leave the dense model's logits where they were (a hard label would let them move freely)."""
    if numerical:
        out, want = logits[..., 0][mask], target_logits[..., 0][mask]
        return F.mse_loss(out, want), (out - want).abs() < 0.02
    out, want = logits[mask], target_logits[mask]
    return F.cross_entropy(out, (SHARPNESS * want).softmax(-1)), out.argmax(-1) == want.argmax(-1)


# --- the dense model -----------------------------------------------------------------------------------------
def dense_model(high, name: str, seed: int = SEED, norm: str | None = "LN"):
    """A dense model of the program's layout (its layers and heads, so that every node has its place), wider, with
    random initialisation and LayerNorm (without a norm, training diverged at this learning rate: reverse's task
    loss rose from 0.25 to 4.8 between steps 750 and 1000)."""
    from transformer_lens import HookedTransformerConfig

    from headcoop.models.tl import HookedTransformer

    c = high.cfg
    cfg = HookedTransformerConfig(n_layers=c.n_layers, n_heads=c.n_heads, d_model=WIDTH["d_model"],
                                  d_head=WIDTH["d_head"], d_mlp=WIDER_MLP.get(name, WIDTH["d_mlp"]),
                                  d_vocab=c.d_vocab, d_vocab_out=c.d_vocab_out, n_ctx=c.n_ctx, act_fn="relu",
                                  normalization_type=norm, attention_dir="bidirectional", seed=seed,
                                  init_weights=True)  # fmt: skip
    return HookedTransformer(cfg)


def false_edges_of(model, truth: dict) -> list[tuple]:
    """The edges of `hc.edges`' graph (as (writer, reader) keys) outside the program's truth."""
    from headcoop.analysis.edges.graph import graph, reader_name, writer_name

    true = {tuple(e) for e in truth["edges"]}
    _, _, edges = graph(model)
    return [(w, r) for w, r in edges if (writer_name(w), *reader_name(r)) not in true]


def edge_strict_run(low, base, source, false_edges: list) -> torch.Tensor:
    """The dense model's logits on `base` with every false edge carrying the writer's output on `source`: the true
    circuit alone (the edge-level strictness: an edge the program lacks must carry nothing; `hc.faithfulness`'s own
    ablated run, with autograd). All at once: a random share of them left the model free to read a false edge
    redundantly through several others."""
    from headcoop.analysis.edges.exact import writer_outputs
    from headcoop.analysis.edges.faithfulness import ablated_run
    from headcoop.analysis.edges.graph import graph

    writers, readers, _ = graph(low)
    keep = torch.ones(len(writers), len(readers), dtype=torch.bool)
    w_index, r_index = {w: i for i, w in enumerate(writers)}, {r: i for i, r in enumerate(readers)}
    for w, r in false_edges:
        keep[w_index[w], r_index[r]] = False
    with torch.no_grad():
        _, cache = low.run_with_cache(source)
        reference = writer_outputs(low, cache, writers)
    return ablated_run(low, base, keep, writers, readers, reference)


def unfiltered(low, high, info: dict, aligned: list[str], one_length: bool, n: int = 2048, seed: int = 2) -> dict:
    """InterpBench's reading of interchange accuracy: per aligned node, the share of token positions where the
    dense model's output under the interchange matches the program's, over every pair as drawn (sources not
    chosen, pairs whose output does not change counted too). one_length: base and source both at the longest
    length (InterpBench's inputs have one length); else the training's lengths (`draw`, `draw_source`).
    {node: accuracy}."""
    gen = torch.Generator().manual_seed(seed)
    pad = info["encoding"]["compiler_pad"]
    top = torch.full((n,), longest(info))
    base, lengths = draw(info, n, gen, top if one_length else None)
    source = draw(info, n, gen, top)[0] if one_length else draw_source(info, lengths, gen)
    both = token_mask(base, info) & token_mask(source, info)
    hb = pad_mask_hooks(base, pad, high.cfg.n_layers)
    out = {}
    with torch.no_grad():
        high_src = activations(high, source, aligned, pad_mask_hooks(source, pad, high.cfg.n_layers))
        low_src = activations(low, source, aligned)
        for node in aligned:
            target = run(high, base, {node: high_src[node]}, hb)
            _, hits = loss_and_hits(run(low, base, {node: low_src[node]}), target, both, info["numerical"])
            out[node] = round(float(hits.float().mean()), 4)
    return out


@dataclasses.dataclass
class Recipe:
    """The training's switches, each recorded in the checkpoint's training record (issue 63).

    source_grad: the interchange's source run keeps its gradient (InterpBench's --backprop-on-cache), so the
      intervened node learns from its own interchange; False detaches it (the committed models' recipe).
    hard_targets: the interchange loss is cross-entropy against the program's answer (InterpBench's); False:
      the soft targets of `loss_and_hits`.
    candidates: sources drawn per base (rare: where the share of candidates that change the program's output
      is under RARE), one kept so that about half the pairs change the output; 0: one source as drawn.
    balanced: the share of shuffle_dyck's inputs that are balanced prefixes (the rest uniform).
    node_strict_p: each non-aligned node resampled with this probability (node strictness).
    edge_strict: the true circuit alone must answer (edge strictness), its weight edge_low until the
      interchange loss's running mean falls below raise_below, edge_high after.
    separate_steps: the task, interchange and strictness losses as separate optimizer steps (InterpBench's).
    writer_cap: the task step also pays (ratio - cap)^2 for each writer whose mean |output| exceeds `cap` times
      the embedding's (0: off). Without it, once edge strictness weighed in full, reverse's MLP3 grew to 683x
      and xproportion's MLP1 to 126x the embedding by step 1,500-2,000 (the gate allows 20x).
    lr (constant after `warmup` steps, or halved every lr_halflife steps), batch, max_steps; norms_every: the writers' norms logged; gate_every:
    the gate checked (training stops when it passes); checkpoint_s: the run's state saved this often."""

    source_grad: bool = True
    hard_targets: bool = True
    candidates: int = 8
    candidates_rare: int = 16
    balanced: float = 0.5
    node_strict_p: float = 0.5
    edge_strict: bool = True
    edge_low: float = 0.1
    edge_high: float = 1.0
    raise_below: float = 0.1
    separate_steps: bool = True
    writer_cap: float = 10.0
    lr: float = 1e-3
    warmup: int = 100
    lr_halflife: int = 0
    batch: int = 128
    max_steps: int = 20000
    norms_every: int = 250
    gate_every: int = 500
    checkpoint_s: float = 120.0


RARE = 0.15  # below this share of changing candidates, a node draws candidates_rare of them
GATE = dict(changed=0.9, unchanged=0.95, task=0.99, circuit=0.95, strict=0.95, writer_ratio=20.0)  # issue 63, item 4


def interchange_targets(high, base, sources: torch.Tensor, node: str, info: dict, mask: torch.Tensor):
    """The program's outputs [k, batch, pos, out] with `node` taken from each of k candidate sources
    [k, batch, pos], and whether each changes the base's answer somewhere both hold tokens [k, batch]."""
    pad = info["encoding"]["compiler_pad"]
    hb = pad_mask_hooks(base, pad, high.cfg.n_layers)
    with torch.no_grad():
        plain = run(high, base, extra=hb)
        outs, changed = [], []
        for source in sources:
            value = activations(high, source, [node], pad_mask_hooks(source, pad, high.cfg.n_layers))[node]
            out = run(high, base, {node: value}, hb)
            both = mask & token_mask(source, info)
            if info["numerical"]:
                differs = (out[..., 0] - plain[..., 0]).abs() >= 0.02
            else:
                differs = out.argmax(-1) != plain.argmax(-1)
            outs.append(out)
            changed.append((differs & both).any(1))
    return torch.stack(outs), torch.stack(changed)


def choose_sources(high, info: dict, base, lengths, node: str, count: int, gen: torch.Generator):
    """(source [batch, pos], its program target, changed [batch], share of candidates that change): `count`
    candidate sources per base, the one kept changing the output on a random half of the rows where one can."""
    mask = token_mask(base, info)
    sources = torch.stack([draw_source(info, lengths, gen) for _ in range(count)])
    outs, changed = interchange_targets(high, base, sources, node, info, mask)
    want = torch.rand(len(base), generator=gen) < 0.5
    fits = changed == want[None]  # [count, batch]
    pick = torch.where(fits.any(0), fits.float().argmax(0), torch.zeros(len(base), dtype=torch.long))
    rows = torch.arange(len(base))
    return sources[pick, rows], outs[pick, rows], changed[pick, rows], float(changed.float().mean())


def hard_loss(logits, target_logits, mask, numerical: bool) -> torch.Tensor:
    """Cross-entropy against the program's answer (its argmax) at the masked positions; squared error for a
    numerical output."""
    if numerical:
        return F.mse_loss(logits[..., 0][mask], target_logits[..., 0][mask])
    return F.cross_entropy(logits[mask], target_logits[mask].argmax(-1))


def writer_ratios(low, tokens, mask) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits, ratios [writer]): one run with gradient, each head's and MLP's mean |output| at the token
    positions over the embedding's (the writer cap's penalty reads it)."""
    kept: dict = {}

    def keep(act, hook):
        kept[hook.name] = act
        return act

    names = ["hook_embed", "hook_pos_embed"] + [f"blocks.{lay}.attn.hook_z" for lay in range(low.cfg.n_layers)]
    if not low.cfg.attn_only:
        names += [f"blocks.{lay}.hook_mlp_out" for lay in range(low.cfg.n_layers)]
    logits = low.run_with_hooks(tokens, fwd_hooks=[(name, keep) for name in names])
    floor = (kept["hook_embed"] + kept["hook_pos_embed"]).norm(dim=-1)[mask].mean().detach()
    ratios = []
    for lay in range(low.cfg.n_layers):
        z = kept[f"blocks.{lay}.attn.hook_z"]
        written = torch.einsum("bphd,hdm->bphm", z, low.blocks[lay].attn.W_O)
        ratios.append(written.norm(dim=-1)[mask].mean(0) / floor)  # [head]
        if not low.cfg.attn_only:
            ratios.append(kept[f"blocks.{lay}.hook_mlp_out"].norm(dim=-1)[mask].mean()[None] / floor)
    return logits, torch.cat(ratios)


def writer_norms(low, tokens, mask) -> dict:
    """Each writer's median |output| at the token positions over the embedding's: {writer: ratio}."""
    with torch.no_grad():
        _, cache = low.run_with_cache(tokens)
        embed = cache["hook_embed"] + cache["hook_pos_embed"]
        floor = float(embed.norm(dim=-1)[mask].median())
        out = {}
        for layer in range(low.cfg.n_layers):
            z = cache[f"blocks.{layer}.attn.hook_z"]  # [batch, pos, head, d_head]
            for head in range(low.cfg.n_heads):
                written = z[:, :, head] @ low.blocks[layer].attn.W_O[head]
                out[f"L{layer}H{head}"] = float(written.norm(dim=-1)[mask].median()) / floor
            if not low.cfg.attn_only:
                out[f"MLP{layer}"] = float(cache[f"blocks.{layer}.hook_mlp_out"].norm(dim=-1)[mask].median()) / floor
    return out


def gate(low, high, info: dict, aligned: list[str], others: list[str], false_edges: list, recipe: Recipe,
         n: int = 2048, seed: int = 1) -> dict:  # fmt: skip
    """The gate (issue 63, item 4) on `n` held-out pairs: per aligned node the interchange accuracy where the
    program's output changes and where it does not (sources chosen as in training), task accuracy, the true
    circuit alone, every non-aligned node resampled at once, the largest writer ratio; `passed`."""
    gen = torch.Generator().manual_seed(seed)
    pad = info["encoding"]["compiler_pad"]
    base, lengths = draw(info, n, gen, balanced=recipe.balanced)
    mask = token_mask(base, info)
    hb = pad_mask_hooks(base, pad, high.cfg.n_layers)
    out: dict = {"inputs": n}
    with torch.no_grad():
        high_base = run(high, base, extra=hb)
        _, hits = loss_and_hits(run(low, base), high_base, mask, info["numerical"])
        out["task_accuracy"] = float(hits.float().mean())
        per_node = {}
        for node in aligned:
            source, target, changed, share = choose_sources(
                high, info, base, lengths, node, recipe.candidates or 1, gen
            )
            both = mask & token_mask(source, info)
            value = activations(low, source, [node])[node]
            _, hit = loss_and_hits(run(low, base, {node: value}), target, both, info["numerical"])
            rows = both.nonzero()[:, 0]
            moved = changed[rows]
            rate = lambda m: round(float(hit[m].float().mean()), 4) if bool(m.any()) else float("nan")  # noqa: E731
            per_node[node] = dict(changed=rate(moved), unchanged=rate(~moved), all=rate(torch.ones_like(moved)),
                                  changed_share=round(float(changed.float().mean()), 3))  # fmt: skip
        out["interchange"] = per_node
        source = draw_source(info, lengths, gen)
        if others:
            low_src = activations(low, source, others)
            _, hits = loss_and_hits(run(low, base, low_src), high_base, mask, info["numerical"])
            out["strict_accuracy"] = float(hits.float().mean())
        if false_edges:
            _, hits = loss_and_hits(edge_strict_run(low, base, source, false_edges), high_base, mask, info["numerical"])
            out["circuit_accuracy"] = float(hits.float().mean())
    norms = writer_norms(low, base, mask)
    out["writer_ratio_max"] = max(norms.values())
    out["writer_max"] = max(norms, key=norms.get)
    checks = [
        out["task_accuracy"] >= GATE["task"],
        out["writer_ratio_max"] <= GATE["writer_ratio"],
        out.get("strict_accuracy", 1.0) >= GATE["strict"],
        out.get("circuit_accuracy", 1.0) >= GATE["circuit"],
    ]
    for row in per_node.values():  # NaN (no pair of that kind) does not fail a node
        checks.append(not row["changed"] < GATE["changed"])
        checks.append(not row["unchanged"] < GATE["unchanged"])
    out["passed"] = all(checks)
    return out


def step_losses(
    low,
    high,
    info: dict,
    recipe: Recipe,
    state: dict,
    aligned: list[str],
    others: list[str],
    false_edges: list,
    iit_nodes: int,
    gen: torch.Generator,
    pick: torch.Generator,
) -> tuple[dict, tuple]:
    """One training step's data and losses: ({"task", "iit"[, "strict"]}: functions computing each loss, each
    its own forward pass; (base, mask) for the writer norms). Draws from `gen` and `pick` in a fixed order and
    updates the nodes' changing shares in `state` (a resumed run draws the same)."""
    base, lengths = draw(info, recipe.batch, gen, balanced=recipe.balanced)
    mask = token_mask(base, info)
    nodes = [aligned[int(i)] for i in torch.randperm(len(aligned), generator=pick)[: iit_nodes or len(aligned)]]
    pad = info["encoding"]["compiler_pad"]
    with torch.no_grad():
        high_base = run(high, base, extra=pad_mask_hooks(base, pad, high.cfg.n_layers))
    picked = []  # (node, source, target, both) per intervened node, chosen before any loss is computed
    for node in nodes:
        count = recipe.candidates_rare if state["share"].get(node, 1.0) < RARE else recipe.candidates
        source, target, _, share = choose_sources(high, info, base, lengths, node, max(count, 1), gen)
        state["share"][node] = share if node not in state["share"] else 0.9 * state["share"][node] + 0.1 * share
        picked.append((node, source, target, mask & token_mask(source, info)))
    strict_source, circuit_source = draw_source(info, lengths, gen), draw_source(info, lengths, gen)
    chosen = [o for o in others if torch.rand((), generator=pick) < recipe.node_strict_p] or others[:1]
    edge_weight = recipe.edge_high if (state["iit_mean"] or 1e9) < recipe.raise_below else recipe.edge_low

    def task_loss():
        if not recipe.writer_cap:
            return loss_and_hits(run(low, base), high_base, mask, info["numerical"])[0]
        logits, ratios = writer_ratios(low, base, mask)
        excess = torch.relu(ratios - recipe.writer_cap)
        return loss_and_hits(logits, high_base, mask, info["numerical"])[0] + (excess**2).sum()

    def iit_loss():
        terms = []
        for node, source, target, both in picked:
            value = activations(low, source, [node], grad=recipe.source_grad)[node]
            logits = run(low, base, {node: value})
            terms.append(hard_loss(logits, target, both, info["numerical"]) if recipe.hard_targets
                         else loss_and_hits(logits, target, both, info["numerical"])[0])  # fmt: skip
        return sum(terms) / len(terms)

    def strict_loss():
        total = torch.zeros(())
        if chosen:
            low_src = activations(low, strict_source, chosen, grad=recipe.source_grad)
            total = total + loss_and_hits(run(low, base, low_src), high_base, mask, info["numerical"])[0]
        if false_edges:
            circuit = edge_strict_run(low, base, circuit_source, false_edges)
            total = total + edge_weight * loss_and_hits(circuit, high_base, mask, info["numerical"])[0]
        return total

    parts = {"task": task_loss, "iit": iit_loss}
    if chosen or false_edges:
        parts["strict"] = strict_loss
    return parts, (base, mask)


def apply_losses(opt, low, parts: dict, separate: bool) -> dict:
    """Take the step: each loss its own forward pass and optimizer step (InterpBench), or one step of their
    sum; the losses' values."""
    losses = {}
    if separate:  # each loss its own forward pass and optimizer step, as InterpBench
        for key, part in parts.items():
            opt.zero_grad()
            losses[key] = part()
            losses[key].backward()
            torch.nn.utils.clip_grad_norm_(low.parameters(), 1.0)
            opt.step()
    else:
        losses = {key: part() for key, part in parts.items()}
        opt.zero_grad()
        sum(losses.values()).backward()
        torch.nn.utils.clip_grad_norm_(low.parameters(), 1.0)
        opt.step()
    return losses


def train(name: str, recipe: Recipe, out: Path = GATED, seed: int = SEED, iit_nodes: int | None = None,
          norm: str | None = "LN", log=print):  # fmt: skip
    """The dense model of program `name`, SIIT-trained under `recipe` until its gate passes (or max_steps),
    resuming from `out`'s saved state of an unfinished run; (model, info, record, gate)."""
    from experiments.groundtruth.resume import load_state, save_state, state_folder
    from experiments.tracr.common import load

    check_float("recipe.checkpoint_s", recipe.checkpoint_s, 0.0)  # NaN would never save a state
    high, info = load(name)
    high.eval()
    for p in high.parameters():
        p.requires_grad_(False)
    torch.manual_seed(seed)
    low = dense_model(high, name, seed, norm)
    truth = info["truth"]
    aligned = [c for c in components(high.cfg) if c not in truth["empty"]]
    others = [c for c in components(high.cfg) if c in truth["empty"]]
    gen, pick = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed + 1)
    false_edges = false_edges_of(low, truth) if recipe.edge_strict else []
    iit_nodes = IIT_NODES if iit_nodes is None else iit_nodes
    opt = torch.optim.AdamW(low.parameters(), lr=recipe.lr, weight_decay=0.01)
    folder = state_folder(out, name)
    operational = ("max_steps", "norms_every", "gate_every", "checkpoint_s")  # may change between resumes
    config = dict(program=name, seed=seed, iit_nodes=iit_nodes, norm=norm,
                  recipe={k: v for k, v in dataclasses.asdict(recipe).items() if k not in operational})  # fmt: skip
    meta = load_state(folder, low, opt, {"data": gen, "pick": pick})
    if meta is not None and meta.get("config") != config:
        raise ValueError(f"{folder} holds a run of another recipe ({meta['config']}); delete it to start over, or run "
                         f"the same command as before")  # fmt: skip
    state = meta or dict(config=config, step=0, seconds=0.0, history=[], gates=[], iit_mean=None, share={},
                         passed=False)  # fmt: skip
    if meta is not None:
        log(f"[siit] {name}: resumed at step {state['step']} from {folder}")
    saved_at = time.perf_counter()
    started = time.perf_counter() - state["seconds"]
    while state["step"] < recipe.max_steps and not state["passed"]:
        step = state["step"]
        for group in opt.param_groups:
            decay = 0.5 ** (step / recipe.lr_halflife) if recipe.lr_halflife else 1.0
            group["lr"] = recipe.lr * min(1.0, (step + 1) / recipe.warmup) * decay
        parts, (base, mask) = step_losses(low, high, info, recipe, state, aligned, others, false_edges, iit_nodes,
                                          gen, pick)  # fmt: skip
        losses = apply_losses(opt, low, parts, recipe.separate_steps)
        iit_now = float(losses["iit"].detach())
        state["iit_mean"] = iit_now if state["iit_mean"] is None else 0.98 * state["iit_mean"] + 0.02 * iit_now
        state["step"] = step + 1
        if step % recipe.norms_every == 0:
            norms = writer_norms(low, base, mask)
            top = max(norms, key=norms.get)
            state["history"].append(dict(step=step, **{k: round(float(v.detach()), 5) for k, v in losses.items()},
                                         iit_mean=round(state["iit_mean"], 5), writer_max=top,
                                         writer_ratio=round(norms[top], 2)))  # fmt: skip
            log(
                f"[siit] {name} step {step}: "
                + " ".join(f"{k} {v}" for k, v in state["history"][-1].items() if k != "step")
            )
        if state["step"] % recipe.gate_every == 0:
            low.eval()
            checked = gate(low, high, info, aligned, others, false_edges, recipe)
            low.train()
            state["gates"].append(dict(step=state["step"], **{k: v for k, v in checked.items() if k != "interchange"},
                                       interchange_min_changed=min(r["changed"] for r in checked["interchange"].values()),
                                       interchange_min_unchanged=min(r["unchanged"] for r in checked["interchange"].values())))  # fmt: skip
            state["passed"] = checked["passed"]
            log(f"[siit] {name} gate at step {state['step']}: {state['gates'][-1]}")
        if time.perf_counter() - saved_at >= recipe.checkpoint_s:
            state["seconds"] = time.perf_counter() - started
            save_state(folder, low, opt, {"data": gen, "pick": pick}, state)
            saved_at = time.perf_counter()
    state["seconds"] = time.perf_counter() - started
    low.eval()
    final = gate(low, high, info, aligned, others, false_edges, recipe)
    record = dict(program=name, steps=state["step"], batch=recipe.batch, lr=recipe.lr, seed=seed, iit_nodes=iit_nodes,
                  norm=norm, seconds=round(state["seconds"], 1), aligned=aligned, non_aligned=others,
                  history=state["history"], gates=state["gates"], recipe=dataclasses.asdict(recipe),
                  width=dict(WIDTH, d_mlp=low.cfg.d_mlp))  # fmt: skip
    return low, info, record, final


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--programs", nargs="*", default=list(PROGRAMS))
    parser.add_argument("--max-steps", type=int, default=Recipe.max_steps, help="stop here if the gate has not passed")
    parser.add_argument(
        "--iit-nodes",
        type=int,
        default=None,
        help=f"aligned nodes intervened on per batch (default: per program, IIT_NODES_OF, else {IIT_NODES}; 0: all)",
    )
    parser.add_argument("--lr", type=float, default=Recipe.lr)
    parser.add_argument("--norm", choices=["LN", "none"], default="LN", help="the dense model's norm")
    parser.add_argument(
        "--detach-source", action="store_true", help="the committed models' recipe: no gradient through the source run"
    )
    parser.add_argument("--soft-targets", action="store_true", help="soft targets for the interchange loss")
    parser.add_argument(
        "--candidates", type=int, default=Recipe.candidates, help="sources drawn per base (0: one as drawn)"
    )
    parser.add_argument("--no-edge-strict", action="store_true")
    parser.add_argument("--joint-step", action="store_true", help="one optimizer step for the summed losses")
    parser.add_argument(
        "--lr-halflife",
        type=int,
        default=0,
        help="halve the learning rate every this many steps "
        "(0: constant; xproportion's numerical output oscillated at a constant 1e-3)",
    )
    parser.add_argument(
        "--raise-below",
        type=float,
        default=Recipe.raise_below,
        help="edge strictness's weight rises once the interchange loss's running mean is below this "
        "(shuffle_dyck's plateaued at 0.16-0.18 over steps 1,000-2,000, so its edge weight never rose)",
    )
    parser.add_argument("--checkpoint-s", type=float, default=Recipe.checkpoint_s, help="seconds between saved states")
    parser.add_argument(
        "--out",
        type=Path,
        default=GATED,
        help="where the models and unfinished runs go (default "
        "experiments/groundtruth/gated: the page's models in checkpoints/ stay until it is regenerated)",
    )
    args = parser.parse_args(argv)
    import shutil

    import headcoop as hc
    from experiments.groundtruth.resume import drop_unpassed, state_folder

    torch.set_num_threads(1)  # tiny models: one thread each is fastest, and two programs can train side by side
    recipe = Recipe(source_grad=not args.detach_source, hard_targets=not args.soft_targets, candidates=args.candidates,
                    edge_strict=not args.no_edge_strict, separate_steps=not args.joint_step, lr=args.lr,
                    max_steps=args.max_steps, checkpoint_s=args.checkpoint_s, lr_halflife=args.lr_halflife,
                    raise_below=args.raise_below)  # fmt: skip
    for name in args.programs:
        low, info, record, checks = train(name, recipe, out=args.out,
                                          iit_nodes=args.iit_nodes if args.iit_nodes is not None else IIT_NODES_OF.get(name),
                                          norm=None if args.norm == "none" else args.norm)  # fmt: skip
        print(f"[siit] {name}: gate {'passed' if checks['passed'] else 'NOT passed'}: {checks}", flush=True)
        target = args.out / (name if checks["passed"] else f"{name}.unpassed")
        hc.save(low, target, metrics=checks, groundtruth=dict(kind="siit", tracr=info, training=record))
        shutil.rmtree(state_folder(args.out, name), ignore_errors=True)  # finished: nothing left to resume
        if checks["passed"]:
            drop_unpassed(args.out, name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
