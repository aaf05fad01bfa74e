"""hc.cooperation against hc.interactions on the shipped Count01 model (16 heads, 512 inputs, accuracy),
in one run: one reading (mean ablation, one reference) as issue 23 timed it, and the default reading
family (zero, and mean and resample aligned by role with 4 reference draws each, every threshold band,
the write readings: issue 48) beside the obvious way to get it, one call per ablation reading (9 calls),
whose reference draws are not stacked on the batch axis.

    python benchmarks/cooperation.py [--threads N] [--repeats 3]
    python benchmarks/cooperation.py --gpt2      # also: 4 heads of a GPT-2-small-shaped model (issue 51)
    python benchmarks/cooperation.py --gpt2-only # that alone

With --gpt2, on a GPT-2-small-shaped model (random weights, 12 x 12 heads, d_model 768; 16 prompts of 16
tokens, 64 reference prompts), the default family on 4 heads (L3H0, L5H1, L8H2, L10H3) beside one timed
forward pass of the same batch: its time as forward passes, and the block rows it ran as forward passes
(every block's input rows, counted by wrapping TransformerLens's TransformerBlock.forward; the goal: at
most 150).
"""

from __future__ import annotations

import argparse
import resource
import time

import torch

import headcoop as hc
from headcoop.analysis.engine import kernels
from headcoop.analysis.games.coalitions import CoalitionGame
from headcoop.analysis.mechanisms import cooperation as coop


def best(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gpt2", action="store_true", help="also the GPT-2-small-shaped measurement (issue 51)")
    parser.add_argument("--gpt2-only", action="store_true", help="only the GPT-2-small-shaped measurement")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.gpt2_only:
        return gpt2_shape(args.repeats)
    model = hc.load("count01")
    inputs, reference = model.task.sample(512, seed=0), model.task.sample(512, seed=1)
    common = dict(metric="accuracy", how="mean", reference=reference)
    t_int = best(lambda: hc.interactions(model, tokens=inputs, **common), args.repeats)
    t_coop = best(lambda: hc.cooperation(model, inputs=inputs, draws=1, **common), args.repeats)
    t_family = best(lambda: hc.cooperation(model, inputs=inputs), args.repeats)
    task = model.task
    refs = [task.sample(512, seed=1 + d) for d in range(4)]

    def one_call_per_reading():
        hc.cooperation(model, inputs=inputs, how="zero", draws=1)
        for how in ("mean", "resample"):
            for ref in refs:
                hc.cooperation(model, inputs=inputs, how=how, reference=ref, draws=1)

    t_loop = best(one_call_per_reading, 1)
    print(f"torch threads {torch.get_num_threads()}")
    print(f"hc.interactions {t_int:.2f} s, hc.cooperation one reading {t_coop:.2f} s, ratio {t_coop / t_int:.2f}")
    print(
        f"hc.cooperation default family (9 ablation readings x 20 threshold readings) {t_family:.2f} s; "
        f"one call per ablation reading {t_loop:.2f} s: {t_loop / t_family:.1f}x slower"
    )
    print(hc.cooperation(model, inputs=inputs))
    if args.gpt2:
        gpt2_shape(args.repeats)


def gpt2_shape(repeats: int) -> None:
    """The GPT-2-small-shaped measurement (module docstring)."""
    import sys
    from pathlib import Path

    from transformer_lens.components import TransformerBlock

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from heads_144 import SHAPE, build

    from headcoop.tasks.base import Batch

    torch.set_grad_enabled(False)
    model, tokens, answer, wrong, reference = build(batch=16, n_pos=16)
    gen = torch.Generator().manual_seed(1)
    batch = Batch.from_answers(tokens, answer, wrong)
    ref = Batch.from_answers(reference, torch.randint(0, SHAPE["d_vocab"], (64,), generator=gen),
                             torch.randint(0, SHAPE["d_vocab"], (64,), generator=gen))  # fmt: skip
    rows = [0]
    plain, plain_from = TransformerBlock.forward, kernels.run_from

    def counted(self, resid_pre, *args, **kwargs):
        rows[0] += resid_pre.shape[0] * resid_pre.shape[1]
        return plain(self, resid_pre, *args, **kwargs)

    def counted_from(model_, start, x, *args, **kwargs):  # the row-wise kernel: every layer from `start`
        rows[0] += x.shape[0] * x.shape[1] * x.shape[2] * (model_.cfg.n_layers - start)
        return plain_from(model_, start, x, *args, **kwargs)

    # each phase's block rows and seconds: the module-level functions hc.cooperation calls, wrapped
    phases = {"interaction index": (coop, "pair_interactions"), "clean runs": (coop, "clean_evidence"),
              "coalitions (pair words, roles; and the replacement checks' zeroed runs in the same call since they "
              "share its prefixes)": (CoalitionGame, "row_logits"),
              "replacement checks (their own runs, before they joined the coalitions' call)": (coop, "zeroed_runs"),
              "roles: composition": (coop, "composition"),
              "roles: backup": (coop, "backup"), "function axis: edits": (coop, "edit_responses")}  # fmt: skip
    spent: dict = {name: [0, 0.0, 0.0] for name in phases}  # block rows, seconds, peak MB above the phase's start
    phases = {name: (owner, attr) for name, (owner, attr) in phases.items() if hasattr(owner, attr)}  # older code
    originals = {name: getattr(owner, attr) for name, (owner, attr) in phases.items()}
    depth = [0]

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            r0, t0 = rows[0], time.perf_counter()
            outer = depth[0] == 0  # a phase inside another (the coalitions of the zeroed runs) shares its peak
            if outer:
                start_mb = _proc_mb("VmRSS")
                _reset_peak()
            depth[0] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1
                spent[name][0] += rows[0] - r0
                spent[name][1] += time.perf_counter() - t0
                if outer:
                    spent[name][2] = max(spent[name][2], _proc_mb("VmHWM") - start_mb)

        return wrapper

    TransformerBlock.forward = counted  # class attributes, not hooks: the fast paths stay on
    kernels.run_from = counted_from
    for name, (owner, attr) in phases.items():
        setattr(owner, attr, timed(name, originals[name]))
    try:
        forward = best(lambda: model(tokens), repeats)
        rows[0] = 0
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10
        start = time.perf_counter()
        result = hc.cooperation(model, inputs=batch, reference=ref, heads=["L3H0", "L5H1", "L8H2", "L10H3"],
                                metric="logit_diff", progress=False)  # fmt: skip
        took = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10 - before
    finally:
        TransformerBlock.forward = plain
        kernels.run_from = plain_from
        for name, (owner, attr) in phases.items():
            setattr(owner, attr, originals[name])
    per_pass = 16 * 16 * SHAPE["n_layers"]
    passes = rows[0] / per_pass
    print(
        f"GPT-2-small shape, 4 heads, 16 x 16 tokens, default family: {took:.1f} s = {took / forward:.0f} forward "
        f"passes of time (one forward {forward:.3f} s); block rows = {passes:.0f} forward passes (goal <= 150; "
        f"63 before the function axis by edits, issue 51)"
    )
    for name, (r, s, mb) in spent.items():
        print(f"  {name}: {r / per_pass:.1f} forward passes of block rows, {s:.1f} s, peak {mb:.0f} MB above its start")
    fn = getattr(result, "function_numbers", None) or {}
    print(f"  the edits: {fn.get('how')}, path {fn.get('path')}, planned {fn.get('forwards') or 0:.1f} forward passes")
    print(f"peak resident memory the call added to the process's peak before it (ru_maxrss): {peak:.0f} MB "
          f"(memory_budget_mb=256; the model's weights {weights_mb(model):.0f} MB)")  # fmt: skip
    print(repr(result)[:300])


def _proc_mb(field: str) -> float:
    """This process's resident memory (VmRSS) or its peak since the last reset (VmHWM), MB (Linux)."""
    import re

    return int(re.search(rf"{field}:\s+(\d+)", open("/proc/self/status").read()).group(1)) / 1024


def _reset_peak() -> None:
    """Reset this process's peak resident memory (Linux's clear_refs, 5), so that VmHWM is a phase's own."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def weights_mb(model) -> float:
    return sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20


if __name__ == "__main__":
    main()
