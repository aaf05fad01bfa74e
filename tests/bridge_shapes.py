"""Hugging Face models built offline from configs (random weights, a locally built word-level tokenizer), saved
as model folders, loaded as TransformerBridges in compatibility mode; and, for each, the HookedTransformer
TransformerLens's own weight conversion makes of the same weights (norms folded, writing weights centred, as
compatibility mode does). The tests compare every analysis on the Bridge with the same analysis on it."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch

SHAPES = ("gpt2", "llama", "neox")
VOCAB = 96
N_CTX = 32


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{i}": i for i in range(VOCAB - 1)} | {"<unk>": VOCAB - 1}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="w0", eos_token="w0", pad_token="w0"
    )


def hf_model(shape: str, seed: int = 0):
    """A small causal LM of one of SHAPES: GPT-2 (LayerNorm, learned positions), Llama (RMSNorm, rotary,
    grouped-query: 4 query heads over 2 key/value heads, gated MLP), GPT-NeoX/Pythia (parallel attention and
    MLP, rotary on a quarter of each head)."""
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        GPTNeoXConfig,
        GPTNeoXForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,  # fmt: skip
    )

    torch.manual_seed(seed)
    if shape == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=VOCAB, n_positions=N_CTX,
                                           bos_token_id=0, eos_token_id=0))  # fmt: skip
    elif shape == "llama":
        model = LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                             hidden_size=64, intermediate_size=128, vocab_size=VOCAB,
                                             max_position_embeddings=N_CTX, bos_token_id=0, eos_token_id=0,
                                             pad_token_id=0))  # fmt: skip
    elif shape == "neox":
        model = GPTNeoXForCausalLM(GPTNeoXConfig(num_hidden_layers=2, num_attention_heads=4, hidden_size=64,
                                                 intermediate_size=128, vocab_size=VOCAB, max_position_embeddings=N_CTX,
                                                 rotary_pct=0.25, use_parallel_residual=True, bos_token_id=0,
                                                 eos_token_id=0))  # fmt: skip
    elif shape in MORE_SHAPES:
        model = _more(shape)
    else:
        raise ValueError(shape)
    # larger weights than the init's 0.02 so that heads matter and patches move the logits
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 2 and "emb" not in name and "wte" not in name and "wpe" not in name:
                p.mul_(8.0)
    return model.eval()


MORE_SHAPES = ("qwen2", "qwen3", "mistral", "gemma", "opt", "phi", "gptj")


def _more(shape: str):
    """Further architectures, checked against TransformerLens on the Bridge only (no twin): Qwen2 and Mistral
    (grouped-query, rotary, q/k/v biases in Qwen2), Qwen3 (QK norm), Gemma (offset RMSNorm, scaled
    embedding, one key/value head), OPT (learned positions read with an offset, ReLU), Phi (parallel block,
    partial rotary), GPT-J (interleaved rotary pairs)."""
    import transformers as t

    common = dict(vocab_size=VOCAB, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    small = dict(
        num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4, max_position_embeddings=N_CTX
    )
    if shape == "qwen2":
        return t.Qwen2ForCausalLM(t.Qwen2Config(**small, num_key_value_heads=2, **common))
    if shape == "qwen3":
        return t.Qwen3ForCausalLM(t.Qwen3Config(**small, num_key_value_heads=2, head_dim=16, **common))
    if shape == "mistral":
        return t.MistralForCausalLM(t.MistralConfig(**small, num_key_value_heads=2, **common))
    if shape == "gemma":
        return t.GemmaForCausalLM(t.GemmaConfig(**small, num_key_value_heads=1, head_dim=16, **common))
    if shape == "opt":
        return t.OPTForCausalLM(t.OPTConfig(num_hidden_layers=2, hidden_size=64, ffn_dim=128, num_attention_heads=4,
                                            max_position_embeddings=N_CTX, word_embed_proj_dim=64, **common))  # fmt: skip
    if shape == "phi":
        return t.PhiForCausalLM(t.PhiConfig(**small, partial_rotary_factor=0.5, **common))
    return t.GPTJForCausalLM(t.GPTJConfig(n_layer=2, n_embd=64, n_head=4, rotary_dim=8, n_positions=N_CTX, **common))


def model_folder(shape: str, root: Path, seed: int = 0) -> Path:
    """The Hugging Face folder (config.json, model.safetensors, tokenizer files) of `shape`."""
    folder = Path(root) / f"{shape}-{seed}"
    if not (folder / "config.json").exists():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            hf_model(shape, seed).save_pretrained(folder)
            tokenizer().save_pretrained(folder)
    return folder


def hooked_twin(shape: str, folder: Path):
    """The HookedTransformer of the folder's weights by TransformerLens's own converters, processed as
    compatibility mode processes the Bridge."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig
    from transformer_lens.pretrained import weight_conversions as wc
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    c = hf.config
    common = dict(n_layers=c.num_hidden_layers, d_model=c.hidden_size, n_heads=c.num_attention_heads,
                  d_head=c.hidden_size // c.num_attention_heads, d_vocab=VOCAB, n_ctx=N_CTX, act_fn=None,
                  original_architecture=type(hf).__name__, device="cpu")  # fmt: skip
    if shape == "gpt2":
        cfg = HookedTransformerConfig(**common | dict(d_mlp=4 * c.hidden_size, act_fn="gelu_new", normalization_type="LN",
                                                      eps=c.layer_norm_epsilon))  # fmt: skip
        state = wc.convert_gpt2_weights(hf, cfg)
    elif shape == "llama":
        cfg = HookedTransformerConfig(**common | dict(d_mlp=c.intermediate_size, act_fn="silu", normalization_type="RMS",
                                                      eps=c.rms_norm_eps, positional_embedding_type="rotary",
                                                      rotary_dim=c.hidden_size // c.num_attention_heads,
                                                      rotary_base=c.rope_parameters["rope_theta"] if getattr(c, "rope_parameters", None) else c.rope_theta,
                                                      n_key_value_heads=c.num_key_value_heads, gated_mlp=True,
                                                      final_rms=True))  # fmt: skip
        state = wc.convert_llama_weights(hf, cfg)
    else:
        d_head = c.hidden_size // c.num_attention_heads
        cfg = HookedTransformerConfig(**common | dict(d_mlp=c.intermediate_size, act_fn="gelu", normalization_type="LN",
                                                      eps=c.layer_norm_eps, positional_embedding_type="rotary",
                                                      rotary_dim=int(d_head * c.rope_parameters.get("partial_rotary_factor", 0.25)), parallel_attn_mlp=True,
                                                      rotary_base=c.rope_parameters["rope_theta"] if getattr(c, "rope_parameters", None) else c.rotary_emb_base))  # fmt: skip
        state = wc.convert_neox_weights(hf, cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = HookedTransformer(cfg, tokenizer=AutoTokenizer.from_pretrained(folder))
        model.load_and_process_state_dict(state, fold_ln=True, center_writing_weights=True, center_unembed=True,
                                          fold_value_biases=True)  # fmt: skip
    return model.eval()


def bridge(folder: Path):
    from headcoop.models.bridge import load_folder

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_folder(folder)


os.environ.setdefault("HF_HUB_OFFLINE", "1")
