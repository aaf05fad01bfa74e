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
keys; with 4 tokens its inputs are at most 4 long). The compiled program reads a padded input as Tracr does (every key at a
pad position masked); the dense model has no mask and learns to ignore the pads. Half the sources share their
base's length, half have their own (`draw_source`), so an interchange at a node of the length moves the program's
output; an interchange's outputs are read where base and source both hold tokens. Outputs are read at the token
positions (not BOS, not the pads), against the program's output as soft targets (`loss_and_hits`).

    python -m experiments.groundtruth.siit [--programs reverse hist ...] [--steps 4000]

Writes `experiments/groundtruth/checkpoints/NAME` (hc.save: the truth, the training record, the checks).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
CHECKPOINTS = HERE / "checkpoints"
PROGRAMS = ("reverse", "hist", "sort_unique", "shuffle_dyck", "xproportion")
WIDTH = dict(d_model=64, d_head=16, d_mlp=128)
WIDER_MLP = {"shuffle_dyck": 256}
SEED = 0
STEPS = dict(reverse=3000, hist=800, sort_unique=1500, shuffle_dyck=1000, xproportion=1200)
IIT_NODES = 2  # aligned nodes intervened on per batch (drawn afresh each batch)
IIT_NODES_OF: dict[str, int] = {}  # per program (0: every aligned node, every batch)
IIT_WEIGHT_OF: dict[str, float] = {}  # per program: the interchange loss's weight beside the task loss


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
        f"MLP{lay}" for lay in range(cfg.n_layers)]


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


def activations(model, tokens, nodes: list[str], extra: list | None = None) -> dict[str, torch.Tensor]:
    """Each node's activation (a head's z, an MLP's output) on `tokens`."""
    store = {}
    hooks = list(extra or [])
    for name in nodes:
        point, head = node_hook_name(name)

        def keep(act, hook, name=name, head=head):
            store[name] = (act if head is None else act[:, :, head]).detach().clone()

        hooks.append((point, keep))
    with torch.no_grad():
        model.run_with_hooks(tokens, fwd_hooks=hooks)
    return store


# --- inputs -------------------------------------------------------------------------------------------------
UNIQUE = ("sort_unique",)  # programs defined on inputs without repeated tokens (Tracr's make_sort_unique: unique keys)


def longest(info: dict) -> int:
    """The longest input of the program's domain: max_seq_len, or the vocabulary's size where tokens are unique."""
    return min(info["max_seq_len"], len(info["vocab"])) if info["program"] in UNIQUE else info["max_seq_len"]


def draw(info: dict, n: int, gen: torch.Generator, lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [n, max_seq_len + 1], lengths [n]): BOS, `lengths` tokens drawn uniformly (without repeats for a
    program of UNIQUE), then pads; lengths drawn (half at the longest, half uniform in 1..longest) unless given."""
    enc, vocab, full = info["encoding"], info["vocab"], info["max_seq_len"]
    ids = torch.tensor([enc[v] for v in vocab])
    top = longest(info)
    if lengths is None:
        lengths = torch.where(torch.rand(n, generator=gen) < 0.5, top, torch.randint(1, top + 1, (n,), generator=gen))
    if info["program"] in UNIQUE:
        order = torch.rand(n, len(ids), generator=gen).argsort(-1)
        body = torch.cat([ids[order], ids[order[:, :1]].expand(n, full - len(ids))], 1)[:, :full] if full > len(ids) else ids[order][:, :full]
    else:
        body = ids[torch.randint(len(ids), (n, full), generator=gen)]
    body[torch.arange(full)[None, :] >= lengths[:, None]] = enc["compiler_pad"]
    return torch.cat([torch.full((n, 1), enc["BOS"]), body], 1), lengths


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

    from headcoop.tl import HookedTransformer

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


def evaluate(low, high, info: dict, aligned: list[str], others: list[str], n: int = 2048, seed: int = 1) -> dict:
    """The checks: task accuracy, interchange accuracy per aligned node (same-length source), and the effect of
    resampling every non-aligned node at once (accuracy against the program's output on the base inputs, and
    the largest mean |change| of the dense model's output)."""
    gen = torch.Generator().manual_seed(seed)
    pad = info["encoding"]["compiler_pad"]
    base, lengths = draw(info, n, gen)
    source = draw_source(info, lengths, gen)
    mask = token_mask(base, info)
    both = mask & token_mask(source, info)
    hb = pad_mask_hooks(base, pad, high.cfg.n_layers)
    with torch.no_grad():
        high_base = run(high, base, extra=hb)
        low_base = run(low, base)
        _, hits = loss_and_hits(low_base, high_base, mask, info["numerical"])
        out = dict(task_accuracy=float(hits.float().mean()))
        per_node = {}
        high_src = activations(high, source, aligned, pad_mask_hooks(source, pad, high.cfg.n_layers))
        low_src = activations(low, source, aligned + others)
        for node in aligned:
            target = run(high, base, {node: high_src[node]}, hb)
            _, hits = loss_and_hits(run(low, base, {node: low_src[node]}), target, both, info["numerical"])
            per_node[node] = round(float(hits.float().mean()), 4)
        out["interchange_accuracy"] = per_node
        out["interchange_accuracy_min"] = min(per_node.values())
        if others:
            strict = run(low, base, {node: low_src[node] for node in others})
            _, hits = loss_and_hits(strict, high_base, mask, info["numerical"])
            out["strict_accuracy"] = float(hits.float().mean())
            change = (strict - low_base)[mask].abs().mean()
            out["strict_mean_abs_change"] = float(change)
            out["base_mean_abs_output"] = float(low_base[mask].abs().mean())
        out["inputs"] = n
    return out


def train(name: str, steps: int, batch: int = 128, lr: float = 2e-3, seed: int = SEED, iit_nodes: int | None = None,
          iit_weight: float = 1.0, norm: str | None = "LN", log=print):
    """The dense model of program `name`, SIIT-trained; (model, record). `iit_nodes`: aligned nodes intervened on
    per batch (default IIT_NODES; 0 for all of them); iit_weight: the interchange loss's weight beside the task's."""
    from experiments.tracr.common import load

    high, info = load(name)
    high.eval()
    for p in high.parameters():
        p.requires_grad_(False)
    torch.manual_seed(seed)
    low = dense_model(high, name, seed, norm)
    truth = info["truth"]
    aligned = [c for c in components(high.cfg) if c not in truth["empty"]]
    others = [c for c in components(high.cfg) if c in truth["empty"]]
    pad = info["encoding"]["compiler_pad"]
    gen = torch.Generator().manual_seed(seed)
    pick = torch.Generator().manual_seed(seed + 1)
    false_edges = false_edges_of(low, truth)
    iit_nodes = IIT_NODES if iit_nodes is None else iit_nodes
    opt = torch.optim.AdamW(low.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.05)
    started = time.perf_counter()
    history = []
    for step in range(steps):
        base, lengths = draw(info, batch, gen)
        source = draw_source(info, lengths, gen)
        mask = token_mask(base, info)
        both = mask & token_mask(source, info)  # an interchange is read where base and source both hold tokens
        hb, hs = pad_mask_hooks(base, pad, high.cfg.n_layers), pad_mask_hooks(source, pad, high.cfg.n_layers)
        nodes = [aligned[int(i)] for i in torch.randperm(len(aligned), generator=pick)[:iit_nodes or len(aligned)]]
        with torch.no_grad():
            high_base = run(high, base, extra=hb)
            high_src = activations(high, source, nodes, hs)
            high_iit = [run(high, base, {node: high_src[node]}, hb) for node in nodes]
        low_src = activations(low, source, nodes + others)
        task, _ = loss_and_hits(run(low, base), high_base, mask, info["numerical"])
        iit = sum(loss_and_hits(run(low, base, {node: low_src[node]}), target, both, info["numerical"])[0]
                  for node, target in zip(nodes, high_iit)) / len(nodes)  # fmt: skip
        loss = task + iit_weight * iit
        strict = torch.zeros(())
        if others:
            chosen = [o for o in others if torch.rand((), generator=pick) < 0.5] or [others[0]]
            strict, _ = loss_and_hits(run(low, base, {o: low_src[o] for o in chosen}), high_base, mask, info["numerical"])
            loss = loss + strict
        edge_strict = torch.zeros(())
        if false_edges:
            edge_strict, _ = loss_and_hits(edge_strict_run(low, base, source, false_edges), high_base, mask,
                                           info["numerical"])  # fmt: skip
            loss = loss + edge_strict
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(low.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 250 == 0 or step == steps - 1:
            history.append(dict(step=step, task=float(task.detach()), iit=float(iit.detach()), strict=float(strict.detach()),
                                edge_strict=float(edge_strict.detach())))  # fmt: skip
            log(f"[siit] {name} step {step}: " + " ".join(f"{k} {v:.4f}" for k, v in history[-1].items() if k != "step"))
    seconds = time.perf_counter() - started
    low.eval()
    checks = evaluate(low, high, info, aligned, others)
    record = dict(program=name, steps=steps, batch=batch, lr=lr, seed=seed, iit_nodes=iit_nodes, iit_weight=iit_weight, norm=norm, seconds=round(seconds, 1),
                  aligned=aligned, non_aligned=others, history=history, width=dict(WIDTH, d_mlp=low.cfg.d_mlp))  # fmt: skip
    return low, info, record, checks


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--programs", nargs="*", default=list(PROGRAMS))
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: per program, STEPS)")
    parser.add_argument("--iit-nodes", type=int, default=None,
                        help=f"aligned nodes intervened on per batch (default: per program, IIT_NODES_OF, else {IIT_NODES}; 0: all)")
    parser.add_argument("--iit-weight", type=float, default=None, help="the interchange loss's weight (default: per program, IIT_WEIGHT_OF, else 1)")
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--norm", choices=["LN", "none"], default="LN", help="the dense model's norm")
    parser.add_argument("--out", type=Path, default=CHECKPOINTS)
    args = parser.parse_args(argv)
    import headcoop as hc

    torch.set_num_threads(1)  # tiny models: one thread each is fastest, and two programs can train side by side
    for name in args.programs:
        low, info, record, checks = train(name, args.steps or STEPS[name],
                                          iit_nodes=args.iit_nodes if args.iit_nodes is not None else IIT_NODES_OF.get(name),
                                          iit_weight=args.iit_weight or IIT_WEIGHT_OF.get(name, 1.0), lr=args.lr,
                                          norm=None if args.norm == "none" else args.norm)
        print(f"[siit] {name}: {checks}", flush=True)
        hc.save(low, args.out / name, metrics=checks,
                groundtruth=dict(kind="siit", tracr=info, training=record))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
