"""The stacked-copies engine: n modified copies of one target run, side by side on the batch axis, each
scored by the metric. `hc.patch`, `hc.path_patch` and the coalition games behind `hc.interactions` are
specifications on it (as TransformerLens's `generic_activation_patch` takes a `patch_setter`).

A specification (`Copies`) gives, for copy i, the first layer it changes (`layers[i]`, copies of one layer
contiguous) and three ways to make its change:

- `setter(lo, hi)`: hooks (TransformerLens hook names and functions) that make copies lo..hi-1's changes
  on a stack of hi - lo copies of the target batch (activations [(hi - lo) * batch, ...], copy-major). The
  *stacked* path runs the model's own blocks from that layer with these hooks, starting from the target's
  cached residual stream (`start_at_layer`: earlier layers are not rerun).
- `local(layer, lo, hi)` (optional): the same copies computed without hooks from the target's cached
  activations (patch's head-local shortcut, path patching's receiver-only shortcut, the coalition game's
  shared prefixes). It returns logits (`Logits`) or a `Rows`: the copies' residual stream from some layer
  on, at rows r0.. only, which the engine runs through the later layers row-wise (`continue_rows`,
  `kernels.run_from`) and the last layer only at the rows the metric reads.
- `reference(i)`: copy i's logits [batch, pos, vocab] by the slow, obviously-correct route, one plain
  forward pass from the tokens (hooks on the activation, `hc.ablate`, TransformerLens's split q/k/v input).

The engine owns the chunk loop and its size (`copies_per_chunk`, one memory formula), the rows the metric
reads (`read_rows`), the metric per copy (`Score`), the fallback to the reference whenever any hook is
installed on the model (every shortcut would bypass it, and stacking changes the batch a hook may depend
on), and the `method` string that says which path ran (`method_label`).
"""

from __future__ import annotations

import dataclasses
import re
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Union, cast

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens.utilities import get_act_name

from headcoop.analysis.engine import kernels
from headcoop.analysis.engine.inputs import as_tokens, check_choice, read_positions, require_task, task_of
from headcoop.analysis.engine.kernels import RowLogits
from headcoop.analysis.vocabulary import METRIC_NAMES, Path, TieRule
from headcoop.checks import check_memory_budget, check_metric_value
from headcoop.display.progress import advance
from headcoop.models.bridge import is_bridge, user_hooks
from headcoop.models.tl import HookedTransformer
from headcoop.tasks.base import Batch

Hooks = list[tuple[Any, Callable[..., Any]]]  # TransformerLens's fwd_hooks: (name or name filter, hook)


# --- logits of stacked copies -------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class AtRows:
    """Logits of n copies read at one row per input: values [n, batch, vocab], input b's at position
    pos[b] (the coalition games' named metrics read nothing else)."""

    values: Float[Tensor, "copy batch vocab"]
    pos: Int[Tensor, " batch"]


@dataclasses.dataclass(frozen=True)
class Rows:
    """Copies' residual stream entering layer `start`, equal to the target's before row first_row[i] in copy
    i: `resid` [n, batch, pos, d_model], or (base [batch, pos, d_model], rows [n, batch, d_model]) where copy
    i is base with row first_row[i] replaced (a one-row patch: no full copy per patch). With `finish`,
    `resid` is layer `finish`'s resid_mid and its MLP runs on the same rows first."""

    start: int
    resid: Tensor | tuple[Tensor, Tensor]
    first_row: Int[Tensor, " copy"]
    finish: int | None = None


Logits = Union[Float[Tensor, "copy_batch pos vocab"], RowLogits, AtRows]


# --- the target run -----------------------------------------------------------------------------------
def continuation(model: HookedTransformer, tokens: Int[Tensor, "batch pos"]) -> dict[str, Tensor | None]:
    """What a forward pass started mid-model (`start_at_layer`) needs besides the residual stream, as the
    model's own `input_to_embed` computes it from `tokens`: a shortformer's positional embedding, and the
    padding mask TransformerLens derives from a left-padding tokenizer (None where there is none)."""
    if is_bridge(model):  # no mid-model start on a Bridge: its stacked copies run from the tokens
        return {"shortformer_pos_embed": None, "attention_mask": None}
    _, _, shortformer_pos_embed, attention_mask = model.input_to_embed(tokens)
    return {"shortformer_pos_embed": shortformer_pos_embed, "attention_mask": attention_mask}


def repeat_extras(extras: dict[str, Tensor | None], n: int) -> dict[str, Tensor | None]:
    """`continuation` for n stacked copies of the batch."""
    return {k: None if v is None else v.repeat(n, *[1] * (v.ndim - 1)) for k, v in extras.items()}


@dataclasses.dataclass
class Target:
    """The run every copy modifies: its tokens [batch, pos], logits, the cached activations the paths read,
    what a mid-model start needs (`extras`), the metric (`score`) and the logit rows it reads (`needed`,
    None: every row)."""

    model: HookedTransformer
    tokens: Int[Tensor, "batch pos"]
    logits: Float[Tensor, "batch pos vocab"]
    cache: Any  # transformer_lens.ActivationCache
    score: "Score"
    extras: dict[str, Tensor | None]
    needed: Int[Tensor, " row"] | None = None
    value: float | None = None  # the metric of the unmodified run

    @property
    def batch(self) -> int:
        return self.tokens.shape[0]

    @property
    def n_pos(self) -> int:
        return self.tokens.shape[1]

    def act(self, name: str, layer: int) -> Tensor:
        return self.cache[get_act_name(name, layer)]


def target_run(model: HookedTransformer, tokens: Tensor, score: "Score | None", names: Callable[[str], bool],
               rows: bool = False) -> Target:  # fmt: skip
    """Run the target once, caching the activations `names` selects, and score it (`value`); with `rows`,
    find the logit rows the metric reads (`read_rows`) so that the last layer can compute those only."""
    with warnings.catch_warnings():  # a Bridge warns of hooks a name filter matches but it never fires
        warnings.filterwarnings("ignore", message="run_with_cache: skipped")
        logits, cache = model.run_with_cache(tokens, names_filter=names)
    # a Readout's target (score None) is read at a site, never scored on the logits
    target = Target(model, tokens, logits, cache, cast(Score, score), continuation(model, tokens))
    if score is None:  # read at a site (`Readout`), not scored on the logits
        return target
    value = score.one(logits)  # checked before anything else reads the metric
    target.value = float(value) if value.numel() == 1 else None  # None: the "logits" reading
    if rows:
        target.needed = read_rows(score, logits)
    return target


def read_rows(score: "Score", logits: Float[Tensor, "batch pos vocab"]) -> Int[Tensor, " row"] | None:
    """The logit rows (positions) the metric reads, when a small candidate set passes `kernels.reads_only`:
    the rows the metric names (a task's answer positions), else the last position; None (every row)
    otherwise."""
    candidates = score.rows if score.rows is not None else torch.tensor([logits.shape[1] - 1])
    candidates = candidates.unique().to(logits.device)
    if score.named is not None:  # a named metric reads the rows it names, by construction (`Score.of_name`)
        return candidates
    return candidates if kernels.reads_only(score.metric, logits, candidates) else None


def task_score(task, batch: Batch) -> "Score":
    """A task's own metric on `batch` as a `Score`: it keeps leading axes (one call scores every stacked copy)
    and reads the answer positions (checked by `read_rows`). Pass it as `metric=` to measure with a task the
    model does not carry (the report does: no analysis needs `model.task` set)."""
    return Score(lambda logits: task.metric(logits, batch.to(logits.device)), stacked=True, rows=batch.answer_pos)


@dataclasses.dataclass(frozen=True)
class Measurement:
    """What an analysis measures, resolved once from a model, its task and the inputs (`measure`): the inputs
    `tokens` [batch, pos] (and `corrupt` [batch, pos] for a patching analysis), the positions read [batch],
    the right and wrong answers [batch] (None where neither a Batch nor the caller gave them), the Batch given
    (None for plain ids), and the metric as a `Score` (a callable, a name read at `positions`, a `Score`, or
    the task's own metric on the Batch). Every analysis that runs copies resolves its inputs here."""

    tokens: Int[Tensor, "batch pos"]
    positions: Int[Tensor, " batch"]
    score: "Score"
    answer: Tensor | None = None
    wrong: Tensor | None = None
    batch: Batch | None = None
    corrupt: Int[Tensor, "batch pos"] | None = None


def measure(model: HookedTransformer, tokens=None, metric=None, *, corrupt=None, paired: bool = False,
            answer=None, wrong=None, pos=None) -> Measurement:  # fmt: skip
    """The `Measurement` of an analysis, with the task's defaults. paired (patching): clean `tokens` and
    `corrupt` inputs, default the task's `patching_inputs()` or `task.corrupt(clean)` for a Batch, and a
    callable metric (default the task's logit difference on the clean Batch). Unpaired (a coalition game):
    inputs default the task's clean patching inputs; the metric a name ("logit_diff", ...) read at `pos`
    (default the Batch's answer positions, else the last) with `answer` / `wrong` (default the Batch's), a
    callable, or the task's metric. ValueError / TypeError naming what is missing."""
    task = task_of(model)
    if paired:
        clean_tokens, corrupt_tokens, tokens = _paired_inputs(model, task, tokens, corrupt)
    else:
        if tokens is None:
            tokens = require_task(model, "the inputs of a coalition game").patching_inputs()[0]
        clean_tokens, corrupt_tokens = as_tokens(model, tokens), None
    batch = tokens if isinstance(tokens, Batch) else None
    n, width = clean_tokens.shape
    device = clean_tokens.device
    positions = read_positions(tokens, clean_tokens, pos)
    answer = batch.answer if answer is None and batch is not None else answer
    wrong = batch.wrong if wrong is None and batch is not None else wrong
    answer = None if answer is None else torch.as_tensor(answer).to(device)
    wrong = None if wrong is None else torch.as_tensor(wrong).to(device)
    score = _score_of(metric, task, batch, answer, wrong, positions, paired, device)
    return Measurement(clean_tokens, positions, score, answer, wrong, batch, corrupt_tokens)


def _paired_inputs(model, task, clean, corrupt) -> tuple[Tensor, Tensor, object]:
    """(clean tokens, corrupt tokens, the clean inputs as given or defaulted) of a patching analysis."""
    if clean is None and corrupt is None:
        if task is None:
            raise ValueError(
                "this model carries no headcoop task, so patching needs clean=, corrupt= and metric=; "
                "build the model with hc.Count01().model(...) / hc.load(...) for task defaults"
            )
        clean, corrupt = task.patching_inputs()
    elif clean is None:
        raise ValueError("corrupt= was given without clean=; pass both (or neither, to use the task's inputs)")
    elif corrupt is None:
        if not isinstance(clean, Batch) or task is None:
            raise ValueError(
                "corrupt= is missing; it can only be derived (task.corrupt) when clean= is a Batch "
                "and the model carries a task"
            )
        corrupt = task.corrupt(clean)
    clean_tokens, corrupt_tokens = as_tokens(model, clean), as_tokens(model, corrupt)
    if clean_tokens.shape != corrupt_tokens.shape:
        raise ValueError(
            f"clean and corrupt inputs must have the same shape, got clean {tuple(clean_tokens.shape)} "
            f"and corrupt {tuple(corrupt_tokens.shape)}"
        )
    return clean_tokens, corrupt_tokens, clean


def _score_of(metric, task, batch, answer, wrong, positions, paired: bool, device) -> "Score":
    """The metric of a `Measurement` as a `Score` (see `measure`)."""
    if isinstance(metric, Score):
        return metric
    if metric is None:
        if paired and task is None:
            raise ValueError(
                "this model carries no headcoop task, so there is no default metric; pass "
                "metric=lambda logits: ... (logits [batch, pos, vocab] -> scalar tensor)"
            )
        if paired and batch is None:
            raise ValueError(
                "the default metric (the task's logit difference) needs clean= as a Batch, which knows the "
                "answers; pass a Batch or an explicit metric="
            )
        if task is None or batch is None:
            raise ValueError('pass metric= (a name such as "logit_diff", or a callable): the default is the '
                             "task's metric on a Batch")  # fmt: skip
        return task_score(task, batch.to(device))
    if isinstance(metric, str):  # one vocabulary: every analysis takes these names (issue 51)
        check_choice("metric", metric, METRIC_NAMES)
        if answer is None:
            raise ValueError(f"metric {metric!r} needs the right answers: pass clean= (or tokens=) as a Batch, "
                             "which knows them, or a callable metric")  # fmt: skip
        return Score.of_name(metric, answer, wrong, positions)
    if callable(metric):
        return Score(metric)
    raise TypeError(f"metric must be a name {list(METRIC_NAMES)} or a callable, got {type(metric).__name__}")


def clean_corrupt(model: HookedTransformer, clean, corrupt, metric) -> tuple[Tensor, Tensor, "Score"]:
    """(clean tokens [batch, pos], corrupt tokens [batch, pos], the metric as a `Score`) of a patching
    analysis: `measure(..., paired=True)`."""
    m = measure(model, clean, metric, corrupt=corrupt, paired=True)
    assert m.corrupt is not None  # paired=True: measure returns the corrupt tokens or raises
    return m.tokens, m.corrupt, m.score


# --- the metric per copy ------------------------------------------------------------------------------
TIE_TOLERANCE = 1e-5  # a margin below this share of the largest |logit| (at least 1) is a tie: float noise


def per_input_metric(name: str, logits: Float[Tensor, "*copy batch vocab"], answer: Tensor, wrong: Tensor | None,
                     ties: TieRule = "argmax") -> Float[Tensor, "*copy batch"]:  # fmt: skip
    """A named metric at each input, the one definition every analysis reads: "logit_diff" (logit(answer) -
    logit(wrong), or the best other token where wrong is None), "accuracy" (1 where the answer is the top
    logit; ties: "argmax" breaks a tie for the top by token order, as torch's argmax, "none" counts a tie as no
    answer), "loss" (cross-entropy of the answer), "prob" (the answer's probability)."""
    right = logits.gather(-1, answer.expand(*logits.shape[:-1])[..., None])[..., 0]
    if name == "accuracy":
        if ties == "argmax":
            return (logits.argmax(-1) == answer).to(logits.dtype)
        # a margin within float noise of the logits' scale is a tie (a plain forward and a coalition's
        # per-head sums then agree: 0.0 and 7.45e-9 are one margin)
        tol = TIE_TOLERANCE * logits.abs().amax(-1).clamp(min=1.0)
        return (right - _best_other(logits, answer, None) > tol).to(logits.dtype)
    if name == "logit_diff":
        return right - _best_other(logits, answer, wrong)
    logp = right - logits.logsumexp(-1)
    return -logp if name == "loss" else logp.exp()


def _best_other(logits: Tensor, answer: Tensor, wrong: Tensor | None) -> Tensor:
    """logit(wrong), or the largest logit other than the answer's where wrong is None."""
    if wrong is not None:
        return logits.gather(-1, wrong.expand(*logits.shape[:-1])[..., None])[..., 0]
    others = logits.scatter(-1, answer.expand(*logits.shape[:-1])[..., None], float("-inf"))
    return others.max(-1).values


def named_metric(name: str, logits: Float[Tensor, "*copy batch vocab"], answer: Tensor, wrong: Tensor | None) -> Tensor:
    """A named metric of logits at the answer positions, one value per leading copy (`per_input_metric`'s mean
    over inputs; accuracy counts a tie for the top logit as no answer, the rule `hc.cooperation` reads per
    input): "logit_diff", "accuracy", "loss", "prob"; "logits": the logits themselves, no mean, in the dtype they
    were computed in (what per-input evidence reads; their float64 is exact, at twice the memory)."""
    if name == "logits":
        return logits
    if name == "logit_diff" and wrong is None:
        raise ValueError('metric "logit_diff" needs the wrong answers: pass a Batch or wrong=')
    return per_input_metric(name, logits, answer, wrong, ties="none").mean(-1)


@dataclasses.dataclass(frozen=True)
class Score:
    """The metric of each copy, [n], without leaving the device.

    metric:  logits [batch, pos, vocab] -> scalar (called once per copy), or, with `stacked`, a metric that
             keeps leading axes ([n, batch, pos, vocab] -> [n], a task's metric: one call for all copies).
    named:   (name, answer [batch], wrong [batch] | None, pos [batch]): a named metric (`named_metric`)
             read at row pos[b] of input b, in float64.
    rows:    the positions the metric names as the ones it reads (checked by `read_rows`), or None.
    """

    metric: Callable
    stacked: bool = False
    named: tuple | None = None
    rows: Tensor | None = None

    @classmethod
    def of_name(cls, name: str, answer: Tensor, wrong: Tensor | None, pos: Tensor) -> "Score":
        batch = torch.arange(len(pos), device=pos.device)

        def metric(logits):  # the same metric on one copy's full logits (for read_rows and the reference)
            at = logits[..., batch, pos, :]
            return named_metric(name, at if name == "logits" else at.double(), answer, wrong)

        return cls(metric=metric, named=(name, answer, wrong, pos), rows=pos)

    @property
    def splits(self) -> bool:
        """Whether the metric is a mean over inputs (a named one), so that a batch may run in parts (`part`)."""
        return self.named is not None and self.named[0] != "logits"

    def part(self, lo: int, hi: int) -> "Score":
        """The same named metric on inputs lo..hi of the batch (their mean: `splits`)."""
        assert self.named is not None  # part() is for named metrics (`splits`)
        name, answer, wrong, pos = self.named
        return Score.of_name(name, answer[lo:hi], None if wrong is None else wrong[lo:hi], pos[lo:hi])

    def one(self, logits: Float[Tensor, "batch pos vocab"]) -> Tensor:
        """The metric of one run's logits, a 0-dim tensor ([batch, vocab] for the "logits" reading)."""
        if self.named is not None and self.named[0] == "logits":
            return self.metric(logits)
        return check_metric_value(self.metric(logits), "metric")

    def __call__(self, logits: Logits, n: int, batch: int) -> Float[Tensor, " copy"]:
        if isinstance(logits, AtRows):
            if self.named is None:
                raise TypeError("logits at one row per input can only be scored by a named metric")
            name, answer, wrong, _ = self.named
            values = logits.values if name == "logits" else logits.values.double()  # the logits: as computed
            return named_metric(name, values, answer, wrong)
        if isinstance(logits, RowLogits):
            if self.stacked or self.named is not None:
                logits = logits.full()
            else:
                return torch.stack([self.one(copy).detach().clone().to(copy.device) for copy in logits.each()])
        else:
            logits = logits.view(n, batch, *logits.shape[1:])
        if self.named is not None:
            name, answer, wrong, pos = self.named
            at = logits[:, torch.arange(batch, device=logits.device), pos]
            return named_metric(name, at if name == "logits" else at.double(), answer, wrong)
        if self.stacked:
            values = self.metric(logits)
            if values.shape != logits.shape[:1]:
                raise ValueError(
                    f"the task's metric returned shape {tuple(values.shape)} for logits {tuple(logits.shape)}; "
                    "Task.metric must keep leading axes (one value per copy)"
                )
            return values
        return torch.stack([self.one(copy).to(logits.device) for copy in logits])


# --- the specification --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Copies:
    """n modified copies of a target run (module docstring): `layers` [n] the first layer each changes
    (nondecreasing; n_layers for a change after the last block), `setter(lo, hi)` hooks for the stacked
    path, `local(layer, lo, hi)` the hook-free shortcut (None: none), `reference(i)` one copy's logits by
    one plain forward pass; `reference_hooks(i)` (optional) the hooks of that pass, with which the engine
    runs it itself and can read it at any site (`Readout`)."""

    layers: Sequence[int]
    setter: Callable[[int, int], Hooks] | None
    reference: Callable[[int], Tensor]
    local: Callable[[int, int, int], Logits | Rows] | None = None
    reference_hooks: Callable[[int], Hooks] | None = None
    chunk: int | None = None  # copies per `local` call, where the shortcut sizes its own memory (layered games)

    def __len__(self) -> int:
        return len(self.layers)


@dataclasses.dataclass(frozen=True)
class Readout:
    """What each copy is read as, instead of its logits: the activation at hook `site` (a TransformerLens
    hook name), stacked over copies [n, batch, ...], reduced by `read` to one value per copy ([n]). Copies
    stop after the site's block (`stop_at_layer`): nothing later is computed. `Score` is the logits case."""

    site: str
    read: Callable[[Tensor], Tensor]

    @property
    def layer(self) -> int | None:
        """The block the site belongs to (-1: the embeddings, before block 0; None: after the last block)."""
        match = re.match(r"blocks\.(\d+)\.", self.site)
        if match:
            return int(match.group(1))
        return -1 if self.site in ("hook_embed", "hook_pos_embed") else None

    @property
    def stop_at_layer(self) -> int | None:
        """Where copies stop: after the site's block (None: run to the end)."""
        return None if self.layer is None else self.layer + 1

    def of_target(self, target: "Target") -> Tensor:
        """The unmodified run's reading ([] per copy, for one copy): from the target's cache."""
        return self.read(target.cache[self.site][None])[0]


def read_stacked(target: "Target", layer: int, n: int, hooks: Hooks, readout: Readout) -> Tensor:
    """`readout` of n copies of the target run from the residual stream entering `layer`, through the model's
    own blocks with `hooks`, stopped after the site's block: [n] values."""
    model, stop = target.model, readout.stop_at_layer
    seen: dict[str, Tensor] = {}
    capture = (readout.site, lambda act, hook: seen.__setitem__("act", act))
    if is_bridge(model):
        model.run_with_hooks(target.tokens.repeat(n, 1), fwd_hooks=hooks + [capture], stop_at_layer=stop)
    else:
        model.run_with_hooks(target.act("resid_pre", layer).repeat(n, 1, 1), start_at_layer=layer, stop_at_layer=stop,
                             fwd_hooks=hooks + [capture], **repeat_extras(target.extras, n))  # fmt: skip
    return readout.read(seen["act"].view(n, target.batch, *seen["act"].shape[1:]))


def read_reference(target: "Target", hooks: Hooks, readout: Readout) -> Tensor:
    """`readout` of one copy by one plain forward pass from the tokens with `hooks` (every installed hook on,
    the capture after them all): [] value."""
    seen: dict[str, Tensor] = {}
    target.model.run_with_hooks(target.tokens, stop_at_layer=readout.stop_at_layer,
                                fwd_hooks=hooks + [(readout.site, lambda act, hook: seen.__setitem__("act", act))])  # fmt: skip
    return readout.read(seen["act"][None])[0]


def copies_per_chunk(
    model: HookedTransformer, batch: int, n_pos: int, memory_budget_mb: float, from_layer: int = 0,
    head_local: bool = False, rows_out: int | None = None,
) -> int:  # fmt: skip
    """How many modified copies of a [batch, n_pos] run fit in `memory_budget_mb` (at least 1): the one
    memory formula of every stacked analysis.

    Estimates the live activations of one sequence: one layer's q, k, v, z, scores and pattern (twice over
    for temporaries) for each layer run from `from_layer`; with `head_local`, the first of those layers is
    one head's recomputation instead (the patched layer's z, one head's scores, the residual stream); and
    the logits kept, `rows_out` rows (default every row), twice.
    """
    cfg = model.cfg
    n_kv = cfg.n_key_value_heads or cfg.n_heads
    layer = (
        n_pos * cfg.d_head * (2 * cfg.n_heads + 2 * n_kv)
        + 2 * cfg.n_heads * n_pos * n_pos
        + 4 * n_pos * cfg.d_model
        + (2 * n_pos * cfg.d_mlp if not cfg.attn_only and cfg.d_mlp else 0)
    )
    later = max(0, cfg.n_layers - from_layer - (1 if head_local else 0))
    first = 2 * n_pos * cfg.n_heads * cfg.d_head + 3 * n_pos * n_pos + 3 * n_pos * cfg.d_model if head_local else 0
    rows_out = n_pos if rows_out is None else rows_out
    per_sequence = (first + 2 * later * layer + 2 * rows_out * cfg.d_vocab_out) * torch.finfo(cfg.dtype).bits // 8
    return max(1, int(check_memory_budget(memory_budget_mb) * 2**20 // (per_sequence * batch)))


def inputs_per_gradient_chunk(model: HookedTransformer, n_pos: int, memory_budget_mb: float, n_writers: int = 0) -> int:
    """How many inputs of n_pos tokens one forward-and-backward pass may take within `memory_budget_mb` (at
    least 1): the same budget as `copies_per_chunk`'s, the memory an analysis adds to the loaded model, for the
    analyses that keep gradients (EAP, EAP-IG). Estimates, per input, what autograd keeps of each layer (the
    residual stream and the norms' intermediates, q, k, v, z, the scores and pattern, the MLP's pre- and
    post-activation and the activation function's intermediates), the logits and their gradient, and
    `n_writers` changes of writers' output [pos, d_model] (EAP's products). Calibrated on the GPT-2-medium
    shape at 64 tokens (benchmarks/memory.py: 480 MB per input for a plain forward and backward; this gives
    457 MB, and with EAP's 410 writers 559 MB against 537 MB measured)."""
    cfg = model.cfg
    n_kv = cfg.n_key_value_heads or cfg.n_heads
    layer = (32 * cfg.d_model + cfg.d_head * (2 * cfg.n_heads + 2 * n_kv) + 4 * cfg.n_heads * n_pos
             + (8 * cfg.d_mlp if not cfg.attn_only and cfg.d_mlp else 0))  # fmt: skip
    per_input = n_pos * (cfg.n_layers * layer + 2 * cfg.d_vocab_out + n_writers * cfg.d_model)
    per_input *= torch.finfo(cfg.dtype).bits // 8
    return max(1, int(check_memory_budget(memory_budget_mb) * 2**20 // per_input))


def gradient_part_size(model: HookedTransformer, score: "Score", n: int, n_pos: int, memory_budget_mb: float,
                       what: str, n_writers: int = 0, hooked: bool = False) -> int:  # fmt: skip
    """How many of n inputs one gradient pass takes (`inputs_per_gradient_chunk`): all of them for a metric that
    is not a mean over inputs (a callable), or where hooks are installed on the model (`hooked`: a hook may read
    the whole batch, a mean over it, so a part would not be the batch's share), with a warning beyond
    OVER_BUDGET times the budget."""
    size = inputs_per_gradient_chunk(model, n_pos, memory_budget_mb, n_writers)
    if size >= n:
        return n
    if not score.splits or hooked:
        why = "hooks are installed on the model (one may read the whole batch)" if hooked else \
            "a callable metric cannot be split over inputs"  # fmt: skip
        if n / size > OVER_BUDGET:
            warnings.warn(f"{what}: the {n} inputs need about {n / size:.0f}x memory_budget_mb={memory_budget_mb:g} "
                          f"for one gradient pass, and {why}, so they run at once; a named metric (\"logit_diff\", "
                          '"prob", "loss") on a model without hooks runs them in parts within the budget',
                          stacklevel=4)  # fmt: skip
        return n
    return size


OVER_BUDGET = 4  # a gradient pass that cannot run in parts warns beyond this many times the budget (an estimate)


def chunks(lo: int, hi: int, size: int) -> Iterator[tuple[int, int]]:
    """(start, stop) of consecutive chunks of at most `size` covering lo..hi."""
    for start in range(lo, hi, size):
        yield start, min(start + size, hi)


# --- the engine ---------------------------------------------------------------------------------------
def hooks_in_the_way(model: HookedTransformer) -> list[str]:
    """The hook points holding a hook right now (a Bridge's own routing hooks left out): any makes the
    engine take the reference path."""
    return user_hooks(model)


BRIDGE_STACKED = " (TransformerBridge: every copy runs from the tokens, the Bridge has no start_at_layer)"


@dataclasses.dataclass(frozen=True)
class Route:
    """Which path the engine takes for one analysis call, and why: `path` ("local", "stacked", "reference"),
    the hooks that forced the reference (empty if none did), and `label`, the result's `method` string;
    `evaluate` runs the copies by that path."""

    path: Path
    hooks: tuple[str, ...]
    label: str

    def evaluate(self, target: Target, copies: Copies, memory_budget_mb: float, head_local: bool = True,
                 readout: Readout | None = None) -> Float[Tensor, " copy"]:  # fmt: skip
        """The metric (or `readout`) of every copy, [n], by the path this route chose: an analysis routes
        first (the target it builds depends on the path), then evaluates through the same object, so the
        copies cannot run on another path than the one its result's `method` names."""
        return evaluate(target, copies, self.path, memory_budget_mb, head_local=head_local, readout=readout)


def route(model: HookedTransformer, method: str, fast: Path, fast_label: str, what: str = "copy",
          reference: str | None = None, no_fast: str | None = None) -> Route:  # fmt: skip
    """The engine's one policy: the reference path when `method` is "reference", when any hook is installed
    on the model (every shortcut would bypass it, and stacking changes the batch a hook may depend on), or
    when the model has no fast path (`no_fast`: why, shown in the label); else `fast` (the caller's choice for
    "auto" or a named fast path). The label names the path, on a Bridge that stacked copies run from the
    tokens, and why the reference ran."""
    hooks = tuple(hooks_in_the_way(model))
    if method != "reference" and not hooks and no_fast is None:
        return Route(fast, hooks, method_label(fast, fast_label, list(hooks), what, model))
    label = method_label("reference", fast_label, list(hooks), what, model, reference=reference)
    if no_fast is not None and not hooks and method != "reference":
        label = f"reference: {reference or f'one pass per {what}'} ({no_fast})"
    return Route("reference", hooks, label)


def method_label(path: Path, fast: str, hooks: list[str], what: str = "copy", model=None,
                 reference: str | None = None) -> str:  # fmt: skip
    """The `method` string of a result: the fast path's name (on a Bridge, that its stacked copies run from
    the tokens), or "reference: <reference>" (default "one pass per <what>") and why the reference ran
    (method='reference', or the hooks installed)."""
    if path != "reference":
        return fast + (BRIDGE_STACKED if path == "stacked" and is_bridge(model) else "")
    route = reference or f"one pass per {what}"
    if not hooks:
        return f"reference: {route} (method='reference')"
    shown = ", ".join(hooks[:3]) + (f" and {len(hooks) - 3} more" if len(hooks) > 3 else "")
    return f"reference: {route} (hooks at {shown})"


@torch.no_grad()
def evaluate(target: Target, copies: Copies, path: Path, memory_budget_mb: float,
             head_local: bool = True, readout: Readout | None = None) -> Float[Tensor, " copy"]:  # fmt: skip
    """The metric of every copy, [n] on the target's device, computed by `path`:
    "local" (the specification's shortcut, then the row-wise suffix), "stacked" (the model's blocks with the
    setter's hooks from each copy's first layer) or "reference" (one plain forward pass per copy). With a
    `readout`, each copy is read at its site instead (`evaluate_readout`)."""
    memory_budget_mb = check_memory_budget(memory_budget_mb)  # every caller's budget, checked once here
    if readout is not None:
        return evaluate_readout(target, copies, path, memory_budget_mb, readout)
    model = target.model
    batch, n_pos = target.batch, target.n_pos
    layers = torch.as_tensor(list(copies.layers))
    out = []
    advance(more=len(copies))  # the open call's progress bar (headcoop.display.progress), if any
    if path == "reference":
        for i in range(len(copies)):
            out.append(target.score.one(copies.reference(i)).to(target.logits.device))
            advance(done=1)
        return torch.stack(out) if out else torch.zeros(0)
    for layer in layers.unique().tolist():
        lo, hi = int((layers < layer).sum()), int((layers <= layer).sum())
        size = copies.chunk if path == "local" and copies.chunk else \
            copies_per_chunk(model, batch, n_pos, memory_budget_mb, from_layer=layer, head_local=path == "local" and head_local)  # fmt: skip
        for start, stop in chunks(lo, hi, size):
            if path == "local" or layer >= model.cfg.n_layers:  # after the last block there is nothing to hook
                assert copies.local is not None  # route() chose "local" (or the copies change nothing) only with one
                logits = copies.local(layer, start, stop)
                if isinstance(logits, Rows):
                    logits = continue_rows(target, logits)
            else:
                assert copies.setter is not None  # route() chose the stacked path only with a setter
                logits = run_stacked(target, layer, stop - start, copies.setter(start, stop))
            out.append(target.score(logits, stop - start, batch))
            advance(done=stop - start)
    return out[0] if len(out) == 1 else torch.cat(out)  # one chunk: no copy


@torch.no_grad()
def evaluate_readout(target: Target, copies: Copies, path: Path, memory_budget_mb: float,
                     readout: Readout) -> Tensor:  # fmt: skip
    """`readout` of every copy, [n]: the shortcuts return logits, so "local" runs stacked; a copy whose first
    change lies after the site's block reads as the target (nothing before the site changed); the reference
    runs the specification's `reference_hooks` with the capture after every hook."""
    setter = copies.setter
    site_layer = readout.layer if readout.layer is not None else target.model.cfg.n_layers
    layers = torch.as_tensor(list(copies.layers))
    unchanged = readout.of_target(target)
    out = []
    advance(more=len(copies))
    if path == "reference":
        reference_hooks = copies.reference_hooks
        if reference_hooks is None:
            raise ValueError(
                "this specification has no reference_hooks, so its reference path cannot be read at a site"
            )
        for i in range(len(copies)):
            value = unchanged if int(layers[i]) > site_layer else read_reference(target, reference_hooks(i), readout)
            out.append(value.to(unchanged.device))
            advance(done=1)
        return torch.stack(out) if out else torch.zeros(0)
    for layer in layers.unique().tolist():
        lo, hi = int((layers < layer).sum()), int((layers <= layer).sum())
        if layer > site_layer:
            out.append(unchanged[None].expand(hi - lo, *unchanged.shape))
            advance(done=hi - lo)
            continue
        size = copies_per_chunk(target.model, target.batch, target.n_pos, memory_budget_mb, from_layer=layer)
        if setter is None:
            raise ValueError("this specification has no setter, so its copies cannot be read at a site stacked")
        for start, stop in chunks(lo, hi, size):
            out.append(read_stacked(target, layer, stop - start, setter(start, stop), readout).to(unchanged.device))
            advance(done=stop - start)
    return torch.cat(out) if out else torch.zeros(0)


def run_stacked(target: Target, layer: int, n: int, hooks: Hooks) -> Float[Tensor, "copy_batch pos vocab"]:
    """Logits of n copies of the target run from the residual stream entering `layer` (cached), through the
    model's own blocks with `hooks` (each copy's change) and its final norm, unembedding and soft-cap."""
    model = target.model
    if is_bridge(model):  # the Bridge runs its Hugging Face model whole: the copies start from the tokens
        return model.run_with_hooks(target.tokens.repeat(n, 1), fwd_hooks=hooks)
    resid = target.act("resid_pre", layer) if layer < model.cfg.n_layers else None
    if resid is None:
        raise ValueError("the stacked path starts at a block; a change after the last block needs `local`")
    return model.run_with_hooks(resid.repeat(n, 1, 1), start_at_layer=layer, fwd_hooks=hooks,
                                **repeat_extras(target.extras, n))  # fmt: skip


def row_groups(first_row: Int[Tensor, " copy"], groups: int) -> list[tuple[int, Tensor]]:
    """The copies split into at most `groups` runs of nearby first changed rows: (r0, copies) with r0 the
    group's smallest first row. A group runs rows r0.. for every copy in it; a copy's rows between r0 and
    its own first row are the target's, recomputed (exact: the same inputs give the same rows). Fewer groups
    mean fewer, larger passes, more groups fewer rows each. Measured on the 2-layer shapes of
    `benchmarks/patching_shapes.py`: 2 or 4 groups were no faster than one per distinct row, so attention
    layers get one group per row; after the last block (no attention left) one group serves all."""
    starts = first_row.unique()  # sorted
    bounds = torch.linspace(0, len(starts), min(groups, len(starts)) + 1).round().long().tolist()
    out = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        members = ((first_row >= starts[lo]) & (first_row <= starts[hi - 1])).nonzero().flatten()
        out.append((int(starts[lo]), members))
    return out


def continue_rows(target: Target, resid: Rows) -> Float[Tensor, "copy_batch pos vocab"] | RowLogits:
    """Logits of copies given as `Rows`: the copies are grouped by their first changed row (`row_groups`)
    and each group runs the later layers on its rows from there (`kernels.run_from`; the last layer only at
    `target.needed`, when known); every other row is the target's. Returns [n * batch, pos, vocab], or
    `RowLogits` when the metric reads known rows."""
    model, target_logits, needed = target.model, target.logits, target.needed
    first_row = resid.first_row
    one_row = isinstance(resid.resid, tuple)
    n, batch = (resid.resid[1] if isinstance(resid.resid, tuple) else resid.resid).shape[:2]
    kept = torch.arange(target_logits.shape[1], device=target_logits.device) if needed is None else needed
    if one_row and needed is not None and resid.start == model.cfg.n_layers - 1 and resid.finish is None:
        # one changed row entering the last layer: all copies in one pass (kernels.last_layer_one_row)
        base, rows_new = resid.resid
        one_pass = kernels.last_layer_one_row(model, base, rows_new, first_row, target.cache,
                                           target.extras["shortformer_pos_embed"], needed)  # fmt: skip
        return RowLogits(target_logits, needed, one_pass.view(n, batch, len(needed), -1))
    out = target_logits[:, kept][None].repeat(n, 1, 1, 1)  # [n, batch, kept row, vocab]; changed rows below
    after_last = resid.start >= model.cfg.n_layers  # no attention left: rows are independent, one group
    if one_row and after_last and resid.finish is None:  # only a changed row the metric reads is unembedded
        copy, at = (first_row[:, None] == kept[None]).nonzero(as_tuple=True)
        if len(copy):
            out[copy, :, at] = kernels.unembed(model, resid.resid[1][copy][:, :, None])[:, :, 0]
        return out.view(n * batch, *target_logits.shape[1:]) if needed is None else RowLogits(target_logits, kept, out)
    for r0, group in row_groups(first_row, 1 if after_last else len(first_row)):
        if one_row:
            base, rows_new = resid.resid
            x = base[None, :, r0:].repeat(len(group), 1, 1, 1)
            x[torch.arange(len(group), device=x.device), :, first_row[group] - r0] = rows_new[group]
        else:
            x = cast(Tensor, resid.resid)[group, :, r0:]
        if after_last and needed is not None:  # only the rows the metric reads, before the block's MLP
            rows = kept[kept >= r0]
            if not len(rows):
                continue
            x = x[:, :, rows - r0]
            if resid.finish is not None:
                x = kernels.finish_block(model, resid.finish, x)
            logits: Tensor | None = kernels.unembed(model, x.reshape(len(group) * batch, len(rows), -1))
        else:
            if resid.finish is not None:
                x = kernels.finish_block(model, resid.finish, x)
            rows, logits = kernels.run_from(model, resid.start, x, r0, target.cache, target_logits,
                                           target.extras["shortformer_pos_embed"], needed)  # fmt: skip
        if logits is not None:
            at = torch.searchsorted(kept, rows)  # rows is a subset of kept, both sorted
            out[group[:, None], :, at[None, :]] = logits.view(len(group), batch, len(rows), -1).transpose(1, 2)
    if needed is None:
        return out.view(n * batch, *target_logits.shape[1:])
    return RowLogits(target_logits, kept, out)


__all__ = ["Copies", "Target", "Score", "Readout", "Route", "route", "Measurement", "measure", "task_score", "Rows", "AtRows", "evaluate", "copies_per_chunk",
           "inputs_per_gradient_chunk", "gradient_part_size", "target_run",
           "named_metric", "continue_rows", "run_stacked", "method_label"]  # fmt: skip
