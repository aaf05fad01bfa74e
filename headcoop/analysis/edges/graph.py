"""The residual graph of a model: its writers (embeddings, heads, MLPs), its readers (each head's q/k/v input, a
key/value head's k/v input in a grouped-query model, each MLP's input, the logits) and the edges between them,
named as MIB and EAP-IG name them."""

from __future__ import annotations

import functools

from torch import Tensor

from headcoop.analysis.vocabulary import head_name
from headcoop.models.bridge import head_weight, is_bridge
from headcoop.models.tl import HookedTransformer

Writer = tuple  # ("embed",) | ("pos_embed",) | ("head", layer, head) | ("mlp", layer)
Reader = tuple  # ("head", layer, head, via) | ("kv", layer, kv_head, via) | ("mlp", layer) | ("logits",)
ATTN_READERS = ("head", "kv")  # a head's q/k/v input; "kv": the k or v input of a key/value head (grouped-query)


# --- the graph ------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=65536)
def writer_name(w: Writer) -> str:
    return {"embed": "embed", "pos_embed": "pos_embed"}.get(w[0]) or (
        head_name(w[1], w[2]) if w[0] == "head" else f"MLP{w[1]}"
    )


@functools.lru_cache(maxsize=65536)
def reader_name(r: Reader) -> tuple[str, str]:
    """(reader, via): ("L1H2", "q"), ("MLP1", "in"), ("logits", "direct")."""
    if r[0] == "head":
        return head_name(r[1], r[2]), r[3]
    if r[0] == "kv":
        return f"L{r[1]}KV{r[2]}", r[3]
    return (f"MLP{r[1]}", "in") if r[0] == "mlp" else ("logits", "direct")


def forward_order(node: tuple, n_layers: int) -> int:
    """Position in the forward pass: embeddings first, then per layer its heads, then its MLP, then the logits."""
    kind = node[0]
    if kind in ("embed", "pos_embed"):
        return -1
    if kind in ATTN_READERS:
        return 2 * node[1]
    return 2 * node[1] + 1 if kind == "mlp" else 2 * n_layers


def has_mlp(model) -> bool:
    return not model.cfg.attn_only and bool(model.cfg.d_mlp)


def graph(model: HookedTransformer) -> tuple[list[Writer], list[Reader], list[tuple[Writer, Reader]]]:
    """Every writer, every reader and every edge (writer before reader) of the model, in forward order (built
    once per shape: `_graph`; fresh lists each call)."""
    cfg = model.cfg
    shape = (cfg.n_layers, cfg.n_heads, n_kv(model), kv_kind(model), has_mlp(model),
             cfg.positional_embedding_type == "standard")  # fmt: skip
    writers, readers, edges = _graph(*shape)
    return list(writers), list(readers), list(edges)


@functools.lru_cache(maxsize=32)
def _graph(n_layers: int, n_heads: int, kv_heads: int, kv: str, mlp: bool, positional: bool) -> tuple:
    writers: list[Writer] = [("embed",)]
    if positional:
        writers.append(("pos_embed",))
    readers: list[Reader] = []
    for lay in range(n_layers):
        writers += [("head", lay, h) for h in range(n_heads)]
        readers += [("head", lay, h, "q") for h in range(n_heads)]
        readers += [(kv, lay, g, v) for g in range(kv_heads) for v in ("k", "v")]
        if mlp:
            writers.append(("mlp", lay))
            readers.append(("mlp", lay))
    readers.append(("logits",))
    edges = [(w, r) for r in readers for w in writers if forward_order(w, n_layers) < forward_order(r, n_layers)]
    return tuple(writers), tuple(readers), tuple(edges)


def grouped(model) -> bool:
    kv = model.cfg.n_key_value_heads
    return kv is not None and kv != model.cfg.n_heads


def n_kv(model) -> int:
    return model.cfg.n_key_value_heads if grouped(model) else model.cfg.n_heads


def kv_kind(model) -> str:
    """Grouped-query models read k and v per key/value head ("kv", shared by several query heads: one reader)."""
    return "kv" if grouped(model) else "head"


def qkv_weights(model, layer: int, via: str, index: int) -> tuple[Tensor, Tensor]:
    """(W [d_model, d_head], b [d_head]) of head `index`'s q, k or v in `layer`; a grouped-query model's k
    and v by key/value head (TransformerLens's `_W_K`, `_b_K`; on a Bridge, `head_weight` of the first query
    head of that key/value group)."""
    attn = model.blocks[layer].attn
    kv = grouped(model) and via in ("k", "v")
    if is_bridge(model):
        at = index * (model.cfg.n_heads // n_kv(model)) if kv else index
        return head_weight(attn, f"W_{via.upper()}", model.cfg)[at], head_weight(attn, f"b_{via.upper()}", model.cfg)[
            at
        ]
    prefix = "_" if kv else ""
    return getattr(attn, f"{prefix}W_{via.upper()}")[index], getattr(attn, f"{prefix}b_{via.upper()}")[index]


def check_edge_model(model: HookedTransformer) -> None:
    """The model shapes `hc.edges` supports; a clear error for the others."""
    cfg = model.cfg
    if cfg.parallel_attn_mlp:
        raise ValueError(
            "hc.edges needs sequential blocks (attention, then the MLP); this model has parallel_attn_mlp=True"
        )
    if has_mlp(model) and cfg.act_fn in ("solu_ln",):
        raise ValueError("hc.edges does not support SoLU-LN MLPs (their hook_pre is not the MLP's only input)")
