"""A two-layer attention-only transformer trained on sequences of repeated random tokens (BOS, random tokens in
which a segment of random length is repeated at once): the task the literature solves with a previous-token head in layer 0 feeding an
induction head in layer 1 through K-composition (Olsson et al. 2022, "In-context learning and induction heads").

The truth is read off the trained model by the literature's own tests, not assumed: the previous-token head is
the layer-0 head attending most to the position before (prefix score), the induction head the layer-1 head
attending most to the token after the current token's earlier occurrence (prefix-matching score), and its OV
circuit is checked to copy (the share of tokens whose own logit is the largest through embed -> OV -> unembed).
The true edges: the positional embedding into the previous-token head's q and k, the token embedding into its v,
its output into the induction head's k, the token embedding into the induction head's q and v, the induction
head into the logits.

    python -m experiments.groundtruth.induction
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
CHECKPOINTS = HERE / "checkpoints"
VOCAB, HALF, SEED = 24, 8, 0  # tokens 1..VOCAB-1 drawn, 0 is BOS; HALF tokens, repeated once


SHORTEST = 3  # the shortest repeated segment


def sequences(n: int, gen: torch.Generator, repeated: bool = True) -> torch.Tensor:
    """[n, 1 + 2 * HALF]: BOS, then random tokens in which a segment of random length L (SHORTEST..HALF) is
    repeated at once (positions 1..L again at L+1..2L; fresh tokens after), or, repeated=False, no repeat. The
    period varies, so no head can find the earlier occurrence by position alone (with a fixed period, layer-0 heads
    did: prefix-matching 0.86 with previous-token scores under 0.1)."""
    tokens = torch.randint(1, VOCAB, (n, 2 * HALF), generator=gen)
    if repeated:
        lengths = torch.randint(SHORTEST, HALF + 1, (n,), generator=gen)
        for i, length in enumerate(lengths.tolist()):
            tokens[i, length:2 * length] = tokens[i, :length]
    return torch.cat([torch.zeros(n, 1, dtype=torch.long), tokens], 1)


def periods(tokens: torch.Tensor) -> torch.Tensor:
    """[batch]: each sequence's repeated segment length L (0 where none repeats; the shortest that does)."""
    out = torch.zeros(len(tokens), dtype=torch.long)
    for length in range(HALF, SHORTEST - 1, -1):
        match = (tokens[:, 1 + length:1 + 2 * length] == tokens[:, 1:1 + length]).all(1)
        out[match] = length
    return out


def determined(tokens: torch.Tensor) -> torch.Tensor:
    """[batch, pos]: True where the next token is fixed by the repeat (positions L+1 .. 2L-1, predicting the
    tokens L+2 .. 2L)."""
    pos = torch.arange(tokens.shape[1])[None, :]
    length = periods(tokens)[:, None]
    return (length > 0) & (pos >= length + 1) & (pos <= 2 * length - 1)


def model(seed: int = SEED):
    from transformer_lens import HookedTransformerConfig

    from headcoop.tl import HookedTransformer

    cfg = HookedTransformerConfig(n_layers=2, n_heads=2, d_model=64, d_head=16, d_vocab=VOCAB, n_ctx=1 + 2 * HALF,
                                  attn_only=True, normalization_type="LN", act_fn="relu", seed=seed)  # fmt: skip
    return HookedTransformer(cfg)


def scores(m, n: int = 512, seed: int = 1) -> dict:
    """The literature's checks on held-out repeated sequences: each head's previous-token score (mean attention
    to the position before), prefix-matching score (attention from a second-half token to the position after its
    first occurrence), the induction head's copying score, and the accuracy on the second half."""
    gen = torch.Generator().manual_seed(seed)
    tokens = sequences(n, gen)
    with torch.no_grad():
        logits, cache = m.run_with_cache(tokens)
    out = {}
    pos = torch.arange(1, tokens.shape[1])
    where = determined(tokens)  # [batch, pos]: queries inside the repeat
    rows, queries = torch.nonzero(where, as_tuple=True)
    keys = queries - periods(tokens)[rows] + 1  # the token after the earlier occurrence
    for layer in range(2):
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"]  # [batch, head, q, k]
        for h in range(2):
            out[f"L{layer}H{h}"] = dict(
                previous_token=float(pattern[:, h, pos, pos - 1].mean()),
                prefix_matching=float(pattern[rows, h, queries, keys].mean()))  # fmt: skip
    predicted = logits[:, :-1].argmax(-1)
    out["second_half_accuracy"] = float((predicted == tokens[:, 1:])[where[:, :-1]].float().mean())
    return out


def copying(m, head: tuple[int, int]) -> float:
    """The share of tokens whose own logit is the largest through embed -> the head's OV -> unembed."""
    layer, h = head
    with torch.no_grad():
        ov = m.W_E @ m.W_V[layer, h] @ m.W_O[layer, h] @ m.W_U  # [vocab, vocab]
        return float((ov[1:, 1:].argmax(-1) == torch.arange(VOCAB - 1)).float().mean())


def truth_of(checks: dict) -> dict:
    prev = max(("L0H0", "L0H1"), key=lambda h: checks[h]["previous_token"])
    ind = max(("L1H0", "L1H1"), key=lambda h: checks[h]["prefix_matching"])
    edges = [["pos_embed", prev, "q"], ["pos_embed", prev, "k"], ["embed", prev, "v"], [prev, ind, "k"],
             ["embed", ind, "q"], ["embed", ind, "v"], [ind, "logits", "direct"]]  # fmt: skip
    return dict(nodes=sorted({prev, ind, "embed", "pos_embed"}), edges=edges, previous_token_head=prev,
                induction_head=ind, empty=[])  # fmt: skip


def train(steps: int = 3000, batch: int = 128, lr: float = 1e-3, seed: int = SEED, log=print):
    torch.manual_seed(seed)
    m = model(seed)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=0.01)
    started = time.perf_counter()
    history = []
    for step in range(steps):
        tokens = sequences(batch, gen)
        logits = m(tokens)
        where = determined(tokens)[:, :-1]  # every next-token prediction the repeat determines
        loss = F.cross_entropy(logits[:, :-1][where], tokens[:, 1:][where])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 250 == 0 or step == steps - 1:
            history.append(dict(step=step, loss=float(loss.detach())))
            log(f"[induction] step {step}: loss {float(loss.detach()):.4f}")
    record = dict(steps=steps, batch=batch, lr=lr, seed=seed, seconds=round(time.perf_counter() - started, 1),
                  history=history, vocab=VOCAB, half=HALF)  # fmt: skip
    return m, record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--out", type=Path, default=CHECKPOINTS / "induction")
    args = parser.parse_args(argv)
    import headcoop as hc

    m, record = train(args.steps)
    checks = scores(m)
    truth = truth_of(checks)
    checks["copying"] = copying(m, (1, int(truth["induction_head"][-1])))
    print(f"[induction] {checks}\n{truth}", flush=True)
    hc.save(m, args.out, metrics=checks, groundtruth=dict(kind="induction", truth=truth, training=record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
