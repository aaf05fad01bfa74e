"""A task built from your own inputs, for any model: clean prompts, corrupt prompts, the right answer and
the alternative, and (optionally) a class label per prompt.

    task = hc.contrast(clean, corrupt, answer, wrong, labels=None, vocab=None)
    task.attach(model)                      # every analysis now takes its defaults from the task
    hc.patch(model); hc.dla(model); hc.probe(model, task.clean); hc.report(model, task=task)

clean / corrupt: [batch, pos] token ids, or lists of texts that `vocab` encodes. `vocab` is tokenizer-like
(a Hugging Face tokenizer, or anything with `encode(text) -> ids`, `decode(ids) -> text` and a vocabulary
size) or a list of token strings (a text is then split on spaces). answer / wrong: one token per prompt
(ids, or texts that encode to exactly one token). The answer is read at the last real token of each
clean prompt (prompts of different lengths are right-padded with `pad_id`), where its logit is compared
with the alternative's: `metric` = mean logit(answer) - logit(wrong), as for the toy tasks.

The prompts are fixed: `sample(n)` returns the first min(n, batch) clean prompts (a contrast draws
nothing), `corrupt(batch)` the corrupt prompts of those clean rows, and `patching_inputs()` the pair.
A contrast builds no models and is not saved with a checkpoint.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Sequence
from typing import Any, cast

import torch
from jaxtyping import Int
from torch import Tensor

from headcoop.checks import check_int, check_seed
from headcoop.models.bridge import require_model
from headcoop.models.tl import HookedTransformer, HookedTransformerConfig
from headcoop.tasks.base import Batch, Task, check_ids


class Contrast(Task):
    """Fixed clean / corrupt prompts with their right and alternative answers (module docstring)."""

    name = "contrast"
    fixed_inputs = True

    def __init__(self, clean, corrupt, answer, wrong, labels=None, vocab=None, pad_id: int = 0):
        self._tokenizer = vocab if _is_tokenizer(vocab) else None
        self.vocab = _token_strings(vocab)
        pad_id = check_int("pad_id", pad_id, 0)
        if self.vocab and pad_id >= len(self.vocab):
            raise ValueError(f"pad_id {pad_id} is outside the vocabulary 0..{len(self.vocab) - 1}")
        clean_ids, clean_len = self._prompts(clean, "clean")
        corrupt_ids, corrupt_len = self._prompts(corrupt, "corrupt")
        n = len(clean_ids)
        if len(corrupt_ids) != n:
            raise ValueError(
                f"clean has {n} prompts but corrupt has {len(corrupt_ids)}; pass one corrupt prompt per clean one"
            )
        width = max(max(clean_len), max(corrupt_len))
        if clean_len != corrupt_len:
            raise ValueError(
                "each corrupt prompt must have the length of its clean prompt (so positions line up for patching); "
                f"lengths differ at prompt {next(i for i, (a, b) in enumerate(zip(clean_len, corrupt_len)) if a != b)}"
            )
        self.pad_id = pad_id
        tokens = torch.full((n, width), pad_id, dtype=torch.long)
        bad = torch.full((n, width), pad_id, dtype=torch.long)
        for i, (a, b) in enumerate(zip(clean_ids, corrupt_ids)):
            tokens[i, : len(a)], bad[i, : len(b)] = a, b
        answer_pos = torch.tensor(clean_len) - 1
        answer_ids, wrong_ids = self._answers(answer, n, "answer"), self._answers(wrong, n, "wrong")
        same = (answer_ids == wrong_ids).nonzero().flatten().tolist()
        if len(same) == n:
            raise ValueError(
                "answer and wrong are the same token for every prompt: the logit difference is 0 whatever the model "
                "does, so no measurement on this contrast could show anything; give each prompt another alternative"
            )
        if same:
            warnings.warn(f"answer and wrong are the same token at prompt(s) {same[:8]}{' ...' if len(same) > 8 else ''}"
                          ": their logit difference is 0 whatever the model does", stacklevel=3)  # fmt: skip
        if labels is None:
            labels = torch.zeros(n, dtype=torch.long)
        try:
            labels = torch.as_tensor(labels)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(f"labels must be integer class ids, one per prompt, got {labels!r}") from None
        if labels.dtype == torch.bool or labels.is_floating_point() or (labels.numel() and labels.min() < 0):
            raise ValueError(f"labels must be non-negative integer class ids, got {labels.tolist()[:8]}")
        labels = labels.long()
        if labels.shape != (n,):
            raise ValueError(f"labels must hold one integer per prompt ({n}), got shape {tuple(labels.shape)}")
        strings = tuple(self.vocab) if self.vocab else None
        self.clean = Batch(tokens, answer_pos[:, None], answer_ids[:, None], answer_pos, answer_ids, wrong_ids,
                           labels, vocab=strings)  # fmt: skip
        self.corrupted = self.clean.replace(tokens=bad, answer=wrong_ids, wrong=answer_ids,
                                            targets=wrong_ids[:, None])  # fmt: skip
        self._max_prompt_id = int(max(tokens.max(), bad.max()))  # read by the embedding: < d_vocab
        self._max_answer_id = int(max(answer_ids.max(), wrong_ids.max()))  # read from the logits: < d_vocab_out
        self._max_id = max(self._max_prompt_id, self._max_answer_id)

    # --- inputs --------------------------------------------------------------------------
    def _encode_text(self, text: str, what: str) -> list[int]:
        if self._tokenizer is not None:
            tok = self._tokenizer
            try:
                ids = tok.encode(text)
            except Exception as err:  # noqa: BLE001 - a tokenizer's own error, e.g. an unknown word
                raise ValueError(f"{what}: the tokenizer cannot encode {text!r} ({err})") from None
            ids = ids.tolist() if hasattr(ids, "tolist") else ids
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # a BatchEncoding
                ids = ids["input_ids"]
            if isinstance(ids, (list, tuple)) and len(ids) == 1 and isinstance(ids[0], (list, tuple)):
                ids = ids[0]  # a [1, n] tensor (return_tensors="pt"): one prompt
            if not isinstance(ids, (list, tuple)) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in ids
            ):
                raise ValueError(
                    f"{what}: the tokenizer's encode({text!r}) returned {ids!r:.80}, not a list of token ids"
                )
            ids = list(ids)
            unk, unk_text = getattr(tok, "unk_token_id", None), getattr(tok, "unk_token", None)
            if unk is not None and unk in ids and (unk_text is None or unk_text not in text):
                raise ValueError(
                    f"{what}: the tokenizer does not know a word of {text!r}: it encodes to its unknown token "
                    f"{unk_text!r} (id {unk}), a real token to the model"
                )
            return ids
        if self.vocab:
            index = {t: i for i, t in enumerate(self.vocab)}
            unknown = [t for t in text.split() if t not in index]
            if unknown:
                raise ValueError(f"{what}: token {unknown[0]!r} is not in the vocabulary")
            return [index[t] for t in text.split()]
        raise ValueError(f"{what} is text, so contrast needs vocab= (a tokenizer or a list of token strings)")

    def _prompts(self, prompts, what: str) -> tuple[list[Tensor], list[int]]:
        if isinstance(prompts, str):
            prompts = [prompts]
        if isinstance(prompts, Sequence) and len(prompts) == 0:
            raise ValueError(f"{what} must hold at least one non-empty prompt, got an empty list")
        if isinstance(prompts, Sequence) and prompts and all(isinstance(p, str) for p in prompts):
            rows = [torch.tensor(self._encode_text(p, what), dtype=torch.long) for p in prompts]
        elif (
            isinstance(prompts, Sequence)
            and prompts
            and all(isinstance(p, Sequence) and not isinstance(p, (str, bytes)) for p in prompts)
        ):  # a list of token-id lists, maybe of different lengths: each row on its own
            rows = [check_ids(p, 2**62, f"{what} prompt {i}") for i, p in enumerate(prompts)]
            bad = next((i for i, r in enumerate(rows) if r.ndim != 1), None)
            if bad is not None:
                raise ValueError(f"{what} prompt {bad} must be a list of token ids, got shape {tuple(rows[bad].shape)}")
        else:
            ids = check_ids(prompts, 2**62, what)
            ids = ids[None] if ids.ndim == 1 else ids
            if ids.ndim != 2:
                raise ValueError(f"{what} must be [batch, pos] ids or a list of texts, got shape {tuple(ids.shape)}")
            rows = list(ids)
        if not rows or any(len(r) == 0 for r in rows):
            raise ValueError(f"{what} must hold at least one non-empty prompt")
        return rows, [len(r) for r in rows]

    def _answers(self, value, n: int, what: str) -> Int[Tensor, " batch"]:
        if isinstance(value, str) or (isinstance(value, Sequence) and value and isinstance(value[0], str)):
            texts = [value] * n if isinstance(value, str) else list(value)
            firsts = []
            for text in texts:
                encoded = self._encode_text(text, what)
                if len(encoded) != 1:
                    raise ValueError(
                        f"{what} {text!r} encodes to {len(encoded)} tokens {encoded}; it must be one token"
                    )
                firsts.append(encoded[0])
            value = firsts
        ids = check_ids(value, 2**62, what)
        ids = ids.expand(n) if ids.ndim == 0 else ids
        if ids.shape != (n,):
            raise ValueError(f"{what} must be one token per prompt ({n}), got shape {tuple(ids.shape)}")
        return ids.clone()

    # --- the Task interface ----------------------------------------------------------------
    @property
    def d_vocab(self) -> int:
        return len(self.vocab) if self.vocab else self._max_id + 1

    @property
    def n_ctx(self) -> int:
        return self.clean.tokens.shape[1]

    def encode(self, text: str) -> Int[Tensor, " pos"]:
        return torch.tensor(self._encode_text(text, "text"), dtype=torch.long)

    def decode(self, ids) -> str | list[str]:
        ids = torch.as_tensor(ids)
        if ids.ndim == 2:
            return [cast(str, self.decode(row)) for row in ids]  # a row decodes to one string
        if self._tokenizer is not None:
            return self._tokenizer.decode(ids.tolist())
        return " ".join(self.vocab[i] if self.vocab else str(i) for i in ids.tolist())

    def token_strings(self, ids) -> list[str]:
        """One string per id: the vocabulary's, else the tokenizer's decoding of that id alone, else the id."""
        ids = torch.as_tensor(ids).tolist()
        if self.vocab:
            return [self.vocab[i] for i in ids]
        if self._tokenizer is not None:
            return [self._tokenizer.decode([i]) for i in ids]
        return [str(i) for i in ids]

    def check_model(self, model: HookedTransformer, what: str = "this task") -> HookedTransformer:
        require_model(model, what)
        cfg = model.cfg
        out = cfg.d_vocab_out if (cfg.d_vocab_out or -1) > 0 else cfg.d_vocab
        if self._max_prompt_id >= cfg.d_vocab or self._max_answer_id >= out or self.n_ctx > cfg.n_ctx:
            raise ValueError(
                f"{what}: the contrast's prompts need input ids up to {self._max_prompt_id}, answer ids up to "
                f"{self._max_answer_id} and {self.n_ctx} positions, but the model has d_vocab {cfg.d_vocab}, "
                f"d_vocab_out {out} and n_ctx {cfg.n_ctx}"
            )
        return model

    def sample(self, n: int, seed: int = 0) -> Batch:
        """The first min(n, batch) clean prompts: a contrast holds fixed inputs and draws nothing."""
        check_int("n", n, 1)
        check_seed(seed)
        return self.clean[:n]

    def corrupt(self, batch: Batch) -> Batch:
        """The corrupt prompts of the clean rows in `batch`, found by their tokens, answer, alternative and
        label; where several clean prompts are identical in all of these, the k-th such row of `batch` is the
        k-th such clean prompt (so `corrupt(sample(n))` pairs every row with its own corrupt prompt)."""
        if not isinstance(batch, Batch):
            raise TypeError(f"corrupt() takes a Batch of the contrast's clean prompts, got {type(batch).__name__}")
        rows_of: dict[tuple, list[int]] = {}
        for j in range(len(self.clean)):
            rows_of.setdefault(self._row_key(self.clean, j), []).append(j)
        used: dict[tuple, int] = {}
        rows = []
        for i in range(len(batch)):
            key = self._row_key(batch, i)
            matches = rows_of.get(key, [])
            if not matches:
                raise ValueError(f"corrupt() takes rows of the contrast's clean prompts; row {i} is not one of them")
            k = used.get(key, 0)
            rows.append(matches[k % len(matches)])
            used[key] = k + 1
        return self.corrupted[torch.tensor(rows)].to(batch.tokens.device)

    def _row_key(self, batch: Batch, i: int) -> tuple:
        width = self.clean.tokens.shape[1]
        tokens = batch.tokens[i].cpu().tolist()
        return (tuple(tokens + [self.pad_id] * (width - len(tokens))), int(batch.answer[i]), int(batch.wrong[i]),
                int(batch.labels[i]))  # fmt: skip

    def patching_inputs(self, n: int = 256, seed: int = 0) -> tuple[Batch, Batch]:
        """Every clean prompt and its corrupt prompt (n and seed are ignored: the prompts are fixed)."""
        return self.clean, self.corrupted

    @torch.no_grad()
    def evaluate(self, model: HookedTransformer, n: int = 4096, seed: int = 10_000) -> dict[str, float]:
        """On the clean prompts: mean logit difference, the share with logit(answer) > logit(wrong), and
        the share whose top prediction is the answer."""
        self.check_ready(model, "evaluate")
        batch = self.clean.to(model.cfg.device)
        logits = model(batch.tokens)
        rows = torch.arange(len(batch), device=logits.device)
        at = logits[rows, batch.answer_pos]
        diff = at[rows, batch.answer] - at[rows, batch.wrong]
        return {
            "logit_diff": float(diff.mean()),
            "answer_over_wrong": float((diff > 0).float().mean()),
            "top1": float((at.argmax(-1) == batch.answer).float().mean()),
        }

    def config(self, **kwargs) -> HookedTransformerConfig:
        raise ValueError("a contrast task builds no models: attach it to a model you have (task.attach(model))")

    def prepare(self, model: HookedTransformer) -> HookedTransformer:
        """Attach the task (nothing is imposed or frozen)."""
        return self.attach(model)

    def attach(self, model: HookedTransformer) -> HookedTransformer:
        """Set `model.task = self` (after checking the prompts fit the model); returns the model."""
        self.check_model(model, "contrast.attach")
        model.task = self
        return model

    def params(self) -> dict[str, Any]:
        raise ValueError("a contrast task is not saved with a checkpoint: set model.task = None before hc.save")

    def __repr__(self) -> str:
        return f"Contrast({len(self.clean)} prompts of up to {self.n_ctx} tokens)"


def contrast(clean, corrupt, answer, wrong, labels=None, vocab=None, pad_id: int = 0) -> Contrast:
    """A task from your own prompts for any model (see `headcoop.tasks.contrast`)."""
    return Contrast(clean, corrupt, answer, wrong, labels=labels, vocab=vocab, pad_id=pad_id)


def _is_tokenizer(vocab) -> bool:
    return vocab is not None and hasattr(vocab, "encode") and hasattr(vocab, "decode")


def _token_strings(vocab) -> list[str]:
    """The vocabulary as token strings: a list as given, a tokenizer's tokens by id, or [] if unknown."""
    if vocab is None:
        return []
    if _is_tokenizer(vocab):
        size = len(vocab) if hasattr(vocab, "__len__") else getattr(vocab, "vocab_size", 0)
        if hasattr(vocab, "convert_ids_to_tokens"):
            return [str(t) for t in vocab.convert_ids_to_tokens(list(range(size)))]
        return [vocab.decode([i]) for i in range(size)]
    if isinstance(vocab, Sequence) and not isinstance(vocab, str) and all(isinstance(t, str) for t in vocab):
        twice = sorted(t for t, k in Counter(vocab).items() if k > 1)
        if twice:
            raise ValueError(f"vocab lists these tokens more than once: {twice[:8]}; each token string needs one id")
        bad = [t for t in vocab if not t or t != t.strip() or len(t.split()) != 1]
        if bad:
            raise ValueError(
                f"vocab tokens must be non-empty words without spaces (texts are split on spaces), got {bad[:4]}"
            )
        return list(vocab)
    raise TypeError(f"vocab must be a tokenizer (encode/decode) or a list of token strings, got {type(vocab).__name__}")
