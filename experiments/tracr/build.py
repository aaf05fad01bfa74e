"""Compile RASP programs from `tracr.compiler.lib` with Tracr, convert each to a TransformerLens
HookedTransformer, check it reproduces Tracr's own outputs, and save it as a headcoop checkpoint with its
ground truth, read from the compiled model's labelled residual space:

- which residual directions each component writes and reads (Tracr gives every SOp its own labelled
  subspace, "reverse_1:a", "indices:3", "one"), hence the operation (SOp) each head and MLP implements;
- the empty components (Tracr pads every layer to the widest layer's head count and gives a layer without an
  MLP a zero MLP): all-zero weights;
- the true edges: writer -> reader (q, k, v of a head, an MLP's input, the logits) where the reader reads a
  direction the writer writes, in hc.edges' names; the true nodes: non-empty components on a true path to
  the logits.

    pip install -e ".[bench]"          # tracr-pypi and jax, in their own environment if you like
    python -m experiments.tracr.build  # writes experiments/tracr/checkpoints/<program>/

Not needed by the tests: the checkpoints and truths are committed.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
OUT = HERE / "checkpoints"
MAX_LEN = {"reverse": 5, "hist": 5, "sort_unique": 4, "shuffle_dyck": 6, "xproportion": 5}
# sort_unique: 8 tokens at length 4 (issue 63). With 4 tokens at length 5 every full-length input held the four
# tokens once and sorted to one answer, so an interchange at a full-length input could not change the output.


def programs():
    """name -> (RASP program, vocabulary, max_seq_len, what it computes)."""
    from tracr.compiler import lib
    from tracr.rasp import rasp

    return {
        "reverse": (lib.make_reverse(rasp.tokens), {"a", "b", "c"}, "the input reversed"),
        "hist": (lib.make_hist(), {"a", "b", "c"}, "how often each position's token occurs"),
        "sort_unique": (lib.make_sort_unique(rasp.tokens, rasp.tokens), set(range(1, 9)), "the tokens sorted (unique)"),
        "shuffle_dyck": (lib.make_shuffle_dyck(pairs=["()", "{}"]), {"(", ")", "{", "}"},
                         "1 where the prefix is a balanced shuffle of two bracket kinds"),
        "xproportion": (lib.make_frac_prevs(rasp.tokens == "x"), {"x", "y", "z"},
                        "the fraction of 'x' up to each position (numerical)"),
    }  # fmt: skip


def convert(assembled, label: str, numerical: bool):
    """A HookedTransformer with the compiled weights, and the output labels its logits read (in order)."""
    import einops
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    p = {k: {kk: np.asarray(vv) for kk, vv in v.items()} for k, v in assembled.params.items()}
    mc = assembled.model_config
    labels = list(assembled.residual_labels)
    if numerical:
        out_labels = [label]
    else:
        order = sorted(assembled.output_encoder.encoding_map.items(), key=lambda kv: kv[1])
        out_labels = [f"{label}:{value}" for value, _ in order]
    cfg = HookedTransformerConfig(
        n_layers=mc.num_layers, d_model=len(labels), d_head=mc.key_size, n_heads=mc.num_heads, d_mlp=mc.mlp_hidden_size,
        d_vocab=p["token_embed"]["embeddings"].shape[0], d_vocab_out=len(out_labels),
        n_ctx=p["pos_embed"]["embeddings"].shape[0], act_fn="relu", attention_dir="bidirectional",
        normalization_type=None, positional_embedding_type="standard", seed=0,
    )  # fmt: skip
    model = HookedTransformer(cfg)
    sd = {"embed.W_E": p["token_embed"]["embeddings"], "pos_embed.W_pos": p["pos_embed"]["embeddings"]}
    for lay in range(mc.num_layers):
        pre = f"transformer/layer_{lay}"
        for mine, theirs in (("Q", "query"), ("K", "key"), ("V", "value")):
            sd[f"blocks.{lay}.attn.W_{mine}"] = einops.rearrange(
                p[f"{pre}/attn/{theirs}"]["w"], "d (h k) -> h d k", h=mc.num_heads
            )
            sd[f"blocks.{lay}.attn.b_{mine}"] = einops.rearrange(
                p[f"{pre}/attn/{theirs}"]["b"], "(h k) -> h k", h=mc.num_heads
            )
        sd[f"blocks.{lay}.attn.W_O"] = einops.rearrange(
            p[f"{pre}/attn/linear"]["w"], "(h k) d -> h k d", h=mc.num_heads
        )
        sd[f"blocks.{lay}.attn.b_O"] = p[f"{pre}/attn/linear"]["b"]
        sd[f"blocks.{lay}.mlp.W_in"], sd[f"blocks.{lay}.mlp.b_in"] = (
            p[f"{pre}/mlp/linear_1"]["w"],
            p[f"{pre}/mlp/linear_1"]["b"],
        )
        sd[f"blocks.{lay}.mlp.W_out"], sd[f"blocks.{lay}.mlp.b_out"] = (
            p[f"{pre}/mlp/linear_2"]["w"],
            p[f"{pre}/mlp/linear_2"]["b"],
        )
    W_U = np.zeros((len(labels), len(out_labels)), dtype=np.float32)
    for j, name in enumerate(out_labels):
        W_U[labels.index(name), j] = 1.0
    sd["unembed.W_U"], sd["unembed.b_U"] = W_U, np.zeros(len(out_labels), dtype=np.float32)
    state = model.state_dict()
    for k, v in sd.items():
        state[k] = torch.tensor(np.asarray(v, dtype=np.float32))
    model.load_state_dict(state)
    return model.eval(), out_labels


def _nonzero(matrix: np.ndarray, axis: int) -> list[int]:
    return [int(i) for i in np.nonzero(np.abs(matrix).sum(axis=axis) > 1e-9)[0]]


def ground_truth(model, labels: list[str], out_labels: list[str]) -> dict:
    """Reads and writes of every component, its operation, the empty components, the true edges and nodes."""
    from headcoop.analysis.edges.scores import graph, reader_name, writer_name

    cfg = model.cfg
    W = lambda t: t.detach().cpu().numpy()  # noqa: E731
    writes, reads = {}, {}
    writes["embed"] = _nonzero(W(model.W_E), 0)
    writes["pos_embed"] = _nonzero(W(model.W_pos), 0)
    for lay in range(cfg.n_layers):
        attn = model.blocks[lay].attn
        for h in range(cfg.n_heads):
            name = f"L{lay}H{h}"
            writes[name] = _nonzero(W(attn.W_O[h]), 0)
            for via in ("q", "k", "v"):
                reads[(name, via)] = _nonzero(W(getattr(attn, f"W_{via.upper()}")[h]), 1)
        mlp = model.blocks[lay].mlp
        writes[f"MLP{lay}"] = _nonzero(W(mlp.W_out), 0)
        reads[(f"MLP{lay}", "in")] = _nonzero(W(mlp.W_in), 1)
    reads[("logits", "direct")] = [labels.index(n) for n in out_labels]
    empty = sorted(n for n in writes if n not in ("embed", "pos_embed") and not writes[n])
    operation = {n: sorted({labels[i].split(":")[0] for i in idx}) for n, idx in writes.items() if idx}
    _, _, edges = graph(model)
    true_edges = []
    for w, r in edges:
        wn, (rn, via) = writer_name(w), reader_name(r)
        if set(writes[wn]) & set(reads[(rn, via)]):
            true_edges.append([wn, rn, via])
    # true nodes: writers with a true path to the logits
    feeds: dict[str, set] = {}
    for wn, rn, _ in true_edges:
        feeds.setdefault(wn, set()).add(rn)
    alive, changed = {"logits"}, True
    while changed:
        changed = False
        for wn, targets in feeds.items():
            if wn not in alive and targets & alive:
                alive.add(wn)
                changed = True
    nodes = sorted(n for n in alive if n != "logits")
    return dict(labels=labels, output_labels=out_labels, writes={n: [labels[i] for i in v] for n, v in writes.items()},
                reads={f"{n}.{via}": [labels[i] for i in v] for (n, via), v in reads.items()},
                operation=operation, empty=empty, edges=true_edges, nodes=nodes)  # fmt: skip


def check_against_tracr(assembled, model, vocab, max_len: int, numerical: bool, n: int = 64, seed: int = 0) -> dict:
    """Random inputs through Tracr and the converted model: the final residual stream and the decoded outputs
    agree (numerical: the values)."""
    rng = np.random.default_rng(seed)
    enc = assembled.input_encoder.encoding_map
    tokens = sorted(vocab, key=str)
    worst, agree = 0.0, 0
    for _ in range(n):
        length = int(rng.integers(1, max_len + 1))
        seq = ["BOS"] + [tokens[i] for i in rng.integers(0, len(tokens), size=length)]
        out = assembled.apply(seq)
        ids = torch.tensor([[enc[t] for t in seq]])
        with torch.no_grad():
            logits, cache = model.run_with_cache(ids)
        resid = cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"][0].numpy()
        worst = max(worst, float(np.abs(resid - np.asarray(out.transformer_output)[0]).max()))
        if numerical:
            agree += bool(np.allclose(logits[0, 1:, 0].numpy(), np.asarray(out.decoded[1:], dtype=float), atol=1e-4))
        else:
            order = sorted(assembled.output_encoder.encoding_map.items(), key=lambda kv: kv[1])
            decoded = [order[i][0] for i in logits[0, 1:].argmax(-1).tolist()]
            agree += decoded == list(out.decoded[1:])
    return dict(inputs=n, agree=agree, max_resid_diff=worst)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--only", nargs="+", default=None)
    args = parser.parse_args(argv)
    from tracr.compiler import compiling
    from tracr.rasp import rasp

    import headcoop as hc

    for name, (program, vocab, what) in programs().items():
        if args.only and name not in args.only:
            continue
        numerical = bool(rasp.is_numerical(program))
        assembled = compiling.compile_rasp_to_model(program, vocab=vocab, max_seq_len=MAX_LEN[name], compiler_bos="BOS")
        model, out_labels = convert(assembled, program.label, numerical)
        check = check_against_tracr(assembled, model, vocab, MAX_LEN[name], numerical)
        if check["agree"] != check["inputs"] or check["max_resid_diff"] > 1e-3:
            raise RuntimeError(f"{name}: the converted model does not reproduce Tracr: {check}")
        truth = ground_truth(model, list(assembled.residual_labels), out_labels)
        encoding = {str(k): int(v) for k, v in assembled.input_encoder.encoding_map.items()}
        target = args.out / name  # hc.save replaces only a folder holding a headcoop checkpoint and nothing else
        hc.save(model, target, metrics=check, tracr=dict(program=name, what=what, vocab=sorted(map(str, vocab)),
                max_seq_len=MAX_LEN[name], numerical=numerical, encoding=encoding, truth=truth))  # fmt: skip
        print(f"{name}: {model.cfg.n_layers} layers x {model.cfg.n_heads} heads, d_model {model.cfg.d_model}; "
              f"{check['agree']}/{check['inputs']} inputs agree with Tracr (max residual diff "
              f"{check['max_resid_diff']:.2g}); {len(truth['edges'])} true edges, {len(truth['nodes'])} true nodes, "
              f"{len(truth['empty'])} empty components -> {target}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
