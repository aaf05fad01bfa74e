"""The committed Tracr checkpoints (`build.py` wrote them) and what an analysis of them needs: the model with its
ground truth, clean and corrupt inputs, and a metric. Needs no jax."""

from __future__ import annotations

from pathlib import Path

import torch

import headcoop as hc

HERE = Path(__file__).resolve().parent
CHECKPOINTS = HERE / "checkpoints"
NAMES = ("reverse", "hist", "sort_unique", "shuffle_dyck", "xproportion")


def load(name: str):
    """(model, info): info is the `tracr` metadata build.py saved (program, vocab, encoding, truth, ...)."""
    if name not in NAMES:
        raise ValueError(f"unknown Tracr program {name!r}; known: {', '.join(NAMES)}")
    model = hc.load(CHECKPOINTS / name)
    return model, model.checkpoint_meta["tracr"]


def inputs(info: dict, n: int = 64, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """n clean and n corrupt token sequences [n, max_seq_len + 1]: BOS, then tokens drawn uniformly from the
    vocabulary (full length), the corrupt ones drawn independently."""
    enc, vocab, length = info["encoding"], info["vocab"], info["max_seq_len"]
    ids = torch.tensor([enc[v] for v in vocab])
    gen = torch.Generator().manual_seed(seed)

    def draw() -> torch.Tensor:
        body = ids[torch.randint(len(ids), (n, length), generator=gen)]
        return torch.cat([torch.full((n, 1), enc["BOS"]), body], 1)

    return draw(), draw()


def metric_for(model, info: dict, clean: torch.Tensor):
    """A metric differentiable in the logits, on every position after BOS: categorical outputs, the clean
    answer's logit minus the mean logit (the answer read off the clean run); numerical outputs, the value."""
    if info["numerical"]:
        return lambda logits: logits[:, 1:, 0].mean()
    with torch.no_grad():
        answer = model(clean)[:, 1:].argmax(-1)  # [batch, pos]

    def metric(logits):
        body = logits[:, 1:]
        picked = body.gather(-1, answer[..., None])[..., 0]
        return (picked - body.mean(-1)).mean()

    return metric
