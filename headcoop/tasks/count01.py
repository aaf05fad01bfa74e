"""Count01 (arXiv 2502.06923): does a string of 0/1/2 hold more 1s than 0s?

A sequence is `[BOS] w = a [EOS]`, w in {0,1,2}^n; `a` is '5' if w has more 1s
than 0s, else '4'. Batches are right-padded with [EOS] to width max_len + 4.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import torch
from jaxtyping import Int
from torch import Tensor

from headcoop.checks import check_bool, check_choice, check_device, check_int
from headcoop.models.tl import HookedTransformer, HookedTransformerConfig
from headcoop.tasks.base import Batch, Task, check_ids, check_sample_size, generator, hold_entries
from headcoop.tasks.features import Features, counting_features

ZERO, ONE, TWO, EQ, FOUR, FIVE, EOS, BOS = range(8)
MAX_LEN = 4096  # longer strings would need contexts no toy model here is built for
Readout = Literal["residual", "heads"]
READOUTS: tuple[str, ...] = get_args(Readout)


class Count01(Task):
    """The Count01 task.

    min_len, max_len: range of the length n of w (uniform over lengths, symbols uniform).
    include_ties:     keep strings with as many 1s as 0s (answer '4'); excluded by default.
    positional:       learn a positional embedding; by default W_pos is held at zero so
                      attention depends on token identity only.
    readout:          "residual" (default): the unembedding reads the whole residual stream, embedding
                      and biases included. "heads": the logits are a linear map of the concatenated head
                      outputs and nothing else (the reading of the paper's "head outputs are concatenated
                      and projected to logits"): the residual stream is d_model embedding dimensions plus
                      n_heads * d_head head dimensions; W_E (and W_pos) write only the former, every W_O
                      only the latter, W_U reads only the latter, b_O and b_U are held at zero. Still a
                      HookedTransformer, so every analysis runs on it.
    """

    name = "count01"
    vocab = ["0", "1", "2", "=", "4", "5", "[EOS]", "[BOS]"]

    def __init__(self, min_len: int = 1, max_len: int = 20, include_ties: bool = False, positional: bool = False,
                 readout: Readout = "residual"):  # fmt: skip
        self.max_len = check_int("max_len", max_len, 1, MAX_LEN)
        self.min_len = check_int("min_len", min_len, 1)
        if self.min_len > self.max_len:
            raise ValueError(f"need min_len <= max_len, got min_len={min_len}, max_len={max_len}")
        self.include_ties = check_bool("include_ties", include_ties)
        self.positional = check_bool("positional", positional)
        self.readout = check_choice("readout", readout, READOUTS)

    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(
            min_len=self.min_len, max_len=self.max_len, include_ties=self.include_ties, positional=self.positional
        )
        if self.readout != "residual":  # (checkpoints of the default setup keep their task JSON)
            out["readout"] = self.readout
        return out

    @property
    def n_ctx(self) -> int:
        return self.max_len + 4

    # --- text ------------------------------------------------------------------------
    def encode(self, text: str) -> Int[Tensor, " pos"]:
        """`encode("0121=")` -> ids of `[BOS] 0 1 2 1 =`. Whitespace is ignored."""
        text = self.check_text(text)
        ids, i = [], 0
        while i < len(text):
            if text[i].isspace():
                i += 1
                continue
            symbol = next((s for s in ("[EOS]", "[BOS]") if text.startswith(s, i)), text[i])
            if symbol not in self.vocab:
                raise ValueError(
                    f"unknown symbol {symbol!r} at position {i} of {text!r}; Count01 symbols are {self.vocab}"
                )
            ids.append(self.vocab.index(symbol))
            i += len(symbol)
        if not ids or ids[0] != BOS:
            ids.insert(0, BOS)
        return torch.tensor(ids, dtype=torch.long)

    def decode(self, ids) -> str | list[str]:
        return self.decode_with(ids, "")

    # --- data ------------------------------------------------------------------------
    def _draw_strings(self, n: int, g: torch.Generator) -> tuple[Tensor, Tensor]:
        """n strings (symbols [n, max_len], lengths [n]), ties rejected unless included."""
        kept_syms, kept_lens, have = [], [], 0
        while have < n:
            m = 2 * (n - have) + 16
            lengths = torch.randint(self.min_len, self.max_len + 1, (m,), generator=g)
            syms = torch.randint(0, 3, (m, self.max_len), generator=g)
            inside = torch.arange(self.max_len) < lengths[:, None]
            syms = torch.where(inside, syms, EOS)
            if not self.include_ties:
                keep = (syms == ZERO).sum(1) != (syms == ONE).sum(1)
                syms, lengths = syms[keep], lengths[keep]
            kept_syms.append(syms)
            kept_lens.append(lengths)
            have += len(lengths)
        return torch.cat(kept_syms)[:n], torch.cat(kept_lens)[:n]

    def batch_from_strings(self, syms: Int[Tensor, "batch n"], lengths: Int[Tensor, " batch"]) -> Batch:
        """A Batch from symbol rows (ids 0/1/2, anything past `lengths` ignored)."""
        syms = check_ids(syms, self.d_vocab, "Count01 symbols")
        lengths = check_ids(lengths, self.max_len + 1, "lengths")
        if syms.ndim != 2 or lengths.ndim != 1 or len(lengths) != len(syms):
            raise ValueError(f"need symbols [batch, n] and lengths [batch], got shapes {tuple(syms.shape)} and "
                             f"{tuple(lengths.shape)}")  # fmt: skip
        n = len(lengths)
        width = self.n_ctx
        if syms.shape[1] > self.max_len or lengths.max() > self.max_len or lengths.min() < 1:
            raise ValueError(f"string lengths must lie in 1..{self.max_len}, got {lengths.min()}..{lengths.max()}")
        inside = torch.arange(syms.shape[1]) < lengths[:, None]
        syms = torch.where(inside, syms, EOS)
        if ((syms > TWO) & inside).any():
            raise ValueError("Count01 strings may only hold the symbols 0, 1, 2")
        label = ((syms == ONE).sum(1) > (syms == ZERO).sum(1)).long()
        answer = FOUR + label
        tokens = torch.full((n, width), EOS, dtype=torch.long)
        tokens[:, 0] = BOS
        tokens[:, 1 : 1 + syms.shape[1]] = syms
        eq_pos = 1 + lengths
        rows = torch.arange(n)
        tokens[rows, eq_pos] = EQ
        tokens[rows, eq_pos + 1] = answer
        tokens[rows, eq_pos + 2] = EOS
        return Batch(
            tokens=tokens,
            loss_pos=torch.stack([eq_pos, eq_pos + 1], 1),
            targets=torch.stack([answer, torch.full_like(answer, EOS)], 1),
            answer_pos=eq_pos,
            answer=answer,
            wrong=FOUR + FIVE - answer,
            labels=label,
            vocab=tuple(self.vocab),
        )

    def sample(self, n: int, seed: int = 0) -> Batch:
        """`n` sequences `[BOS] w = a [EOS]`, right-padded with [EOS] to width max_len + 4."""
        n = check_sample_size(n, self.n_ctx)
        syms, lengths = self._draw_strings(n, generator(seed))
        return self.batch_from_strings(syms, lengths)

    def corrupt(self, batch: Batch) -> Batch:
        """Swap every 0 and 1 (and the written answer): the count comparison flips.

        Ties stay ties and keep the answer '4'.
        """
        self.check_batch(batch)
        tokens = batch.tokens.clone()
        tokens[batch.tokens == ZERO] = ONE
        tokens[batch.tokens == ONE] = ZERO
        n0 = (tokens == ZERO).sum(1)
        n1 = (tokens == ONE).sum(1)
        label = (n1 > n0).long()
        answer = FOUR + label
        rows = torch.arange(len(batch))
        tokens[rows, batch.answer_pos + 1] = answer
        targets = batch.targets.clone()
        targets[:, 0] = answer
        return batch.replace(tokens=tokens, targets=targets, answer=answer, wrong=FOUR + FIVE - answer, labels=label)

    def features(self) -> Features:
        """The counts of 1s and of 0s are the semantics; the noise token '2' the other (the digits' positions
        are measured apart); insertions and deletions are edits where the lengths vary."""
        lengths = (self.min_len, self.max_len) if self.min_len < self.max_len else None
        return counting_features(ZERO, ONE, TWO, start=1, lengths=lengths)

    # --- scoring ---------------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, model: HookedTransformer, n: int = 4096, seed: int = 10_000) -> dict[str, float]:
        """Accuracy of the answer at '=', of [EOS] after the answer, and of both, on `n` fresh strings."""
        self.check_ready(model, f"{self.name} evaluate")
        batch = self.sample(n, seed=seed).to(model.cfg.device)
        logits = model(batch.tokens)
        correct = self.correct(logits, batch)
        return {
            "answer_acc": correct[:, 0].float().mean().item(),
            "eos_acc": correct[:, 1].float().mean().item(),
            "both_acc": correct.all(1).float().mean().item(),
            "loss": self.loss(logits, batch).item(),
        }

    # --- models ----------------------------------------------------------------------
    def config(
        self,
        n_heads: int = 16,
        d_model: int = 32,
        d_head: int = 2,
        n_layers: int = 1,
        device: str | None = None,
    ) -> HookedTransformerConfig:
        """One attention-only layer (by default), no LayerNorm; the paper's primary size by default."""
        for key, value in dict(n_heads=n_heads, d_model=d_model, d_head=d_head, n_layers=n_layers).items():
            check_int(key, value, 1)
        device = check_device(device)
        heads = self.readout == "heads"
        return HookedTransformerConfig(
            n_layers=n_layers,
            d_model=d_model + n_heads * d_head if heads else d_model,
            d_head=d_head,
            n_heads=n_heads,
            n_ctx=self.n_ctx,
            d_vocab=self.d_vocab,
            attn_only=True,
            normalization_type=None,
            positional_embedding_type="standard",
            default_prepend_bos=False,
            model_name=f"count01-L{n_layers}-H{n_heads}-d{d_model}-dh{d_head}" + ("-heads" if heads else ""),
            device=device,
        )

    def frozen_parameters(self) -> list[str]:
        frozen = [] if self.positional else ["pos_embed.W_pos"]
        if self.readout == "heads":
            frozen += ["unembed.b_U"]  # (and every b_O: see prepare)
        return frozen

    def held_entries(self, model: HookedTransformer) -> dict[str, Tensor]:
        """With readout "heads": the embedding writes, W_O writes and W_U reads of the wrong subspace."""
        if self.readout != "heads":
            return {}
        cfg = model.cfg
        head_dims = torch.arange(cfg.d_model) >= cfg.d_model - cfg.n_heads * cfg.d_head  # [d_model]
        held = {
            "embed.W_E": head_dims.expand(cfg.d_vocab, -1),
            "unembed.W_U": (~head_dims)[:, None].expand(-1, cfg.d_vocab_out),
        }
        if self.positional:
            held["pos_embed.W_pos"] = head_dims.expand(cfg.n_ctx, -1)
        for layer in range(cfg.n_layers):
            held[f"blocks.{layer}.attn.W_O"] = (~head_dims).expand(cfg.n_heads, cfg.d_head, -1)
        return held

    def prepare(self, model: HookedTransformer) -> HookedTransformer:
        """Hold W_pos at zero unless positional (a model without W_pos, e.g. rotary, has none to hold); with
        readout "heads", hold b_O and b_U at zero and the entries of `held_entries`; attach the task."""
        if not self.positional and hasattr(model, "pos_embed"):
            with torch.no_grad():
                model.pos_embed.W_pos.zero_()
            model.pos_embed.W_pos.requires_grad_(False)
        if self.readout == "heads":
            cfg = model.cfg
            d_embed = cfg.d_model - cfg.n_heads * cfg.d_head
            if d_embed < 1 or cfg.model_name != self.config(cfg.n_heads, d_embed, cfg.d_head, cfg.n_layers).model_name:
                raise ValueError(f"readout='heads' needs a model built by this task's config (its residual stream "
                                 f"holds d_model + n_heads * d_head dimensions), got {cfg.model_name!r} with d_model "
                                 f"{cfg.d_model}")  # fmt: skip
            biases = [model.unembed.b_U] + [block.attn.b_O for block in model.blocks]
            with torch.no_grad():
                for bias in biases:
                    bias.zero_()
                    bias.requires_grad_(False)
            hold_entries(dict(model.named_parameters()), self.held_entries(model))
        model.task = self
        return model
