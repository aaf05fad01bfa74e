"""A dense-weight ground-truth bench: models trained here with SIIT to implement Tracr programs at known nodes,
and an induction model whose mechanism the literature fixes (issue 50)."""
