"""What a researcher sees: plotly figures and their house template (`plot`), circuitsvis attention views
(`views`), the static page writer the report and the results pages share (`pages`), and progress bars with their
time estimates (`progress`).

Imports nothing of headcoop above it (no analysis, storage, training or report): every other floor may draw and
report progress through it.
"""
