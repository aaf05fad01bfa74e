"""What headcoop writes and reads back: analysis results (`results`), model checkpoints and the shipped ones
(`checkpoints`), models and prompts from outside headcoop for the command line (`foreign`: TransformerLens exports,
prompt files), swapping folders and replacing files as the shell would (`folders`), and which process owns a
temporary folder or a lock (`owners`): headcoop overwrites only what it wrote itself.

Below analysis: it may import `display` (a result's figures), `models` and `tasks`; analysis imports it, never
the reverse (a result class is found by its module name when loaded).
"""
