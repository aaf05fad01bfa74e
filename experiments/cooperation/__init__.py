"""Cooperate, compete or superpose: Shapley values, interactions and path patching of the toy models:
`python -m experiments.cooperation.run_all`."""
