"""docs/results/smollm2.md from the tables `python -m experiments.smollm2.run_all` writes (docs/results/smollm2/):
SmolLM2-135M's previous-token, duplicate-token and induction heads by their scores, and each head's share of
the repeat's loss restored by exact patching, with the time each step took.

    python -m experiments.smollm2.page
"""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"


def top(heads, column: str, k: int = 6) -> str:
    """A markdown table of the k heads highest on `column`, with the other scores beside them."""
    cols = ["head", "kv_group", "previous_token", "duplicate_token", "induction"]
    cols += ["restored"] if "restored" in heads else []
    rows = heads.nlargest(k, column)[cols]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join([":--"] + ["--:"] * (len(cols) - 1)) + "|"]
    for row in rows.itertuples(index=False):
        lines.append("| " + " | ".join(str(v) if isinstance(v, str) else f"{v:.3f}" if isinstance(v, float)
                                        else str(v) for v in row) + " |")  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    import pandas as pd

    folder = RESULTS / "smollm2"
    heads = pd.read_csv(folder / "heads.csv")
    s = json.loads((folder / "summary.json").read_text())
    seconds = "\n".join(f"| {what} | {t:.1f} s |" for what, t in s["seconds"].items())
    patched = "restored" in heads
    restore = ""
    if patched:
        strongest = heads.nlargest(6, "restored")
        both = set(strongest["head"]) & set(heads.nlargest(6, "induction")["head"])
        restore = (
            "\n## 3. Which heads the repeat's loss needs: exact patching\n\n"
            f"Each head's z patched from the repeated run into a run whose repeat is fresh tokens, at every position, "
            f"on the negative mean loss of the repeat's tokens (clean {s['clean_metric']:.3f}, corrupt "
            f"{s['corrupt_metric']:.3f}; `hc.patch`, {s['method']}). The share of that gap each head restores alone, "
            "highest first:\n\n" + top(heads, "restored") + "\n\n"
            f"Of the six heads that restore most, {len(both)} are among the six highest induction scores"
            f"{' (' + ', '.join(sorted(both)) + ')' if both else ''}.\n"
        )
    text = f"""# SmolLM2-135M: its induction heads, found from generic inputs

Source: issue 73. The model is `hc.load_gguf("smollm2-135m")`: {s["model"]}. What is analysed is this
quantized model. Every number below comes from `docs/results/smollm2/` (`heads.csv`: one row per head;
`summary.json`), written by `python -m experiments.smollm2.run_all` on this project's 2-core CPU machine while
other jobs ran on it; this page is rendered by `python -m experiments.smollm2.page`.

## 1. Inputs and the loss

{s["n"]} sequences of {s["half"]} random token ids (2,000..20,000), each repeated once (seed {s["seed"]}). The
mean loss is {s["loss_first_half"]:.2f} on the first half and {s["loss_repeat"]:.2f} on the repeat: the model
copies what followed a token's earlier occurrence.

## 2. Heads by their attention scores (plain hooks on hook_pattern)

A head's **previous-token** score is its mean attention from each position of the first half to the one
before it; **duplicate-token**, from each position of the repeat to the same token in the first half;
**induction**, to the token after that one. 9 query heads per layer share 3 key/value heads (`kv_group`).

Induction heads, highest first:

{top(heads, "induction")}

Previous-token heads:

{top(heads, "previous_token")}

Duplicate-token heads:

{top(heads, "duplicate_token")}
{restore}
## {4 if patched else 3}. Time on this machine

| step | time |
|:--|--:|
{seconds}

## {5 if patched else 4}. Not yet here
{"" if patched else chr(10) + "- Exact patching of every head on the repeat's loss (`run_all` without `--no-patch`): this run left it out." + chr(10)}
- The K-composition from the previous-token heads into the induction heads' keys by edge attribution and exact
  path patching, and the circuit's faithfulness: `hc.edges`, `hc.path_patch` and `hc.faithfulness` refuse
  grouped-query models today (one key/value input is shared by 3 query heads here).
- The IOI circuit, the backup name movers, `hc.cooperation` on the key heads and `hc.pair_map` over the 270 heads.
- `headcoop report` on this model.
"""
    (RESULTS / "smollm2.md").write_text(text, encoding="utf-8")
    print(RESULTS / "smollm2.md")


if __name__ == "__main__":
    main()
