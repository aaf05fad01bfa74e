"""The engine: one stacked-copies engine runs n modified copies of a target run on the batch axis, with the
readouts, the resolution of inputs/positions/metric, the attention and block arithmetic (kernels), norms and
ablations every analysis shares. Imports nothing from the other analysis packages."""
