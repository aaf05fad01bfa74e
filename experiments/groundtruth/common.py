"""The dense ground-truth bench's committed models (`siit.py` and `induction.py` wrote them to `gated/`) and what
an analysis needs: the model with its truth, clean and corrupt inputs, a metric, and which true edges the inputs can
show. Needs no jax."""

from __future__ import annotations

from pathlib import Path

import torch

import headcoop as hc

HERE = Path(__file__).resolve().parent
GATED = HERE / "gated"  # NAME where the model passed its gate, NAME.unpassed where it did not
SIIT = ("reverse", "hist", "sort_unique", "shuffle_dyck", "xproportion")
NAMES = SIIT + ("induction",)
CONTRASTS = ("same length", "designed")


def load(name: str):
    """(model, spec): spec holds the truth ({"nodes", "edges", "empty"}), the kind ("siit" or "induction"), the
    training record, whether the model passed its gate (`passed`; a model that did not is read from
    `NAME.unpassed`) and, for a SIIT model, the Tracr program's metadata."""
    if name not in NAMES:
        raise ValueError(f"unknown ground-truth model {name!r}; known: {', '.join(NAMES)}")
    folder = GATED / name
    if not folder.exists():
        folder = GATED / f"{name}.unpassed"
    if not folder.exists():
        raise FileNotFoundError(
            f"no model of {name!r} in {GATED} (neither {name} nor {name}.unpassed); train it with "
            f"python -m experiments.groundtruth.{'induction' if name == 'induction' else 'siit --programs ' + name}"
        )
    model = hc.load(folder)
    model.eval()
    spec = dict(model.checkpoint_meta["groundtruth"])
    spec["passed"] = not folder.name.endswith(".unpassed")
    if spec["kind"] == "siit":
        spec["truth"] = spec["tracr"]["truth"]
    return model, spec


def inputs(spec: dict, n: int = 64, seed: int = 0, contrast: str = "designed") -> tuple[torch.Tensor, torch.Tensor]:
    """n clean and n corrupt inputs. SIIT models: "same length" draws both at the longest length of the program's domain
    (the Tracr bench's contrast); "designed" draws half the pairs at one shared random length and half with independent lengths (pads
    after the tokens), so that every operation computed from the length moves too. Induction: clean sequences are
    repeated random tokens; "same length" corrupts draw fresh ones, "designed" corrupts are repeated sequences of
    other tokens for half the pairs and unrepeated for the other half."""
    if contrast not in CONTRASTS:
        raise ValueError(f"contrast must be one of {CONTRASTS}, got {contrast!r}")
    gen = torch.Generator().manual_seed(seed)
    if spec["kind"] == "induction":
        from experiments.groundtruth.induction import sequences

        clean = sequences(n, gen)
        if contrast == "same length":
            return clean, sequences(n, gen, repeated=False)
        half = n // 2
        return clean, torch.cat([sequences(half, gen), sequences(n - half, gen, repeated=False)])
    from experiments.groundtruth.siit import draw, longest

    info = spec["tracr"]
    full = longest(info)
    if contrast == "same length":
        lengths = torch.full((n,), full)
        return draw(info, n, gen, lengths)[0], draw(info, n, gen, lengths)[0]
    shared = torch.randint(1, full + 1, (n,), generator=gen)
    other = torch.randint(1, full + 1, (n,), generator=gen)
    other[: n // 2] = shared[: n // 2]
    return draw(info, n, gen, shared)[0], draw(info, n, gen, other)[0]


def metric_for(model, spec: dict, clean: torch.Tensor):
    """A metric differentiable in the logits, at the clean input's answer positions (SIIT: every token, not BOS,
    not a pad; induction: where the repeat fixes the next token): categorical, the clean answer's logit minus the mean logit (the answer
    read off the clean run); numerical, the output value."""
    if spec["kind"] == "induction":
        from experiments.groundtruth.induction import determined

        where = determined(clean)
    else:
        from experiments.groundtruth.siit import token_mask

        where = token_mask(clean, spec["tracr"])
    weight = where.float() / where.sum()
    if spec["kind"] == "siit" and spec["tracr"]["numerical"]:
        return lambda logits: (logits[..., 0] * weight).sum()
    with torch.no_grad():
        answer = model(clean).argmax(-1)  # [batch, pos]

    def metric(logits):
        picked = logits.gather(-1, answer[..., None])[..., 0]
        return ((picked - logits.mean(-1)) * weight).sum()

    return metric


CONSTANT = ("one", "tokens:BOS")  # Tracr's directions every input writes alike: a constant, the BOS marker


def read_labels(spec: dict, edge: tuple) -> list[str]:
    """The labelled directions a true edge carries (SIIT: what its writer writes and its reader reads; induction:
    the writer's name, as nothing is labelled)."""
    w, r, via = edge
    truth = spec["truth"]
    if spec["kind"] == "induction":
        return [w]
    return sorted(set(truth["writes"][w]) & set(truth["reads"][f"{r}.{via}"]))


def why_unshown(spec: dict, edge: tuple) -> str:
    """Why no contrast of inputs of one shape can show a true edge, where that follows from what it carries; ""
    where it does not (then the inputs are to blame)."""
    labels = read_labels(spec, edge)
    if edge[0] == "pos_embed" or all(x in CONSTANT or x.startswith("indices:") for x in labels):
        return (
            "it carries only " + ", ".join(labels) + ": the same in every input of one shape (a constant, the "
            "BOS marker at position 0, or a position), so an interchange cannot move it; zero ablation does"
        )
    return ""


def shown(spec: dict, clean: torch.Tensor, corrupt: torch.Tensor | None, how: str = "contrast") -> set:
    """The true edges these inputs can show. SIIT: read in the compiled program (the truth's own model, pads masked
    as Tracr masks them): the writer's output differs between clean and corrupt in a direction its reader reads
    (how="zero": the writer's clean output is non-zero there, what zero ablation removes). Induction (no labelled
    directions): the writer's output differs at all. The positional embedding is the same vector at a position in
    every input of one shape, so an edge it writes is never shown by a contrast."""
    from headcoop.analysis.edges.exact import writer_outputs
    from headcoop.analysis.edges.graph import graph, writer_name

    truth = spec["truth"]
    if spec["kind"] == "induction":
        model, _ = load("induction")
    else:
        from experiments.groundtruth.siit import pad_mask_hooks
        from experiments.tracr.common import load as load_tracr

        model, _ = load_tracr(spec["tracr"]["program"])
    pad = None if spec["kind"] == "induction" else spec["tracr"]["encoding"]["compiler_pad"]
    writers, _, _ = graph(model)
    outs = []
    for tokens in (clean, corrupt) if how == "contrast" else (clean,):
        hooks = [] if pad is None else pad_mask_hooks(tokens, pad, model.cfg.n_layers)
        with torch.no_grad(), model.hooks(fwd_hooks=hooks):
            _, cache = model.run_with_cache(tokens)
        outs.append({writer_name(w): o for w, o in writer_outputs(model, cache, writers).items()})
    delta = {w: (outs[0][w] - (outs[1][w] if how == "contrast" else 0)).abs().amax((0, 1)) for w in outs[0]}
    edges = set()
    for w, r, via in truth["edges"]:
        if spec["kind"] == "induction":
            dims = list(range(model.cfg.d_model))
        else:
            labels = truth["labels"]
            dims = [labels.index(x) for x in set(truth["writes"][w]) & set(truth["reads"][f"{r}.{via}"])]
        if dims and float(delta[w][dims].max()) > 1e-6:
            edges.add((w, r, via))
    return edges
