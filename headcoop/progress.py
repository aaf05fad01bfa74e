"""The progress bar: tqdm's notebook widget where ipywidgets is installed, its text bar elsewhere.

`tqdm.auto` in a Jupyter kernel without ipywidgets warns "IProgress not found" on every import; choosing
here keeps `import headcoop` quiet there and still gives notebook users the widget when they have it.
"""

from __future__ import annotations

import importlib
import importlib.util

import warnings

if importlib.util.find_spec("ipywidgets") is not None:
    from tqdm.auto import tqdm
else:
    from tqdm.std import tqdm

    # TransformerLens imports tqdm.auto itself; its one-time warning says nothing a headcoop user can act on.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        importlib.import_module("tqdm.auto")

__all__ = ["tqdm"]
