"""The Count01 reproduction (arXiv 2502.06923): `python -m experiments.count01.run_all`."""
