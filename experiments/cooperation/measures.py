"""Measures derived from the cooperation tables that both `cooperation.md` and the claim registry read
(`experiments/claims.py`): one definition, so the page's numbers and the registry's verdicts agree."""

from __future__ import annotations

import pandas as pd

# the readings of "writes to" in skip_pair_contexts's column names ("several | R", "only_correct | R")
WRITES_TO = ("positive above a tenth of the largest, consistent completions (hc.cooperation)",
             "positive, completions (the post's figure)", "centered, completions",
             "half_answer, vocabulary (the earlier hc.cooperation)")  # fmt: skip


def active_pairs(heads: pd.DataFrame, pairs: pd.DataFrame) -> pd.DataFrame:
    """Per (model, how), from `count01_heads` and `count01_pairs`: pairs of heads neither of which is inactive,
    and how many of those are redundant, in conjunction (a division or superposition), undetermined
    (`conflicting`); `redundant_share` is redundant / active pairs."""
    rows = []
    for (model, how), part in pairs.groupby(["model", "how"], sort=False):
        roles = heads[(heads.model == model) & (heads.how == how)].set_index("head").role
        active = part[(part.head_a.map(roles) != "inactive") & (part.head_b.map(roles) != "inactive")]
        rows.append(dict(model=model, how=how, active_heads=int((roles != "inactive").sum()), active_pairs=len(active),
                         redundant=int((active.mechanism == "redundant").sum()),
                         in_conjunction=int(active.mechanism.isin(["division", "superposition"]).sum()),
                         conflicting=int((active.mechanism == "undetermined").sum())))  # fmt: skip
    frame = pd.DataFrame(rows)
    frame["redundant_share"] = frame.redundant / frame.active_pairs.clip(lower=1)
    return frame
