"""What every experiment's scripts share: the process setup, the table writer and the figure lines of a page."""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd
import torch

from headcoop.display.pages import Table


def setup(threads: int = 1) -> None:
    """One torch thread by default (fastest for the toy models; workers run side by side), quiet warnings."""
    torch.set_num_threads(threads)
    warnings.filterwarnings("ignore", category=DeprecationWarning)


def write_table(df: pd.DataFrame, out: Path, name: str, digits: int = 4) -> pd.DataFrame:
    """Write `df` as out/name.csv and out/name.md (a markdown table, floats to `digits`); returns df."""
    out.mkdir(parents=True, exist_ok=True)
    df.to_csv(out / f"{name}.csv", index=False)
    (out / f"{name}.md").write_text(Table(df, digits).markdown() + "\n")
    return df


def figure_lines(folder: Path, name: str, caption: str) -> list[str]:
    """The markdown lines showing folder/name.png (when written) and linking name.html; none if not drawn."""
    if not (folder / f"{name}.html").exists():
        return []
    image = [f"![{caption}](circuits/{name}.png)", ""] if (folder / f"{name}.png").exists() else []
    return [*image, f"*{caption}* ([interactive: {name}.html](circuits/{name}.html))", ""]
