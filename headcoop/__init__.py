"""headcoop: do attention heads cooperate, compete or superpose?

`import headcoop as hc` exposes the whole API; analysis modules load on first use.
"""

import importlib as _importlib
import sys as _sys

import headcoop.display.progress  # noqa: F401  (before TransformerLens loads tqdm.auto: no notebook warning)

__version__ = "0.1.0"

# modules that moved (issue 64's packages and their predecessors): old name -> where it is now. Importing an old
# name says where to look (issue 77) instead of a bare "No module named".
MOVED = {
    **{f"headcoop.{m}": f"headcoop.display.{m}" for m in ("pages", "plot", "progress", "views")},
    **{f"headcoop.{m}": f"headcoop.models.{m}" for m in ("bridge", "fused", "tl")},
    **{f"headcoop.{m}": f"headcoop.storage.{m}" for m in ("checkpoints", "folders", "foreign", "owners", "results")},
    "headcoop.claims": "headcoop.training.chunk_locks", "headcoop.executors": "headcoop.training.executors",
    "headcoop.fast_train": "headcoop.training.fast", "headcoop.sweeps": "headcoop.training.sweeps",
    "headcoop.sweep": "headcoop.training.sweeps", "headcoop.train": "headcoop.training.loop",
    "headcoop.report": "headcoop.reporting.page",
    "headcoop.analysis.edge_ablation": "headcoop.analysis.edges.ablation",
    **{f"headcoop.analysis.{m}": f"headcoop.analysis.edges.{m}" for m in ("faithfulness", "mib", "path_patching")},
    **{f"headcoop.analysis.{m}": f"headcoop.analysis.engine.{m}" for m in ("ablation", "copies", "grid", "kernels",
                                                                            "norms")},
    "headcoop.analysis.common": "headcoop.analysis.engine.inputs",
    **{f"headcoop.analysis.{m}": f"headcoop.analysis.games.{m}" for m in ("coalitions", "estimators", "interactions")},
    "headcoop.analysis.cooperation": "headcoop.analysis.mechanisms.cooperation",
    **{f"headcoop.analysis.{m}": f"headcoop.analysis.nodes.{m}" for m in ("attention", "attribution", "dla",
                                                                           "intervene", "patching", "probe_patching",
                                                                           "probes")},
    "headcoop.analysis.composition": "headcoop.analysis.weights.composition",
    "headcoop.analysis.circuits": "headcoop.analysis.weights.qkov",
    "headcoop.analysis.count01_metrics": "headcoop.studies.count01",
    "headcoop.analysis.skip_pair_metrics": "headcoop.studies.skip_pair",
}  # fmt: skip


class _MovedFinder:
    """Consulted after every other finder: an old module name raises ModuleNotFoundError naming the new one."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if fullname in MOVED:
            raise ModuleNotFoundError(f"{fullname} moved to {MOVED[fullname]}: import it from there (or use "
                                      f"`import headcoop as hc` and the hc.* names)", name=fullname)  # fmt: skip
        return None


if not any(isinstance(f, _MovedFinder) for f in _sys.meta_path):
    _sys.meta_path.append(_MovedFinder())


# name -> module defining it; imported on first access, so `import headcoop` (and `headcoop --help`) stay light.
_LAZY = {
    "load": "headcoop.storage.checkpoints",
    "load_gguf": "headcoop.storage.gguf",
    "save": "headcoop.storage.checkpoints",
    "Batch": "headcoop.tasks",
    "Count01": "headcoop.tasks",
    "SkipPair": "headcoop.tasks",
    "Task": "headcoop.tasks",
    "task_from_dict": "headcoop.tasks",
    "task_of": "headcoop.tasks",
    "contrast": "headcoop.tasks.contrast",
    "Contrast": "headcoop.tasks.contrast",
    "train": "headcoop.training.loop",
    "evaluate": "headcoop.training.loop",
    "TrainConfig": "headcoop.training.loop",
    "run": "headcoop.analysis.engine.inputs",
    "head_names": "headcoop.analysis.engine.inputs",
    "patch": "headcoop.analysis.nodes.patching",
    "PatchResult": "headcoop.analysis.nodes.patching",
    "attribute": "headcoop.analysis.nodes.attribution",
    "AttributionResult": "headcoop.analysis.nodes.attribution",
    "dla": "headcoop.analysis.nodes.dla",
    "qk": "headcoop.analysis.weights.qkov",
    "ov": "headcoop.analysis.weights.qkov",
    "probe": "headcoop.analysis.nodes.probes",
    "ablate": "headcoop.analysis.engine.ablation",
    "set_attention": "headcoop.analysis.nodes.intervene",
    "set_progress": "headcoop.display.progress",
    "load_result": "headcoop.storage.results",
    "attention": "headcoop.analysis.nodes.attention",
    "interactions": "headcoop.analysis.games.interactions",
    "composition": "headcoop.analysis.weights.composition",
    "path_patch": "headcoop.analysis.edges.path_patching",
    "probe_patch": "headcoop.analysis.nodes.probe_patching",
    "ablate_edges": "headcoop.analysis.edges.ablation",
    "edges": "headcoop.analysis.edges.scores",
    "EdgeResult": "headcoop.analysis.edges.scores",
    "circuit": "headcoop.analysis.edges.faithfulness",
    "Circuit": "headcoop.analysis.edges.faithfulness",
    "faithfulness": "headcoop.analysis.edges.faithfulness",
    "FaithfulnessResult": "headcoop.analysis.edges.faithfulness",
    "circuit_stability": "headcoop.analysis.edges.stability",
    "CircuitStability": "headcoop.analysis.edges.stability",
    "export_mib": "headcoop.analysis.edges.mib",
    "Interactions": "headcoop.analysis.games.interactions",
    "cooperation": "headcoop.analysis.mechanisms.cooperation",
    "pair_map": "headcoop.analysis.pairs.compute",
    "PairMap": "headcoop.analysis.pairs.result",
    "Cooperation": "headcoop.analysis.mechanisms.cooperation",
    "superposed_writes": "headcoop.analysis.mechanisms.cooperation",
    "planted": "headcoop.tasks.planted",
    "PlantedTask": "headcoop.tasks.planted",
    "bench": "headcoop.tasks.bench",
    "BenchTask": "headcoop.tasks.bench",
    "function_bench": "headcoop.tasks.function_bench",
    "train_many": "headcoop.training.fast",
    "sweep": "headcoop.training.sweeps",
    "dask_client": "headcoop.training.executors",
    "head_metrics": "headcoop.studies.count01",
    "report": "headcoop.reporting.page",
}


TL_MISSING = (
    "headcoop needs TransformerLens, which is not installed: pip install 'transformer-lens>=3.5,<4' "
    "(3.x runs the toy tasks; 4.x runs every analysis on a TransformerBridge)"
)


def __getattr__(name: str):
    if name in _LAZY:
        try:
            module = _importlib.import_module(_LAZY[name])
        except ModuleNotFoundError as err:  # whichever module imported it first, the fix is named
            if (err.name or "").split(".")[0] == "transformer_lens":
                raise ImportError(TL_MISSING) from None
            raise
        value = getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'headcoop' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The API (`__all__`) and the version: not the module's own helpers (TL_MISSING, MOVED, ...)."""
    return sorted(set(_LAZY) | {"__version__"})


__all__ = list(_LAZY)
