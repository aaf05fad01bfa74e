"""The two kinds of model headcoop analyses: a `HookedTransformer`, and a `TransformerBridge` (TransformerLens
3.x's way of loading a Hugging Face model) in compatibility mode, which gives the same hook names, cache and
weight layout (`W_Q` [layer, head, d_model, d_head], ...).

Everything that must know which kind it holds asks here (`is_bridge`, `user_hooks`), so the analyses keep
one code path. A Bridge has no `HookedTransformer` internals (its blocks wrap the Hugging Face modules), so
the shortcuts that recompute one head from cached activations (`head-local`, the coalition game's shared
prefixes) step aside for it. It has no `start_at_layer` either, so the engine's stacked path runs its copies
from the tokens (batched, with hooks), beside the reference path; every result's `method` says which ran.

Importing this module does not import the Bridge: with a TransformerLens without `model_bridge` every model
is simply not a Bridge.
"""

from __future__ import annotations

import weakref
from pathlib import Path

import torch
from torch import nn

from headcoop.checks import global_hooks, has_hooks, installed_hooks, weight_shapes
from headcoop.models.tl import HookedTransformer

COMPATIBILITY_FIX = "call model.enable_compatibility_mode() first"


def bridge_class():
    """transformer_lens.model_bridge.TransformerBridge, or None where this TransformerLens has none."""
    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError:  # pragma: no cover - TransformerLens < 3.0
        return None
    return TransformerBridge


def is_bridge(model) -> bool:
    """Whether `model` is a TransformerBridge (in compatibility mode or not)."""
    cls = bridge_class()
    return cls is not None and isinstance(model, cls)


def check_bridge(model, what: str) -> None:
    """ValueError naming the fix when a Bridge is not in compatibility mode: without it the hook names,
    the cache's shapes and the weight layout differ from a HookedTransformer's."""
    if not getattr(model, "compatibility_mode", False):
        raise ValueError(
            f"{what} needs a TransformerBridge in compatibility mode (the HookedTransformer hook names, "
            f"cache shapes and weight layout headcoop reads); {COMPATIBILITY_FIX}"
        )
    if "blocks.0.attn.hook_z" not in getattr(model, "hook_dict", {}):
        arch = getattr(model.cfg, "architecture", None) or type(getattr(model, "original_model", model)).__name__
        raise ValueError(f"{what}: {DECODER_ONLY}; this TransformerBridge wraps {arch}, which has no attention "
                         "heads' hook points (blocks.0.attn.hook_z)")  # fmt: skip


def require_model(model, what: str = "this function"):
    """`model` when it is a HookedTransformer or a TransformerBridge in compatibility mode; TypeError naming
    what was passed instead, ValueError naming the fix for a Bridge outside compatibility mode."""
    if is_bridge(model):
        check_bridge(model, what)
        return model
    if not isinstance(model, HookedTransformer):
        raise TypeError(f"{what} needs a HookedTransformer (e.g. hc.load('count01')) or a TransformerBridge in "
                        f"compatibility mode, got {type(model).__name__}")  # fmt: skip
    return model


def kind_label(model) -> str:
    """ "HookedTransformer" or "TransformerBridge (<architecture>)", for a result's repr."""
    if not is_bridge(model):
        return type(model).__name__
    arch = getattr(model.cfg, "architecture", None) or type(getattr(model, "original_model", model)).__name__
    return f"TransformerBridge ({arch})"


def user_hooks(model: nn.Module) -> list[str]:
    """Where hooks a user (or headcoop's own context managers) put on `model` sit, by hook name.

    On a HookedTransformer that is every hook (`checks.installed_hooks`). On a Bridge: every hook on a hook
    point and on the Bridge's own modules, torch's global module hooks, and the torch hooks (forward,
    pre-forward, their with_kwargs forms, backward) on the Hugging Face modules it wraps
    (`_original_component`), less any TransformerLens installs there itself to route their activations."""
    if not is_bridge(model):
        return installed_hooks(model)
    from transformer_lens.hook_points import HookPoint

    names: dict[int, list[str]] = {}
    hook_dict: dict = getattr(model, "hook_dict")  # a HookedRootModule's hook points by name
    for name, point in hook_dict.items():  # one hook point has several names: prefer the TransformerLens one
        names.setdefault(id(point), []).append(name)
    canonical = {
        key: min(found, key=lambda n: (n.endswith((".hook_in", ".hook_out")), len(n))) for key, found in names.items()
    }
    shortest: dict[int, str] = {}  # a wrapped module sits under two paths (the Bridge's and the Hugging Face model's)
    for name, module in model.named_modules(remove_duplicate=False):
        if id(module) not in shortest or len(name) < len(shortest[id(module)]):
            shortest[id(module)] = name
    found = []
    for name, module in model.named_modules():
        wrapped = not isinstance(module, HookPoint) and "_original_component" in name.split(".")
        if wrapped and any(_users(hooks) for hooks in _hook_dicts(module)):
            found.append(shortest[id(module)])  # a torch hook a user put on a wrapped Hugging Face module
        elif not wrapped and has_hooks(module):
            found.append(canonical.get(id(module), name) or "<model>")
    return found + global_hooks()


def _hook_dicts(module: nn.Module) -> list[dict]:
    """A module's hook dictionaries: forward, pre-forward (their with_kwargs forms live in the same ones),
    backward and pre-backward."""
    return [module._forward_hooks, module._forward_pre_hooks, module._backward_hooks,
            getattr(module, "_backward_pre_hooks", {})]  # fmt: skip


# who installs hooks on a Bridge's wrapped modules as part of running it: TransformerLens (routing activations
# to its hook points, capturing norm inputs) and transformers (capturing outputs); they change no value
MODEL_HOOKS = ("transformer_lens.", "transformers.utils.output_capturing")


def _users(hooks: dict) -> list:
    """The hooks of one dictionary that the model's own libraries did not install (`MODEL_HOOKS`)."""

    def owner(fn) -> str:
        fn = getattr(fn, "func", fn)  # functools.partial
        return getattr(fn, "__module__", None) or type(fn).__module__ or ""

    return [fn for fn in hooks.values() if not owner(fn).startswith(MODEL_HOOKS)]


def is_hf_folder(folder) -> bool:
    """Whether `folder` holds a Hugging Face model: a config.json with a "model_type" (a TransformerLens export's
    config.json holds HookedTransformerConfig fields instead, d_model among them; a Hugging Face config with a
    d_model, such as T5's, is told apart by its "transformers_version")."""
    import json

    config = Path(folder) / "config.json"
    if not config.is_file():
        return False
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "model_type" in data and ("d_model" not in data or "transformers_version" in data)


NOT_DECODERS = ("t5", "mt5", "bart", "mbart", "pegasus", "marian", "mamba", "mamba2", "rwkv", "bert", "roberta",
                "distilbert", "electra", "whisper", "encoder-decoder", "falcon_mamba", "recurrent_gemma")  # fmt: skip
DECODER_ONLY = "headcoop needs a decoder-only transformer with attention heads"
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_WIDTH_KEYS = ("hidden_size", "n_embd", "d_model")
_EMBEDDINGS = ("embed_tokens.weight", "wte.weight", "embed_in.weight", "word_embeddings.weight")


def check_folder(folder) -> dict:
    """config.json of a Hugging Face model folder, checked before anything is built (as `hc.load` checks a
    checkpoint): a decoder-only transformer (`DECODER_ONLY`, naming the model type it got), layer count and
    width positive integers that agree with the weights' safetensors headers (layers counted from the tensor
    names, width from the token embedding). ValueError naming the field and both values otherwise."""
    import json
    import re

    folder = Path(folder)
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read {folder / 'config.json'}: {err}") from None
    model_type = str(config.get("model_type", "?"))
    archs = config.get("architectures") or []
    if model_type in NOT_DECODERS or config.get("is_encoder_decoder") or not any(k in config for k in (
            "num_attention_heads", "n_head", "num_heads", "n_heads")):  # fmt: skip
        raise ValueError(
            f"{DECODER_ONLY}; {folder} holds a {model_type!r} model ({', '.join(map(str, archs)) or 'no architectures listed'})"
        )
    layers = next((config[k] for k in _LAYER_KEYS if k in config), None)
    width = next((config[k] for k in _WIDTH_KEYS if k in config), None)
    for name, value in (("number of layers", layers), ("width", width)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{folder / 'config.json'}: its {name} is {value!r}; it must be a positive integer")
    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(folder.glob("*.safetensors")):
        shapes.update(weight_shapes(file))
    if not shapes:
        return config  # weights in another format: transformers checks them while loading
    found = {
        int(m.group(1)) for name in shapes for m in [re.search(r"\.(?:layers|h|layer|blocks)\.(\d+)\.", name)] if m
    }
    if layers is not None and found and layers != max(found) + 1:
        raise ValueError(f"{folder / 'config.json'} says {layers} layers, but the weights hold {max(found) + 1} "
                         "(counted from the tensor names); the config does not describe these weights")  # fmt: skip
    embedding = next((shape for name, shape in shapes.items() if name.endswith(_EMBEDDINGS) and len(shape) == 2), None)
    if width is not None and embedding is not None and width != embedding[1]:
        raise ValueError(f"{folder / 'config.json'} says width {width}, but the weights' token embedding is "
                         f"{list(embedding)}; the config does not describe these weights")  # fmt: skip
    return config


def _first_mismatch(folder: Path) -> str | None:
    """The first tensor whose shape in the folder's safetensors headers differs from what its config.json builds
    (the model built on the meta device: no memory), as "NAME: weights [..], config [..]"; None if none found."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
        with torch.device("meta"):
            built = AutoModelForCausalLM.from_config(config)
    except Exception:  # noqa: BLE001 - transformers' own errors: nothing better to name
        return None
    expected = {name: tuple(t.shape) for name, t in built.state_dict().items()}
    for file in sorted(folder.glob("*.safetensors")):
        for name, shape in weight_shapes(file).items():
            for candidate in (name, name.split(".", 1)[-1], f"transformer.{name}", f"model.{name}"):
                if candidate in expected and expected[candidate] != shape:
                    return f"{name}: the weights hold {list(shape)}, the config builds {list(expected[candidate])}"
    return None


def _check_pickled_weights(folder: Path) -> None:
    """A folder whose weights are only pickled (`*.bin`, no safetensors) is read here first with
    `weights_only=True`: a file holding anything but tensors is refused with headcoop's message, naming it."""
    if any(folder.glob("*.safetensors")):
        return
    for file in sorted(folder.glob("*.bin")):
        try:
            torch.load(file, map_location="meta", weights_only=True)
        except Exception as err:  # noqa: BLE001 - torch's unpickling errors have no common type
            raise ValueError(
                f"refusing {file}: it is not a plain file of tensors (loading it with weights_only=True "
                f"failed: {' '.join(str(err).split())[:160]}); nothing in it was run. Save the model "
                "with save_pretrained(..., safe_serialization=True) to get model.safetensors"
            ) from None


def load_folder(folder, device: str | torch.device | None = None):
    """A Hugging Face model folder (config.json, weights, tokenizer files) as a TransformerBridge in
    compatibility mode, read offline (nothing is downloaded). ValueError for a folder without config.json,
    one `check_folder` refuses, or an architecture TransformerLens's Bridge cannot load (named)."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise ValueError(f"{folder} is not a Hugging Face model folder: it has no config.json")
    config = check_folder(folder)
    _check_pickled_weights(folder)
    cls = bridge_class()
    if cls is None:  # pragma: no cover
        raise RuntimeError("this TransformerLens has no TransformerBridge (it needs TransformerLens >= 3.0)")
    import os

    offline = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ.update({k: "1" for k in offline})
    try:
        bridge = cls.boot_transformers(str(folder), device=device)
    except (ValueError, KeyError, TypeError, RuntimeError, OSError) as err:
        text = " ".join(str(err).split()).split(" Available architectures")[0]  # not TransformerLens's list of 300
        arch = ", ".join(map(str, config.get("architectures") or [])) or str(config.get("model_type", "?"))
        if "not supported" in text.lower() or "unsupported" in text.lower() or "architecture" in text.lower():
            raise ValueError(f"{DECODER_ONLY} that TransformerLens's Bridge can load; {folder} holds {arch}, which it "
                             f"cannot ({text[:160]})") from None  # fmt: skip
        mismatch = _first_mismatch(folder) if "mismatched" in text or "report" in text else None
        if mismatch:
            raise ValueError(f"{folder / 'config.json'} does not describe its weights: {mismatch}") from None
        raise ValueError(f"cannot load {folder} as a TransformerBridge ({arch}): {text[:300]}") from None
    finally:
        for k, v in offline.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    bridge.enable_compatibility_mode(disable_warnings=True)
    bridge.eval()
    return bridge


def w_pos(model) -> torch.Tensor:
    """The positional embedding of each position [n_ctx, d_model]: a HookedTransformer's `W_pos`; on a Bridge,
    what its forward pass puts at `hook_pos_embed` for positions 0..n_ctx-1 (a Hugging Face table may be
    read with an offset, as OPT's is, so its raw weight is not the embedding of position i)."""
    if not is_bridge(model):
        return model.W_pos
    # a forward pass of n_ctx tokens (3 s on a GPT-2-small shape): kept per Bridge while the positional weights'
    # checksum and the model's hooks stay the same (a changed weight or a new hook computes it again)
    params = list(model.pos_embed.parameters()) if hasattr(model, "pos_embed") else None
    key = None
    if params:
        with torch.no_grad():
            key = (model.cfg.n_ctx, tuple(user_hooks(model)),
                   tuple((p.data_ptr(), tuple(p.shape), float(p.double().sum()), float(p.double().square().sum()))
                         for p in params))  # fmt: skip
        kept = _W_POS.get(model)
        if kept is not None and kept[0] == key:
            return kept[1]
    ids = torch.zeros(1, model.cfg.n_ctx, dtype=torch.long, device=model.W_E.device)
    with torch.no_grad():
        _, cache = model.run_with_cache(ids, names_filter=lambda name: name == "hook_pos_embed")
    table = cache["hook_pos_embed"][0]
    if key is not None:
        _W_POS[model] = (key, table)
    return table


_W_POS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # Bridge -> (weights' checksum, its w_pos)


def w_e(model) -> torch.Tensor:
    """The token embedding of each token [d_vocab, d_model] as the forward pass computes it: a
    HookedTransformer's `W_E`; on a Bridge, its embedding component applied to every id (Gemma scales the
    table by sqrt(d_model) there, so the raw weight is not the embedding)."""
    if not is_bridge(model):
        return model.W_E
    with torch.no_grad():
        return model.embed(torch.arange(model.cfg.d_vocab, device=model.W_E.device)[None])[0]


def out_bias(attn, d_model: int, like: torch.Tensor) -> torch.Tensor:
    """A layer's attention output bias b_O [d_model] (zeros for a Bridge over a model without one, Llama)."""
    b_o = getattr(attn, "b_O", None)
    return b_o if b_o is not None else torch.zeros(d_model, dtype=like.dtype, device=like.device)


def head_weight(attn, name: str, cfg) -> torch.Tensor:
    """One of an attention layer's per-head weights W_Q, W_K, W_V, W_O [head, ...] or biases b_Q, b_K, b_V
    [head, d_head], with a head axis of n_heads: a grouped-query Bridge keeps key/value weights per key/value
    head (expanded here, as a HookedTransformer's `W_K` property does), and a model without that bias
    (Llama) gets zeros."""
    value = getattr(attn, name, None)
    if value is None:
        if not name.startswith("b_"):
            raise AttributeError(f"this attention layer has no {name}")
        return torch.zeros(cfg.n_heads, cfg.d_head, device=attn.W_Q.device, dtype=attn.W_Q.dtype)
    if value.shape[0] != cfg.n_heads and cfg.n_key_value_heads and value.shape[0] == cfg.n_key_value_heads:
        value = value.repeat_interleave(cfg.n_heads // cfg.n_key_value_heads, dim=0)
    return value


def attn_scale(model, layer: int) -> float:
    """What layer `layer` divides its attention scores by: a HookedTransformer layer's `attn_scale`; on a
    Bridge, from its config (where attn_scale -1 means sqrt(d_head), as HookedTransformerConfig fills it in)."""
    attn = model.blocks[layer].attn
    if hasattr(attn, "attn_scale"):
        return attn.attn_scale
    cfg = model.cfg
    scale = (cfg.attn_scale if cfg.attn_scale > 0 else cfg.d_head**0.5) if cfg.use_attn_scale else 1.0
    return scale * (layer + 1) if cfg.scale_attn_by_inverse_layer_idx else scale


def apply_rotary(model, x: torch.Tensor) -> torch.Tensor:
    """x [batch, pos, head, d_head] (q or k at positions 0..pos-1) rotated as a rotary Bridge's Hugging Face
    model rotates it: cos and sin from the model's own rotary-embedding module (so its base, partial rotary
    and any scaling are the model's), applied with Hugging Face's `rotate_half` to the first cos.shape[-1]
    dimensions. Callers check the result against cached scores (`hc.qk` does). ValueError for a model
    without a rotary-embedding module or with GPT-J's interleaved pairs."""
    hf = getattr(model, "original_model", None)
    rotary = next((m for m in hf.modules() if type(m).__name__.endswith("RotaryEmbedding")), None) if hf else None
    if rotary is None or getattr(model.cfg, "rotary_adjacent_pairs", False):
        raise ValueError("cannot rotate this Bridge's q and k: its Hugging Face model has no rotary-embedding module "
                         "with half-split pairs; hc.patch, hc.dla and hc.attention read its own scores")  # fmt: skip
    n_pos = x.shape[1]
    positions = torch.arange(n_pos, device=x.device)[None]
    with torch.no_grad():
        cos, sin = rotary(x.new_zeros(1, n_pos, x.shape[-1]), positions)  # [1, pos, rotary_dim]
    cos, sin = cos[0, :, None, :].to(x.dtype), sin[0, :, None, :].to(x.dtype)  # [pos, 1, rotary_dim]
    width = cos.shape[-1]
    part, rest = x[..., :width], x[..., width:]
    half = width // 2
    turned = torch.cat([-part[..., half:], part[..., :half]], dim=-1)
    return torch.cat([part * cos + turned * sin, rest], dim=-1)
