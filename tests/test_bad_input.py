"""A catalogue of wrong types, wrong values and broken models: each gets a clear error from headcoop's own
code naming the bad value, and training is bit-identical at two threads."""

import pytest
import torch

import headcoop as hc
from headcoop.cli import main

TINY = dict(n_heads=2, d_model=4, d_head=2)
FAST = dict(steps=3, batch_size=8, warmup=1, progress=False)


@pytest.fixture(scope="module")
def count01_model():
    return hc.Count01(max_len=6).model(seed=0, **TINY)


def nan_model():
    model = hc.Count01(max_len=6).model(seed=0, **TINY)
    with torch.no_grad():
        model.blocks[0].attn.W_K[0, 1, 1] = float("nan")
    return model


# --- 6. types and values ------------------------------------------------------------------------------
@pytest.mark.parametrize("task", [hc.Count01(), hc.SkipPair()], ids=["count01", "skip-pair"])
@pytest.mark.parametrize("text", [121, b"01=", None, ["0", "1"]])
def test_encode_takes_only_text(task, text):
    with pytest.raises(TypeError, match=r"encode\(\) takes a str, got"):
        task.encode(text)


@pytest.mark.parametrize("ids, error", [([0.0, 1.0], TypeError), ([True, False], TypeError),
                                        (torch.tensor([0.5]), TypeError), ("01", TypeError), ([0, -1], ValueError),
                                        ([[[0]]], ValueError)])  # fmt: skip
def test_decode_takes_only_integer_ids(ids, error):
    with pytest.raises(error, match="ids"):
        hc.Count01().decode(ids)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(min_len="3"), TypeError, "min_len must be an int, got '3'"),
        (dict(max_len=20.7), TypeError, "max_len must be an int, got 20.7"),
        (dict(max_len=10**9), ValueError, r"max_len must be in 1..4096, got 1000000000"),
        (dict(min_len=0), ValueError, "min_len must be >= 1"),
        (dict(min_len=5, max_len=3), ValueError, "min_len <= max_len"),
        (dict(include_ties="no"), TypeError, "include_ties must be True or False, got 'no'"),
        (dict(positional="false"), TypeError, "positional must be True or False, got 'false'"),
        (dict(positional=1), TypeError, "positional must be True or False"),
    ],
)
def test_count01_parameters(kwargs, error, message):
    with pytest.raises(error, match=message):
        hc.Count01(**kwargs)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(seq_len=2), ValueError, "seq_len must be in 3..4096"),
        (dict(seq_len=10.0), TypeError, "seq_len must be an int"),
        (dict(signal_fraction=2.0), ValueError, "signal_fraction must be <= 1.0"),
        (dict(signal_fraction="half"), TypeError, "signal_fraction must be a number"),
        (dict(signal_fraction=float("nan")), ValueError, "signal_fraction must be finite"),
        (dict(mapping={(1, 1): 5.5}), TypeError, r"mapping value of \(1, 1\) must be an int"),
        (dict(mapping=[1, 2]), TypeError, "mapping must be a dict"),
        (dict(mapping={"a,b": 1}), ValueError, "mapping key 'a,b' is not a pair"),
    ],
)
def test_skip_pair_parameters(kwargs, error, message):
    with pytest.raises(error, match=message):
        hc.SkipPair(**kwargs)


@pytest.mark.parametrize("seed, error", [("0", TypeError), (1.7, TypeError), (2**70, ValueError), (-1, ValueError),
                                         (True, TypeError)])  # fmt: skip
def test_seeds_everywhere(seed, error, count01_model):
    task = hc.Count01(max_len=6)
    with pytest.raises(error, match="seed"):
        task.sample(4, seed=seed)
    with pytest.raises(error, match="seed"):
        task.model(seed=seed, **TINY)
    with pytest.raises(error, match="seed"):
        hc.train(task, task.model(seed=0, **TINY), seed=seed, **FAST)
    with pytest.raises(error, match="seed"):
        hc.train_many(task, [TINY], seeds=[seed], **FAST)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(warmup=-3), ValueError, "warmup must be >= 0, got -3"),
        (dict(weight_decay=-1), ValueError, "weight_decay must be >= 0.0, got -1"),
        (dict(log_every=0), ValueError, "log_every must be >= 1, got 0"),
        (dict(lr=float("inf")), ValueError, "lr must be finite, got inf"),
        (dict(lr=0), ValueError, "lr must be > 0.0"),
        (dict(steps=2.0), TypeError, "steps must be an int, got 2.0"),
        (dict(batch_size=True), TypeError, "batch_size must be an int"),
    ],
)
def test_training_settings(kwargs, error, message):
    task = hc.Count01(max_len=6)
    settings = dict(FAST, **kwargs)
    with pytest.raises(error, match=message):
        hc.train(task, task.model(seed=0, **TINY), **settings)
    with pytest.raises(error, match=message):
        hc.train_many(task, [TINY], **settings)


@pytest.mark.parametrize("n, error", [(2.5, TypeError), (0, ValueError), ("8", TypeError), (10**9, ValueError)])
def test_sample_sizes(n, error):
    for task in (hc.Count01(), hc.SkipPair()):
        with pytest.raises(error, match="n=" if n == 10**9 else "n must be"):
            task.sample(n)


def test_sample_signal_fraction():
    with pytest.raises(ValueError, match="signal_fraction must be <= 1.0, got 2.0"):
        hc.SkipPair().sample(8, signal_fraction=2.0)


@pytest.mark.parametrize(
    "metric, error, message",
    [
        (lambda logits: logits[:, -1, 0], ValueError, r"must return a scalar, got a tensor of shape \(6,\)"),
        (lambda logits: "good", TypeError, "must return a scalar .* got 'good'"),
        (lambda logits: None, TypeError, "must return a scalar .* got None"),
    ],
)
def test_metrics_that_do_not_return_a_scalar(count01_model, metric, error, message):
    clean, corrupt = count01_model.task.patching_inputs(n=6)
    with pytest.raises(error, match=message):
        hc.patch(count01_model, clean=clean.tokens, corrupt=corrupt.tokens, metric=metric)


def test_empty_batches(count01_model):
    clean, corrupt = count01_model.task.patching_inputs(n=6)
    with pytest.raises(ValueError, match=r"tokens are empty \(shape \(0, 10\)\)"):
        hc.patch(count01_model, clean=clean[:0], corrupt=corrupt[:0])
    with pytest.raises(ValueError, match="tokens are empty"):
        hc.probe(count01_model, clean[:0], clean.labels[:0])
    with pytest.raises(ValueError, match="tokens are empty"):
        with hc.ablate(count01_model, heads=[0], how="mean", reference=clean[:0]):
            pass
    with pytest.raises(ValueError, match="tokens are empty"):
        hc.dla(count01_model, clean[:0])


@pytest.mark.parametrize("ids, error", [([0, 9], ValueError), ([-1, 0], ValueError), ([0.0, 1.0], TypeError)])
def test_table_lookups_with_ids_outside_the_vocabulary(count01_model, ids, error):
    with pytest.raises(error, match="id|ids"):
        hc.qk(count01_model, head=0).scores_for(ids)
    with pytest.raises(error, match="id|ids"):
        hc.ov(count01_model, head=0).effects_for(ids)


def test_a_task_on_a_model_it_does_not_fit(count01_model):
    with pytest.raises(ValueError, match=r"hc.train: SkipPair.* needs a model with d_vocab 12 .* has d_vocab 8"):
        hc.train(hc.SkipPair(), count01_model, **FAST)
    with pytest.raises(ValueError, match="skip-pair evaluate: SkipPair.* needs a model with d_vocab 12"):
        hc.evaluate(count01_model, hc.SkipPair())
    with pytest.raises(TypeError, match="task must be a headcoop Task"):
        hc.evaluate(count01_model, "count01")
    with pytest.raises(ValueError, match="n_ctx >= 24"):  # a longer context than the model was built for
        hc.evaluate(count01_model, hc.Count01(max_len=20))


def test_a_model_with_nothing_to_train():
    task = hc.Count01(max_len=6)
    model = task.model(seed=0, **TINY)
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="has no trainable parameters"):
        hc.train(task, model, **FAST)
    with pytest.raises(ValueError, match="has no trainable parameters"):
        hc.train_many(task, [model], **FAST)


# --- 4. non-finite weights and diverging training ------------------------------------------------------
def test_nan_weights_are_refused_everywhere(tmp_path):
    model = nan_model()
    message = r"non-finite weights: blocks.0.attn.W_K hold NaN or inf"
    for call in (
        lambda: hc.evaluate(model),
        lambda: hc.patch(model),
        lambda: hc.probe(model, model.task.sample(16), site="z"),
        lambda: hc.head_metrics(model, n=16),
        lambda: hc.dla(model),
        lambda: hc.save(model, tmp_path / "m", metrics={}),
        lambda: hc.train(model.task, model, **FAST),
        lambda: hc.train_many(model.task, [model], **FAST),
    ):
        with pytest.raises(ValueError, match=message):
            call()
    assert not (tmp_path / "m").exists()


def test_inf_weights_are_refused():
    model = hc.Count01(max_len=6).model(seed=0, **TINY)
    with torch.no_grad():
        model.unembed.b_U[2] = float("inf")
    with pytest.raises(ValueError, match="unembed.b_U hold NaN or inf"):
        hc.evaluate(model)


def test_diverging_training_stops_with_an_error():
    task = hc.Count01(max_len=6)
    with pytest.raises(ValueError, match=r"training diverged: the loss at step \d+ is \[nan\]"):
        hc.train(task, task.model(seed=0, **TINY), lr=1e12, steps=40, batch_size=8, warmup=1, progress=False)
    with pytest.raises(ValueError, match=r"training diverged: at step \d+ the loss of model\(s\) \[0\]"):
        hc.train_many(task, [TINY], lr=1e12, steps=40, batch_size=8, warmup=1, progress=False)


# --- 3. determinism at two threads ---------------------------------------------------------------------
@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
def test_train_is_bit_identical_at_two_threads(two_threads):
    """The W_E gradient of the embedding lookup used to be summed in a thread-dependent order."""
    task = hc.Count01()
    runs = []
    for _ in range(2):
        model = task.model(seed=0, n_heads=4, d_model=8, d_head=2)
        runs.append(hc.train(task, model, steps=60, batch_size=256, seed=0, progress=False))
    assert torch.get_num_threads() == 2 and not torch.are_deterministic_algorithms_enabled()
    for (name, p), q in zip(runs[0].named_parameters(), runs[1].parameters()):
        assert torch.equal(p, q), name


@pytest.mark.slow
def test_train_many_is_bit_identical_at_two_threads(two_threads):
    task = hc.Count01()
    runs = [hc.train_many(task, [dict(n_heads=4, d_model=8, d_head=2)] * 2, steps=60, batch_size=256, progress=False)
            for _ in range(2)]  # fmt: skip
    for a, b in zip(*runs):
        for (name, p), q in zip(a.named_parameters(), b.parameters()):
            assert torch.equal(p, q), name


# --- 7. the command line: one line on stderr, non-zero exit, nothing trained --------------------------
@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "count01", "--out", "{file}"], "it is a file"),
        (["train", "count01", "--out", "{file}/sub"], "is a file, not a folder"),
        (["train", "count01", "--out", ""], "empty string"),
        (["train", "count01", "--out", "{project}"], "not a headcoop checkpoint"),
        (["train", "count01", "--lr", "inf", "--out", "{new}"], "lr must be finite"),
        (["train", "count01", "--seed", "-1", "--out", "{new}"], "seed must be in"),
        (["train", "count01", "--heads", "0", "--out", "{new}"], "--heads must be >= 1"),
        (
            [
                "train",
                "count01",
                "--lr",
                "1e12",
                "--steps",
                "40",
                "--heads",
                "2",
                "--d-model",
                "4",
                "--batch-size",
                "8",
                "--out",
                "{new}",
            ],
            "training diverged",
        ),
        (["report", "count01", "--out", "{project}"], "is a folder"),
        (["report", "count01", "--out", ""], "--out is empty"),
        (["report", "count01", "--out", "{file}/r.html"], "is a file, not a folder"),
        (["eval", "{project}"], "no headcoop checkpoint"),
        (["sweep", "count01", "--out", "{file}", "--steps", "2"], "is a file, not a folder"),
        (["sweep", "count01", "--seeds", "0", "0", "--out", "{new}", "--steps", "2"], "seeds repeat"),
    ],
)
def test_cli_errors(tmp_path, capsys, argv, message):
    (tmp_path / "file").write_text("x")
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "notes.md").write_text("mine")
    where = dict(file=tmp_path / "file", project=tmp_path / "project", new=tmp_path / "new")
    code = main([arg.format(**where) for arg in argv])
    err = capsys.readouterr().err
    assert code == 2
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.startswith("headcoop")]
    assert len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err
    assert not (tmp_path / "new").exists() and (tmp_path / "file").read_text() == "x"
    assert sorted(p.name for p in (tmp_path / "project").iterdir()) == ["notes.md"]


# --- the rest of the catalogue: each call names its bad argument --------------------------------------
def _catalogue(model, batch):
    task = model.task
    return [
        (lambda: hc.patch(model, head="3"), ValueError, "head name '3' is not of the form 'L<layer>H<head>'"),
        (lambda: hc.patch(model, layer=1.0), TypeError, "layer must be an int, got 1.0"),
        (lambda: hc.patch(model, memory_budget_mb="big"), TypeError, "memory_budget_mb must be a number"),
        (lambda: hc.patch(model, head_local="no"), TypeError, "head_local must be True or False"),
        (
            lambda: hc.patch(model, clean={"a": 1}, corrupt={"a": 1}, metric=lambda x: x.mean()),
            TypeError,
            "tokens must be a Batch, text",
        ),
        (lambda: hc.train("count01", model), TypeError, "task must be a headcoop Task"),
        (lambda: hc.train(task, "count01"), TypeError, "hc.train needs a HookedTransformer, got str"),
        (
            lambda: hc.train_many(task, [TINY], progress="yes", **{k: v for k, v in FAST.items() if k != "progress"}),
            TypeError,
            "progress must be True, False or a tqdm bar",
        ),
        (lambda: hc.sweep(task, {"n_heads": [1]}, [0], "unused", poll_s=-1), ValueError, "poll_s must be > 0.0"),
        (lambda: hc.sweep(task, {"n_heads": [1]}, None, "unused"), TypeError, "seeds must be an int or a list"),
        (lambda: hc.load("count01", device="tpu"), ValueError, "unknown device 'tpu'"),
        (lambda: task.model(seed=0, device="tpu"), ValueError, "unknown device 'tpu'"),
        (lambda: task.corrupt("0121="), TypeError, "expects a Batch"),
        (lambda: hc.head_metrics(model, n=64, success_threshold=2), ValueError, "success_threshold must be <= 1.0"),
        (
            lambda: hc.evaluate(hc.Count01().model(seed=0).__class__(hc.Count01().config())),
            ValueError,
            "carries no task",
        ),
        (lambda: hc.save("count01", "unused"), TypeError, "hc.save takes a HookedTransformer"),
    ]


@pytest.mark.parametrize("index", range(16))
def test_catalogue(count01_model, index):
    call, error, message = _catalogue(count01_model, count01_model.task.sample(8))[index]
    with pytest.raises(error, match=message):
        call()


def _more(model, batch):
    task = model.task
    return [
        (lambda: hc.dla(model, batch, pos="x"), TypeError, "pos must be an int or one integer position"),
        (lambda: hc.dla(model, batch, pos=99), IndexError, "pos 99 is out of range"),
        (lambda: hc.probe(model, batch, pos=99), IndexError, "pos 99 is out of range"),  # the same type everywhere
        (lambda: batch["x"], TypeError, "a Batch is indexed by"),
        (lambda: batch.to("tpu"), ValueError, "unknown device 'tpu'"),
        (lambda: task.batch_from_strings(torch.rand(2, 3), torch.tensor([1, 2])), TypeError, "must be integer ids"),
        (lambda: hc.train_many(task, 5), TypeError, "train_many takes a list"),
        (lambda: hc.SkipPair().encode(""), ValueError, "holds no tokens"),
        (lambda: hc.head_names("count01"), TypeError, "head_names needs a HookedTransformer"),
        (lambda: hc.patch("count01"), TypeError, "hc.patch needs a HookedTransformer"),
        (lambda: hc.dla(None), TypeError, "dla needs a HookedTransformer"),
        (lambda: hc.qk(5, head=0), TypeError, "qk needs a HookedTransformer"),
        (lambda: hc.evaluate("count01"), TypeError, "hc.evaluate needs a HookedTransformer"),
        (lambda: hc.ablate("count01", heads=0).__enter__(), TypeError, "needs a HookedTransformer"),
    ]


@pytest.mark.parametrize("index", range(14))
def test_more_of_the_catalogue(count01_model, index):
    call, error, message = _more(count01_model, count01_model.task.sample(8))[index]
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("history", "x", "'history' should be a list"),
        ("frozen", "embed.W_E", "'frozen' should be a list"),
        ("frozen", ["nope"], r"frozen names \['nope'\] are not parameters"),
        ("task", "count01", "'task' should be a dict"),
        ("task", {"name": "count01", "params": {"max_len": "x"}}, "checkpoint task .* max_len must be an int"),
        ("task", {"name": "count99"}, "unknown task 'count99'"),
        ("dtype", "int8", "has dtype 'int8'"),
        ("weights_sha256", 5, "SHA-256"),
        ("config", [1], "no 'config' object"),
        ("config", {"n_layers": "x"}, "checkpoint config .* is invalid"),
    ],
)
def test_damaged_metadata_fields(count01_model, tmp_path, field, value, message):
    import json

    path = hc.save(count01_model, tmp_path / "m", metrics={})
    meta = json.loads((path / "headcoop.json").read_text())
    meta[field] = value
    (path / "headcoop.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=message):
        hc.load(path)


# --- heads are named the same way everywhere ----------------------------------------------------------
def test_every_analysis_takes_the_head_names_ablate_takes():
    model = hc.Count01(max_len=6).model(seed=0, n_heads=3, d_model=6, d_head=2, n_layers=2)
    clean, corrupt = model.task.patching_inputs(n=6)
    by_int = hc.patch(model, clean=clean, corrupt=corrupt, head=2, layer=1)
    for spec in ("L1H2", (1, 2), ["L1H2"]):
        same = hc.patch(model, clean=clean, corrupt=corrupt, head=spec)
        assert same.coords == by_int.coords and torch.equal(same.values, by_int.values), spec
        assert torch.equal(hc.qk(model, head=spec if not isinstance(spec, list) else spec[0]).scores,
                           hc.qk(model, head=2, layer=1).scores)  # fmt: skip
        assert torch.equal(hc.ov(model, head=spec if not isinstance(spec, list) else spec[0]).effects,
                           hc.ov(model, head=2, layer=1).effects)  # fmt: skip
    pair = hc.patch(model, clean=clean, corrupt=corrupt, head=["L0H0", "L0H2"])
    assert pair.coords == {"layer": [0], "head": [0, 2]}
    names = hc.probe(model, clean, clean.labels, head="L1H2").names
    assert names == hc.probe(model, clean, clean.labels, head=2, layer=1).names
    with pytest.raises(ValueError, match=r"lie in layers \[0, 1\]"):
        hc.patch(model, clean=clean, corrupt=corrupt, head=["L0H0", "L1H0"])
    with pytest.raises(ValueError, match="is in layer 1, but layer=0"):
        hc.patch(model, clean=clean, corrupt=corrupt, head="L1H0", layer=0)
    with pytest.raises(IndexError, match="head 5 is out of range"):
        hc.qk(model, head="L0H5")


def test_the_command_line_parses_without_importing_torch():
    """`headcoop --help` answers at once: parsing imports neither torch nor TransformerLens, and the names and
    defaults the parser spells out are those of the code they stand for."""
    import subprocess
    import sys

    code = ("import sys; from headcoop.cli import build_parser; build_parser().parse_args(['train', 'count01', "
            "'--out', 'x']); assert 'torch' not in sys.modules and 'transformer_lens' not in sys.modules")  # fmt: skip
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
    from headcoop import cli
    from headcoop.storage.checkpoints import SHIPPED
    from headcoop.tasks import TASKS
    from headcoop.training.loop import SCHEDULES

    assert tuple(sorted(TASKS)) == cli.TASK_NAMES and tuple(SHIPPED) == cli.SHIPPED_NAMES
    default = hc.TrainConfig()
    assert cli.TRAIN_DEFAULTS == {k: v for k, v in default.to_dict().items() if k != "seed"}
    assert cli.SCHEDULES == SCHEDULES


def test_public_names_are_not_shadowed_by_submodules():
    """Importing every submodule leaves hc.train, hc.sweep, hc.report ... the functions (a submodule named like
    a public function would replace it on the package)."""
    import importlib
    import pkgutil

    import headcoop

    for info in pkgutil.walk_packages(headcoop.__path__, "headcoop."):
        importlib.import_module(info.name)
    for name in headcoop.__all__:
        assert not type(getattr(headcoop, name)).__name__ == "module", name
