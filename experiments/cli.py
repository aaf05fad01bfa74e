"""The command line every experiment's run_all shares: --quick (tiny sizes, for the smoke test), --out (the
results folder) and --no-png, with the rule that quick tables never overwrite docs/results. It imports
nothing heavy: each run_all parses its arguments (and answers --help) before importing torch."""

from __future__ import annotations

import argparse
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"  # every experiment's default --out


def parser(doc: str | None, default_out: Path, png_help: str = "write HTML figures only") -> argparse.ArgumentParser:
    """An ArgumentParser with the shared options; add an experiment's own before `parse`."""
    made = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    made.add_argument("--quick", action="store_true", help="tiny sizes, for the smoke test")
    made.add_argument("--out", type=Path, default=None, help=f"results folder (default {default_out})")
    made.add_argument("--no-png", action="store_true", help=png_help)
    return made


def parse(made: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
    """Parse argv; exits with a usage error when --quick comes without --out."""
    args = made.parse_args(argv)
    if args.quick and args.out is None:
        made.error("--quick needs --out (the quick tables must not overwrite docs/results)")
    return args
