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


# --- a model headcoop never trained, with a tokenizer and prompts of its own ----------------------------
WORDS = ["<pad>", "when", "and", "gave", "sat", "a", "the", "cat", "dog", "mat", "to", "John", "Mary", "Tom", "Ann"]


def tiny_tokenizer():
    """A real Hugging Face fast tokenizer (word level, whitespace split) built locally: no download."""
    from headcoop.storage.foreign import word_tokenizer

    return word_tokenizer(WORDS)


def attn_only_2l_like(seed: int = 0, **changes):
    """A model of attn-only-2l's shape (LayerNorm, shortformer positions, two attention-only layers) at toy
    width, with random weights and non-trivial norm weights and biases."""
    import warnings

    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = dict(n_layers=2, d_model=32, d_head=8, n_heads=4, n_ctx=16, d_vocab=len(WORDS), attn_only=True,
               normalization_type="LN", positional_embedding_type="shortformer", seed=seed)  # fmt: skip
    cfg.update(changes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        model = HookedTransformer(HookedTransformerConfig(**cfg))
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "b_" in name or name.endswith((".b", ".w")):
                param.add_(0.3 * torch.randn(param.shape, generator=gen))
    return model.eval()


def name_prompts():
    """(clean, corrupt, answer, wrong, labels): 'when A and B gave the cat to' -> B, corrupt swaps A and B."""
    import itertools

    clean, corrupt, answer, wrong, labels = [], [], [], [], []
    for (a, b), verb, obj in itertools.product(itertools.permutations(["John", "Mary", "Tom"], 2), ["gave", "sat"],
                                               ["cat", "dog"]):  # fmt: skip
        clean.append(f"when {a} and {b} {verb} the {obj} to")
        corrupt.append(f"when {b} and {a} {verb} the {obj} to")
        answer.append(b)
        wrong.append(a)
        labels.append(int(a == "John"))
    return clean, corrupt, answer, wrong, labels
