"""headcoop: do attention heads cooperate, compete or superpose?

`import headcoop as hc` exposes the whole API; analysis modules load on first use.
"""

from __future__ import annotations

import importlib

import headcoop.progress  # noqa: F401  (before TransformerLens loads tqdm.auto: no notebook warning)

__version__ = "0.1.0"


# name -> module defining it; imported on first access, so `import headcoop` (and `headcoop --help`) stay light.
_LAZY = {
    "load": "headcoop.checkpoints",
    "save": "headcoop.checkpoints",
    "Batch": "headcoop.tasks",
    "Count01": "headcoop.tasks",
    "SkipPair": "headcoop.tasks",
    "Task": "headcoop.tasks",
    "task_from_dict": "headcoop.tasks",
    "task_of": "headcoop.tasks",
    "contrast": "headcoop.tasks.contrast",
    "Contrast": "headcoop.tasks.contrast",
    "train": "headcoop.training",
    "evaluate": "headcoop.training",
    "TrainConfig": "headcoop.training",
    "run": "headcoop.analysis.common",
    "head_names": "headcoop.analysis.common",
    "patch": "headcoop.analysis.patching",
    "PatchResult": "headcoop.analysis.patching",
    "attribute": "headcoop.analysis.attribution",
    "AttributionResult": "headcoop.analysis.attribution",
    "dla": "headcoop.analysis.dla",
    "qk": "headcoop.analysis.circuits",
    "ov": "headcoop.analysis.circuits",
    "probe": "headcoop.analysis.probes",
    "ablate": "headcoop.analysis.ablation",
    "set_attention": "headcoop.analysis.intervene",
    "set_progress": "headcoop.progress",
    "load_result": "headcoop.results",
    "attention": "headcoop.analysis.attention",
    "interactions": "headcoop.analysis.interactions",
    "composition": "headcoop.analysis.composition",
    "path_patch": "headcoop.analysis.path_patching",
    "probe_patch": "headcoop.analysis.probe_patching",
    "ablate_edges": "headcoop.analysis.edge_ablation",
    "edges": "headcoop.analysis.edges",
    "EdgeResult": "headcoop.analysis.edges",
    "circuit": "headcoop.analysis.faithfulness",
    "Circuit": "headcoop.analysis.faithfulness",
    "faithfulness": "headcoop.analysis.faithfulness",
    "FaithfulnessResult": "headcoop.analysis.faithfulness",
    "export_mib": "headcoop.analysis.mib",
    "Interactions": "headcoop.analysis.interactions",
    "cooperation": "headcoop.analysis.cooperation",
    "Cooperation": "headcoop.analysis.cooperation",
    "superposed_writes": "headcoop.analysis.cooperation",
    "planted": "headcoop.tasks.planted",
    "PlantedTask": "headcoop.tasks.planted",
    "bench": "headcoop.tasks.bench",
    "BenchTask": "headcoop.tasks.bench",
    "train_many": "headcoop.fast_train",
    "sweep": "headcoop.sweeps",
    "dask_client": "headcoop.executors",
    "head_metrics": "headcoop.studies.count01",
    "report": "headcoop.reporting",
}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'headcoop' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = list(_LAZY)
