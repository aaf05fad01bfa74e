"""What every task provides: a `Batch` of token sequences and the `Task` interface.

A task is a vocabulary, a sampler, labels, a corruption and the positions where
the loss applies, plus the `HookedTransformerConfig` of the models that solve it.
"""

from __future__ import annotations

import dataclasses
import reprlib
import warnings
from abc import ABC, abstractmethod
from typing import Any, ClassVar

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from headcoop.checks import check_device, check_finite, check_int, check_seed
from headcoop.models.bridge import require_model
from headcoop.models.tl import HookedTransformer, HookedTransformerConfig
from headcoop.tasks.features import Features


@dataclasses.dataclass(frozen=True)
class Batch:
    """A batch of task sequences and everything needed to score a model on them.

    tokens:     [batch, pos]     input ids (right-padded where lengths differ)
    loss_pos:   [batch, n_loss]  positions whose next-token prediction is scored
    targets:    [batch, n_loss]  the token each loss position must predict
    answer_pos: [batch]          the position that predicts the answer
    answer:     [batch]          the right answer token
    wrong:      [batch]          the alternative answer (what the corrupted input asks for)
    labels:     [batch]          class label (Count01: 1 if more 1s than 0s; SkipPair: pair index, -1 for noise)
    vocab:      the task's token strings (for the repr; not a tensor), or None
    """

    tokens: Int[Tensor, "batch pos"]
    loss_pos: Int[Tensor, "batch n_loss"]
    targets: Int[Tensor, "batch n_loss"]
    answer_pos: Int[Tensor, " batch"]
    answer: Int[Tensor, " batch"]
    wrong: Int[Tensor, " batch"]
    labels: Int[Tensor, " batch"]
    vocab: tuple[str, ...] | None = dataclasses.field(default=None, compare=False)

    def _tensors(self) -> dict[str, Tensor]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "vocab"}

    def __repr__(self) -> str:
        """Shapes and two examples (decoded when the task's vocabulary is known), not thousands of ids."""
        shapes = ", ".join(f"{name} {list(t.shape)}" for name, t in self._tensors().items())
        examples = []
        for row in self.tokens[:2].tolist():
            text = " ".join(self.vocab[i] if self.vocab and 0 <= i < len(self.vocab) else str(i) for i in row)
            examples.append(text if len(text) <= 100 else text[:97] + "...")
        return f"Batch({len(self)} examples: {shapes}; e.g. " + " | ".join(repr(e) for e in examples) + ")"

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def __getitem__(self, index) -> "Batch":
        """Select examples: `batch[:10]`, `batch[mask]`, `batch[indices]`."""
        if isinstance(index, (str, bytes, float)) or index is None:
            raise TypeError(f"a Batch is indexed by an int, slice, mask or index tensor, got {index!r}")
        return Batch(**{name: t[index] for name, t in self._tensors().items()}, vocab=self.vocab)

    def to(self, device: torch.device | str) -> "Batch":
        target = check_device(device)
        return Batch(**{name: t.to(target) for name, t in self._tensors().items()}, vocab=self.vocab)

    def replace(self, **changes: Any) -> "Batch":
        return dataclasses.replace(self, **changes)

    @staticmethod
    def from_answers(tokens, answer, wrong, answer_pos=None, vocab: tuple[str, ...] | None = None) -> "Batch":
        """A Batch for a model with no headcoop task (a Hugging Face model, a TransformerBridge): `tokens`
        [batch, pos] ids, the right `answer` and the alternative `wrong` [batch] token ids, predicted at
        `answer_pos` [batch] (default the last position). The loss is scored at the answer position only
        and `labels` are -1 (no classes)."""
        tokens = torch.as_tensor(tokens)
        if tokens.ndim != 2 or tokens.dtype.is_floating_point:
            raise ValueError(
                f"tokens must be [batch, pos] integer ids, got shape {tuple(tokens.shape)} ({tokens.dtype})"
            )
        n, width = tokens.shape
        if n == 0:
            raise ValueError("tokens hold 0 inputs (shape [0, ...]): a Batch needs at least one")
        pos = torch.full((n,), width - 1) if answer_pos is None else torch.as_tensor(answer_pos).expand(n).clone()
        if pos.dtype.is_floating_point or ((pos < 0) | (pos >= width)).any():
            raise ValueError(f"answer_pos must be integer positions in 0..{width - 1}, got {pos.tolist()}")
        fields = {"answer": answer, "wrong": wrong}
        for name, value in fields.items():
            value = torch.as_tensor(value).to(tokens.device)
            if value.dtype == torch.bool:
                raise TypeError(f"{name} must be integer token ids, got booleans {value.tolist()}")
            if value.ndim != 1 or len(value) != n or value.dtype.is_floating_point:
                raise ValueError(
                    f"{name} must be [{n}] integer token ids (one per input), got shape {tuple(value.shape)}"
                )
            if bool((value < 0).any()):
                raise ValueError(f"{name} holds negative token ids: {value[value < 0].tolist()[:5]}")
            fields[name] = value.long()
        same = (fields["answer"] == fields["wrong"]).nonzero().flatten().tolist()
        if len(same) == n:  # as hc.contrast: refused on every input, warned on some
            raise ValueError("answer == wrong on every input: the logit difference is 0 by construction, whatever the "
                             "model does; give each input another wrong token")  # fmt: skip
        if same:
            warnings.warn(f"answer == wrong at input(s) {same[:8]}: their logit difference is 0 whatever the model does",
                          stacklevel=2)  # fmt: skip
        pos = pos.long().to(tokens.device)
        return Batch(tokens=tokens.long(), loss_pos=pos[:, None], targets=fields["answer"][:, None], answer_pos=pos,
                     answer=fields["answer"], wrong=fields["wrong"], labels=torch.full_like(pos, -1), vocab=vocab)  # fmt: skip

    @staticmethod
    def cat(batches: list["Batch"]) -> "Batch":
        """Concatenate batches of the same width along the batch axis."""
        if not batches:
            raise ValueError("Batch.cat needs at least one batch, got none")
        widths = sorted({b.tokens.shape[1] for b in batches})
        if len(widths) > 1:
            raise ValueError(f"Batch.cat needs batches of one width (tokens [batch, pos]); got widths {widths}: sample "
                             "them from one task, or pad them to one width first")  # fmt: skip
        names = batches[0]._tensors()
        return Batch(**{name: torch.cat([getattr(b, name) for b in batches]) for name in names}, vocab=batches[0].vocab)


def hold_entries(params: dict[str, Tensor], held: dict[str, Tensor]) -> None:
    """Zero the held entries of `params` (name -> tensor, a model's parameters or train_many's stacked
    ones, whose trailing dims match the masks) and mask their gradients, so that no optimizer step moves
    them: AdamW's update of an entry whose gradient is always 0 is 0, and weight decay keeps 0 at 0."""
    for name, mask in held.items():
        param = params[name]
        keep = (~mask).to(param.dtype).to(param.device)
        with torch.no_grad():
            param.mul_(keep)
        if param.requires_grad:
            param.register_hook(lambda grad, keep=keep: grad * keep)


def build_model(cfg: HookedTransformerConfig, seed: int) -> HookedTransformer:
    """A freshly initialised HookedTransformer whose weights depend on `seed` only.

    The global RNG is left untouched (TransformerLens's own `cfg.seed` reseeds it).
    """
    seed = check_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="HookedTransformer is deprecated", category=DeprecationWarning)
            model = HookedTransformer(cfg)
    model.eval()
    return model


def generator(seed: int) -> torch.Generator:
    """A private CPU generator; TypeError/ValueError for a seed that is not an int in 0..2**63 - 1."""
    return torch.Generator().manual_seed(check_seed(seed))


# The most token ids one `sample` call may hold (int64: 2 GiB); beyond it a typo such as
# max_len=10**9 would try to allocate tens of gigabytes before failing.
MAX_SAMPLE_TOKENS = 2**28


def check_sample_size(n, width: int) -> int:
    """`n` as a positive int whose [n, width] batch stays within MAX_SAMPLE_TOKENS."""
    n = check_int("n", n, 1)
    if n * width > MAX_SAMPLE_TOKENS:
        raise ValueError(
            f"a sample of n={n} sequences of width {width} holds {n * width:,} tokens, more than the "
            f"{MAX_SAMPLE_TOKENS:,} one call may draw; draw it in parts"
        )
    return n


def check_ids(ids, d_vocab: int, what: str = "token ids") -> Tensor:
    """`ids` (a tensor, list or array of integer ids) as a LongTensor; TypeError for floats or bools,
    ValueError naming an id outside 0..d_vocab - 1."""
    if isinstance(ids, (str, bytes)):
        raise TypeError(f"{what} must be integer ids, got the text {ids!r}; use encode() for text")
    try:
        ids = torch.as_tensor(ids)
    except (TypeError, ValueError, RuntimeError) as err:
        why = "rows of different lengths" if "expected sequence of length" in str(err) else str(err)
        raise TypeError(f"{what} must be integer ids, got {reprlib.repr(ids)} ({why})") from None
    if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
        raise TypeError(f"{what} must be integer ids, got dtype {ids.dtype}")
    if ids.numel() and (ids.min() < 0 or ids.max() >= d_vocab):
        bad = ids[(ids < 0) | (ids >= d_vocab)].flatten()[0].item()
        raise ValueError(f"{what}: id {bad} is outside the vocabulary 0..{d_vocab - 1}")
    return ids.long()


class Task(ABC):
    """A toy task: vocabulary, sampler, labels, corruption, loss positions and model config."""

    fixed_inputs: bool = False  # True for a task of fixed prompts (a contrast): sample() draws nothing

    name: ClassVar[str]
    vocab: list[str]

    # --- vocabulary -----------------------------------------------------------------
    @property
    def d_vocab(self) -> int:
        return len(self.vocab)

    @property
    @abstractmethod
    def n_ctx(self) -> int:
        """Width of every sampled batch; the models' context length."""

    @abstractmethod
    def encode(self, text: str) -> Int[Tensor, " pos"]:
        """Token ids of `text`; ValueError naming any unknown symbol and its position."""

    @abstractmethod
    def decode(self, ids) -> str | list[str]:
        """Text of a [pos] id sequence (a list of texts for [batch, pos])."""

    def token_strings(self, ids) -> list[str]:
        """One string per token of a [pos] sequence, for attention views and axis labels."""
        ids = check_ids(ids, self.d_vocab, f"{self.name} token ids")
        if ids.ndim != 1:
            raise ValueError(f"token_strings takes one [pos] sequence, got shape {tuple(ids.shape)}")
        return [self.vocab[i] for i in ids.tolist()]

    def check_tokens(self, tokens: Tensor) -> None:
        """ValueError if any id lies outside the vocabulary (TypeError for non-integer ids)."""
        check_ids(tokens, self.d_vocab, f"{self.name} token ids")

    def check_text(self, text) -> str:
        """`text` itself when it is a str; TypeError naming what was passed instead."""
        if not isinstance(text, str):
            raise TypeError(f"{self.name} encode() takes a str, got {text!r} ({type(text).__name__})")
        return text

    def decode_with(self, ids, join: str) -> str | list[str]:
        """Text of a [pos] id sequence (a list of texts for [batch, pos]), symbols joined by `join`."""
        ids = check_ids(ids, self.d_vocab, f"{self.name} token ids")
        if ids.ndim == 2:
            return [join.join(self.vocab[i] for i in row) for row in ids.tolist()]
        if ids.ndim != 1:
            raise ValueError(f"decode takes [pos] or [batch, pos] ids, got shape {tuple(ids.shape)}")
        return join.join(self.vocab[i] for i in ids.tolist())

    def check_model(self, model: HookedTransformer, what: str = "this task") -> HookedTransformer:
        """`model` when its vocabulary and context fit this task; ValueError naming both otherwise
        (a SkipPair task on a Count01 model, say)."""
        require_model(model, what)
        cfg = model.cfg
        if cfg.d_vocab != self.d_vocab or cfg.d_vocab_out != self.d_vocab or cfg.n_ctx < self.n_ctx:
            raise ValueError(
                f"{what}: {self!r} needs a model with d_vocab {self.d_vocab} and n_ctx >= {self.n_ctx}, but "
                f"{cfg.model_name!r} has d_vocab {cfg.d_vocab}, d_vocab_out {cfg.d_vocab_out} and n_ctx {cfg.n_ctx}"
            )
        return model

    def check_batch(self, batch) -> "Batch":
        """`batch` when it is a Batch of this task's width; TypeError/ValueError otherwise."""
        if not isinstance(batch, Batch):
            raise TypeError(f"{self.name} expects a Batch (from task.sample), got {type(batch).__name__}")
        if batch.tokens.ndim != 2 or batch.tokens.shape[1] != self.n_ctx:
            raise ValueError(f"{self.name} batches have shape [batch, {self.n_ctx}], got {tuple(batch.tokens.shape)}")
        return batch

    def check_ready(self, model: HookedTransformer, what: str) -> HookedTransformer:
        """`check_model`, and ValueError when any weight is NaN or inf."""
        self.check_model(model, what)
        check_finite(model, what)
        return model

    # --- data ------------------------------------------------------------------------
    @abstractmethod
    def sample(self, n: int, seed: int = 0) -> Batch:
        """`n` examples drawn with a private generator seeded by `seed`."""

    @abstractmethod
    def corrupt(self, batch: Batch) -> Batch:
        """The minimally different inputs whose answer is `batch.wrong`."""

    def mechanism_inputs(self, n: int = 512, seed: int = 0) -> Batch:
        """The inputs a mechanism claim is about (`hc.cooperation`'s default): `sample(n, seed)` unless the
        task narrows it (SkipPair: signal contexts only)."""
        return self.sample(n, seed=seed)

    def completions(self) -> Int[Tensor, " output"] | None:
        """The token ids a head's writes are read over (`hc.cooperation`); None: every answer of the inputs."""
        return None

    def features(self) -> Features | None:
        """The features of the inputs a same-function question is about, its semantics and the others
        (`headcoop.tasks.features`); None: the task declares none, and every edit counts alike."""
        return None

    def patching_inputs(self, n: int = 256, seed: int = 0) -> tuple[Batch, Batch]:
        """Default (clean, corrupt) pair for activation patching."""
        clean = self.sample(n, seed=seed)
        return clean, self.corrupt(clean)

    # --- scoring ---------------------------------------------------------------------
    @staticmethod
    def logit_diff(logits: Float[Tensor, "*copies batch pos vocab"], batch: Batch) -> Float[Tensor, "*copies batch"]:
        """logit(answer) - logit(wrong) at the answer position, per example (and per leading copy axis)."""
        rows = torch.arange(len(batch), device=logits.device)
        at_answer = logits[..., rows, batch.answer_pos.to(logits.device), :]  # [*copies, batch, vocab]
        return (
            at_answer[..., rows, batch.answer.to(logits.device)] - at_answer[..., rows, batch.wrong.to(logits.device)]
        )

    def metric(self, logits: Float[Tensor, "*copies batch pos vocab"], batch: Batch) -> Float[Tensor, "*copies"]:
        """The default patching metric: mean logit difference, right answer minus the alternative.

        Leading axes before [batch, pos, vocab] are kept (hc.patch scores all its stacked copies in one
        call); a task that overrides this must do the same."""
        return self.logit_diff(logits, batch).mean(-1)

    @staticmethod
    def loss_logits(logits: Float[Tensor, "batch pos vocab"], batch: Batch) -> Float[Tensor, "batch n_loss vocab"]:
        """The logits at the loss positions."""
        index = batch.loss_pos.to(logits.device)[..., None].expand(-1, -1, logits.shape[-1])
        return logits.gather(1, index)

    def row_loss(
        self, row_logits: Float[Tensor, "*copies batch n_loss vocab"], batch: Batch
    ) -> Float[Tensor, "*copies"]:
        """What training minimises, from the logits at the loss positions: mean cross-entropy over them.

        Leading axes (K stacked models in `hc.train_many`, whose batch targets carry the same axes) are
        kept, one loss per copy. Override this, not `loss`, to change the objective: `hc.train` and
        `hc.train_many` both call it."""
        targets = batch.targets.to(row_logits.device)
        if row_logits.ndim == 3:
            return torch.nn.functional.cross_entropy(row_logits.flatten(0, 1), targets.flatten())
        lead = row_logits.shape[:-3]
        flat = row_logits.reshape(-1, *row_logits.shape[-3:])  # [copy, batch, n_loss, vocab]
        targets = targets.expand(row_logits.shape[:-1]).reshape(flat.shape[:-1])
        # classes on axis 1: for logits stored vocab-major this is the fast layout
        per_row = torch.nn.functional.cross_entropy(flat.permute(0, 3, 1, 2), targets, reduction="none")
        return per_row.flatten(1).mean(1).reshape(lead)

    def row_correct(
        self, row_logits: Float[Tensor, "*copies batch n_loss vocab"], batch: Batch
    ) -> Bool[Tensor, "*copies batch n_loss"]:
        """Whether the prediction at each loss position is right (argmax == target); leading axes kept.
        Override with `row_loss` when a task scores differently."""
        return row_logits.argmax(-1) == batch.targets.to(row_logits.device)

    def loss(self, logits: Float[Tensor, "batch pos vocab"], batch: Batch) -> Float[Tensor, ""]:
        """Cross-entropy at the loss positions only (`row_loss` of the logits there)."""
        return self.row_loss(self.loss_logits(logits, batch), batch)

    def correct(self, logits: Float[Tensor, "batch pos vocab"], batch: Batch) -> Bool[Tensor, "batch n_loss"]:
        """Whether the argmax prediction is right, at each loss position (`row_correct` there)."""
        return self.row_correct(self.loss_logits(logits, batch), batch)

    @abstractmethod
    def evaluate(self, model: HookedTransformer, n: int = 4096, seed: int = 10_000) -> dict[str, float]:
        """Accuracies on fresh samples."""

    # --- models ----------------------------------------------------------------------
    @abstractmethod
    def config(self, *args: Any, **kwargs: Any) -> HookedTransformerConfig:
        """The HookedTransformerConfig of a model for this task."""

    def model(self, seed: int = 0, **kwargs) -> HookedTransformer:
        """A freshly initialised model for this task, with `model.task` set.

        `kwargs` go to `config` (n_heads, d_head, n_layers, device, ...).
        """
        return self.prepare(build_model(self.config(**kwargs), seed))

    @abstractmethod
    def prepare(self, model: HookedTransformer) -> HookedTransformer:
        """Impose the task's fixed weights, freeze them, and attach the task as `model.task`."""

    def frozen_parameters(self) -> list[str]:
        """Names of parameters this task holds fixed during training."""
        return []

    def held_entries(self, model: HookedTransformer) -> dict[str, Tensor]:
        """Parameters of which this task holds some entries fixed (at zero) while the rest train: name ->
        bool mask of the parameter's shape, True where held. `prepare` zeroes them and `hold_entries` keeps
        every training path (`hc.train`, `train_many`) from moving them."""
        return {}

    # --- persistence -----------------------------------------------------------------
    @abstractmethod
    def params(self) -> dict[str, Any]:
        """The constructor arguments that rebuild this task."""

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "params": self.params()}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return f"{type(self).__name__}({args})"

    def __eq__(self, other) -> bool:
        return type(self) is type(other) and self.params() == other.params()

    def __hash__(self) -> int:
        return hash(repr(self))
