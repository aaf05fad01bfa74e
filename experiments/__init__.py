"""Experiments that regenerate docs/results/: run each as `python -m experiments.<task>.run_all` from the repository root."""
