"""The report on a researcher's own model at GPT-2-small shape: time and size of `headcoop report`.

    python benchmarks/report.py [--prompts 16] [--tokens 16] [--budget 60] [--json out.json]

The model: a HookedTransformer built from GPT-2 small's configuration (12 layers x 12 heads, d_model 768,
d_mlp 3072, vocabulary 50,257, LayerNorm, learned positions; random weights, seed 0), saved as a
TransformerLens export (config.json + model.safetensors), and a prompts file of `--prompts` clean / corrupt
pairs of `--tokens` token ids (the corrupt prompt changes one token) with a right and a wrong answer each;
and the same shape as a Hugging Face folder (transformers' GPT2LMHeadModel from GPT2Config(), random
weights), which the report loads as a TransformerBridge.
The command a researcher types, `headcoop report MODEL --prompts FILE --out report.html`, runs in a fresh
process and is timed from its start (the imports included) to the page on disk.

Printed, measured in the same run: one forward pass of the prompts (the unit every prediction uses); the
report's wall time and its page size beside the goals (60 s on 2 cores, 10 MB); the sections built, the
analyses left out to stay in budget (with their predicted cost); and the same report with --heads of three
heads (every analysis fits).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
warnings.filterwarnings("ignore")

SHAPE = dict(n_layers=12, d_model=768, d_head=64, n_heads=12, d_mlp=3072, d_vocab=50257, n_ctx=1024, act_fn="gelu_new",
             normalization_type="LN", positional_embedding_type="standard", model_name="gpt2-small-shape")  # fmt: skip


def build(folder: Path, n_prompts: int, n_tokens: int) -> tuple[Path, Path]:
    """Write the model (a TransformerLens export) and its prompts file into `folder`."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from headcoop.storage.foreign import export

    torch.manual_seed(0)
    model = HookedTransformer(HookedTransformerConfig(**SHAPE, seed=0)).eval()
    export(model, folder / "model")
    import transformers

    torch.manual_seed(0)  # the same shape as a Hugging Face folder, loaded as a TransformerBridge
    transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval().save_pretrained(folder / "hf")
    gen = torch.Generator().manual_seed(0)
    clean = torch.randint(0, SHAPE["d_vocab"], (n_prompts, n_tokens), generator=gen)
    corrupt = clean.clone()
    corrupt[:, n_tokens // 4] = torch.randint(0, SHAPE["d_vocab"], (n_prompts,), generator=gen)
    answer, wrong = torch.randint(0, SHAPE["d_vocab"], (2, n_prompts), generator=gen)
    prompts = folder / "prompts.json"
    prompts.write_text(json.dumps({"clean": clean.tolist(), "corrupt": corrupt.tolist(), "answer": answer.tolist(),
                                   "wrong": wrong.tolist()}))  # fmt: skip
    return folder / "model", prompts


def forward_s(model_dir: Path, prompts: Path) -> float:
    from headcoop.storage.foreign import load_model, read_prompts

    model = load_model(model_dir)
    tokens = read_prompts(prompts).patching_inputs()[0].tokens
    with torch.no_grad():
        model(tokens)
        start = time.perf_counter()
        model(tokens)
    return time.perf_counter() - start


def run_report(model_dir: Path, prompts: Path, out: Path, extra: list[str]) -> dict:
    command = [sys.executable, "-m", "headcoop.cli", "report", str(model_dir), "--prompts", str(prompts), "--out",
               str(out), "--no-progress", *extra]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"the report failed: {done.stderr.strip()}")
    page = out.read_text(encoding="utf-8")
    left_out = re.findall(r"Left out to stay within the report's budget:</b> (.*?) \(predicted (\d+) s", page)
    sections = re.findall(r"<section id='hc-sec-([^']+)'", page)
    return dict(seconds=round(seconds, 1), mb=round(out.stat().st_size / 2**20, 2), sections=sections,
                left_out=[{"what": what, "predicted_s": int(s)} for what, s in dict.fromkeys(left_out)], command=" ".join(extra))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--budget", type=float, default=60.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results = {"threads": torch.get_num_threads(), "prompts": args.prompts, "tokens": args.tokens}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model_dir, prompts = build(folder, args.prompts, args.tokens)
        results["forward_s"] = round(forward_s(model_dir, prompts), 3)
        print(f"GPT-2-small shape, {args.prompts} prompts x {args.tokens} tokens, {results['threads']} threads; "
              f"one forward pass {results['forward_s']:.3f} s")  # fmt: skip
        runs = {"every head": (model_dir, ["--budget", str(args.budget)]),
                "three heads": (model_dir, ["--budget", str(args.budget), "--heads", "L0H1", "L5H5", "L11H2"]),
                "every head, Hugging Face GPT-2 folder (TransformerBridge)": (folder / "hf", ["--budget", str(args.budget)])}  # fmt: skip
        for label, (where, extra) in runs.items():
            result = run_report(where, prompts, folder / f"run-{len(results)}.html", extra)
            results[label] = result
            verdict = "within" if result["seconds"] <= 60 and result["mb"] <= 10 else "OVER"
            print(f"\n{label}: {result['seconds']:.1f} s (goal 60 s), {result['mb']:.2f} MB (goal 10 MB): {verdict}")
            print(f"  sections: {', '.join(result['sections'])}")
            for row in result["left_out"]:
                print(f"  left out: {row['what']} (predicted {row['predicted_s']} s)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
