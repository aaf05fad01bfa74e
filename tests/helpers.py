"""Helpers shared by several test files."""

import torch


def jiggle(model, scale=0.1, seed=1, skip=()):
    """Perturb every trainable weight (biases included) so a forgotten term cannot hide behind a zero."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name not in skip:
                p.add_(scale * torch.randn(p.shape, generator=g))
    return model
