"""The toy tasks: one module per task."""

from headcoop.tasks.base import Batch, Task, build_model
from headcoop.tasks.count01 import Count01
from headcoop.tasks.skip_pair import SkipPair

TASKS: dict[str, type[Task]] = {Count01.name: Count01, SkipPair.name: SkipPair}


def task_from_dict(spec: dict) -> Task:
    """Rebuild a task from `task.to_dict()`."""
    name = spec.get("name")
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks are {sorted(TASKS)}")
    return TASKS[name](**spec.get("params", {}))


def task_of(model) -> Task | None:
    """The task a headcoop model was built or loaded for (None for a foreign model)."""
    return getattr(model, "task", None)


__all__ = ["Batch", "Task", "Count01", "SkipPair", "TASKS", "task_from_dict", "task_of", "build_model"]
