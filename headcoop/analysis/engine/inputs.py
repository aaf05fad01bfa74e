"""Input handling shared by every analysis: tokens from any form, range checks, head names."""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import ActivationCache

from headcoop.analysis.vocabulary import head_name
from headcoop.checks import check_choice  # noqa: F401  (analyses import it from here)
from headcoop.models.bridge import require_model  # noqa: F401  (the analyses import it from here)
from headcoop.models.tl import HookedTransformer
from headcoop.tasks import task_of  # noqa: F401  (one definition; the analyses import it from here)
from headcoop.tasks.base import Batch, Task


def require_task(model: HookedTransformer, what: str) -> Task:
    task = task_of(model)
    if task is None:
        raise ValueError(
            f"this model carries no headcoop task, so {what} has no default; pass it explicitly "
            "(or build the model with hc.Count01().model(...) / load it with hc.load)"
        )
    return task


def model_device(model: HookedTransformer) -> torch.device:
    return next(model.parameters()).device


def as_tokens(model: HookedTransformer, tokens) -> Int[Tensor, "batch pos"]:
    """A [batch, pos] LongTensor on the model's device from a Batch, a text (or list of texts,
    encoded by the model's task), or a [pos] / [batch, pos] tensor or nested list of ids.

    ValueError for ids outside the model's vocabulary or texts with unknown symbols.
    """
    require_model(model)
    if isinstance(tokens, Batch):
        out = model.cfg.d_vocab_out if (model.cfg.d_vocab_out or -1) > 0 else model.cfg.d_vocab
        for name in ("answer", "wrong"):
            ids = getattr(tokens, name)
            bad = ids[(ids < 0) | (ids >= out)].tolist()
            if bad:
                raise ValueError(
                    f"the batch's {name} ids {bad[:5]} are outside the model's output vocabulary 0..{out - 1}"
                )
        tokens = tokens.tokens
    elif isinstance(tokens, str) or (isinstance(tokens, (list, tuple)) and tokens and isinstance(tokens[0], str)):
        task = require_task(model, "text input")
        texts = [tokens] if isinstance(tokens, str) else list(tokens)
        encoded = [task.encode(t) for t in texts]
        if len({len(e) for e in encoded}) != 1:
            raise ValueError(f"texts encode to different lengths {[len(e) for e in encoded]}; pass equal-length texts")
        tokens = torch.stack(encoded)
    if isinstance(tokens, (list, tuple)) and len(tokens) == 0:
        raise ValueError("tokens are empty ([]); pass at least one sequence of one token (ids, text(s) or a Batch)")
    if not isinstance(tokens, Tensor):
        try:
            tokens = torch.as_tensor(tokens)
        except (TypeError, ValueError, RuntimeError) as err:
            hint = (
                "; pass its inputs, e.g. task.clean or task.sample(256)" if hasattr(tokens, "patching_inputs") else ""
            )
            raise TypeError(f"tokens must be a Batch, text(s) or integer ids, got {type(tokens).__name__}{hint} "
                            f"({err})") from None  # fmt: skip
    if tokens.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
        raise ValueError(f"tokens must be integer ids, got dtype {tokens.dtype}")
    if tokens.ndim == 1:
        tokens = tokens[None]
    if tokens.ndim != 2:
        raise ValueError(f"tokens must have shape [batch, pos] or [pos], got {tuple(tokens.shape)}")
    if tokens.shape[0] == 0 or tokens.shape[1] == 0:
        raise ValueError(f"tokens are empty (shape {tuple(tokens.shape)}); pass at least one sequence of one token")
    d_vocab = model.cfg.d_vocab
    if tokens.numel() and (tokens.min() < 0 or tokens.max() >= d_vocab):
        bad = tokens[(tokens < 0) | (tokens >= d_vocab)][0].item()
        raise ValueError(f"token id {bad} is outside the model's vocabulary 0..{d_vocab - 1}")
    if tokens.shape[1] > model.cfg.n_ctx:
        raise ValueError(f"sequence length {tokens.shape[1]} exceeds the model's n_ctx {model.cfg.n_ctx}")
    return tokens.long().to(model_device(model))


def check_positions(pos, n: int, width: int, name: str = "pos") -> Int[Tensor, " batch"]:
    """A [n] LongTensor of positions in 0..width - 1 from an int (negative counts from the end) or one
    position per example. TypeError for non-integers, ValueError for a wrong shape, IndexError out of range
    (as for heads and layers)."""
    if isinstance(pos, (str, bytes, float)) or isinstance(pos, bool):
        raise TypeError(f"{name} must be an int or one integer position per example, got {pos!r}")
    try:
        p = torch.as_tensor(pos)
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(f"{name} must be an int or one integer position per example, got {pos!r}") from None
    if p.is_floating_point() or p.is_complex() or p.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer positions, got dtype {p.dtype}")
    if p.ndim == 0:
        p = p.expand(n)
    if p.shape != (n,):
        raise ValueError(f"{name} must be an int or one position per example ({n}), got shape {tuple(p.shape)}")
    if p.numel() and (p.min() < -width or p.max() >= width):
        bad = p[(p < -width) | (p >= width)][0].item()
        raise IndexError(f"{name} {bad} is out of range: these inputs have positions 0..{width - 1}")
    return (p % width).long()


def check_layer(model: HookedTransformer, layer: int) -> int:
    """`layer` itself, or IndexError naming the valid range (negative indices count from the end)."""
    n = require_model(model).cfg.n_layers
    if not isinstance(layer, int) or isinstance(layer, bool):
        raise TypeError(f"layer must be an int, got {layer!r} ({type(layer).__name__})")
    if not -n <= layer < n:
        raise IndexError(f"layer {layer!r} is out of range: this model has layers 0..{n - 1}")
    return layer % n


def check_head(model: HookedTransformer, head: int) -> int:
    """`head` itself, or IndexError naming the valid range."""
    n = require_model(model).cfg.n_heads
    if not isinstance(head, int) or isinstance(head, bool):
        raise TypeError(f"head must be an int, got {head!r} ({type(head).__name__})")
    if not -n <= head < n:
        raise IndexError(f"head {head!r} is out of range: this model has heads 0..{n - 1}")
    return head % n


def layers_of(model: HookedTransformer, layer: int | None) -> list[int]:
    """The layers `layer` selects, the same in every function that takes one: None every layer, an int that
    layer (negative counts from the end; IndexError out of range)."""
    n = require_model(model).cfg.n_layers
    return list(range(n)) if layer is None else [check_layer(model, layer)]


def parse_heads(model: HookedTransformer, heads, layer: int | None = None) -> list[tuple[int, int]]:
    """(layer, head) pairs from an int, a (layer, head) tuple, a name "L0H3", or a list of these.

    An int names that head in each layer `layer` selects (`layers_of`: every layer for None); a tuple or a
    name carries its own layer, and ValueError when it contradicts a `layer` passed. IndexError naming
    the valid range for a layer or head out of range; duplicates are dropped.
    """
    require_model(model)
    one_pair = isinstance(heads, tuple) and len(heads) == 2 and all(isinstance(h, int) for h in heads)
    if isinstance(heads, (int, str)) or one_pair:
        heads = [heads]
    if isinstance(heads, Tensor):
        heads = heads.tolist()
    if not isinstance(heads, Sequence) or isinstance(heads, str):
        raise TypeError(
            f"heads must be an int, a (layer, head) tuple, a name like 'L0H3' or a list of these, got {heads!r}"
        )
    layers = layers_of(model, layer)
    pairs: list[tuple[int, int]] = []
    for spec in heads:
        if isinstance(spec, str):
            match = re.fullmatch(r"L(\d+)H(\d+)", spec)
            if match is None:
                every = (" (every head: leave heads= out; every pair's interaction: hc.pair_map(model))"
                         if spec.strip().lower() == "all" else "")  # fmt: skip
                raise ValueError(f"head name {spec!r} is not of the form 'L<layer>H<head>', e.g. 'L0H3'{every}")
            found = [(int(match.group(1)), int(match.group(2)))]
        elif isinstance(spec, (tuple, list)) and len(spec) == 2:
            found = [tuple(spec)]
        elif isinstance(spec, int) and not isinstance(spec, bool):
            found = [(lay, spec) for lay in layers]
        else:
            raise TypeError(f"cannot read a head from {spec!r}; use an int, (layer, head) or 'L0H3'")
        for lay, head in found:
            pair = (check_layer(model, lay), check_head(model, head))
            if layer is not None and pair[0] not in layers:
                raise ValueError(f"head {spec!r} is in layer {pair[0]}, but layer={layer!r} was passed")
            if pair not in pairs:
                pairs.append(pair)
    if not pairs:
        raise ValueError("no heads given")
    return pairs


def parse_players(model: HookedTransformer, heads, what: str) -> list[tuple[int, int]]:
    """The players of a pair analysis (`parse_heads`; every head for None), at least 2: ValueError saying how
    `heads` was read where it gives fewer (a bare (layer, head) tuple is one head; duplicates count once)."""
    if heads is None:
        return [(lay, h) for lay in range(model.cfg.n_layers) for h in range(model.cfg.n_heads)]
    players = parse_heads(model, heads)
    if len(players) >= 2:
        return players
    name = "L{}H{}".format(*players[0])
    if isinstance(heads, tuple) and len(heads) == 2 and all(isinstance(h, int) for h in heads):
        a, b = heads
        how = (f"heads={heads!r} is one head, {name} (a (layer, head) tuple); for heads {a} and {b} of layer 0 pass "
               f"a list: [(0, {a}), (0, {b})] or ['L0H{a}', 'L0H{b}']")  # fmt: skip
    elif isinstance(heads, (list, tuple)) and len(heads) > 1:
        how = f"heads={heads!r} names {name} {len(heads)} times (duplicates count once)"
    else:
        how = f"heads={heads!r} is one head, {name}"
    raise ValueError(f"{what} needs at least 2 heads: {how}")


def head_selection(model: HookedTransformer, head, layer: int | None) -> tuple[int | None, list[int] | None]:
    """(layer, heads) from `head` in any form `parse_heads` reads: None (every head), an int or a list of
    ints (heads of `layer`, or of every layer when layer is None), a (layer, head) pair, a name "L0H3", or a
    list of these in one layer. ValueError when the heads span layers or contradict `layer`."""
    if head is None:
        return (None if layer is None else check_layer(model, layer)), None
    ints = [head] if isinstance(head, int) and not isinstance(head, bool) else head
    if isinstance(ints, list) and ints and all(isinstance(h, int) and not isinstance(h, bool) for h in ints):
        return (None if layer is None else check_layer(model, layer)), sorted({check_head(model, h) for h in ints})
    pairs = parse_heads(model, head, layer)
    layers = sorted({lay for lay, _ in pairs})
    if len(layers) > 1:
        raise ValueError(f"heads {head!r} lie in layers {layers}; pass heads of one layer")
    return layers[0], [h for _, h in pairs]


def one_head(model: HookedTransformer, head, layer: int | None = None) -> tuple[int, int]:
    """(layer, head) of exactly one head: an int (in `layer`; with layer None only a one-layer model makes it
    one head), a (layer, head) pair or a name "L0H3". ValueError when the arguments name several heads."""
    pairs = parse_heads(model, head, layer)
    if len(pairs) != 1:
        names = ", ".join(head_name(lay, h) for lay, h in pairs)
        raise ValueError(
            f"expected one head, but head={head!r} with layer={layer!r} names {len(pairs)} ({names}); "
            "pass layer= or a name like 'L1H3'"
        )
    return pairs[0]


def head_names(model: HookedTransformer) -> list[str]:
    """['L0H0', 'L0H1', ...] in (layer, head) order."""
    cfg = require_model(model, "head_names").cfg
    return [head_name(layer, head) for layer in range(cfg.n_layers) for head in range(cfg.n_heads)]


def task_symbols(model: HookedTransformer, task=None) -> list[str] | None:
    """The task's (given, else attached) token strings when it names every id of the model's vocabulary, else None
    (a contrast built from token ids has none; a task of another vocabulary size names other ids)."""
    task = task if task is not None else task_of(model)
    vocab = getattr(task, "vocab", None) if task is not None else None
    return list(vocab) if vocab and len(vocab) == model.cfg.d_vocab else None


def token_labels(model: HookedTransformer, ids, task=None) -> list[str]:
    """Strings for a [pos] sequence of ids: the task's symbols, else each id decoded by the tokenizer (the task's,
    given or attached, or the model's own), else the ids themselves."""
    symbols = task_symbols(model, task)
    ids = torch.as_tensor(ids).tolist()
    if symbols:
        return [symbols[i] for i in ids]
    tokenizer = getattr(task if task is not None else task_of(model), "_tokenizer", None) or getattr(
        model, "tokenizer", None
    )
    if tokenizer is not None and hasattr(tokenizer, "decode"):
        return [tokenizer.decode([i]) for i in ids]
    return [str(i) for i in ids]


def vocab_labels(model: HookedTransformer) -> list[str]:
    """One label per vocabulary entry."""
    return token_labels(model, range(model.cfg.d_vocab))


@torch.no_grad()
def run(model: HookedTransformer, tokens, **cache_kwargs) -> tuple[Float[Tensor, "batch pos vocab"], ActivationCache]:
    """Logits and the TransformerLens ActivationCache of `model` on `tokens` (any form `as_tokens` takes)."""
    return model.run_with_cache(as_tokens(model, tokens), **cache_kwargs)


def check_decomposable(model: HookedTransformer, what: str) -> None:
    """ValueError unless the residual stream of `model` is a plain sum of its components (no norm after a
    block's attention or MLP, no post-norm architecture) and the logits are linear in the final norm's
    output (no soft-capping): the conditions under which the decomposition is exact."""
    try:
        from transformer_lens.components.transformer_block import POST_NORM_ARCHITECTURES
    except ImportError:  # TransformerLens 4.x: no components; the Bridge's config names post-norm models
        POST_NORM_ARCHITECTURES = ()

    cfg = require_model(model, what).cfg
    if cfg.use_normalization_before_and_after or cfg.original_architecture in POST_NORM_ARCHITECTURES:
        raise ValueError(
            f"{what}: this model normalises each block's attention and MLP output before adding it to the "
            "residual stream, so the stream is not a sum of the heads' outputs and no exact decomposition exists"
        )
    if cfg.output_logits_soft_cap is not None and cfg.output_logits_soft_cap > 0:
        raise ValueError(f"{what} needs linear logits, but this model soft-caps them (output_logits_soft_cap)")
    if cfg.final_rms and cfg.normalization_type not in ("LN", "LNPre"):
        pass  # final_rms only changes the final norm's module, which norms.through_norm reads


def output_labels(model: HookedTransformer) -> list[str]:
    """One label per output logit: the task's token strings when the vocabularies match, else the ids."""
    if model.cfg.d_vocab_out == model.cfg.d_vocab:
        return vocab_labels(model)
    return [str(i) for i in range(model.cfg.d_vocab_out)]


def read_positions(tokens, ids: Int[Tensor, "batch pos"], pos=None) -> Int[Tensor, " batch"]:
    """The one rule for where an analysis reads each input [batch]: `pos` (an int, negative from the end, or one
    per input), else a Batch's answer position, else the last position. `measure` (patching, games, edges),
    `hc.dla`, `hc.probe` and `hc.probe_patch` all read there."""
    n, width = ids.shape
    if pos is None:
        pos = tokens.answer_pos if isinstance(tokens, Batch) else width - 1
    return check_positions(pos, n, width).to(ids.device)
