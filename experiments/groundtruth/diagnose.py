"""Where a SIIT model's interchange accuracy falls short: per aligned node, the accuracy on sources of the base's
own length and of another length, on the pairs where the program's output changes under the interchange and
where it does not, and the share of pairs whose program output is decided (its top logit ahead of the next).

    PYTHONPATH=. python -m experiments.groundtruth.diagnose reverse [--checkpoint PATH]

An accuracy far below 1 where the program's output does not change says the dense model reads the node for
something the program does not (it carries tokens there); low accuracy only where the output changes says the
node does not yet compute the program's value.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from experiments.groundtruth.siit import (CHECKPOINTS, activations, components, draw, draw_source, loss_and_hits,
                                          pad_mask_hooks, run, token_mask)  # fmt: skip


def diagnose(name: str, checkpoint: Path | None = None, n: int = 2048, seed: int = 1) -> list[dict]:
    """One row per aligned node of program `name`'s SIIT model (module docstring)."""
    import headcoop as hc
    from experiments.tracr.common import load

    high, info = load(name)
    low = hc.load(checkpoint or CHECKPOINTS / name)
    aligned = [c for c in components(high.cfg) if c not in info["truth"]["empty"]]
    gen = torch.Generator().manual_seed(seed)
    pad = info["encoding"]["compiler_pad"]
    base, lengths = draw(info, n, gen)
    source = draw_source(info, lengths, gen)
    mask = token_mask(base, info) & token_mask(source, info)
    same = ((source != pad).sum(1) == (base != pad).sum(1))[:, None].expand_as(mask)[mask]
    hb = pad_mask_hooks(base, pad, high.cfg.n_layers)
    rows = []
    with torch.no_grad():
        high_src = activations(high, source, aligned, pad_mask_hooks(source, pad, high.cfg.n_layers))
        low_src = activations(low, source, aligned)
        numerical = info["numerical"]
        answer = (lambda t: t[..., 0]) if numerical else (lambda t: t.argmax(-1))  # noqa: E731
        unchanged_out = answer(run(high, base, None, hb)[mask])
        for node in aligned:
            target_full = run(high, base, {node: high_src[node]}, hb)
            _, hit = loss_and_hits(run(low, base, {node: low_src[node]}), target_full, mask, numerical)
            target = target_full[mask]
            top2 = target.topk(2, -1).values if not numerical else torch.stack([target[:, 0], 0 * target[:, 0]], 1)
            changed = ((answer(target) - unchanged_out).abs() >= 0.02) if numerical else answer(target) != unchanged_out
            rate = lambda m: round(float(hit[m].float().mean()), 3) if bool(m.any()) else float("nan")  # noqa: E731
            rows.append(dict(node=node, accuracy=rate(torch.ones_like(hit)), same_length=rate(same),
                             other_length=rate(~same), where_output_changes=rate(changed),
                             where_it_does_not=rate(~changed), changed_share=round(float(changed.float().mean()), 3),
                             decided_share=1.0 if numerical else  # a number is always decided
                             round(float((top2[:, 0] - top2[:, 1] > 0.1 * top2[:, 0].abs()).float().mean()), 3)))  # fmt: skip
    return rows


def diagnosis_rows(programs=None) -> list[dict]:
    """`diagnose` of every SIIT program (default siit.PROGRAMS), a `program` column first."""
    from experiments.groundtruth.siit import PROGRAMS

    return [dict(program=name, **row) for name in programs or PROGRAMS for row in diagnose(name)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("program", nargs="?", help="one program (default: every SIIT program, written to --csv)")
    parser.add_argument("--checkpoint", type=Path, default=None)
    parser.add_argument("--csv", type=Path, default=None, help="write the table here (docs/results/circuits/dense_diagnosis.csv)")
    args = parser.parse_args(argv)
    import pandas as pd

    frame = pd.DataFrame(diagnose(args.program, args.checkpoint) if args.program else diagnosis_rows())
    print(frame.to_string(index=False))
    if args.csv:
        frame.to_csv(args.csv, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
