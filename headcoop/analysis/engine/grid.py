"""The grid of a patching sweep: which cells (layer, position, head) a sweep of one component covers, in
what order, with what labels; shared by `hc.patch` (every cell, exactly) and `hc.attribute` (every cell
estimated, some verified exactly by the same sweep). One `normalized` helper maps a metric to the share of the
clean - corrupt gap for every result that reports one."""

from __future__ import annotations

import dataclasses

import torch
from jaxtyping import Int
from torch import Tensor

from headcoop.analysis.engine.inputs import check_layer, head_selection, task_symbols
from headcoop.analysis.vocabulary import RESID_COMPONENTS
from headcoop.models.tl import HookedTransformer


@dataclasses.dataclass
class PatchGrid:
    """Every patch of a sweep, flattened in the order of `dims` (layer outermost): `coords` {dim: indices},
    and per patch its `layer` [n_patches] (CPU), `head` and `pos` [n_patches] on the model's device (None where
    the component has no such axis, or positions="all")."""

    dims: tuple[str, ...]
    coords: dict[str, list[int]]
    layer: Tensor
    head: Tensor | None
    pos: Tensor | None

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(len(self.coords[d]) for d in self.dims)

    @classmethod
    def build(
        cls, component: str, positions: str, layers: list[int], heads: list[int], n_pos: int, device
    ) -> "PatchGrid":
        """The full grid of `component` over `layers` x `heads` (x positions, unless positions="all")."""
        if component in RESID_COMPONENTS:
            dims: tuple[str, ...] = ("layer",) if positions == "all" else ("layer", "pos")
        elif positions == "all":
            dims = ("layer", "head")
        else:
            dims = ("layer", "dest_pos" if component == "pattern" else "pos", "head")
        values = {"layer": layers, "head": heads, "pos": list(range(n_pos)), "dest_pos": list(range(n_pos))}
        coords = {d: values[d] for d in dims}
        mesh = torch.cartesian_prod(*[torch.tensor(coords[d]) for d in dims]).reshape(-1, len(dims))
        column = {d: mesh[:, i] for i, d in enumerate(dims)}
        pos = column.get("pos", column.get("dest_pos"))
        return cls(dims=dims, coords=coords, layer=column["layer"],
                   head=column["head"].to(device) if "head" in column else None,
                   pos=pos.to(device) if pos is not None else None)  # fmt: skip

    def take(self, index: Tensor) -> "PatchGrid":
        """The cells `index` (flat indices into this grid, in the order given) as a grid of the same dims."""
        return PatchGrid(dims=self.dims, coords=self.coords, layer=self.layer[index],
                         head=self.head[index.to(self.head.device)] if self.head is not None else None,
                         pos=self.pos[index.to(self.pos.device)] if self.pos is not None else None)  # fmt: skip


SMALL_GAP = 0.05  # a clean - corrupt gap under this share of the scale the values move on is warned about


def normalized(values, clean: float, corrupt: float):
    """(values - corrupt) / (clean - corrupt): 0 at the corrupt baseline, 1 at the clean one; ValueError when
    the two baselines are equal (there is no gap to share), a UserWarning when the gap is under `SMALL_GAP`
    of the scale the values move on (the largest of |clean|, |corrupt| and |value - corrupt|): the shares
    then mostly measure the gap."""
    gap = clean - corrupt
    if gap == 0:
        raise ValueError("clean and corrupt baselines are equal, so the gap cannot be normalised")
    out = (values - corrupt) / gap
    moved = float(torch.as_tensor(values - corrupt).abs().max()) if torch.as_tensor(values).numel() else 0.0
    scale = max(abs(clean), abs(corrupt), moved)
    if abs(gap) < SMALL_GAP * scale:
        import warnings

        shares = torch.as_tensor(out)
        shares = shares[torch.isfinite(shares)] if bool(torch.isfinite(shares).any()) else torch.zeros(1)
        warnings.warn(f"the clean - corrupt gap is {gap:.3g}, under {SMALL_GAP:.0%} of the scale the patched values "
                      f"move on ({scale:.3g}): the normalized effects (here {float(shares.min()):.2f} to "
                      f"{float(shares.max()):.2f}) divide by it and mostly measure the gap; read the raw values, "
                      "or choose clean and corrupt inputs whose metrics differ", UserWarning, stacklevel=3)  # fmt: skip
    return out


def select_cells(model: HookedTransformer, component: str, head, layer) -> tuple[list[int], list[int]]:
    """(layers, heads) a sweep covers: `head`/`layer` as `hc.patch` takes them, checked against the component."""
    if component in RESID_COMPONENTS and head is not None:
        raise ValueError(f"component {component!r} has no head axis; pass head=None (use layer= to pick a layer)")
    if component == "mlp_out" and (model.cfg.attn_only or not model.cfg.d_mlp):
        raise ValueError("component 'mlp_out' needs a model with MLPs; this one is attention-only")
    layer, picked = head_selection(model, head, layer)
    layers = list(range(model.cfg.n_layers)) if layer is None else [check_layer(model, layer)]
    n_kv = kv_heads(model)
    if component in RESID_COMPONENTS:
        heads = []
    elif component in ("k", "v") and n_kv != model.cfg.n_heads:
        heads = list(range(n_kv)) if picked is None else picked
        if max(heads) >= n_kv:
            raise IndexError(
                f"head {max(heads)} is out of range for component {component!r}: this grouped-query model has "
                f"key/value heads 0..{n_kv - 1} (each shared by {model.cfg.n_heads // n_kv} query heads)"
            )
    else:
        heads = list(range(model.cfg.n_heads)) if picked is None else picked
    return layers, heads


def kv_heads(model: HookedTransformer) -> int:
    """How many key/value heads the k and v hooks hold (fewer than n_heads in a grouped-query model)."""
    cfg = model.cfg
    if cfg.n_key_value_heads is None or getattr(cfg, "ungroup_grouped_query_attention", False):
        return cfg.n_heads
    return cfg.n_key_value_heads


def pos_labels(model: HookedTransformer, tokens: Int[Tensor, "batch pos"]) -> list[str]:
    """'p tok' where every row holds the task symbol tok at position p, else 'p'."""
    symbols = task_symbols(model)
    same = (tokens == tokens[:1]).all(0).tolist()
    first = tokens[0].tolist()
    return [f"{p} {symbols[first[p]]}" if symbols and same[p] else str(p) for p in range(tokens.shape[1])]


__all__ = ["PatchGrid", "normalized", "select_cells", "kv_heads", "pos_labels"]
