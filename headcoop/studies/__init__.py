"""Studies: what a task measures beyond the generic analyses, and what its report adds.

Data flows one way: tasks -> model -> training -> analysis -> studies -> rendering. A study computes
task-specific quantities with the analyses (Count01's per-head s_acc, w01, w02; SkipPair's preference
orderings) and hands the report plain data: extra per-head columns with notes, and whole sections
(`StudySection`: notes, a table, a figure). The report renders any study the same way, so a third
task plugs in by registering its study, without touching `headcoop.reporting`:

    register_study("my-task", MyStudy())
"""

from __future__ import annotations

from headcoop.studies.base import STUDIES, Study, StudySection, register_study, study_for


def _register_builtin() -> None:
    from headcoop.studies.count01 import Count01Study
    from headcoop.studies.skip_pair import SkipPairStudy

    register_study("count01", Count01Study())
    register_study("skip-pair", SkipPairStudy())


_register_builtin()

__all__ = ["STUDIES", "Study", "StudySection", "register_study", "study_for"]
