"""Analyses of the weights alone: QK and OV tables, composition scores."""
