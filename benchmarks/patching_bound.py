"""How fast can exact by-position patching be? A count of multiply-adds per patch: TransformerLens's
by-position sweep (one full forward pass per patch) against the least an exact method must compute, for
each shape of `patching_shapes.py` (issue 12's speed suite).

    python benchmarks/patching_bound.py

The least exact work, per patch of head h in layer l at position p, read at the last position: whatever
cannot be taken from the target run's cache. A z, q or pattern patch changes z at row p only; a k or v
patch changes it at rows p.. . The rows whose residual stream changed are then

- layer l: the patched head's W_O at the changed rows and the MLP at those rows;
- the first later layer: queries, keys and values at the changed rows only (every other row's input is
  unchanged), W_O and the MLP at every row from p on (their attention now sees a changed key);
- each later layer: queries, keys and values, W_O and the MLP at rows p..;
- the last layer: keys and values at the changed rows, and the query, W_O, MLP and unembedding at the
  read row only.

Attention scores, softmax, norms and embeddings are left out of both sides (they are small here), which
favours neither side much. The ratio is an upper bound on any exact method's speed-up that computes in
the same precision with kernels as efficient as TransformerLens's full-width matrix products.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    n_layers: int
    d_model: int
    n_heads: int
    d_head: int
    d_mlp: int  # 0: attention-only
    d_vocab_out: int
    n_pos: int

    @property
    def q(self) -> int:  # per row, all heads
        return self.d_model * self.n_heads * self.d_head

    @property
    def kv(self) -> int:
        return 2 * self.d_model * self.n_heads * self.d_head

    @property
    def w_o(self) -> int:
        return self.n_heads * self.d_head * self.d_model

    @property
    def mlp(self) -> int:
        return 2 * self.d_model * self.d_mlp

    @property
    def unembed(self) -> int:
        return self.d_model * self.d_vocab_out


SHAPES = {
    "count01 (shipped, 1 layer)": Shape(1, 32, 16, 2, 0, 8, 22),
    "2-layer attn-only": Shape(2, 32, 4, 8, 0, 50, 16),
    "attn-only-2l shape + tokenizer": Shape(2, 64, 4, 16, 0, 15, 16),
    "gelu-2l shape (d_model 64)": Shape(2, 64, 4, 16, 256, 50, 16),
    "4-layer d_model 256 + MLPs": Shape(4, 256, 8, 32, 1024, 200, 16),
}


def transformer_lens(s: Shape) -> int:
    """One full forward pass: every layer at every row, then the unembedding of every row."""
    return s.n_layers * s.n_pos * (s.q + s.kv + s.w_o + s.mlp) + s.n_pos * s.unembed


def least_exact(s: Shape, layer: int, p: int, rows_changed_in_layer: int) -> int:
    """Multiply-adds an exact method cannot avoid for one patch (module docstring)."""
    last, read = s.n_layers - 1, s.n_pos - 1
    changed = rows_changed_in_layer
    per_head_w_o = s.d_head * s.d_model
    work = changed * per_head_w_o
    if layer == last:  # only the read row's MLP and logits
        return (per_head_w_o if read >= p else 0) + s.mlp + s.unembed
    work += changed * s.mlp
    tail = s.n_pos - p  # rows p.. change from the first later layer on
    for m in range(layer + 1, s.n_layers):
        inputs_changed = changed if m == layer + 1 else tail
        if m == last:
            work += inputs_changed * s.kv + s.q + s.w_o + s.mlp + s.unembed
        else:
            work += inputs_changed * (s.q + s.kv) + tail * (s.w_o + s.mlp)
    return work


def sweep_ratio(s: Shape, component: str) -> float:
    total_tl = total_least = 0
    for layer in range(s.n_layers):
        for p in range(s.n_pos):
            changed = 1 if component in ("z", "q", "pattern") else s.n_pos - p
            total_tl += transformer_lens(s)
            total_least += least_exact(s, layer, p, changed)
    return total_tl / total_least


def main() -> None:
    print(f"{'shape':32s} {'z/q/pattern each':>17s} {'k/v each':>9s}")
    for name, shape in SHAPES.items():
        print(f"{name:32s} {sweep_ratio(shape, 'z'):16.1f}x {sweep_ratio(shape, 'v'):8.1f}x")


if __name__ == "__main__":
    main()
