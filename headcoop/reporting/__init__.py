"""The HTML report (`hc.report`, `headcoop report`): one self-contained page on what every head does.

Its rooms: `budget` (the time budget and the cost predictor every analysis is priced by), `context` (the model,
inputs and shared results the sections read), `sections`, `cooperation` and `circuits` (the page's sections, each
returning page blocks), and `page` (the sections in order, the page assembled and written, `report`).

The top floor: it may import everything below it (analysis, studies, storage, models, display, tasks); only the
CLI imports it.
"""
