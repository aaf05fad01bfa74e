"""Data-free scores: what a bench must beat before it can separate the methods (issue 50). They read the weights
alone, no input: the weight product of an edge (the Frobenius norm of writer's output matrix times the reader's
input matrix, the reader's norm weight folded in: W_E, W_pos, a head's W_O or an MLP's W_out, times a head's
W_Q / W_K / W_V, an MLP's W_in or W_U), the weight norm of a node (a head's |W_V W_O|, an MLP's |W_in| |W_out|),
and a random score (seeded). On Tracr's compiled models every false edge has a zero weight product and every
component outside the truth zero weights, so these scores find the truth without running the model."""

from __future__ import annotations

import numpy as np
import torch

from headcoop.analysis.edges.graph import graph, reader_name, writer_name


def _writer_matrix(model, w) -> torch.Tensor:
    if w[0] == "embed":
        return model.W_E
    if w[0] == "pos_embed":
        return model.W_pos
    if w[0] == "head":
        return model.W_O[w[1], w[2]]
    return model.W_out[w[1]]


def _reader_matrix(model, r) -> torch.Tensor:
    def fold(norm, matrix):
        weight = getattr(norm, "w", None) if norm is not None else None
        return matrix if weight is None else weight[:, None] * matrix

    if r[0] == "head":
        matrix = {"q": model.W_Q, "k": model.W_K, "v": model.W_V}[r[3]][r[1], r[2]]
        return fold(getattr(model.blocks[r[1]], "ln1", None), matrix)
    if r[0] == "mlp":
        return fold(getattr(model.blocks[r[1]], "ln2", None), model.W_in[r[1]])
    return fold(getattr(model, "ln_final", None), model.W_U)


@torch.no_grad()
def weight_product(model) -> dict[tuple[str, str, str], float]:
    """{(writer, reader, via): |W_writer W_reader|_F} over every edge of `hc.edges`' graph."""
    _, _, edges = graph(model)
    return {(writer_name(w), *reader_name(r)): float(torch.linalg.matrix_norm(_writer_matrix(model, w) @ _reader_matrix(model, r)))
            for w, r in edges}  # fmt: skip


@torch.no_grad()
def weight_norm(model) -> dict[str, float]:
    """{node: its weight norm}: a head's |W_V W_O|_F, an MLP's |W_in|_F |W_out|_F."""
    out = {}
    for layer in range(model.cfg.n_layers):
        for h in range(model.cfg.n_heads):
            out[f"L{layer}H{h}"] = float(torch.linalg.matrix_norm(model.W_V[layer, h] @ model.W_O[layer, h]))
        if not model.cfg.attn_only:
            out[f"MLP{layer}"] = float(
                torch.linalg.matrix_norm(model.W_in[layer]) * torch.linalg.matrix_norm(model.W_out[layer])
            )
    return out


def random_auc(truth: list[bool], draws: int = 200, seed: int = 0) -> tuple[float, float, float]:
    """The ROC AUC of a random score against `truth`: (mean, 5th, 95th percentile) over `draws` seeded draws."""
    from sklearn.metrics import roc_auc_score

    truth = np.asarray(truth, bool)
    if truth.all() or not truth.any():
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    values = [roc_auc_score(truth, rng.random(len(truth))) for _ in range(draws)]
    return float(np.mean(values)), float(np.percentile(values, 5)), float(np.percentile(values, 95))
