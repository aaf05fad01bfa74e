"""SkipPair, the OV-coherent task ("An OV-Coherent Toy Model of Attention Head Superposition").

Tokens 0..11: 0 is the read-off token, 1..4 are signal, 5..11 noise.
Signal example: noise context with exactly two positions holding signal tokens a, b
(independent, uniform over 1..4), then the read-off 0; the target is mapping[{a, b}].
Noise example: every token uniform over 5..11, target uniform over 5..11.
"""

from __future__ import annotations

import itertools
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from headcoop.checks import check_choice, check_device, check_float, check_int
from headcoop.models.tl import HookedTransformer, HookedTransformerConfig
from headcoop.tasks.base import Batch, Task, check_sample_size, generator
from headcoop.tasks.features import Features, signal_features

READ_OFF = 0
SIGNAL = (1, 2, 3, 4)
NOISE = tuple(range(5, 12))
MAX_SEQ_LEN = 4096
UNIFORM_NOISE = -1  # a target that stands for the uniform distribution over the noise tokens
LossPositions = Literal["read_off", "all"]
LOSS_POSITIONS: tuple[str, ...] = get_args(LossPositions)
PAIRS: list[tuple[int, int]] = list(itertools.combinations_with_replacement(SIGNAL, 2))

# An injection from the 10 unordered pairs to 10 distinct completions, containing
# the post's two examples {1,4} -> 3 and {3,3} -> 7. The rest is an arbitrary choice.
DEFAULT_MAPPING: dict[tuple[int, int], int] = {
    (1, 1): 5, (1, 2): 9, (1, 3): 1, (1, 4): 3, (2, 2): 11,
    (2, 3): 6, (2, 4): 2, (3, 3): 7, (3, 4): 10, (4, 4): 4,
}  # fmt: skip


def _next_signal(token: Tensor) -> Tensor:
    """The corruption's replacement for a signal token: 1->2->3->4->1."""
    return token % 4 + 1


class SkipPair(Task):
    """The OV-coherent SkipPair task.

    seq_len:         tokens per example, the read-off token included (default 10).
    signal_fraction: share of signal examples in `sample` (default 0.5).
    mapping:         {(a, b): completion} over the 10 sorted pairs of 1..4, an injection.
    loss_positions:  "read_off" (default): training's cross-entropy is taken at the last position only.
                     "all": at every position, the last with its target and every earlier one against
                     the uniform distribution over the noise tokens 5..11 (our reading of the post's
                     comment thread: a language-model loss on sequences whose next token is noise),
                     averaged over positions. Evaluation (accuracies, noise loss) reads the last position
                     either way.
    """

    name = "skip-pair"
    vocab = [str(i) for i in range(12)]

    def __init__(self, seq_len: int = 10, signal_fraction: float = 0.5, mapping: dict | None = None,
                 loss_positions: LossPositions = "read_off"):  # fmt: skip
        # seq_len >= 3: two signal tokens and the read-off
        self.seq_len = check_int("seq_len", seq_len, 3, MAX_SEQ_LEN)
        self.signal_fraction = check_float("signal_fraction", signal_fraction, 0.0, 1.0)
        self.mapping = self._check_mapping(DEFAULT_MAPPING if mapping is None else mapping)
        self.loss_positions = check_choice("loss_positions", loss_positions, LOSS_POSITIONS)
        table = torch.full((5, 5), -1, dtype=torch.long)
        for (a, b), c in self.mapping.items():
            table[a, b] = table[b, a] = c
        self._table = table
        pair_index = torch.full((5, 5), -1, dtype=torch.long)
        for i, (a, b) in enumerate(PAIRS):
            pair_index[a, b] = pair_index[b, a] = i
        self._pair_index = pair_index

    @staticmethod
    def _check_mapping(mapping: dict) -> dict[tuple[int, int], int]:
        if not isinstance(mapping, dict):
            raise TypeError(f"mapping must be a dict {{(a, b): completion}}, got {type(mapping).__name__}")
        clean = {}
        for key, value in mapping.items():
            try:
                parts = key.replace("{", "").replace("}", "").split(",") if isinstance(key, str) else list(key)
                pair = tuple(
                    sorted(check_int("a mapping key's token", t) if not isinstance(t, str) else int(t) for t in parts)
                )
            except (TypeError, ValueError):
                raise ValueError(f"mapping key {key!r} is not a pair of signal tokens 1..4") from None
            if pair not in PAIRS:
                raise ValueError(f"mapping key {key!r} is not a pair of signal tokens 1..4")
            clean[pair] = check_int(f"the mapping value of {pair}", value, 0, 11)
        if sorted(clean) != PAIRS:
            raise ValueError(f"mapping must cover all 10 pairs, missing {sorted(set(PAIRS) - set(clean))}")
        if len(set(clean.values())) != len(clean):
            raise ValueError("mapping must send the 10 pairs to 10 distinct completions")
        return dict(sorted(clean.items()))

    def params(self) -> dict[str, Any]:
        mapping = {f"{a},{b}": c for (a, b), c in self.mapping.items()}
        out = dict(seq_len=self.seq_len, signal_fraction=self.signal_fraction, mapping=mapping)
        if self.loss_positions != "read_off":  # (checkpoints of the default setup keep their task JSON)
            out["loss_positions"] = self.loss_positions
        return out

    @property
    def n_ctx(self) -> int:
        return self.seq_len

    @property
    def pairs(self) -> list[tuple[int, int]]:
        """The 10 unordered signal pairs, in the order of `labels`."""
        return list(PAIRS)

    # --- text ------------------------------------------------------------------------
    def encode(self, text: str) -> Int[Tensor, " pos"]:
        """`encode("5 3 9 1 0")` -> ids; tokens are separated by whitespace or commas."""
        words = self.check_text(text).replace(",", " ").split()
        if not words:
            raise ValueError(f"{text!r} holds no tokens; SkipPair tokens are 0..11 separated by spaces or commas")
        ids = []
        for i, word in enumerate(words):
            if word not in self.vocab:
                raise ValueError(
                    f"unknown symbol {word!r} at token position {i} of {text!r}; SkipPair tokens are 0..11"
                )
            ids.append(int(word))
        return torch.tensor(ids, dtype=torch.long)

    def decode(self, ids) -> str | list[str]:
        return self.decode_with(ids, " ")

    # --- data ------------------------------------------------------------------------
    def sample(
        self, n: int, seed: int = 0, signal_fraction: float | None = None, pair: tuple[int, int] | None = None
    ) -> Batch:
        """`n` examples; `signal_fraction` overrides the task's, `pair` fixes the signal pair."""
        n = check_sample_size(n, self.n_ctx)
        fraction = (
            self.signal_fraction
            if signal_fraction is None
            else check_float("signal_fraction", signal_fraction, 0.0, 1.0)
        )
        if pair is not None:
            if tuple(sorted(pair)) not in PAIRS:
                raise ValueError(f"pair {pair!r} is not a pair of signal tokens 1..4")
            fraction = 1.0
        g = generator(seed)
        L = self.seq_len
        tokens = torch.randint(NOISE[0], NOISE[-1] + 1, (n, L), generator=g)
        noise_target = torch.randint(NOISE[0], NOISE[-1] + 1, (n,), generator=g)
        is_signal = torch.rand(n, generator=g) < fraction
        where = torch.rand(n, L - 1, generator=g).argsort(1)[:, :2]
        if pair is None:
            signal = torch.randint(1, 5, (n, 2), generator=g)
        else:
            signal = torch.tensor(pair).expand(n, 2).clone()
            swap = torch.rand(n, generator=g) < 0.5
            signal[swap] = signal[swap].flip(1)
        signal_tokens = tokens.scatter(1, where, signal)
        signal_tokens[:, -1] = READ_OFF
        tokens = torch.where(is_signal[:, None], signal_tokens, tokens)
        return self._finish(tokens, is_signal, signal, where, noise_target)

    def _finish(self, tokens, is_signal, signal, where, noise_target) -> Batch:
        n, L = tokens.shape
        a, b = signal[:, 0], signal[:, 1]
        first = where.argmin(1)  # the earlier of the two signal positions is the one corruption replaces
        a_first = torch.where(first == 0, a, b)
        other = torch.where(first == 0, b, a)
        answer = torch.where(is_signal, self._table[a, b], noise_target)
        wrong = torch.where(is_signal, self._table[_next_signal(a_first), other], noise_target)
        labels = torch.where(is_signal, self._pair_index[a, b], -1)
        last = torch.full((n,), L - 1, dtype=torch.long)
        loss_pos, targets = last[:, None].clone(), answer[:, None].clone()
        if self.loss_positions == "all":  # every position; UNIFORM_NOISE marks the uniform-over-noise targets
            loss_pos = torch.arange(L).expand(n, L).clone()
            targets = torch.full((n, L), UNIFORM_NOISE, dtype=torch.long)
            targets[:, -1] = answer
        return Batch(
            tokens=tokens,
            loss_pos=loss_pos,
            targets=targets,
            answer_pos=last,
            answer=answer,
            wrong=wrong,
            labels=labels,
            vocab=tuple(self.vocab),
        )

    def signal_positions(self, tokens: Int[Tensor, "batch pos"]) -> Int[Tensor, "batch 2"]:
        """The two positions holding signal tokens in each signal example."""
        is_sig = (tokens >= 1) & (tokens <= 4)
        if not (is_sig.sum(1) == 2).all():
            raise ValueError("every row must hold exactly two signal tokens (1..4)")
        return is_sig.float().topk(2, dim=1, sorted=False).indices.sort(1).values

    def corrupt(self, batch: Batch) -> Batch:
        """Replace the first signal token t by t % 4 + 1 (1->2->3->4->1): the pair, so the completion, changes.

        Noise rows are returned unchanged (they have no counterfactual; their `wrong` equals `answer`).
        """
        self.check_batch(batch)
        tokens = batch.tokens.clone()
        is_signal = batch.labels >= 0
        if is_signal.any():
            rows = is_signal.nonzero().squeeze(1)
            pos = self.signal_positions(tokens[rows])
            first = pos[:, 0]
            tokens[rows, first] = _next_signal(tokens[rows, first])
        answer = torch.where(is_signal, batch.wrong, batch.answer)
        wrong = torch.where(is_signal, batch.answer, batch.wrong)
        labels = batch.labels.clone()
        if is_signal.any():
            pos = self.signal_positions(tokens[rows])
            labels[rows] = self._pair_index[tokens[rows, pos[:, 0]], tokens[rows, pos[:, 1]]]
        return batch.replace(tokens=tokens, targets=answer[:, None].clone(), answer=answer, wrong=wrong, labels=labels)

    def mechanism_inputs(self, n: int = 512, seed: int = 0) -> Batch:
        """Signal contexts only: the post's claims about the heads are about them (noise has no pattern)."""
        return self.sample(n, seed=seed, signal_fraction=1.0)

    def completions(self) -> Tensor:
        """The 10 signal completions (the post's figure reads contributions over them)."""
        return torch.tensor(sorted(set(self.mapping.values())))

    def features(self) -> Features:
        """Each signal token's count is the semantics; each noise token (the tokens between them) another
        feature, and the positions are measured apart. One length: no insertions."""
        return signal_features(SIGNAL, NOISE, tuple(str(t) for t in SIGNAL + NOISE))

    def patching_inputs(self, n: int = 256, seed: int = 0) -> tuple[Batch, Batch]:
        """Signal-only clean inputs and their corruption."""
        clean = self.sample(n, seed=seed, signal_fraction=1.0)
        return clean, self.corrupt(clean)

    # --- scoring ---------------------------------------------------------------------
    def row_loss(
        self, row_logits: Float[Tensor, "*copies batch n_loss vocab"], batch: Batch
    ) -> Float[Tensor, "*copies"]:
        """Cross-entropy at the loss positions; with loss_positions "all", positions whose target is
        UNIFORM_NOISE are scored against the uniform distribution over 5..11 (class docstring)."""
        if self.loss_positions == "read_off":
            return super().row_loss(row_logits, batch)
        logp = row_logits.log_softmax(-1)
        targets = batch.targets.to(row_logits.device).expand(row_logits.shape[:-1])
        hard = -logp.gather(-1, targets.clamp(min=0)[..., None])[..., 0]
        soft = -logp[..., NOISE[0] : NOISE[-1] + 1].mean(-1)
        return torch.where(targets == UNIFORM_NOISE, soft, hard).flatten(-2).mean(-1)

    def row_correct(self, row_logits: Float[Tensor, "*copies batch n_loss vocab"], batch: Batch) -> Tensor:
        """Whether the prediction at the read-off position is right ([*copies, batch, 1])."""
        targets = batch.targets.to(row_logits.device)
        return row_logits[..., -1:, :].argmax(-1) == targets[..., -1:]

    @torch.no_grad()
    def evaluate(self, model: HookedTransformer, n: int = 256, seed: int = 10_000) -> dict[str, float]:
        """Accuracy on each of the 10 signal pair types (`n` random contexts each, both orders),
        overall signal accuracy, and the noise-case loss beside its optimum ln 7."""
        self.check_ready(model, f"{self.name} evaluate")
        device = model.cfg.device
        result, total = {}, 0.0
        for i, pair in enumerate(PAIRS):
            batch = self.sample(n, seed=seed + i, pair=pair).to(device)
            acc = self.correct(model(batch.tokens), batch).float().mean().item()
            result[f"acc_{pair[0]}{pair[1]}"] = acc
            total += acc
        noise = self.sample(4 * n, seed=seed + 100, signal_fraction=0.0).to(device)
        result["signal_acc"] = total / len(PAIRS)
        if self.loss_positions == "read_off":
            result["noise_loss"] = self.loss(model(noise.tokens), noise).item()
        else:  # the read-off position's cross-entropy, as in the default setup
            result["noise_loss"] = F.cross_entropy(model(noise.tokens)[:, -1], noise.answer).item()
        result["noise_loss_optimum"] = float(torch.log(torch.tensor(float(len(NOISE)))))
        return result

    # --- models ----------------------------------------------------------------------
    def config(
        self,
        n_heads: int = 2,
        d_head: int = 5,
        n_layers: int = 1,
        device: str | None = None,
        d_model: int | None = None,
    ) -> HookedTransformerConfig:
        """One attention-only layer, no LayerNorm, d_model = d_vocab = 12 (one-hot residual stream)."""
        if d_model is not None and d_model != self.d_vocab:
            raise ValueError(
                f"SkipPair models have one-hot embeddings, so d_model must be {self.d_vocab}, got {d_model}"
            )
        for key, value in dict(n_heads=n_heads, d_head=d_head, n_layers=n_layers).items():
            check_int(key, value, 1)
        device = check_device(device)
        return HookedTransformerConfig(
            n_layers=n_layers,
            d_model=self.d_vocab,
            d_head=d_head,
            n_heads=n_heads,
            n_ctx=self.n_ctx,
            d_vocab=self.d_vocab,
            attn_only=True,
            normalization_type=None,
            positional_embedding_type="standard",
            default_prepend_bos=False,
            model_name=f"skip-pair-L{n_layers}-H{n_heads}-dh{d_head}",
            device=device,
        )

    def frozen_parameters(self) -> list[str]:
        return ["embed.W_E", "pos_embed.W_pos", "unembed.W_U", "unembed.b_U"]

    def prepare(self, model: HookedTransformer) -> HookedTransformer:
        """One-hot (identity) embedding and unembedding, zero W_pos and b_U, all frozen."""
        with torch.no_grad():
            eye = torch.eye(self.d_vocab, device=model.embed.W_E.device)
            model.embed.W_E.copy_(eye)
            model.unembed.W_U.copy_(eye)
            model.unembed.b_U.zero_()
            model.pos_embed.W_pos.zero_()
        for name, param in model.named_parameters():
            if name in self.frozen_parameters():
                param.requires_grad_(False)
        model.task = self
        return model
