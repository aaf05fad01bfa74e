"""Interpretability over hooks: one module per analysis."""
