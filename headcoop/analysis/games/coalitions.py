"""Coalition values: v(S), the metric with only the heads in S active and every other player head ablated,
for many coalitions S per forward pass: a specification on the stacked-copies engine (`copies`), copy i
being coalition i.

Players are heads (layer, head); heads that are not players stay as they are. An ablated head's z (before
W_O) is replaced as `hc.ablate` replaces it, by the same function (`ablation.replacement`): "zero", "mean"
(the reference inputs' mean z at each position) or "resample" (example i takes reference example
perm[i % n_ref], perm seeded by `seed`).

Metrics are read at the answer position of each input: by name "logit_diff" (logit(answer) -
logit(wrong)), "accuracy" (the answer is the top logit; a tie is no answer), "loss" (cross-entropy of the answer) and "prob" (the
answer's probability), each a mean over inputs; or a callable on [batch, pos, vocab] logits (the task's
metric is its default). The paths (`method`), each compared with the reference in the tests:

- "linear": one-layer attention-only models without a norm (the logits are linear in every head's z): the
  logits of any coalition are the full model's minus, for each ablated player, its change of logits,
  computed once per player; no forward pass per coalition (named metrics only);
- "layered": layer by layer. Coalitions that agree on the players of layers 0..l share the residual stream
  after layer l, so layer l runs once per distinct such prefix (a random order of 32 heads in 4 layers has
  33 coalitions but 9 + 17 + 25 + 33 = 84 distinct layer states instead of 132), through TransformerLens's
  own block with a hook on z; with a named metric, the last layer computes only the row each input is read
  at (`headcoop.analysis.engine.kernels.supported` models);
- "stacked": the engine's stacked path, C coalitions at a time through the model's blocks from the first
  player's layer, one hook per layer setting each copy's ablated heads;
- "reference": `hc.ablate` of the players outside S and one plain forward pass per coalition. It is also
  the path whenever any hook is installed on the model (every shortcut would bypass it).
"""

from __future__ import annotations

import contextlib
import math
from typing import cast

import torch
from jaxtyping import Bool, Float
from torch import Tensor
from transformer_lens.utilities import apply_softcap, get_act_name

from headcoop.analysis.engine.ablation import (
    ablate,
    describe_ablation,
    hooks_added,
    reference_z,
    replacement,
    resample_order,
    z_hooks,
)  # fmt: skip
from headcoop.analysis.engine.copies import (
    BRIDGE_STACKED,
    AtRows,
    Copies,
    Score,
    Target,
    copies_per_chunk,
    evaluate,
    hooks_in_the_way,
    measure,
    route,
    target_run,
)
from headcoop.analysis.engine.inputs import check_choice, require_task
from headcoop.analysis.engine.kernels import attention_out, finish_block, pattern_at_rows, supported, unembed
from headcoop.analysis.vocabulary import ABLATION_HOWS, GAME_METHODS, AblationHow, GameMethod, Path, head_name
from headcoop.checks import check_memory_budget
from headcoop.models.bridge import is_bridge
from headcoop.models.tl import HookedTransformer


def linear_applies(model: HookedTransformer, metric) -> bool:
    """Whether a game on `model` takes the linear path: a named metric on a one-layer attention-only model
    without a norm or soft-capping, with no hook in the way (logits linear in every head's z)."""
    cfg = model.cfg
    return (isinstance(metric, str) and cfg.n_layers == 1 and cfg.attn_only and cfg.normalization_type is None
            and not (cfg.output_logits_soft_cap or 0) > 0 and not hooks_in_the_way(model))  # fmt: skip


REPLACED, KEPT, ZEROED = 0, 1, 2  # a player's state in one coalition (`CoalitionGame.values`' zeroed=)


class CoalitionGame:
    """v(S) for coalitions of `players` on fixed inputs (module docstring). `values(masks)` evaluates any
    [coalition, player] boolean masks (True: the player is active).

    method: "auto" (linear where it applies, else layered; the reference whenever a hook is installed),
    "linear", "layered", "stacked" or "reference" (`hc.ablate` + one forward pass per coalition). `.method`
    says in words which path ran last."""

    def __init__(
        self, model: HookedTransformer, players: list[tuple[int, int]], tokens=None, metric=None,
        how: AblationHow = "mean", reference=None, seed: int = 0, answer=None, wrong=None, pos=None,
        memory_budget_mb: float = 256, method: GameMethod = "auto", replacements: dict | None = None,
    ):  # fmt: skip
        check_choice("how", how, ABLATION_HOWS)
        check_choice("method", method, GAME_METHODS)
        if how == "zero" and reference is not None:
            raise ValueError('reference= only applies to how="mean" or "resample", not how=\'zero\'')
        self.model, self.players, self.how, self.seed = model, list(players), how, seed
        measured = measure(model, tokens, metric, answer=answer, wrong=wrong, pos=pos)  # inputs resolved once
        self.measurement = measured
        self.tokens, self.pos, self.score = measured.tokens, measured.positions, measured.score
        metric = metric if metric is not None else measured.score.metric
        self.metric = metric
        self.memory_budget_mb = check_memory_budget(memory_budget_mb)
        self.custom = replacements is not None
        if replacements is None:
            self._prepare_replacements(reference)
        else:  # the caller's values (a family of references stacked on the batch axis: hc.cooperation)
            self._set_replacements(replacements)
        self.linear = linear_applies(model, metric)
        if method == "linear" and not self.linear:
            raise ValueError("method='linear' needs a one-layer attention-only model without a norm, a named metric "
                             "and no hooks installed; use 'auto'")  # fmt: skip
        # the layered path recomputes heads from HookedTransformer internals a Bridge does not have
        self.layered = (method in ("auto", "layered") and not self.linear and not hooks_in_the_way(model)
                        and not is_bridge(model))  # fmt: skip
        if method == "layered" and is_bridge(model):
            raise ValueError("method='layered' needs a HookedTransformer; a TransformerBridge runs 'stacked' or "
                             "'reference' (use 'auto')")  # fmt: skip
        self.requested = method
        self.method = self._describe(self._path())
        if self.linear:
            self._prepare_linear()

    # --- what an ablated head writes ---------------------------------------------------------------
    @property
    def ablation(self) -> str:
        """The definition the game's absent players are replaced by, in words (`describe_ablation`)."""
        if self.custom:
            return f"{self.how}: the caller's replacement values (one per input)"
        return describe_ablation(self.how, self.n_ref)

    def _prepare_replacements(self, reference) -> None:
        n, width = self.tokens.shape
        layers = sorted({lay for lay, _ in self.players})
        self.reference = reference
        self.n_ref = 0
        self.replacement: dict[tuple[int, int], Tensor] = {}  # (layer, head) -> [batch, pos, d_head]
        if self.how == "zero":
            d_head = self.model.cfg.d_head
            for player in self.players:
                self.replacement[player] = torch.zeros(n, width, d_head, device=self.tokens.device)
            return
        if reference is None:
            self.reference = require_task(self.model, f'the reference of how="{self.how}"').sample(512, seed=0)
        ref_z = reference_z(self.model, self.reference, set(layers))
        self.n_ref = next(iter(ref_z.values())).shape[0]
        order = resample_order(self.n_ref, self.seed)
        for lay, head in self.players:
            value = replacement(ref_z[lay][:, :, head, None], self.how, n, width, order)[:, :, 0]
            self.replacement[(lay, head)] = value.to(self.tokens.device)

    def _set_replacements(self, replacements: dict) -> None:
        n, width = self.tokens.shape
        self.replacement = {}
        for player in self.players:
            if player not in replacements:
                raise ValueError(f"replacements= has no value for player {head_name(*player)}")
            value = torch.as_tensor(replacements[player]).to(self.tokens.device)
            if value.shape[:2] != (n, width) or value.shape[2] != self.model.cfg.d_head:
                raise ValueError(f"replacements[{head_name(*player)}] must be [{n}, {width}, {self.model.cfg.d_head}], "
                                 f"got {tuple(value.shape)}")  # fmt: skip
            self.replacement[player] = value

    # --- one layer, linear -------------------------------------------------------------------------
    @torch.no_grad()
    def _prepare_linear(self) -> None:
        model = self.model
        logits, cache = model.run_with_cache(self.tokens, names_filter=lambda n: n == get_act_name("z", 0))
        rows = torch.arange(len(self.tokens), device=logits.device)
        self.full = logits[rows, self.pos].double()  # [batch, vocab]
        z = cache[get_act_name("z", 0)][rows, self.pos]  # [batch, head, d_head]
        deltas, writes = [], []
        for lay, head in self.players:
            change = z[:, head] - self.replacement[(lay, head)][rows, self.pos]
            deltas.append((change @ model.blocks[lay].attn.W_O[head] @ model.W_U).double())
            writes.append((self.replacement[(lay, head)][rows, self.pos] @ model.blocks[lay].attn.W_O[head]
                           @ model.W_U).double())  # fmt: skip
        self.delta = torch.stack(deltas)  # [player, batch, vocab]: what ablating each player removes
        self.writes = torch.stack(writes)  # [player, batch, vocab]: what its replacement writes (zeroing removes it)

    # --- evaluation ---------------------------------------------------------------------------------
    def _path(self) -> str:
        if route(self.model, self.requested, "stacked", "").path == "reference":  # the engine's one policy
            return "reference"
        if self.linear:
            return "linear"
        return "layered" if self.layered else "stacked"

    def _describe(self, path: str) -> str:
        if path == "reference":
            hooks = hooks_in_the_way(self.model)
            why = "hooks installed" if hooks else "method='reference'"
            return f"reference: hc.ablate and one forward pass per coalition ({why})"
        return {
            "linear": "linear (one layer: per-head logit changes, no forward pass per coalition)",
            "layered": "layer by layer, shared prefixes computed once, hooks on z",
            "stacked": "stacked forward passes with hooks on z" + (BRIDGE_STACKED if is_bridge(self.model) else ""),
        }[path]

    @torch.no_grad()
    def values(
        self, masks: Bool[Tensor, "coalition player"], score: Score | None = None,
        zeroed: Bool[Tensor, "coalition player"] | None = None,
    ) -> Float[Tensor, " coalition"]:  # fmt: skip
        """v(S) for each row of `masks` (True: active), float64; `score`: another reading of each coalition's
        logits than the game's metric (`row_logits` reads the logits themselves); `zeroed`: absent players
        zeroed instead of replaced, per coalition (a third state beside kept and replaced, so that runs
        that differ only there share their prefixes)."""
        masks = torch.as_tensor(masks, dtype=torch.bool, device=self.tokens.device)
        if masks.ndim != 2 or masks.shape[1] != len(self.players):
            raise ValueError(f"masks must be [coalition, {len(self.players)}] booleans, got {tuple(masks.shape)}")
        masks = self._states(masks, zeroed)
        path = self._path()  # hooks may have been installed since the game was built
        self.method = self._describe(path)
        first = min(lay for lay, _ in self.players)
        named = isinstance(self.metric, str) or score is not None  # a named reading reads the rows only
        target = self._target(first if path == "stacked" else None, self.score if score is None else score)
        # the logits themselves (`row_logits`) are the result, kept whole: they do not size the chunks
        result_rows = score is not None and score.named is not None and score.named[0] == "logits"
        copies = self._copies(masks, target, first, path, named, result_rows)
        engine_path = cast(Path, {"linear": "local", "layered": "local"}.get(path, path))
        values = evaluate(target, copies, engine_path, self.memory_budget_mb, head_local=False)
        if not result_rows or path == "linear":  # the logits themselves stay as computed: .double() of them is exact
            values = values.double()
        bad = (~torch.isfinite(values.reshape(len(values), -1)).all(1)).nonzero().flatten()
        if len(bad):
            active = [i for i, on in enumerate(masks[int(bad[0])].tolist()) if on == KEPT]
            flat = values[bad[0]].flatten()
            raise ValueError(
                f"the metric is {float(flat[~torch.isfinite(flat)][0])} for {len(bad)} of {len(values)} coalitions (first: the "
                f"players {active} active); Shapley values and verdicts need a finite number for every coalition"
            )
        return values

    @torch.no_grad()
    def row_logits(
        self, masks: Bool[Tensor, "coalition player"], zeroed: Bool[Tensor, "coalition player"] | None = None
    ) -> Float[Tensor, "coalition batch vocab"]:
        """The logits of each coalition at each input's read row (no metric, no mean over inputs): the per-input
        evidence `hc.cooperation` reads, in the model's dtype as computed (float64 on the linear path; their
        .double() is exact, at half the memory of storing it). Same paths as `values` (`zeroed` as there)."""
        return self.values(masks, score=Score.of_name("logits", self.pos, None, self.pos), zeroed=zeroed)

    def _states(self, masks: Tensor, zeroed) -> Tensor:
        """[coalition, player] int8: each player KEPT, REPLACED or ZEROED (`values`)."""
        states = torch.where(masks, KEPT, REPLACED).to(torch.int8)
        if zeroed is None:
            return states
        zeroed = torch.as_tensor(zeroed, dtype=torch.bool, device=masks.device)
        if zeroed.shape != masks.shape:
            raise ValueError(f"zeroed must be {list(masks.shape)} booleans like masks, got {tuple(zeroed.shape)}")
        if bool((zeroed & masks).any()):
            raise ValueError("zeroed marks a player the same coalition keeps: only an absent player can be zeroed")
        return torch.where(zeroed, torch.tensor(ZEROED, dtype=torch.int8), states)

    def _target(self, cached_layer: int | None, score: Score) -> Target:
        """The unablated run: tokens and score, with the residual stream entering `cached_layer` cached."""
        model = self.model
        if cached_layer is None:
            logits = torch.zeros(0, device=self.tokens.device)
            return Target(model, self.tokens, logits, None, score, {})
        name = get_act_name("resid_pre", cached_layer)
        return target_run(model, self.tokens, score, lambda n: n == name)

    def _copies(self, masks: Tensor, target: Target, first: int, path: str, named: bool,
                result_rows: bool = False) -> Copies:  # fmt: skip
        """The engine's specification: copy i is coalition masks[i]; `named`: the score reads each input's
        row only (a named metric or the logits), so the layered path may stop at the read rows;
        `result_rows`: those rows are the caller's result (kept whole), not a chunk's temporary."""
        model, (n, width) = self.model, self.tokens.shape
        player_layers = sorted({lay for lay, _ in self.players})
        n_layers = model.cfg.n_layers
        # the layer of a copy sizes its chunks: the layered path holds one layer's activations at a time
        layer = {"stacked": first, "layered": n_layers - 1, "linear": n_layers}.get(path, first)

        def setter(lo: int, hi: int):
            chunk = masks[lo:hi]
            return [(get_act_name("z", lay), self._z_hook(lay, chunk, n)) for lay in player_layers]

        def reference(i: int) -> Tensor:
            state = masks[i].tolist()
            off = [head_name(*p) for p, on in zip(self.players, state) if on == REPLACED]
            zero = [head_name(*p) for p, on in zip(self.players, state) if on == ZEROED]
            if not off and not zero:
                return model(self.tokens)
            if self.custom:  # the caller's replacement values (or zeros), set on z by plain hooks
                values = {p: self.replacement[p] if on == REPLACED else torch.zeros_like(self.replacement[p])
                          for p, on in zip(self.players, state) if on != KEPT}  # fmt: skip
                with hooks_added(model, z_hooks(values)):
                    return model(self.tokens)
            with contextlib.ExitStack() as stack:
                if zero:
                    stack.enter_context(ablate(model, heads=zero, how="zero"))
                if off:
                    stack.enter_context(ablate(model, heads=off, how=self.how, seed=self.seed,
                                               reference=None if self.how == "zero" else self.reference))  # fmt: skip
                return model(self.tokens)

        def local(_layer: int, lo: int, hi: int):
            if path == "linear":
                return self._linear_chunk(masks[lo:hi])
            return self._layered_chunk(masks[lo:hi], named)

        chunk = None
        if path == "layered":  # coalitions share prefixes within a chunk: take as many as their kept states allow
            # per coalition: its residual stream state, and the logits a chunk holds before they are scored
            rows = 0 if result_rows else 1 if self._row_only(named) else width
            held = (
                n
                * (width * model.cfg.d_model + 2 * rows * model.cfg.d_vocab_out)
                * torch.finfo(model.cfg.dtype).bits
                // 8
            )
            chunk = max(1, int(check_memory_budget(self.memory_budget_mb) * 2**20 // held))
        return Copies(layers=[layer] * len(masks), setter=setter, reference=reference, local=local, chunk=chunk)

    def _linear_chunk(self, masks: Tensor) -> AtRows:
        n, vocab = self.full.shape
        off = (masks != KEPT).double()  # replaced or zeroed: the head's own write minus the replacement's
        logits = self.full - (off @ self.delta.reshape(len(self.players), -1)).view(-1, n, vocab)
        if bool((masks == ZEROED).any()):  # a zeroed player removes the replacement's write too
            logits = logits - ((masks == ZEROED).double() @ self.writes.reshape(len(self.players), -1)).view(
                -1, n, vocab
            )
        return AtRows(logits, self.pos)

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
        """A hook on layer's z for a stack of len(active) states ([state, player] KEPT, REPLACED or ZEROED):
        each state's ablated players of that layer get their replacement, its zeroed ones zeros."""
        idx = [i for i, (lay, _) in enumerate(self.players) if lay == layer]
        if not idx:
            return None
        heads = [self.players[i][1] for i in idx]
        source = torch.stack([self.replacement[self.players[i]] for i in idx], 2)  # [batch, pos, k, d_head]
        off = active[:, idx] != KEPT  # [state, k]
        zero = active[:, idx] == ZEROED if bool((active[:, idx] == ZEROED).any()) else None
        states = len(active)

        def hook(z: Tensor, hook=None) -> Tensor:
            z = z.view(states, n, z.shape[1], *z.shape[2:]).clone()
            current = z[:, :, :, heads]  # [state, batch, pos, k, d_head]
            new = source[None, :, : z.shape[2]].to(z)
            if zero is not None:
                new = torch.where(zero[:, None, None, :, None], torch.zeros((), dtype=z.dtype, device=z.device), new)
            z[:, :, :, heads] = torch.where(off[:, None, None, :, None], new, current)
            return z.view(states * n, *z.shape[2:])

        return hook

    def _layered_chunk(self, masks: Tensor, named: bool) -> AtRows | Tensor:
        """Logits of each coalition of the chunk (module docstring, "layered"): [c, batch, vocab] at each
        input's read row (AtRows) with a named metric on a supported model, else [c * batch, pos, vocab]."""
        model, cfg = self.model, self.model.cfg
        n, width = self.tokens.shape
        residual, shortformer, attention_mask = self._layer_inputs()
        row_only = self._row_only(named)
        layer_of = torch.tensor([lay for lay, _ in self.players], device=masks.device)
        states = residual[None]  # [state, batch, pos, d_model]
        parent_of = torch.zeros(len(masks), dtype=torch.long, device=masks.device)  # coalition -> its state
        for layer in range(cfg.n_layers):
            prefix = masks[:, layer_of <= layer]
            if prefix.shape[1] == 0:  # no player up to this layer: every coalition shares the one state
                unique, inverse = prefix[:1], torch.zeros(len(masks), dtype=torch.long, device=masks.device)
            else:
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
                if row_only:
                    if len(unique) == len(masks):  # no two coalitions alike: the states, not the logits, reordered
                        flat = x[inverse].reshape(len(masks) * n, width, -1)
                        logits = self._last_layer_rows(flat, extra, masks)
                        return AtRows(logits.view(len(masks), n, -1), self.pos)
                    logits = self._last_layer_rows(flat, extra, active).view(len(unique), n, -1)
                    return AtRows(logits[inverse], self.pos)
                with model.hooks(fwd_hooks=hooks):
                    logits = self._last_layer_all(flat, extra, mask)
                return logits.view(len(unique), n, *logits.shape[1:])[inverse].flatten(0, 1)
            states = self._block_in_pieces(layer, flat, extra, mask, active).view(len(unique), n, width, -1)
            parent_of = inverse
        raise AssertionError("unreachable: a model has at least one layer")

    def _row_only(self, named: bool) -> bool:
        """Whether the layered path's last layer computes each input's read row only (a named metric on a
        supported model without rotary positions or an attention mask)."""
        return (named and supported(self.model) and self.model.cfg.positional_embedding_type != "rotary"
                and self._layer_inputs()[2] is None)  # fmt: skip

    def _block_in_pieces(self, layer: int, flat: Tensor, extra: Tensor | None, mask: Tensor | None,
                         active: Tensor) -> Tensor:  # fmt: skip
        """Block `layer` on the stacked states [states * batch, pos, d_model] (`active` [states, player]: each
        state's coalition), a few states at a time so that one block's activations stay within the memory
        budget, each piece with the hook that ablates its states' absent players."""
        model, n = self.model, len(self.tokens)
        states, width = len(active), flat.shape[1]
        per = copies_per_chunk(model, n, width, self.memory_budget_mb, from_layer=model.cfg.n_layers - 1, rows_out=0)
        out = []
        for lo in range(0, states, per):
            hi, rows = min(states, lo + per), slice(lo * n, min(states, lo + per) * n)
            hook = self._z_hook(layer, active[lo:hi], n)
            with model.hooks(fwd_hooks=[] if hook is None else [(get_act_name("z", layer), hook)]):
                out.append(model.blocks[layer](flat[rows], shortformer_pos_embed=None if extra is None else extra[rows],
                                               attention_mask=None if mask is None else mask[rows]))  # fmt: skip
        return torch.cat(out) if len(out) > 1 else out[0]

    def _last_layer_all(self, flat: Tensor, shortformer: Tensor | None, attention_mask: Tensor | None) -> Tensor:
        model = self.model
        x = model.blocks[-1](flat, shortformer_pos_embed=shortformer, attention_mask=attention_mask)
        logits = unembed(model, x)
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
        pattern = pattern_at_rows(model, attn, q, k, at, align="copy")  # one query row per [state*batch] entry
        z = attn.calculate_z_scores(v, pattern)  # [state*batch, 1, head, d_head]
        idx = [i for i, (lay, _) in enumerate(self.players) if lay == layer]
        if idx:
            heads = [self.players[i][1] for i in idx]
            source = torch.stack([self.replacement[self.players[i]][torch.arange(n), self.pos] for i in idx], 1)
            off = (active[:, idx] != KEPT).repeat_interleave(n, 0)  # [state*batch, k]
            new = source.repeat(states, 1, 1).to(z)
            zero = (active[:, idx] == ZEROED).repeat_interleave(n, 0)
            new = torch.where(zero[:, :, None], torch.zeros((), dtype=z.dtype, device=z.device), new)
            z[:, 0, heads] = torch.where(off[:, :, None], new, z[:, 0, heads])
        x = finish_block(model, layer, flat[rows, at] + attention_out(attn, z[:, 0]))
        return unembed(model, x[:, None])[:, 0]


def layered_passes(model, players: list[tuple[int, int]], masks: Bool[Tensor, "coalition player"]) -> float:
    """Forward passes of one batch the layered path runs for `masks` (its distinct prefix states per layer,
    each one block of the batch, over the layers of a pass): what `values` costs on a model without the
    linear path and without hooks. A Bridge runs every coalition from the tokens: len(masks) passes."""
    if is_bridge(model):
        return float(len(masks))
    n_layers = model.cfg.n_layers
    masks = torch.as_tensor(masks)  # booleans, or the game's KEPT / REPLACED / ZEROED states
    layer_of = torch.tensor([lay for lay, _ in players])
    states = 0
    for layer in range(n_layers):
        prefix = masks[:, layer_of <= layer]
        states += 1 if prefix.shape[1] == 0 else len(torch.unique(prefix, dim=0))
    return states / n_layers


def game_seconds(game: "CoalitionGame", masks: Bool[Tensor, "coalition player"], forward_s: float,
                 sample: int = 256) -> float:  # fmt: skip
    """Predicted seconds of `game.values(masks)`: on the linear path, timed on `sample` of the coalitions and
    extrapolated (its cost is per coalition); on the layered path, `layered_passes` x forward_s (the batch's
    forward time); otherwise one forward pass per coalition from the first player's layer."""
    import time

    if game.linear:  # a fixed cost per call and one per coalition: two sample sizes give both
        order = torch.randperm(len(masks), generator=torch.Generator().manual_seed(0))
        if len(masks) <= 4 * sample:
            start = time.perf_counter()
            game.values(masks)
            return time.perf_counter() - start
        times = []
        for size in (sample, 4 * sample):
            start = time.perf_counter()
            game.values(masks[order[:size]])
            times.append(time.perf_counter() - start)
        per = max(0.0, (times[1] - times[0]) / (3 * sample))
        return max(0.0, times[0] - per * sample) + per * len(masks)
    if game.layered:
        return layered_passes(game.model, game.players, masks) * forward_s
    first = min(lay for lay, _ in game.players)
    return len(masks) * forward_s * (game.model.cfg.n_layers - first) / game.model.cfg.n_layers


def all_masks(n: int, device=None) -> Bool[Tensor, "coalition player"]:
    """Every coalition of n players, row S as the bits of the integer S (player i active iff bit i is set)."""
    if n > 24:
        raise ValueError(f"{n} players have {2**n:,} coalitions; enumerate at most 24 (use sampling above that)")
    ids = torch.arange(2**n, device=device)
    return (ids[:, None] >> torch.arange(n, device=device)) & 1 == 1


def shapley_weights(n: int, sizes: Tensor, extra: int) -> Tensor:
    """|S|! (n - |S| - extra)! / (n - extra + 1)! for coalitions of the given sizes (extra = 1: Shapley
    value; extra = 2: Shapley interaction index)."""
    lg = lambda k: torch.lgamma(k.double() + 1)  # noqa: E731
    total = math.lgamma(n - extra + 2)
    return torch.exp(lg(sizes) + lg(n - sizes - extra) - total)
