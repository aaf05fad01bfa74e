"""Training the toy models: the hooked training loop and its config (`loop`), the fused batched trainer that
trains many models at once (`fast`), sweeps over seeds and settings (`sweeps`) run on local processes, Dask or
Ray (`executors`), and the file locks by which sweep workers take chunks of a sweep (`chunk_locks`).

Above storage, models and tasks (it saves checkpoints); nothing below imports it.
"""
