"""The OV-coherent SkipPair reproduction: `python -m experiments.skip_pair.run_all`."""
