"""Ground truth for the pair map at scale: a random network (12 layers x 12 heads, d_model 768 by default, with
MLPs, no norm) with four planted pairs whose interaction is known by construction.

The inputs: position 0 a start token, position 1 a "name" (one of K name tokens, K = `names`), then random
tokens; the answer at the last position is the name's own answer token (wrong: another name's answer), so the
logit difference is x.(u_k - u_k') for the residual x and the answers' unembedding directions u. Every
planted head attends to position 1 (its query a constant, its key that position's tag), reads which name is
there (K orthonormal name directions) and writes that name's direction of one family (K orthonormal
directions per family). A replaced head (mean: the average over names, small in each direction; resample:
another name's direction, orthogonal to this one's) leaves the other head's signal alone, as in a model
whose heads move one of many names. Planted (layer, head), each with its own family of directions:

- backups B1, B2 (L4H0, L4H5): each writes 2c r_k; one ReLU pair of layer 5's MLP per name writes
  clip(x.r_k, 0, c) u_k: either head alone saturates it (redundant: I = -c);
- conjunction C1, C2 (L2H3, L2H8): each writes 2c q_k; one ReLU neuron of layer 3's MLP per name writes
  relu(x.q_k - 3c) u_k: only both together reach it (I = +c);
- a suppressor against a mover M, S (L7H2, L9H4): M writes m (u_k + mu_k); S reads mu_k at position 1 and
  writes -m u_k / 2 (removing S helps, removing M hurts, and without M, S has nothing to suppress: I = -m/2);
- composition X, Y (L1H6, L6H9): X writes nu_k at position 1; Y reads nu_k there and writes y u_k (Y's
  effect runs through X: I = +y).

The rest of the network is TransformerLens's random initialisation scaled by `noise` (the random heads' and
neurons' writes stay small beside the planted ones). `truths(model, batch, reference)` checks each planted
pair's interaction with plain `hook_z` hooks (mean ablation), no headcoop code.
"""

from __future__ import annotations

import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

import headcoop as hc

PLANTED = {  # pair -> the word hc.cooperation should give it, and the sign of its interaction I
    ("L4H0", "L4H5"): ("redundant", -1),
    ("L2H3", "L2H8"): ("conjunction", +1),
    ("L7H2", "L9H4"): ("competition", -1),
    ("L1H6", "L6H9"): ("composition", +1),
}
C, M, Y = 4.0, 4.0, 4.0  # the planted writes' sizes, in logit-difference units
FAMILIES = 6  # name directions and the families r, q, mu, nu, u


def _head(model: HookedTransformer, name: str, read: torch.Tensor, write: torch.Tensor, tag: torch.Tensor,
          sharp: float = 60.0) -> None:  # fmt: skip
    """Plant head `name`: attend to the position carrying `tag`, read the K directions `read` [K, d_model]
    there (z dimension k), write `write` [K, d_model] (dimension k writes row k)."""
    layer, head = (int(part) for part in name[1:].split("H"))
    attn = model.blocks[layer].attn
    d_head, names = attn.W_Q.shape[-1], len(read)
    with torch.no_grad():
        for weight in (attn.W_Q, attn.W_K, attn.W_V, attn.W_O, attn.b_Q, attn.b_K, attn.b_V):
            weight[head].zero_()
        attn.b_Q[head, 0] = sharp * d_head**0.5  # a constant query: the score is sharp x (x . tag)
        attn.W_K[head][:, 0] = tag
        attn.W_V[head][:, :names] = read.T
        attn.W_O[head][:names] = write


def _neurons(model: HookedTransformer, layer: int, first: int, read: torch.Tensor, write: torch.Tensor,
             bias: float, sign: float = 1.0) -> None:  # fmt: skip
    """Plant neurons first..first+K-1 of layer's MLP: neuron k = relu(x.read[k] + bias), written along
    sign x write[k]."""
    mlp = model.blocks[layer].mlp
    names = len(read)
    with torch.no_grad():
        mlp.W_in[:, first : first + names] = read.T
        mlp.b_in[first : first + names] = bias
        mlp.W_out[first : first + names] = sign * write


def build(n_layers: int = 12, n_heads: int = 12, d_model: int = 768, d_head: int = 64, d_mlp: int = 3072,
          d_vocab: int = 1000, n_ctx: int = 16, names: int = 32, noise: float = 0.25, seed: int = 0) -> HookedTransformer:  # fmt: skip
    """The planted model (module docstring); `noise` scales TransformerLens's random initialisation."""
    if n_layers < 10 or n_heads < 10:
        raise ValueError(f"the planted pairs use layers 1..9 and heads 0..9: n_layers and n_heads must be >= 10, "
                         f"got {n_layers} and {n_heads}")  # fmt: skip
    if not 2 <= names <= min(d_head, (d_model - 1) // FAMILIES, (d_vocab - 5) // 2, d_mlp // 3):
        raise ValueError(f"names must be in 2..min(d_head, (d_model - 1) / {FAMILIES}, (d_vocab - 5) / 2, d_mlp / 3), "
                         f"got {names}")  # fmt: skip
    cfg = HookedTransformerConfig(n_layers=n_layers, n_heads=n_heads, d_model=d_model, d_head=d_head, d_mlp=d_mlp,
                                  d_vocab=d_vocab, n_ctx=n_ctx, act_fn="relu", normalization_type=None,
                                  initializer_range=noise * 0.8 / d_model**0.5, seed=seed)  # fmt: skip
    model = HookedTransformer(cfg).eval()
    model.planted_names = names
    gen = torch.Generator().manual_seed(seed + 1)
    basis, _ = torch.linalg.qr(torch.randn(d_model, FAMILIES * names + 1, generator=gen))
    name_dir, u, r, q, mu, nu = (basis[:, f * names : (f + 1) * names].T for f in range(FAMILIES))
    pos_tag = basis[:, -1]
    with torch.no_grad():
        model.W_E[1 : 1 + names] = name_dir
        model.W_pos[1] += pos_tag
        model.W_U[:, 1 + names : 1 + 2 * names] = u.T
    _head(model, "L4H0", name_dir, 2 * C * r, pos_tag)
    _head(model, "L4H5", name_dir, 2 * C * r, pos_tag)
    _neurons(model, 5, 0, r, u, bias=0.0)  # clip(t, 0, c) = relu(t) - relu(t - c)
    _neurons(model, 5, names, r, u, bias=-C, sign=-1.0)
    _head(model, "L2H3", name_dir, 2 * C * q, pos_tag)
    _head(model, "L2H8", name_dir, 2 * C * q, pos_tag)
    _neurons(model, 3, 0, q, u, bias=-3 * C)  # relu(t - 3c)
    _head(model, "L7H2", name_dir, M * (u + mu), pos_tag)
    _head(model, "L9H4", mu, -0.5 * u, pos_tag)
    _head(model, "L1H6", name_dir, nu, pos_tag)
    _head(model, "L6H9", nu, Y * u, pos_tag)
    return model


def inputs(model: HookedTransformer, n: int = 16, seed: int = 0) -> hc.Batch:
    """n inputs: name k = i mod K at position 1 (a seeded shuffle), random tokens after it from the tokens no
    name or answer uses; answer: the name's answer token, wrong: the next name's."""
    names = model.planted_names
    gen = torch.Generator().manual_seed(seed)
    width = model.cfg.n_ctx
    tokens = torch.randint(1 + 2 * names, model.cfg.d_vocab, (n, width), generator=gen)
    tokens[:, 0] = 0
    k = torch.arange(n) % names
    k = k[torch.randperm(n, generator=gen)]
    tokens[:, 1] = 1 + k
    answer = 1 + names + k
    wrong = 1 + names + (k + 1) % names
    return hc.Batch.from_answers(tokens, answer, wrong)


def truths(model: HookedTransformer, batch: hc.Batch, reference: hc.Batch) -> dict:
    """Each planted pair's effects and interaction under mean ablation, by plain hook_z hooks:
    {pair: {"effect_a", "effect_b", "pair", "interaction"}} (logit difference, mean over the inputs)."""
    names = sorted({head for pair in PLANTED for head in pair})
    layers = sorted({int(h[1:].split("H")[0]) for h in names})
    _, cache = model.run_with_cache(reference.tokens, names_filter=lambda name: name.endswith("hook_z"))
    means = {lay: cache[f"blocks.{lay}.attn.hook_z"].mean(0) for lay in layers}
    rows = torch.arange(len(batch.tokens))

    def value(off: list[str]) -> float:
        hooks = []
        for name in off:
            lay, head = (int(part) for part in name[1:].split("H"))

            def hook(z, hook=None, lay=lay, head=head):
                z[:, :, head] = means[lay][None, :, head]
                return z

            hooks.append((f"blocks.{lay}.attn.hook_z", hook))
        with torch.no_grad():
            logits = model.run_with_hooks(batch.tokens, fwd_hooks=hooks)[rows, -1]
        return float((logits[rows, batch.answer] - logits[rows, batch.wrong]).double().mean())

    full = value([])
    out = {}
    for a, b in PLANTED:
        ea, eb, both = value([a]) - full, value([b]) - full, value([a, b]) - full
        out[(a, b)] = dict(effect_a=ea, effect_b=eb, pair=both, interaction=both - ea - eb)
    return out
