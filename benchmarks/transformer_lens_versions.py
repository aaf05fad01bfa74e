"""What works with the installed TransformerLens, measured: every analysis on TransformerBridges of three
Hugging Face shapes built offline (tests/bridge_shapes.py: GPT-2, Llama, GPT-NeoX), and the toy-task features
(shipped checkpoints, building and training a task model).

Run it once per environment, then build the page from the JSON files:

    python benchmarks/transformer_lens_versions.py --json tl-3.json              # TransformerLens 3.x
    /path/to/tl4-venv/bin/python benchmarks/transformer_lens_versions.py --json tl-4.json
    python benchmarks/transformer_lens_versions.py --page tl-3.json tl-4.json    # writes docs/transformer_lens_4.md

Each check records "ok" with a fingerprint of its numbers (so that two versions can be compared), or the
error's type and first line. Nothing is guessed: a feature is listed as working only if it ran here.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import traceback
import warnings
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
warnings.filterwarnings("ignore")

PAGE = ROOT / "docs" / "transformer_lens_4.md"


def fingerprint(value) -> float | None:
    """A number summarising a result (sum of |values|), to compare two environments' outputs."""
    import torch

    for attr in ("values", "scores", "effects", "shapley", "weight", "logits"):
        x = getattr(value, attr, None)
        if isinstance(x, dict):
            x = torch.tensor([float(v) for v in x.values()]) if x and not isinstance(next(iter(x.values())), torch.Tensor) \
                else torch.stack([v.float() for v in x.values()])  # fmt: skip
        if isinstance(x, torch.Tensor):
            return round(float(x.detach().double().abs().nansum()), 5)
    if isinstance(value, torch.Tensor):
        return round(float(value.detach().double().abs().sum()), 5)
    pairs = getattr(value, "pairs", None)  # hc.cooperation: its pair table
    if pairs is not None and hasattr(pairs, "select_dtypes"):
        return round(float(pairs.select_dtypes("number").abs().sum().sum()), 5)
    return None


def run_checks() -> dict:
    import torch

    import headcoop as hc
    from headcoop.models.tl import HAS_HOOKED_TRANSFORMER
    from tests import bridge_shapes as shapes

    results: dict[str, dict] = {}

    def check(name: str, fn) -> None:
        try:
            out = fn()
            results[name] = {"ok": True, "fingerprint": fingerprint(out), "method": getattr(out, "method", None)}
        except Exception as err:  # a measurement: every failure is recorded, not raised
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            results[name] = {"ok": False, "error": f"{type(err).__name__}: {first[:240]}"}
            if os.environ.get("HC_VERBOSE"):
                traceback.print_exc()

    g = torch.Generator().manual_seed(0)
    clean = torch.randint(1, shapes.VOCAB, (4, 8), generator=g)
    corrupt = torch.randint(1, shapes.VOCAB, (4, 8), generator=g)
    answer = torch.randint(1, shapes.VOCAB, (4,), generator=g)
    wrong = (answer + 7) % shapes.VOCAB
    rows = torch.arange(4)

    def metric(logits):
        return (logits[rows, -1, answer] - logits[rows, -1, wrong]).mean()

    with tempfile.TemporaryDirectory() as tmp:
        for shape in shapes.SHAPES:
            folder = shapes.model_folder(shape, Path(tmp))
            bridge = None

            def boot():
                nonlocal bridge
                bridge = shapes.bridge(folder)
                return bridge(clean)

            check(f"{shape}: boot (Hugging Face folder, compatibility mode)", boot)
            if bridge is None:
                continue
            b = bridge
            check(f"{shape}: hc.patch z", lambda: hc.patch(b, clean=clean, corrupt=corrupt, metric=metric))
            for comp in ("q", "k", "v", "pattern", "resid_pre", "attn_out", "mlp_out"):
                check(
                    f"{shape}: hc.patch {comp} by position",
                    lambda c=comp: hc.patch(
                        b, clean=clean, corrupt=corrupt, metric=metric, component=c, positions="each"
                    ),
                )
            check(
                f"{shape}: hc.attribute atp*",
                lambda: hc.attribute(
                    b, clean=clean, corrupt=corrupt, metric=metric, estimator="atp*", verify=4, sample=4
                ),
            )
            check(f"{shape}: hc.path_patch", lambda: hc.path_patch(b, clean=clean, corrupt=corrupt, metric=metric))
            check(f"{shape}: hc.dla", lambda: hc.dla(b, clean, answer=answer, wrong=wrong))
            check(f"{shape}: hc.qk", lambda: hc.qk(b, head="L1H2"))
            check(f"{shape}: hc.ov", lambda: hc.ov(b, head="L1H2"))
            check(f"{shape}: hc.composition", lambda: hc.composition(b))
            check(f"{shape}: hc.probe", lambda: hc.probe(b, clean, labels=torch.tensor([0, 1, 0, 1])))

            def ablate():
                with hc.ablate(b, heads=["L0H1"], how="zero"):
                    return b(clean)

            def set_attention():
                with hc.set_attention(b, head="L1H0", weights=torch.ones(8)):
                    return b(clean)

            check(f"{shape}: hc.ablate", ablate)
            check(f"{shape}: hc.set_attention", set_attention)
            check(f"{shape}: hc.attention", lambda: hc.attention(b, clean[0]))
            check(f"{shape}: hc.interactions", lambda: hc.interactions(b, clean, metric=metric, reference=corrupt))
            check(f"{shape}: hc.cooperation", lambda: hc.cooperation(b, inputs=hc.Batch.from_answers(clean, answer, wrong),
                                                                      metric="logit_diff", reference=corrupt))  # fmt: skip
            check(f"{shape}: hc.report",
                  lambda: hc.report(b, out=Path(tmp) / f"{shape}.html", progress=False,
                                    task=hc.contrast(clean, corrupt, answer, wrong)))  # fmt: skip
    check("toy tasks: hc.load('count01')", lambda: hc.load("count01")(hc.Count01().sample(4).tokens))

    def train():
        task = hc.Count01()
        model = hc.train(task, task.model(seed=0), steps=20, log_every=10, progress=False)
        return torch.tensor([h["loss"] for h in model.history])

    check("toy tasks: hc.Count01().model() and hc.train (20 steps)", train)
    check("toy tasks: hc.patch on the shipped count01", lambda: hc.patch(hc.load("count01")))
    return {
        "transformer_lens": version("transformer-lens"),
        "transformers": version("transformers"),
        "torch": version("torch"),
        "python": platform.python_version(),
        "hooked_transformer": HAS_HOOKED_TRANSFORMER,
        "checks": results,
    }


def page(runs: list[dict]) -> str:
    versions = [r["transformer_lens"] for r in runs]
    names = list(dict.fromkeys(name for r in runs for name in r["checks"]))
    lines = [
        "# TransformerLens versions: what headcoop runs on, measured",
        "",
        "Written by `benchmarks/transformer_lens_versions.py --page` from one run per environment (the commands are in "
        "its docstring); every cell is what ran there, not a guess. Environments: "
        + "; ".join(
            f"TransformerLens {r['transformer_lens']} (transformers {r['transformers']}, torch {r['torch']}, "
            f"Python {r['python']}, HookedTransformer {'present' if r['hooked_transformer'] else 'absent'})"
            for r in runs
        )
        + ".",  # fmt: skip
        "",
        "The models are the three Hugging Face shapes of `tests/bridge_shapes.py` (GPT-2; Llama: RMSNorm, rotary, "
        "grouped-query; GPT-NeoX: parallel attention and MLP, partial rotary), built from configs with random "
        "weights and booted as TransformerBridges in compatibility mode. *ok (same numbers)* means the result's "
        "fingerprint (the sum of its absolute values) agrees with the first environment's to 4 significant digits.",
        "",
        "| check | " + " | ".join(f"TransformerLens {v}" for v in versions) + " |",
        "|---|" + "---|" * len(versions),
    ]
    for name in names:
        cells = []
        first = runs[0]["checks"].get(name)
        for r in runs:
            c = r["checks"].get(name)
            if c is None:
                cells.append("not run")
            elif c["ok"]:
                same = first and first.get("ok") and c["fingerprint"] is not None and first["fingerprint"] is not None \
                    and abs(c["fingerprint"] - first["fingerprint"]) <= 1e-4 * max(1.0, abs(first["fingerprint"]))  # fmt: skip
                note = "" if r is runs[0] else " (same numbers)" if same else " (no numbers to compare)" \
                    if c["fingerprint"] is None else " (numbers differ)"  # fmt: skip
                cells.append("ok" + note)
            else:
                cells.append("fails: " + c["error"].replace("|", "/"))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "What the table says. With TransformerLens 4.x, `import headcoop` works and every analysis runs on a "
        "TransformerBridge, with the same numbers as under 3.x where a result has numbers. What needs 3.x: the toy "
        "tasks, training and checkpoints (hc.load, hc.train, hc.Count01().model()), which are HookedTransformer "
        "configs by definition; they stop with an ImportError that names the fix. `hc.path_patch` refuses "
        "grouped-query models under both versions (a k or v input is shared by several query heads). headcoop "
        "therefore still requires `transformer-lens>=3.5,<4`; to use it with 4.x, install it with `pip install "
        "--no-deps headcoop` next to TransformerLens 4.x and its other requirements.",
    ]
    counts = [(sum(c["ok"] for c in r["checks"].values()), len(r["checks"])) for r in runs]
    lines += [
        "",
        "Passed: " + "; ".join(f"TransformerLens {v}: {ok} of {n}" for v, (ok, n) in zip(versions, counts)) + ".",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write this environment's results here")
    parser.add_argument("--page", nargs="+", metavar="JSON", help=f"build {PAGE.relative_to(ROOT)} from runs")
    args = parser.parse_args()
    if args.page:
        text = page([json.loads(Path(p).read_text()) for p in args.page])
        PAGE.write_text(text, encoding="utf-8")
        print(text)
        return
    result = run_checks()
    ok = sum(c["ok"] for c in result["checks"].values())
    print(f"TransformerLens {result['transformer_lens']}: {ok} of {len(result['checks'])} checks pass")
    for name, c in result["checks"].items():
        print(f"  {'ok  ' if c['ok'] else 'FAIL'} {name}" + ("" if c["ok"] else f": {c['error']}"))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
