"""The report's time budget and its cost predictor: one timed forward pass of the patching batch prices every
analysis in forward passes (a copy from layer l costs the share of the layers it runs; AtP* its gradient passes),
and an analysis whose predicted time does not fit what is left is left out and named on the page."""

from __future__ import annotations

import dataclasses
import time

import torch
from markupsafe import Markup
from torch import Tensor

from headcoop.display.pages import Text
from headcoop.models.bridge import is_bridge
from headcoop.models.tl import HookedTransformer

# --- what the sections share --------------------------------------------------------------------------
EXACT_PATCH = "exact head patching (all positions)"
ESTIMATED_PATCH = "AtP* estimates of head patching (all positions), 24 heads verified"
EACH_PATCH = "head patching one position at a time (AtP* estimates, 40 cells verified)"
RESERVE_S = 7.0  # of the budget, kept for drawing and writing the page (about 5 s for a 7 MB page on 2 cores)


@dataclasses.dataclass
class Budget:
    """The report's time: `limit_s` seconds of wall time from `start` (None: no limit). An analysis is run
    when its predicted cost (forward passes of the patching batch, each `forward_s` as measured once on this
    machine) fits in what is left; otherwise it is left out, and the page says what it would have cost and
    the call that runs it."""

    limit_s: float | None
    forward_s: float
    start: float = dataclasses.field(default_factory=time.perf_counter)
    left_out: list = dataclasses.field(default_factory=list)  # (what, predicted s, how to run it, s left then)
    setup: str = ""  # the Python that gives a left-out call its `model`, `clean` and `corrupt`

    def remaining(self) -> float:
        if self.limit_s is None:
            return float("inf")
        return self.limit_s - (time.perf_counter() - self.start) - RESERVE_S

    def afford(self, what: str, forwards: float, how: str) -> bool:
        """Whether `what`, predicted at `forwards` forward passes, fits; if not it is listed as left out."""
        predicted, left = forwards * self.forward_s, self.remaining()
        if predicted <= left:
            return True
        self.left_out.append((what, predicted, how, left))
        return False

    def was_left_out(self, what: str) -> bool:
        return any(row[0] == what for row in self.left_out)

    def note(self, what: str) -> Text:
        """The page's words for an analysis left out."""
        _, predicted, how, left = next(row for row in self.left_out if row[0] == what)
        return Text(
            Markup(
                '<p class="note"><b>Left out to stay within the report\'s budget:</b> {} (predicted {:.0f} s on this '
                "machine; {:.0f} s of the {:.0f} s budget were left). Run it with <code>{}</code> (after <code>{}</code>), "
                "or give the report a larger budget (<code>--budget</code>, <code>hc.report(budget_s=...)</code>) or "
                "fewer heads (<code>--heads</code>).</p>"
            ).format(what, predicted, max(0.0, left), self.limit_s or 0, how, self.setup),
            note=False,
        )


def forward_seconds(model: HookedTransformer, tokens: Tensor) -> float:
    """Wall time of one forward pass of `tokens`: the quickest of three after one that warms up (one timed
    pass read 3x slow under a passing load, and every prediction of the report scales with it)."""
    times = []
    with torch.no_grad():
        model(tokens)
        for _ in range(3):
            start = time.perf_counter()
            model(tokens)
            times.append(time.perf_counter() - start)
            if sum(times) > 5.0:  # a slow model: the first passes are enough
                break
    return max(min(times), 1e-5)


def depth(model: HookedTransformer, layer: int) -> float:
    """The share of a forward pass a copy starting at `layer` runs (a Bridge's copies run from the tokens)."""
    return 1.0 if is_bridge(model) else (model.cfg.n_layers - layer) / model.cfg.n_layers


def gradient_cost(model: HookedTransformer) -> float:
    """Forward passes AtP*'s estimate takes: the clean and corrupt runs, the backward pass, and GradDrop's
    pass per layer (measured on a GPT-2-small-shaped Bridge: 14.7 passes' time for 12 layers)."""
    return 2 + model.cfg.n_layers
