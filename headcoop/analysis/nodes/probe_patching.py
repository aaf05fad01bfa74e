"""Residual-stream patching read by a probe: for every (layer, position) the clean residual stream entering that
layer at that position is patched into the corrupt run, and the run is read by a fitted linear probe
(`hc.probe`) at the probe's own site instead of by the logits. A specification on the engine: `patch_copies`
(hc.patch's resid_pre sweep) read by a `Readout`; copies whose patch lies after the probe's layer read as the
corrupt run, and no copy runs past the probe's block.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformer_lens.utilities import get_act_name

from headcoop.analysis.engine.copies import Readout, route, target_run
from headcoop.analysis.engine.grid import PatchGrid, pos_labels
from headcoop.analysis.engine.inputs import as_tokens, read_positions
from headcoop.analysis.nodes.patching import PatchResult, patch_copies
from headcoop.analysis.nodes.probes import ProbeResult
from headcoop.tasks.base import Batch


def probe_readout(model, probe: ProbeResult, index: int, pos: Tensor) -> Readout:
    """Probe `index` of a binary `probe` as a Readout: its logit of classes[1], w . x + b, at position pos[b] of
    input b, averaged over inputs (x: the probe's site; "result" sites read z @ W_O[head])."""
    if not probe.binary:
        raise ValueError(f"probe_patch reads a binary probe's logit; this probe has {len(probe.classes)} classes")
    layer, head, site = probe.layers[index], probe.heads[index], probe.site
    name = get_act_name("embed") if site == "embed" else get_act_name("z" if site == "result" else site, layer)
    weight, bias = probe.weight[index], probe.bias[index]

    def read(act: Tensor) -> Tensor:  # [n, batch, pos, (head,) d] -> [n]
        x = act[:, torch.arange(act.shape[1], device=act.device), pos.to(act.device)]
        if head is not None:
            x = x[:, :, head]
        if site == "result":
            x = x @ model.blocks[layer].attn.W_O[head]
        return (x.double() @ weight.to(x.device) + bias.to(x.device)).mean(-1)

    return Readout(site=name, read=read)


@torch.no_grad()
def probe_patch(model, clean, corrupt, probe: ProbeResult, index: int = 0, pos=None,
                memory_budget_mb: float = 256) -> PatchResult:  # fmt: skip
    """The probe's mean logit after patching the clean resid_pre into the corrupt run at each (layer, pos):
    a PatchResult [layer, pos] (clean_value / corrupt_value: the unpatched runs' readings). probe: a binary
    `hc.probe` result; index: which of its probes; pos: its read-out position ([batch] or int; default where
    `hc.probe` fits: the corrupt Batch's answer_pos, else the clean Batch's, else the last position)."""
    clean_tokens, corrupt_tokens = as_tokens(model, clean), as_tokens(model, corrupt)
    n_pos = corrupt_tokens.shape[1]
    pos = read_positions(corrupt if pos is not None or isinstance(corrupt, Batch) else clean, corrupt_tokens, pos)
    readout = probe_readout(model, probe, index, pos)
    _, source_cache = model.run_with_cache(
        clean_tokens, names_filter=lambda n: n.endswith("hook_resid_pre") or n == readout.site
    )
    target = target_run(model, corrupt_tokens, None, lambda n: True)
    grid = PatchGrid.build("resid_pre", "each", list(range(model.cfg.n_layers)), [], n_pos, corrupt_tokens.device)
    chosen = route(model, "auto", "stacked", "stacked copies read by the probe, stopped after its block", "patch")
    values = chosen.evaluate(target, patch_copies(model, "resid_pre", grid, source_cache, target),
                      memory_budget_mb, readout=readout)  # fmt: skip
    return PatchResult(values=values.reshape(grid.shape).float().cpu(), dims=grid.dims, coords=grid.coords,
                       clean_value=float(readout.read(source_cache[readout.site][None])[0]),
                       corrupt_value=float(readout.of_target(target)), component="resid_pre", positions="each",
                       direction="denoise", pos_labels=pos_labels(model, corrupt_tokens),
                       method=chosen.label)  # fmt: skip


__all__ = ["probe_patch", "probe_readout"]
