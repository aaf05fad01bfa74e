"""A study's shape (`Study`, `StudySection`) and the registry of studies by task name; `headcoop.studies`
registers the built-in ones."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import pandas as pd

from headcoop.models.tl import HookedTransformer
from headcoop.tasks.base import Task


@dataclasses.dataclass(frozen=True)
class StudySection:
    """One report section a study supplies: notes (short HTML fragments), a table and a figure, any may be empty."""

    notes: tuple[str, ...] = ()
    table: pd.DataFrame | None = None
    figure: Any = None  # a plotly Figure
    figure_height: int = 500


class Study:
    """The default study: nothing beyond the generic analyses. Subclasses override what they add."""

    # (anchor, title) of the study's own report sections, in page order
    sections: ClassVar[tuple[tuple[str, str], ...]] = ()
    # whether the report's generic per-head linear probe columns apply (a study may replace them)
    generic_probes: ClassVar[bool] = True

    def head_columns(self, model: HookedTransformer, task: Task) -> tuple[pd.DataFrame | None, list[str]]:
        """Extra per-head columns (index: head names "L0H3") and the notes that explain them."""
        return None, []

    def section(self, anchor: str, model: HookedTransformer, task: Task, head_table: pd.DataFrame) -> StudySection:
        """The section `anchor` (one of `sections`); `head_table` is the report's per-head table."""
        raise KeyError(f"{type(self).__name__} has no section {anchor!r}")


STUDIES: dict[str, Study] = {}


def register_study(task_name: str, study: Study) -> None:
    """Make `study` the study of every task whose `name` is `task_name`."""
    if not isinstance(study, Study):
        raise TypeError(f"a study must be a headcoop.studies.Study, got {type(study).__name__}")
    STUDIES[task_name] = study


def study_for(task: Task) -> Study:
    """The study registered for `task` (by its name), else the default study that adds nothing."""
    return STUDIES.get(task.name, Study())
