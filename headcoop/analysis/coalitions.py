"""Coalition values: v(S), the metric with only the heads in S active and every other player head ablated,
for many coalitions S per forward pass.

Players are heads (layer, head); heads that are not players stay as they are. An ablated head's z (before
W_O) is replaced exactly as `hc.ablate` replaces it: "zero", "mean" (the reference inputs' mean z at each
position) or "resample" (example i takes reference example perm[i % n_ref], perm seeded by `seed`).

Metrics are read at the answer position of each input: by name "logit_diff" (logit(answer) -
logit(wrong)), "accuracy" (argmax is the answer), "loss" (cross-entropy of the answer) and "prob" (the
answer's probability), each a mean over inputs; or a callable on [batch, pos, vocab] logits (the task's
metric is its default). Two ways to compute, both compared with `hc.ablate` + a forward pass in the tests:

- one-layer attention-only models without a norm (the logits are linear in every head's z): the logits
  of any coalition are the full model's minus, for each ablated player, its change of logits, computed
  once per player; no forward pass per coalition (named metrics only);
- any other model without hooks of its own: layer by layer. Coalitions that agree on the players of
  layers 0..l share the residual stream after layer l, so layer l runs once per distinct such prefix (a
  random order of 32 heads in 4 layers has 33 coalitions but 9 + 17 + 25 + 33 = 84 distinct layer states
  instead of 132), through TransformerLens's own block with a hook on z; with a named metric, the last
  layer computes only the row each input is read at (`headcoop.analysis.suffix.supported` models);
- models with hooks installed: C coalitions at a time stacked along the batch axis through the whole
  model, one hook per layer setting each copy's ablated heads.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer
from transformer_lens.utilities import apply_softcap, get_act_name

from headcoop.analysis.ablation import _reference_z
from headcoop.analysis.common import as_tokens, check_choice, check_positions, require_task, task_of
from headcoop.analysis.suffix import finish_block, supported
from headcoop.analysis.vocabulary import ABLATION_HOWS, METRIC_NAMES, AblationHow
from headcoop.checks import check_metric_value, installed_hooks
from headcoop.tasks.base import Batch, generator



def named_metric(name: str, logits: Float[Tensor, "*copy batch vocab"], answer: Tensor, wrong: Tensor | None) -> Tensor:
    """A named metric of logits at the answer positions, one value per leading copy (mean over inputs)."""
    right = logits.gather(-1, answer.expand(*logits.shape[:-1])[..., None])[..., 0]
    if name == "logit_diff":
        if wrong is None:
            raise ValueError('metric "logit_diff" needs the wrong answers: pass a Batch or wrong=')
        return (right - logits.gather(-1, wrong.expand(*logits.shape[:-1])[..., None])[..., 0]).mean(-1)
    if name == "accuracy":
        return (logits.argmax(-1) == answer).to(logits.dtype).mean(-1)
    logp = right - logits.logsumexp(-1)
    return (-logp).mean(-1) if name == "loss" else logp.exp().mean(-1)


class CoalitionGame:
    """v(S) for coalitions of `players` on fixed inputs (module docstring). `values(masks)` evaluates any
    [coalition, player] boolean masks (True: the player is active)."""

    def __init__(
        self, model: HookedTransformer, players: list[tuple[int, int]], tokens=None, metric=None,
        how: AblationHow = "mean", reference=None, seed: int = 0, answer=None, wrong=None, pos=None,
        memory_budget_mb: float = 256,
    ):  # fmt: skip
        check_choice("how", how, ABLATION_HOWS)
        if how == "zero" and reference is not None:
            raise ValueError('reference= only applies to how="mean" or "resample", not how=\'zero\'')
        self.model, self.players, self.how = model, list(players), how
        task = task_of(model)
        if tokens is None:
            tokens = require_task(model, "the inputs of a coalition game").patching_inputs()[0]
        batch = tokens if isinstance(tokens, Batch) else None
        self.tokens = as_tokens(model, tokens)
        n, width = self.tokens.shape
        device = self.tokens.device
        if pos is None:
            pos = batch.answer_pos if batch is not None else -1
        self.pos = check_positions(pos, n, width).to(device)
        self.answer = (batch.answer if answer is None and batch is not None else answer)
        self.wrong = (batch.wrong if wrong is None and batch is not None else wrong)
        if metric is None:
            if task is None or batch is None:
                raise ValueError('pass metric= (a name such as "logit_diff", or a callable): the default is the '
                                 "task's metric on a Batch")  # fmt: skip
            metric = lambda logits: task.metric(logits, batch.to(device))  # noqa: E731
        if isinstance(metric, str):
            check_choice("metric", metric, METRIC_NAMES)
            if self.answer is None:
                raise ValueError(f"metric {metric!r} needs the right answers: pass a Batch or answer=")
            self.answer = torch.as_tensor(self.answer).to(device)
            self.wrong = None if self.wrong is None else torch.as_tensor(self.wrong).to(device)
        elif not callable(metric):
            raise TypeError(f"metric must be a name {list(METRIC_NAMES)} or a callable, got {type(metric).__name__}")
        self.metric = metric
        self.memory_budget_mb = memory_budget_mb
        self._prepare_replacements(reference, seed)
        cfg = model.cfg
        self.linear = (
            isinstance(metric, str) and cfg.n_layers == 1 and cfg.attn_only and cfg.normalization_type is None
            and not (cfg.output_logits_soft_cap or 0) > 0 and not installed_hooks(model)
        )  # fmt: skip
        self.layered = not self.linear and not installed_hooks(model)
        if self.linear:
            self.method = "linear (one layer: per-head logit changes, no forward pass per coalition)"
        elif self.layered:
            self.method = "layer by layer, shared prefixes computed once, hooks on z"
        else:
            self.method = "stacked forward passes with hooks on z"
        if self.linear:
            self._prepare_linear()

    # --- what an ablated head writes ---------------------------------------------------------------
    def _prepare_replacements(self, reference, seed: int) -> None:
        n, width = self.tokens.shape
        layers = sorted({lay for lay, _ in self.players})
        self.replacement: dict[tuple[int, int], Tensor] = {}  # (layer, head) -> [batch, pos, d_head]
        if self.how == "zero":
            d_head = self.model.cfg.d_head
            for player in self.players:
                self.replacement[player] = torch.zeros(n, width, d_head, device=self.tokens.device)
            return
        if reference is None:
            reference = require_task(self.model, f'the reference of how="{self.how}"').sample(512, seed=0)
        ref_z = _reference_z(self.model, reference, set(layers))
        n_ref, ref_pos = next(iter(ref_z.values())).shape[:2]
        if width > ref_pos:
            raise ValueError(f"inputs of length {width} are longer than the {self.how}-ablation reference ({ref_pos} positions)")
        pick = torch.randperm(n_ref, generator=generator(seed))[torch.arange(n) % n_ref]
        for lay, head in self.players:
            z = ref_z[lay][:, :width, head]  # [ref, pos, d_head]
            value = z.mean(0).expand(n, -1, -1) if self.how == "mean" else z[pick.to(z.device)]
            self.replacement[(lay, head)] = value.to(self.tokens.device)

    # --- one layer, linear -------------------------------------------------------------------------
    @torch.no_grad()
    def _prepare_linear(self) -> None:
        model = self.model
        logits, cache = model.run_with_cache(self.tokens, names_filter=lambda n: n == get_act_name("z", 0))
        rows = torch.arange(len(self.tokens), device=logits.device)
        self.full = logits[rows, self.pos].double()  # [batch, vocab]
        z = cache[get_act_name("z", 0)][rows, self.pos]  # [batch, head, d_head]
        deltas = []
        for lay, head in self.players:
            change = z[:, head] - self.replacement[(lay, head)][rows, self.pos]
            deltas.append((change @ model.blocks[lay].attn.W_O[head] @ model.W_U).double())
        self.delta = torch.stack(deltas)  # [player, batch, vocab]: what ablating each player removes

    # --- evaluation ---------------------------------------------------------------------------------
    @torch.no_grad()
    def values(self, masks: Bool[Tensor, "coalition player"]) -> Float[Tensor, " coalition"]:
        """v(S) for each row of `masks` (True: active), float64."""
        masks = torch.as_tensor(masks, dtype=torch.bool, device=self.tokens.device)
        if masks.ndim != 2 or masks.shape[1] != len(self.players):
            raise ValueError(f"masks must be [coalition, {len(self.players)}] booleans, got {tuple(masks.shape)}")
        if installed_hooks(self.model):  # (perhaps installed since the game was built) every shortcut would bypass them
            self.method = "stacked forward passes with hooks on z, one coalition per pass (hooks installed)"
            values = self._values_stacked(masks)
        elif self.linear:
            values = self._values_linear(masks)
        elif self.layered:
            values = self._values_layered(masks)
        else:
            values = self._values_stacked(masks)
        bad = (~torch.isfinite(values)).nonzero().flatten()
        if len(bad):
            active = [i for i, on in enumerate(masks[int(bad[0])].tolist()) if on]
            raise ValueError(
                f"the metric is {float(values[bad[0]])} for {len(bad)} of {len(values)} coalitions (first: the "
                f"players {active} active); Shapley values and verdicts need a finite number for every coalition"
            )
        return values

    def _values_linear(self, masks: Tensor) -> Tensor:
        n, vocab = self.full.shape
        per_chunk = max(1, int(self.memory_budget_mb * 2**20 // (8 * 3 * n * vocab)))
        out = []
        flat = self.delta.reshape(len(self.players), -1)
        for start in range(0, len(masks), per_chunk):
            off = (~masks[start : start + per_chunk]).double()
            logits = self.full - (off @ flat).view(-1, n, vocab)
            out.append(named_metric(self.metric, logits, self.answer, self.wrong))
        return torch.cat(out)

    def _values_stacked(self, masks: Tensor) -> Tensor:
        model, cfg = self.model, self.model.cfg
        n, width = self.tokens.shape
        rows = torch.arange(n, device=self.tokens.device)
        per_sequence = (2 * cfg.n_layers * width * (4 * cfg.d_model + 3 * cfg.n_heads * width + (cfg.d_mlp or 0))
                        + 2 * width * cfg.d_vocab_out) * 4  # fmt: skip
        per_chunk = 1 if installed_hooks(model) else max(1, int(self.memory_budget_mb * 2**20 // (per_sequence * n)))
        out = []
        for start in range(0, len(masks), per_chunk):
            chunk = masks[start : start + per_chunk]
            c = len(chunk)
            hooks = [(get_act_name("z", lay), self._z_hook(lay, chunk, n)) for lay in sorted({p[0] for p in self.players})]
            logits = model.run_with_hooks(self.tokens.repeat(c, 1), fwd_hooks=hooks).view(c, n, width, -1)
            if isinstance(self.metric, str):
                at = logits[:, rows, self.pos].double()  # [c, batch, vocab]
                out.append(named_metric(self.metric, at, self.answer, self.wrong))
            else:
                out.append(torch.stack([torch.as_tensor(self.metric(copy)).double().reshape(()) for copy in logits]))
        return torch.cat(out)


    # --- layer by layer, prefixes shared ---------------------------------------------------------------
    def _layer_inputs(self) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """The residual stream entering layer 0 [batch, pos, d_model], the shortformer positional
        embedding and the attention mask (None where the model has none), from TransformerLens's own
        embedding of the inputs."""
        if not hasattr(self, "_embedded"):
            residual, _, shortformer, attention_mask = self.model.input_to_embed(self.tokens)
            self._embedded = (residual, shortformer, attention_mask)
        return self._embedded

    def _z_hook(self, layer: int, active: Tensor, n: int):
        """A hook on layer's z for a stack of len(active) states: each state's ablated players of that
        layer get their replacement."""
        idx = [i for i, (lay, _) in enumerate(self.players) if lay == layer]
        if not idx:
            return None
        heads = [self.players[i][1] for i in idx]
        source = torch.stack([self.replacement[self.players[i]] for i in idx], 2)  # [batch, pos, k, d_head]
        off = ~active[:, idx]  # [state, k]
        states = len(active)

        def hook(z: Tensor, hook=None) -> Tensor:
            z = z.view(states, n, z.shape[1], *z.shape[2:]).clone()
            current = z[:, :, :, heads]  # [state, batch, pos, k, d_head]
            z[:, :, :, heads] = torch.where(off[:, None, None, :, None], source[:, : z.shape[2]].to(z), current)
            return z.view(states * n, *z.shape[2:])

        return hook

    def _values_layered(self, masks: Tensor) -> Tensor:
        model, cfg = self.model, self.model.cfg
        n, width = self.tokens.shape
        layer_of = torch.tensor([lay for lay, _ in self.players], device=masks.device)
        row_only = (
            isinstance(self.metric, str) and supported(model) and cfg.positional_embedding_type != "rotary"
            and self._layer_inputs()[2] is None
        )  # fmt: skip
        per_state = 4 * n * width * (2 * cfg.d_model + 3 * cfg.n_heads * cfg.d_head + 2 * cfg.n_heads * width
                                     + (cfg.d_mlp or 0))  # fmt: skip
        per_chunk = max(1, int(self.memory_budget_mb * 2**20 // per_state))
        out = []
        for start in range(0, len(masks), per_chunk):
            out.append(self._layered_chunk(masks[start : start + per_chunk], layer_of, row_only))
        return torch.cat(out)

    def _layered_chunk(self, masks: Tensor, layer_of: Tensor, row_only: bool) -> Tensor:
        model, cfg = self.model, self.model.cfg
        n, width = self.tokens.shape
        residual, shortformer, attention_mask = self._layer_inputs()
        states = residual[None]  # [state, batch, pos, d_model]
        parent_of = torch.zeros(len(masks), dtype=torch.long, device=masks.device)  # coalition -> its state
        for layer in range(cfg.n_layers):
            prefix = masks[:, layer_of <= layer]
            unique, inverse = torch.unique(prefix, dim=0, return_inverse=True)
            first = torch.full((len(unique),), len(masks), dtype=torch.long, device=masks.device)
            first = first.scatter_reduce(0, inverse, torch.arange(len(masks), device=masks.device), "amin")
            x = states[parent_of[first]]  # [state, batch, pos, d_model]
            active = masks[first]  # each state's coalition (its players of later layers are not used yet)
            hook = self._z_hook(layer, active, n)
            hooks = [] if hook is None else [(get_act_name("z", layer), hook)]
            flat = x.reshape(len(unique) * n, width, -1)
            extra = None if shortformer is None else shortformer.repeat(len(unique), 1, 1)
            mask = None if attention_mask is None else attention_mask.repeat(len(unique), 1)
            if layer == cfg.n_layers - 1:
                with model.hooks(fwd_hooks=hooks) if not row_only else contextlib.nullcontext():
                    logits = (self._last_layer_rows(flat, extra, active) if row_only
                              else self._last_layer_all(flat, extra, mask))  # fmt: skip
                return self._metric_of(logits.view(len(unique), n, *logits.shape[1:]), row_only)[inverse]
            with model.hooks(fwd_hooks=hooks):
                states = model.blocks[layer](flat, shortformer_pos_embed=extra, attention_mask=mask)
            states = states.view(len(unique), n, width, -1)
            parent_of = inverse
        raise AssertionError("unreachable: a model has at least one layer")

    def _last_layer_all(self, flat: Tensor, shortformer: Tensor | None, attention_mask: Tensor | None) -> Tensor:
        model = self.model
        x = model.blocks[-1](flat, shortformer_pos_embed=shortformer, attention_mask=attention_mask)
        logits = model.unembed(model.ln_final(x) if model.cfg.normalization_type is not None else x)
        return apply_softcap(logits, model.cfg.output_logits_soft_cap)

    def _last_layer_rows(self, flat: Tensor, shortformer: Tensor | None, active: Tensor) -> Tensor:
        """Logits [state * batch, vocab] at each input's read position only: the last layer's queries,
        attention output, MLP and unembedding at that row; keys and values at every row."""
        model, layer = self.model, self.model.cfg.n_layers - 1
        block, attn = model.blocks[layer], model.blocks[layer].attn
        n, width = self.tokens.shape
        states = len(flat) // n
        at = self.pos.repeat(states)  # [state * batch]
        rows = torch.arange(len(flat), device=flat.device)
        normed = block.ln1(flat)
        qk_in = normed if shortformer is None else normed + shortformer
        q, k, v = attn.calculate_qkv_matrices(qk_in[rows, at][:, None], qk_in, normed)
        scores = attn.calculate_attention_scores(q, k)  # [state*batch, head, 1, key]
        future = torch.arange(width, device=flat.device)[None, :] > at[:, None]  # [state*batch, key]
        scores = torch.where(future[:, None, None, :], attn.IGNORE.to(scores.device), scores)
        pattern = F.softmax(scores, dim=-1).to(model.cfg.dtype)
        z = attn.calculate_z_scores(v, pattern)  # [state*batch, 1, head, d_head]
        idx = [i for i, (lay, _) in enumerate(self.players) if lay == layer]
        if idx:
            heads = [self.players[i][1] for i in idx]
            source = torch.stack([self.replacement[self.players[i]][torch.arange(n), self.pos] for i in idx], 1)
            off = (~active[:, idx]).repeat_interleave(n, 0)  # [state*batch, k]
            z[:, 0, heads] = torch.where(off[:, :, None], source.repeat(states, 1, 1).to(z), z[:, 0, heads])
        w = attn.W_O.reshape(-1, attn.W_O.shape[-1]).T
        out = F.linear(z.reshape(len(z), -1), w.contiguous(), attn.b_O)
        x = finish_block(model, layer, flat[rows, at] + out)
        return model.unembed((model.ln_final(x[:, None]) if model.cfg.normalization_type is not None else x[:, None]))[:, 0]

    def _metric_of(self, logits: Tensor, row_only: bool) -> Tensor:
        """One value per state from its logits ([state, batch, vocab] at the read rows, or [state, batch,
        pos, vocab])."""
        if isinstance(self.metric, str):
            if not row_only:
                logits = logits[:, torch.arange(len(self.tokens), device=logits.device), self.pos]
            return named_metric(self.metric, logits.double(), self.answer, self.wrong)
        return torch.stack([check_metric_value(self.metric(copy), "metric").double() for copy in logits])


def all_masks(n: int, device=None) -> Bool[Tensor, "coalition player"]:
    """Every coalition of n players, row S as the bits of the integer S (player i active iff bit i is set)."""
    if n > 24:
        raise ValueError(f"{n} players have {2**n:,} coalitions; enumerate at most 24 (use sampling above that)")
    ids = torch.arange(2**n, device=device)
    return (ids[:, None] >> torch.arange(n, device=device)) & 1 == 1


def popcount(n: int, device=None) -> Int[Tensor, " coalition"]:
    return all_masks(n, device).sum(1)


def shapley_weights(n: int, sizes: Tensor, extra: int) -> Tensor:
    """|S|! (n - |S| - extra)! / (n - extra + 1)! for coalitions of the given sizes (extra = 1: Shapley
    value; extra = 2: Shapley interaction index)."""
    lg = lambda k: torch.lgamma(k.double() + 1)  # noqa: E731
    total = math.lgamma(n - extra + 2)
    return torch.exp(lg(sizes) + lg(n - sizes - extra) - total)
