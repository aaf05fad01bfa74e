"""SmolLM2-135M's induction circuit by edges (issue 73, item 2): on repeated random tokens, every edge's effect on
the repeat's loss by edge attribution (`hc.edges`, EAP), its strongest edges patched exactly (verify=), and the
edges from the previous-token heads into the induction heads' key inputs. In this grouped-query model 3 query
heads share one key/value head, so a head's "k input" is its key/value head's (`kv_group`), read by all three:
an edge into it is one edge, named by the key/value head. Writes docs/results/smollm2/induction_edges.csv and
induction_edges.json (rendered by `experiments.smollm2.page`); needs `run_all`'s heads.csv (the heads' scores).

    python -m experiments.smollm2.induction_edges [--out FOLDER] [--n 8] [--half 40] [--seed 0] [--verify 40]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "docs" / "results"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--half", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verify", type=int, default=40, help="the strongest edges patched exactly")
    args = parser.parse_args(argv)

    import pandas as pd
    import torch

    import headcoop as hc
    from experiments.shared import setup, write_table

    setup(threads=torch.get_num_threads())
    folder = args.out / "smollm2"
    scores = pd.read_csv(folder / "heads.csv")
    model = hc.load_gguf("smollm2-135m")
    gen = torch.Generator().manual_seed(args.seed)  # run_all's inputs: the same seed and draws
    first = torch.randint(2000, 20000, (args.n, args.half), generator=gen)
    clean = torch.cat([first, first], 1)
    corrupt = torch.cat([first, torch.randint(2000, 20000, (args.n, args.half), generator=gen)], 1)
    h = args.half

    def metric(logits):  # the negative mean loss on the repeat's tokens from its second on (higher is better)
        logp = logits[:, h:-1].log_softmax(-1)
        return logp.gather(-1, clean[:, h + 1 :].to(logp.device)[..., None]).mean()

    tick = time.perf_counter()
    edges = hc.edges(model, clean, corrupt, metric=metric, estimator="eap", verify=args.verify, progress=False)
    seconds = time.perf_counter() - tick
    frame = edges.to_dataframe()
    prev = set(scores.nlargest(4, "previous_token")["head"])
    induction = scores.nlargest(4, "induction")
    group_of = dict(zip(scores["head"], scores["kv_group"]))
    layer_of = dict(zip(scores["head"], scores["layer"]))
    # the key/value heads the induction heads read their keys through, as the edge graph names its readers
    kv_readers = {(int(layer_of[x]), int(group_of[x])) for x in induction["head"]}
    frame["rank"] = frame.score.abs().rank(ascending=False, method="first").astype(int)
    readers = {f"L{lay}KV{g}" for lay, g in kv_readers}  # the edge graph's name of a key/value head's input
    into_keys = frame[frame.writer.isin(prev) & (frame.via == "k") & frame.reader.isin(readers)].copy()
    top = frame.reindex(frame.score.abs().sort_values(ascending=False).index).head(25)
    write_table(top, folder, "induction_edges")
    write_table(into_keys.sort_values("rank").head(20), folder, "induction_k_composition")
    summary = dict(n=args.n, half=args.half, seed=args.seed, edges=len(frame), verify=args.verify,
                   seconds=round(seconds, 1), clean=edges.clean_value, corrupt=edges.corrupt_value,
                   previous_token_heads=sorted(prev), induction_heads=list(induction["head"]),
                   kv_readers=sorted(readers), repr=repr(edges))  # fmt: skip
    (folder / "induction_edges.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    print(json.dumps(summary, indent=1))
    print(top.head(15).to_string())
    print(into_keys.sort_values("rank").head(10).to_string())


if __name__ == "__main__":
    main()
