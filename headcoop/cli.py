"""The `headcoop` command line: train, evaluate and sweep toy attention models, and report on any model."""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import warnings
from typing import Any

EPILOG = """\
examples:
  headcoop report count01 --out report.html  one offline page on what every head of the shipped model does
  headcoop report my-gpt2/ --prompts prompts.json --heads L5H1 L9H6 L9H9 --budget 120
                                             your own model and prompts, three heads, two minutes at most
  headcoop eval count01                      accuracy of the shipped Count01 model
  headcoop train count01 --heads 16 --d-model 32 --d-head 2 --steps 3000 --out runs/c01
  headcoop eval runs/c01                     accuracy of a model you trained
  headcoop train skip-pair --heads 2 --d-head 1 --out runs/sp1
  headcoop sweep count01 --heads 1 2 4 --d-model 8 --d-head 2 --seeds 0 1 --steps 2000 --out runs/grid

shipped models: count01, skip-pair, skip-pair-dhead1
"""


def _print_metrics(metrics: dict) -> None:
    width = max(len(k) for k in metrics)
    for key, value in metrics.items():
        print(f"  {key:<{width}}  {value:.4f}" if isinstance(value, float) else f"  {key:<{width}}  {value}")


def cmd_train(args: argparse.Namespace) -> int:
    import headcoop as hc
    from headcoop.storage.checkpoints import check_save_target
    from headcoop.tasks.base import check_sample_size

    # Every check before the first training step: a bad --out must not cost a training run.
    task = task_from_args(args)
    shape = dict(n_heads=args.heads, d_head=args.d_head, n_layers=args.layers, d_model=args.d_model)
    shape = {key: value for key, value in shape.items() if value is not None}
    config = config_from_args(args, seed=args.seed)
    check_sample_size(config.batch_size, task.n_ctx)
    check_save_target(args.out)
    model = task.model(seed=args.seed, **shape)
    hc.train(task, model, config=config, progress=not args.no_progress)
    metrics = task.evaluate(model)
    path = hc.save(model, args.out, metrics=metrics, model_seed=args.seed)
    print(f"saved {model.cfg.model_name} to {path}")
    _print_metrics(metrics)
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    import headcoop as hc

    model = hc.load(args.model)
    if getattr(model, "task", None) is None:
        print(f"{args.model} carries no task, so there is nothing to evaluate it on", file=sys.stderr)
        return 2
    metrics = hc.evaluate(model, seed=args.seed)
    if args.json:
        print(json.dumps(metrics, indent=1))
    else:
        print(f"{args.model}: {model.cfg.model_name} on {model.task!r}")
        _print_metrics(metrics)
    return 0


# --- what the training flags of `headcoop train` and `headcoop sweep` mean ----------------------------------
def config_from_args(args: argparse.Namespace, seed: int = 0):
    """The TrainConfig the flags of `add_training_arguments` describe (checked: errors name the flag's value)."""
    from headcoop.training.loop import TrainConfig

    return TrainConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr, weight_decay=args.weight_decay,
                       warmup=args.warmup, schedule=args.schedule, seed=seed)  # fmt: skip


def task_from_args(args: argparse.Namespace):
    """The task named on the command line, with --positional for Count01."""
    from headcoop.tasks import TASKS

    if args.positional and args.task != "count01":
        raise ValueError("--positional applies to count01 only")
    return TASKS[args.task](**({"positional": True} if args.positional else {}))


# Parsing imports nothing heavy (no torch, no TransformerLens), so `headcoop --help` answers at once; these
# names and defaults are those of headcoop.tasks.TASKS, checkpoints.SHIPPED and TrainConfig() (a test checks).
TASK_NAMES = ("count01", "skip-pair")
SHIPPED_NAMES = ("count01", "skip-pair", "skip-pair-dhead1")
TRAIN_DEFAULTS = dict(steps=3000, batch_size=256, lr=1e-2, weight_decay=0.0, warmup=100, schedule="cosine")
SCHEDULES = ("cosine", "constant")


def add_training_arguments(parser: argparse.ArgumentParser) -> None:
    """The TrainConfig flags (all but the seed), --positional and --no-progress: the same for train and sweep."""
    d = TRAIN_DEFAULTS
    parser.add_argument("--steps", type=int, default=d["steps"], help=f"optimizer steps (default {d['steps']})")
    parser.add_argument("--batch-size", type=int, default=d["batch_size"],
                        help=f"sequences per step (default {d['batch_size']})")  # fmt: skip
    parser.add_argument("--lr", type=float, default=d["lr"], help=f"peak learning rate (default {d['lr']})")
    parser.add_argument("--weight-decay", type=float, default=d["weight_decay"],
                        help=f"AdamW weight decay (default {d['weight_decay']})")  # fmt: skip
    parser.add_argument("--warmup", type=int, default=d["warmup"], help=f"linear warm-up steps (default {d['warmup']})")
    parser.add_argument("--schedule", choices=SCHEDULES, default=d["schedule"],
                        help="after warm-up: cosine decay to lr/10, or constant (default cosine)")  # fmt: skip
    parser.add_argument("--positional", action="store_true", help="Count01 with a learned positional embedding")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def add_model_arguments(parser: argparse.ArgumentParser, grid: bool) -> None:
    """The task and the model's shape: one value each for train, one or more (a grid) for sweep."""
    many: dict[str, Any] = dict(nargs="+") if grid else {}
    parser.add_argument("task", choices=TASK_NAMES, help="the toy task")
    parser.add_argument("--heads", type=int, default=None, help="attention heads per layer (task default)", **many)
    parser.add_argument("--d-model", type=int, default=None,
                        help="residual width (Count01 only; SkipPair is one-hot, 12)", **many)  # fmt: skip
    parser.add_argument("--d-head", type=int, default=None, help="width of each head (task default)", **many)
    parser.add_argument("--layers", type=int, default=None if grid else 1, help="attention layers (default 1)", **many)


def cmd_sweep(args: argparse.Namespace) -> int:
    from pathlib import Path

    from headcoop.training.sweeps import sweep

    task = task_from_args(args)
    grid = dict(n_heads=args.heads, d_model=args.d_model, d_head=args.d_head, n_layers=args.layers)
    grid = {key: values for key, values in grid.items() if values is not None}
    client = None
    if args.workers is not None or args.scheduler is not None:
        from headcoop.training.executors import dask_client

        client = dask_client(workers=args.workers, scheduler=args.scheduler)
    try:
        table = sweep(task, grid, args.seeds, args.out, config=config_from_args(args), progress=not args.no_progress,
                      chunk=args.chunk, executor=client, device=args.device, threads=args.threads)  # fmt: skip
    finally:
        if client is not None:
            cluster = client.cluster if args.workers is not None else None
            client.close()
            if cluster is not None:
                cluster.close()
    csv = Path(args.out) / "sweep.csv"
    table.to_csv(csv, index=False)
    print(table.drop(columns=["path"]).to_string(index=False, float_format=lambda x: f"{x:.4f}"))
    print(f"{len(table)} runs in {args.out} (table: {csv})")
    failed = table[table.status == "failed"]
    for _, row in failed.iterrows():
        print(f"failed: {row['name']}: {row['reason']}", file=sys.stderr)
    return 1 if len(failed) else 0


# The report's sections (headcoop.reporting.page._sections) and each study's own (headcoop.studies), and the files
# that mark a model folder (checkpoints.META, foreign.CONFIG): the command line checks its arguments against
# these before torch or TransformerLens is imported, so a typo answers at once (a test checks they agree).
REPORT_SECTIONS = ("overview", "accuracy", "heads", "attention", "patching", "dla", "cooperation", "circuits")
STUDY_SECTIONS = ("count01-map", "preferences")
META, CONFIG = "headcoop.json", "config.json"
HEAD_NAME = re.compile(r"L(\d+)H(\d+)")


def _check_model_argument(model: str) -> None:
    """ValueError naming what `model` is when it is neither a shipped name nor a folder holding a model (a
    headcoop checkpoint, a TransformerLens export or a Hugging Face model folder), before anything else is read."""
    from pathlib import Path

    if model in SHIPPED_NAMES:
        return
    path = Path(model)
    what = f"the model {model!r} is neither a shipped name ({', '.join(SHIPPED_NAMES)}) nor"
    if not path.exists():
        raise ValueError(f"{what} an existing folder: there is no headcoop checkpoint, TransformerLens export or "
                         "Hugging Face model there")  # fmt: skip
    if not path.is_dir():
        raise ValueError(f"{what} a folder: it is a file (a model is a folder: a headcoop checkpoint, a TransformerLens "
                         "export or a Hugging Face model folder)")  # fmt: skip
    if not ((path / META).is_file() or (path / CONFIG).is_file()):
        raise ValueError(f"{what} a model folder: {model} holds no {META} (headcoop checkpoint) or {CONFIG} "
                         "(TransformerLens export, Hugging Face model)")  # fmt: skip


def _check_report_arguments(args: argparse.Namespace) -> None:
    """ValueError naming the first bad argument of `headcoop report` that can be told without the model:
    the model's path, the prompt and tokenizer files, --examples, --budget, --out, --sections (against every
    section any task has; the task's own list is checked once it is known) and the form of --heads."""
    from pathlib import Path

    _check_model_argument(args.model)
    for flag, value in (("--prompts", args.prompts), ("--tokenizer", args.tokenizer)):
        if value is not None and not Path(value).is_file():
            raise ValueError(f"{flag} {value!r} is not a file" + (": it is a folder" if Path(value).is_dir() else ""))
    if args.tokenizer is not None and args.prompts is None:
        raise ValueError("--tokenizer encodes the texts of --prompts; pass --prompts too")
    if args.examples < 1:
        raise ValueError(f"--examples must be 1 or more, got {args.examples}")
    if not math.isfinite(args.budget) or args.budget < 0:
        raise ValueError(f"--budget must be 0 (no limit) or more seconds (a finite number), got {args.budget}")
    if not args.out.strip():
        raise ValueError("--out is empty; give a file name such as report.html")
    from headcoop.paths import check_out_file  # torch-free: a folder, a FIFO or a dangling link is told at once

    check_out_file(args.out, "--out")
    known = REPORT_SECTIONS + STUDY_SECTIONS
    unknown = [name for name in args.sections or () if name not in known]
    if unknown:
        raise ValueError(f"unknown report sections {unknown}; the sections are {list(REPORT_SECTIONS)}, and a "
                         f"task's own: {list(STUDY_SECTIONS)}")  # fmt: skip
    bad = [name for name in args.heads or () if not HEAD_NAME.fullmatch(name)]
    if bad:
        raise ValueError(f"--heads takes head names such as L0H1 (layer 0, head 1), got {bad}")


def cmd_report(args: argparse.Namespace) -> int:
    import time

    start = time.perf_counter()  # the command's time, its imports included: the budget counts them
    from pathlib import Path

    _check_report_arguments(args)  # before torch and TransformerLens are imported
    from headcoop.reporting.page import report

    task = None
    if args.prompts is not None:
        from headcoop.storage.foreign import TOKENIZER, load_tokenizer, read_prompts

        tokenizer_file = args.tokenizer
        if tokenizer_file is None and (Path(args.model) / TOKENIZER).is_file():
            tokenizer_file = Path(args.model) / TOKENIZER
        tokenizer = load_tokenizer(tokenizer_file) if tokenizer_file is not None else None
        try:
            task = read_prompts(args.prompts, tokenizer)
        except ValueError as err:
            if "needs vocab=" not in str(err):
                raise
            raise ValueError(f"the prompts in {args.prompts} are texts, and there is no tokenizer to encode them: pass "
                             f"--tokenizer FILE (a tokenizer.json), or put tokenizer.json in {args.model}") from None  # fmt: skip
    # the budget is the command's: the imports and the model's loading above count against it (`started`)
    path = report(args.model, out=args.out, examples=args.examples, progress=not args.no_progress, task=task,
                  heads=args.heads, sections=args.sections, budget_s=args.budget or None, device=args.device,
                  started=start)  # fmt: skip
    size = path.stat().st_size / 2**20
    print(f"wrote {path} ({size:.1f} MB) in {time.perf_counter() - start:.1f} s; open it in a browser (works offline)")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser.
    Long: one argparse declaration per option, in the order `--help` prints them."""
    parser = argparse.ArgumentParser(
        prog="headcoop",
        description="Do attention heads cooperate, compete or superpose? Report on what every head of a model does "
        "(a shipped toy model, a checkpoint, a TransformerLens export or a Hugging Face model folder, with your "
        "own prompts), and train, evaluate and sweep models on the Count01 and SkipPair toy tasks.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    train = sub.add_parser(
        "train",
        help="train one model and save it as a checkpoint folder",
        description="Train one model on a task (loss only at the task's loss positions) and save it.",
    )
    add_model_arguments(train, grid=False)
    add_training_arguments(train)
    train.add_argument("--seed", type=int, default=0, help="seed of the initial weights and the data (default 0)")
    train.add_argument("--out", required=True, help="folder to write the checkpoint to")
    train.set_defaults(func=cmd_train)

    evaluate = sub.add_parser(
        "eval",
        help="print the accuracy of a shipped or saved model",
        description="Evaluate a model on fresh samples of its task. NAME_OR_PATH is a shipped name "
        f"({', '.join(SHIPPED_NAMES)}) or a checkpoint folder.",
    )
    evaluate.add_argument("model", metavar="NAME_OR_PATH")
    evaluate.add_argument("--seed", type=int, default=10_000, help="seed of the evaluation samples")
    evaluate.add_argument("--json", action="store_true", help="print the metrics as JSON")
    evaluate.set_defaults(func=cmd_eval)

    sweep = sub.add_parser(
        "sweep",
        help="train a grid of model sizes x seeds (resumable) and tabulate their accuracy",
        description="Train every combination of the given sizes and seeds, many models at once, saving each "
        "as OUT/<name>-s<seed>. Re-running the same command skips finished runs, so an interrupted "
        "sweep resumes; sweeps started into one folder at once share the runs. Prints the table of metrics "
        "and writes it to OUT/sweep.csv.",
    )
    add_model_arguments(sweep, grid=True)
    sweep.add_argument("--seeds", type=int, nargs="+", default=[0], help="seeds of weights and data (default 0)")
    add_training_arguments(sweep)
    sweep.add_argument("--chunk", type=int, default=32, help="models trained together between saves (default 32)")
    sweep.add_argument("--out", required=True, help="folder of the sweep's checkpoints")
    where = sweep.add_mutually_exclusive_group()
    where.add_argument("--workers", type=int, metavar="N", help="train on a local Dask cluster of N worker "
                       'processes (needs pip install "headcoop[dist]")')  # fmt: skip
    where.add_argument("--scheduler", metavar="ADDRESS", help="train on the workers of a running Dask scheduler, "
                       "e.g. tcp://10.0.0.5:8786 (they must see the --out folder)")  # fmt: skip
    sweep.add_argument("--device", default=None, help="where models train: cpu (default), cuda, cuda:1")
    sweep.add_argument("--threads", type=int, default=None, help="torch threads per worker (default: one for "
                       "--workers, else the process's setting)")  # fmt: skip
    sweep.set_defaults(func=cmd_sweep)

    report = sub.add_parser(
        "report",
        help="write one self-contained HTML page on what every head of a model does",
        description="Write an offline HTML report on any model: task and prompts, accuracy, per-head metrics, "
        "attention views, head patching, DLA, cooperation (mechanisms, Shapley values, path patching), QK/OV "
        "circuits of every head, and the task's own head picture, within a time budget. NAME_OR_PATH is a shipped "
        f"name ({', '.join(SHIPPED_NAMES)}), a checkpoint folder (hc.save), a TransformerLens export (config.json + "
        "model.safetensors or model.pt, optionally tokenizer.json; see headcoop.storage.foreign), or a Hugging Face model "
        "folder (config.json with model_type, and its weights; loaded through TransformerBridge). A model without "
        "a headcoop task needs --prompts.",
    )
    report.add_argument("model", metavar="NAME_OR_PATH")
    report.add_argument("--out", default="report.html", help="the HTML file to write (default report.html)")
    report.add_argument("--examples", type=int, default=3, help="inputs shown in the attention views (default 3)")
    report.add_argument("--no-progress", action="store_true", help="no progress bar")
    report.add_argument(
        "--prompts",
        metavar="FILE",
        help="JSON file of clean/corrupt prompts, answer, wrong "
        "(and labels): the contrast task the report uses (see headcoop.storage.foreign)",
    )
    report.add_argument(
        "--tokenizer",
        metavar="FILE",
        help="tokenizer.json that encodes text prompts (default: the model folder's tokenizer.json)",
    )
    report.add_argument(
        "--heads",
        nargs="+",
        metavar="HEAD",
        help="the heads the per-head sections cover, e.g. L0H1 L5H3 (default every head)",
    )
    report.add_argument(
        "--sections",
        nargs="+",
        metavar="SECTION",
        help="only these sections, e.g. overview "
        "heads patching (default all: overview accuracy heads <the task's own> attention patching "
        "dla cooperation circuits)",
    )
    report.add_argument(
        "--budget",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="time budget: analyses "
        "predicted to overrun it are left out, and the page says how to run them (default 60; 0: "
        "no limit)",
    )
    report.add_argument(
        "--device", default=None, help="where the model runs: cpu, cuda, cuda:1 (default: where it loads)"
    )
    report.set_defaults(func=cmd_report)
    return parser


# The Python names that checks deep inside headcoop use, and the flags a command-line user typed instead.
FLAGS = {"steps": "--steps", "batch_size": "--batch-size", "lr": "--lr", "weight_decay": "--weight-decay",
         "warmup": "--warmup", "schedule": "--schedule", "seed": "--seed", "each seed": "each of --seeds",
         "seeds": "--seeds", "n_heads": "--heads", "d_model": "--d-model", "d_head": "--d-head",
         "n_layers": "--layers", "chunk": "--chunk", "threads": "--threads", "workers": "--workers",
         "scheduler": "--scheduler", "device": "--device", "examples": "--examples", "out": "--out",
         "vocab=": "--tokenizer", "budget_s": "--budget", "sections": "--sections", "heads": "--heads"}  # fmt: skip


def as_flags(message: str) -> str:
    """`message` with the Python argument names it opens with ("batch_size must be >= 1") spoken as the
    flags of the command line ("--batch-size must be >= 1"); "vocab=" becomes --tokenizer."""
    for name, flag in FLAGS.items():
        if name.endswith("="):
            message = message.replace(name, flag)
            continue
        message = re.sub(rf"(^|: )(report: |sweep: |train: )?{re.escape(name)} (must|is|repeat)\b",
                         lambda m: f"{m.group(1)}{m.group(2) or ''}{flag} {m.group(3)}", message)  # fmt: skip
    return message


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore", message="HookedTransformer is deprecated", category=DeprecationWarning)
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    if "torch" not in sys.modules:  # before torch starts OpenMP: threads that hold up on a busy machine
        from headcoop.threads import configure_process

        try:
            configure_process()
        except ValueError as err:  # a bad HEADCOOP_THREADS
            print(f"headcoop {args.command}: error: {err}", file=sys.stderr)
            return 2
    try:
        return args.func(args)
    except (OSError, ValueError, TypeError, IndexError, ImportError, RuntimeError) as err:
        message = as_flags(" ".join(str(err).split()))  # one line, whatever the message holds
        print(f"headcoop {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"headcoop {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
