"""The reliability catalogue, round two (issue 21): surface x case -> expected class, one row each, so a reader
can scan what headcoop answers to a new user's mistakes. "ok" rows must succeed (they once failed with a raw
library error); error rows must raise headcoop's own error of that class, naming the bad value (the regex).
Cases that need state checked afterwards (files kept, runs resent, numbers equal) follow the table."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap

import pytest
import torch
from helpers import attn_only_2l_like

import headcoop as hc
from headcoop.cli import main
from headcoop.storage import checkpoints, foreign
from headcoop.storage.checkpoints import META, WEIGHTS

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def tiny():
    return hc.Count01(max_len=6).model(seed=0, n_heads=2, d_model=4, d_head=2)


def two_layer():
    return attn_only_2l_like(seed=0)


def ids_contrast():
    return hc.contrast([[1, 2, 3], [1, 2, 9]], [[1, 4, 3], [1, 4, 9]], [5, 6], [7, 8])


def plain_model(d_vocab=10):
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=1, d_model=8, n_ctx=6, d_head=4, n_heads=2, d_vocab=d_vocab,
                                  attn_only=True, act_fn="relu", seed=0)  # fmt: skip
    return HookedTransformer(cfg)


def mixed_dtypes():
    model = tiny()
    model.blocks[0].attn.W_Q = torch.nn.Parameter(model.blocks[0].attn.W_Q.detach().double())
    return model


def saved(tmp, **config_changes):
    path = hc.save(tiny(), tmp / "ck", metrics={})
    if config_changes:
        meta = json.loads((path / META).read_text())
        meta["config"].update(config_changes)
        (path / META).write_text(json.dumps(meta))
    return path


def exported(tmp, weights: bytes | None = None, state=None, pickled=None):
    from headcoop.storage.foreign import export

    folder = export(plain_model(), tmp / "exp")
    if weights is not None:
        (folder / "model.safetensors").write_bytes(weights)
    if state is not None:
        from safetensors.torch import save_file

        save_file(state, str(folder / "model.safetensors"))
    if pickled is not None:
        (folder / "model.safetensors").unlink()
        torch.save(pickled, folder / "model.pt")
    return folder


def int8_state():
    return {k: (v * 10).to(torch.int8) if v.is_floating_point() else v for k, v in plain_model().state_dict().items()}


class Payload:  # a pickled object beyond tensors
    pass


def interactions_with(metric, **kwargs):
    model = tiny()
    return hc.interactions(model, metric=metric, **kwargs)


def sometimes_nan():
    calls = iter(range(10**6))
    return lambda logits: torch.tensor(float("nan")) if next(calls) % 3 == 1 else logits.mean()


def zero_wo():
    model = two_layer()
    with torch.no_grad():
        model.blocks[0].attn.W_O[1] = 0
    return model


def path(model=None, **kwargs):
    model = model or two_layer()
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 5), generator=torch.Generator().manual_seed(0))
    kwargs.setdefault("metric", lambda logits: logits[:, -1, 0].mean())
    return hc.path_patch(model, clean=tokens, corrupt=(tokens + 1) % model.cfg.d_vocab, **kwargs)


def word_tok():
    from headcoop.storage.foreign import word_tokenizer

    return word_tokenizer(["<pad>", "[BOS]", "a", "b", "="])


def cli(*argv):
    """The CLI's exit code and one-line error, raised as SystemExit-free ValueError text for the table."""
    import io
    from contextlib import redirect_stderr

    err = io.StringIO()
    with redirect_stderr(err):
        code = main([str(a) for a in argv])
    if code != 0:
        raise ValueError(err.getvalue().strip().splitlines()[-1])
    return code


def prompts_file(tmp, content: str):
    file = tmp / "prompts.json"
    file.write_text(content)
    return file


def text_prompts(tmp):
    return prompts_file(tmp, json.dumps(dict(clean=["a b"], corrupt=["b a"], answer=["a"], wrong=["b"])))


def id_prompts(tmp):
    return prompts_file(tmp, json.dumps(dict(clean=[[7, 0, 1, 1, 3], [7, 0, 6, 3, 7]], corrupt=[[7, 1, 0, 0, 3],
                                             [7, 1, 6, 3, 7]], answer=[5, 5], wrong=[4, 4])))  # fmt: skip


def fifo(tmp):
    os.mkfifo(tmp / "pipe")
    return tmp / "pipe"


def unix_socket(tmp):
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp / "sock"))
    return tmp / "sock"


# (surface, case, action(tmp), expected: "ok" or (exception class, message regex))
CATALOGUE = [
    # --- checkpoints: what save may replace, what load accepts ---------------------------------------------
    (
        "hc.save",
        "a user's headcoop.json alone in the folder",
        lambda t: ((t / "u").mkdir(), (t / "u" / META).write_text('{"mine": 1}'), hc.save(tiny(), t / "u")),
        (ValueError, "not a headcoop checkpoint's JSON"),
    ),
    (
        "hc.save",
        "weights.safetensors is a user's folder",
        lambda t: (t / "u" / WEIGHTS).mkdir(parents=True) or hc.save(tiny(), t / "u"),
        (ValueError, "not a regular file"),
    ),
    (
        "hc.save",
        "the path is a symlink",
        lambda t: os.symlink(saved(t), t / "link") or hc.save(tiny(), t / "link"),
        (ValueError, "symbolic link"),
    ),
    ("hc.save", "model.double() without cfg.dtype", lambda t: hc.load(hc.save(tiny().double(), t / "d")), "ok"),
    (
        "hc.save",
        "parameters of mixed dtypes",
        lambda t: hc.save(mixed_dtypes(), t / "mixed"),
        (ValueError, "mix dtypes"),
    ),
    (
        "hc.load",
        "n_layers 10^6 beside 1-layer weights",
        lambda t: hc.load(saved(t, n_layers=10**6)),
        (ValueError, "n_layers=1000000"),
    ),
    ("hc.load", "n_ctx 10^9", lambda t: hc.load(saved(t, n_ctx=10**9)), (ValueError, "n_ctx=1000000000")),
    ("hc.load", "d_vocab 10^9", lambda t: hc.load(saved(t, d_vocab=10**9)), (ValueError, "d_vocab=1000000000")),
    (
        "hc.load",
        'config "d_model": "8"',
        lambda t: hc.load(saved(t, d_model="8")),
        (ValueError, "'d_model' must be an int, got '8'"),
    ),
    ("hc.load", "config eps NaN", lambda t: hc.load(saved(t, eps=float("nan"))), (ValueError, "'eps' must be finite")),
    (
        "hc.load",
        "config n_heads true",
        lambda t: hc.load(saved(t, n_heads=True)),
        (ValueError, "'n_heads' must be an int"),
    ),
    # --- foreign exports -----------------------------------------------------------------------------------
    (
        "foreign.load_model",
        "truncated model.safetensors",
        lambda t: foreign.load_model(
            (lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:100]) and f)(
                exported(t)
            )
        ),
        (ValueError, "not a readable safetensors file"),
    ),  # fmt: skip
    (
        "foreign.load_model",
        "random bytes as model.safetensors",
        lambda t: foreign.load_model(exported(t, weights=os.urandom(4096))),
        (ValueError, "not a readable safetensors"),
    ),
    (
        "foreign.load_model",
        "a pickled payload in model.pt",
        lambda t: foreign.load_model(exported(t, pickled={"x": Payload()})),
        (ValueError, "Python objects beyond tensors"),
    ),
    (
        "foreign.load_model",
        "int8 weights",
        lambda t: foreign.load_model(exported(t, state=int8_state())),
        (ValueError, "not floating point"),
    ),
    (
        "foreign.load_model",
        "n_layers 10^6 in config.json",
        lambda t: foreign.load_model(
            (
                lambda f: (
                    (f / "config.json").write_text(
                        json.dumps(dict(json.loads((f / "config.json").read_text()), n_layers=10**6))
                    )
                    and f
                )
            )(exported(t))
        ),
        (ValueError, "n_layers=1000000"),
    ),  # fmt: skip
    # --- contrast ------------------------------------------------------------------------------------------
    (
        "hc.contrast",
        "an unknown word (word_tokenizer)",
        lambda t: hc.contrast(["[BOS] a zz"], ["[BOS] b a"], ["a"], ["b"], vocab=word_tok()),
        (ValueError, "zz"),
    ),
    (
        "hc.contrast",
        "[BOS] is one word of word_tokenizer",
        lambda t: word_tok().encode("[BOS] a =") == [1, 2, 4] or (_ for _ in ()).throw(AssertionError("split")),
        "ok",
    ),
    (
        "hc.contrast",
        "pad_id=1.7",
        lambda t: hc.contrast([[1, 2]], [[2, 1]], [1], [2], pad_id=1.7),
        (TypeError, "pad_id must be an int, got 1.7"),
    ),
    (
        "hc.contrast",
        "a vocabulary with duplicates",
        lambda t: hc.contrast(["a b"], ["b a"], ["a"], ["b"], vocab=["a", "b", "a"]),
        (ValueError, r"more than once: \['a'\]"),
    ),
    (
        "hc.contrast",
        "answer == wrong for every prompt",
        lambda t: hc.contrast([[1, 2]], [[2, 1]], [1], [1]),
        (ValueError, "same token for every prompt"),
    ),
    ("hc.contrast", "sample(0)", lambda t: ids_contrast().sample(0), (ValueError, "n must be >= 1, got 0")),
    ("hc.contrast", "sample(2.7)", lambda t: ids_contrast().sample(2.7), (TypeError, "n must be an int, got 2.7")),
    (
        "hc.contrast",
        "token-id prompts of different lengths",
        lambda t: (
            hc.contrast([[1, 2, 3], [1, 2]], [[1, 4, 3], [1, 4]], [5, 6], [7, 8]).clean.answer_pos.tolist() == [2, 1]
            or (_ for _ in ()).throw(AssertionError("padding"))
        ),
        "ok",
    ),  # fmt: skip
    (
        "hc.contrast",
        "ids, no vocab, the model's last id: hc.patch",
        lambda t: hc.patch(ids_contrast().attach(plain_model())),
        "ok",
    ),
    (
        "hc.contrast",
        "ids, no vocab: hc.attention",
        lambda t: hc.attention(ids_contrast().attach(plain_model()), ids_contrast().clean[:1]),
        "ok",
    ),
    (
        "hc.contrast",
        "ids, no vocab, d_vocab above the ids: hc.dla",
        lambda t: hc.dla(ids_contrast().attach(plain_model(12))),
        "ok",
    ),
    (
        "hc.contrast",
        "ids, no vocab: hc.report",
        lambda t: hc.report(plain_model(), t / "r.html", task=ids_contrast(), progress=False),
        "ok",
    ),
    ("hc.contrast", "padded prompts: evaluate", lambda t: ids_contrast().evaluate(plain_model()), "ok"),
    # --- analyses ------------------------------------------------------------------------------------------
    (
        "hc.dla",
        "at= with answer=",
        lambda t: hc.dla(two_layer(), torch.zeros(2, 4, dtype=torch.long), at=(1, "q"), answer=3),
        (ValueError, "answer= and wrong= choose logits"),
    ),
    (
        "hc.ablate",
        "how='scale', factor=nan",
        lambda t: hc.ablate(tiny(), heads=[0], how="scale", factor=float("nan")).__enter__(),
        (ValueError, "finite factor"),
    ),
    (
        "hc.interactions",
        "metric NaN",
        lambda t: interactions_with(lambda l: torch.tensor(float("nan"))),
        (ValueError, "metric is nan"),
    ),
    (
        "hc.interactions",
        "metric inf",
        lambda t: interactions_with(lambda l: torch.tensor(float("inf"))),
        (ValueError, "metric is inf"),
    ),
    (
        "hc.interactions",
        "metric NaN for some coalitions",
        lambda t: interactions_with(sometimes_nan()),
        (ValueError, "finite number for every coalition"),
    ),
    ("hc.interactions", "metric returns a bool", lambda t: interactions_with(lambda l: True), (TypeError, "scalar")),
    (
        "hc.interactions",
        "metric returns a vector",
        lambda t: interactions_with(lambda l: l[:, -1, 0]),
        (ValueError, "must return a scalar, got a tensor of shape"),
    ),
    ("hc.interactions", "metric returns None", lambda t: interactions_with(lambda l: None), (TypeError, "got None")),
    ("hc.interactions", "metric returns a string", lambda t: interactions_with(lambda l: "x"), (TypeError, "got 'x'")),
    (
        "hc.interactions",
        "max_permutations=0",
        lambda t: interactions_with(None, estimator="kernelshap", max_permutations=0),
        (ValueError, "max_permutations must be >= 2"),
    ),
    (
        "hc.interactions",
        "max_permutations=2.5",
        lambda t: interactions_with(None, estimator="kernelshap", max_permutations=2.5),
        (TypeError, "max_permutations must be an int"),
    ),
    (
        "hc.interactions",
        "pair_samples=0",
        lambda t: interactions_with(None, estimator="kernelshap", pair_samples=0),
        (ValueError, "pair_samples must be >= 1"),
    ),
    (
        "hc.path_patch",
        "sender after its receiver",
        lambda t: path(senders=["L1H0"], receivers=["L0H1"]),
        (ValueError, "no edge to patch"),
    ),
    (
        "hc.path_patch",
        "sender and receiver in one layer",
        lambda t: path(senders=["L1H0"], receivers=["L1H1"]),
        (ValueError, "no edge to patch"),
    ),
    ("hc.path_patch", "via=[]", lambda t: path(via=[]), (ValueError, "via is empty")),
    (
        "hc.path_patch",
        "metric returns a vector",
        lambda t: path(metric=lambda l: l[:, -1, 0]),
        (ValueError, "must return a scalar"),
    ),
    ("hc.path_patch", "metric returns None", lambda t: path(metric=lambda l: None), (TypeError, "got None")),
    ("hc.path_patch", "metric returns a string", lambda t: path(metric=lambda l: "x"), (TypeError, "got 'x'")),
    ("hc.composition", "a head whose W_O is zero", lambda t: hc.composition(zero_wo()), (ValueError, r"\['L0H1'\]")),
    # --- command line and files ----------------------------------------------------------------------------
    (
        "headcoop report",
        "--out is a FIFO",
        lambda t: cli("report", "count01", "--out", fifo(t), "--no-progress"),
        (ValueError, "special file"),
    ),
    (
        "headcoop report",
        "--out is a socket",
        lambda t: cli("report", "count01", "--out", unix_socket(t), "--no-progress"),
        (ValueError, "special file"),
    ),
    (
        "headcoop report",
        "--prompts holding null",
        lambda t: cli("report", "count01", "--prompts", prompts_file(t, "null"), "--out", t / "r.html"),
        (ValueError, "holds null; it must hold a JSON object of lists"),
    ),
    (
        "headcoop report",
        "--prompts holding a number",
        lambda t: cli("report", "count01", "--prompts", prompts_file(t, "3"), "--out", t / "r.html"),
        (ValueError, "holds 3; it must hold a JSON object"),
    ),
    (
        "headcoop report",
        "--prompts holding an empty list",
        lambda t: cli("report", "count01", "--prompts", prompts_file(t, "[]"), "--out", t / "r.html"),
        (ValueError, r"holds \[\]; it must hold"),
    ),
    (
        "headcoop report",
        "--prompts with an empty clean list",
        lambda t: cli(
            "report",
            "count01",
            "--prompts",
            prompts_file(t, '{"clean": [], "corrupt": [], "answer": [], "wrong": []}'),
            "--out",
            t / "r.html",
        ),
        (ValueError, "'clean' is \\[\\], not a non-empty list"),
    ),
    (
        "headcoop report",
        "--prompts of texts, no tokenizer",
        lambda t: cli("report", "count01", "--prompts", text_prompts(t), "--out", t / "r.html"),
        (ValueError, "--tokenizer"),
    ),
    (
        "headcoop report",
        "--tokenizer that is no tokenizer.json",
        lambda t: cli(
            "report",
            "count01",
            "--prompts",
            text_prompts(t),
            "--tokenizer",
            prompts_file(t, "{}"),
            "--out",
            t / "r.html",
        ),
        (ValueError, "is not a Hugging Face tokenizer.json"),
    ),  # fmt: skip
    (
        "headcoop report",
        "count01 --prompts ids.json",
        lambda t: cli("report", "count01", "--prompts", id_prompts(t), "--out", t / "r.html", "--no-progress"),
        "ok",
    ),
    (
        "headcoop train",
        "--batch-size 0 speaks the flag",
        lambda t: cli("train", "count01", "--batch-size", "0", "--out", t / "m"),
        (ValueError, "--batch-size must be >= 1"),
    ),
    (
        "headcoop sweep",
        "--seeds 0 0 speaks the flag",
        lambda t: cli("sweep", "count01", "--seeds", "0", "0", "--out", t / "m"),
        (ValueError, "--seeds repeat"),
    ),
    (
        "hc.dask_client",
        "no scheduler at the address",
        lambda t: hc.dask_client(scheduler="tcp://127.0.0.1:1", timeout_s=1),
        (OSError, "no Dask scheduler answered"),
    ),
]


def overflowing():
    model = two_layer()
    with torch.no_grad():
        model.W_U.mul_(1e38)
    return model


def nan_weights():
    model = tiny()
    with torch.no_grad():
        model.blocks[0].attn.W_Q[0, 0, 0] = float("nan")
    return model


def attribution():
    model = two_layer()
    tokens = torch.randint(0, model.cfg.d_vocab, (2, 5), generator=torch.Generator().manual_seed(0))
    return hc.attribute(
        model, clean=tokens, corrupt=tokens.flip(0), metric=lambda l: l[:, -1, 0].mean(), verify=2, sample=2
    )


def twenty_heads():
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=2, d_model=16, n_ctx=6, d_head=2, n_heads=10, d_vocab=8, attn_only=True,
                                  act_fn="relu", seed=0)  # fmt: skip
    return HookedTransformer(cfg)


def game_inputs(model):
    return torch.randint(0, model.cfg.d_vocab, (3, 5), generator=torch.Generator().manual_seed(0))


def in_inference_mode(fn):
    with torch.inference_mode():
        return fn()


def qk_under_a_hook():
    model = tiny()
    model.add_hook("blocks.0.attn.hook_q", lambda x, hook: x * 1.1)
    return hc.qk(model, head="L0H0")


# round three (issue 35): each row failed before with a raw library error or a silent result
ROUND_THREE = [
    (
        "hc.interactions",
        "sampled, budget 50 in 8 runs on 20 heads",
        lambda t: hc.interactions(
            twenty_heads(),
            game_inputs(twenty_heads()),
            metric=lambda l: l[:, -1, 0].mean(),
            estimator="kernelshap",
            budget=50,
            repeats=8,
        ),
        (ValueError, r"at least 4n \+ 2 = 82 per run with 20 heads.*budget >= 656"),
    ),
    (
        "hc.interactions",
        "players all after layer 0",
        lambda t: hc.interactions(
            hc.Count01(max_len=6).model(seed=0, n_heads=2, d_model=8, d_head=2, n_layers=2),
            heads=["L1H0", "L1H1"],
            how="zero",
        ),
        "ok",
    ),
    (
        "hc.cooperation",
        "players all after layer 0",
        lambda t: hc.cooperation(
            hc.Count01(max_len=6).model(seed=0, n_heads=2, d_model=8, d_head=2, n_layers=2),
            heads=["L1H0", "L1H1"],
            n=16,
        ),
        "ok",
    ),
    (
        "hc.attribute",
        "logits overflow (W_U * 1e38)",
        lambda t: hc.attribute(
            overflowing(),
            clean=game_inputs(two_layer()),
            corrupt=game_inputs(two_layer()).flip(0),
            metric=lambda l: l[:, -1, 0].mean() - l[:, -1, 1].mean(),
        ),
        (ValueError, "not finite"),
    ),
    (
        "hc.attribute",
        "argmax accuracy metric",
        lambda t: hc.attribute(
            two_layer(),
            clean=game_inputs(two_layer()),
            corrupt=game_inputs(two_layer()).flip(0),
            metric=lambda l: (l[:, -1].argmax(-1) == 1).float().mean(),
        ),
        (ValueError, "differentiable"),
    ),
    (
        "hc.attribute",
        "a metric returning a Python float",
        lambda t: hc.attribute(
            two_layer(), clean=game_inputs(two_layer()), corrupt=game_inputs(two_layer()).flip(0), metric=lambda l: 0.5
        ),
        (ValueError, "differentiable"),
    ),
    (
        "hc.attribute",
        "under torch.inference_mode()",
        lambda t: in_inference_mode(lambda: attribution()),
        (RuntimeError, "inference_mode"),
    ),
    ("hc.attribute", "a torch.nn.Linear", lambda t: hc.attribute(torch.nn.Linear(2, 2)), (TypeError, "got Linear")),
    (
        "hc.attribute",
        "memory_budget_mb='a'",
        lambda t: hc.attribute(two_layer(), memory_budget_mb="a"),
        (TypeError, "memory_budget_mb must be a number"),
    ),
    (
        "hc.attribute",
        "memory_budget_mb=nan",
        lambda t: hc.attribute(two_layer(), memory_budget_mb=float("nan")),
        (ValueError, "memory_budget_mb must be finite"),
    ),
    ("AttributionResult.compare", "None", lambda t: attribution().compare(None), (TypeError, "got NoneType")),
    ("AttributionResult.compare", "'abc'", lambda t: attribution().compare("abc"), (TypeError, "got str")),
    (
        "AttributionResult.compare",
        "k=-1",
        lambda t: attribution().compare(attribution().exact, k=-1),
        (ValueError, "k must be >= 1"),
    ),
    (
        "AttributionResult.compare",
        "k=2.5",
        lambda t: attribution().compare(attribution().exact, k=2.5),
        (TypeError, "k must be an int"),
    ),
    (
        "AttributionResult.compare",
        "all-NaN exact values",
        lambda t: attribution().compare(torch.full_like(attribution().values, float("nan"))),
        (ValueError, "NaN or inf"),
    ),
    ("hc.composition", "NaN weights", lambda t: hc.composition(nan_weights()), (ValueError, "non-finite weights")),
    (
        "Batch.from_answers",
        "bools as ids",
        lambda t: hc.Batch.from_answers(torch.zeros(2, 4, dtype=torch.long), [True, False], [0, 1]),
        (TypeError, "booleans"),
    ),
    (
        "Batch.from_answers",
        "answer == wrong on every input",
        lambda t: hc.Batch.from_answers(torch.zeros(2, 4, dtype=torch.long), [1, 2], [1, 2]),
        (ValueError, "every input"),
    ),
    (
        "Batch.from_answers",
        "an answer id past the model's vocabulary, then hc.patch",
        lambda t: hc.patch(
            tiny(),
            clean=hc.Batch.from_answers(torch.zeros(2, 4, dtype=torch.long), [100, 2], [1, 3]),
            corrupt=torch.zeros(2, 4, dtype=torch.long),
        ),
        (ValueError, r"answer ids \[100\] are outside"),
    ),
    (
        "hc.superposed_writes",
        "repeated outputs",
        lambda t: hc.superposed_writes(
            torch.randn(3, 8), torch.randn(3, 8), torch.tensor([1, 2, 1]), outputs=[1, 2, 2]
        ),
        (ValueError, r"outputs repeat \[2\]"),
    ),
    (
        "hc.superposed_writes",
        "an answer id past the outputs",
        lambda t: hc.superposed_writes(torch.randn(3, 8), torch.randn(3, 8), torch.tensor([1, 2, 100])),
        (ValueError, r"answer ids \[100\]"),
    ),
    (
        "hc.contrast",
        "d_vocab_out larger than d_vocab",
        lambda t: hc.patch(
            hc.contrast([[1, 2, 3]], [[1, 4, 3]], [9], [8]).attach(plain_model_out(d_vocab=8, d_vocab_out=12))
        ),
        "ok",
    ),
    (
        "hc.contrast",
        "[], [], [], []",
        lambda t: hc.contrast([], [], [], []),
        (ValueError, "clean must hold at least one"),
    ),
    (
        "Batch.cat",
        "batches of different widths",
        lambda t: hc.Batch.cat([hc.Count01(max_len=6).sample(2, seed=0), hc.Count01(max_len=10).sample(2, seed=0)]),
        (ValueError, "widths"),
    ),
    ("hc.run", "[]", lambda t: hc.run(tiny(), []), (ValueError, r"tokens are empty \(\[\]\)")),
    (
        "hc.probe",
        "string labels",
        lambda t: hc.probe(tiny(), torch.zeros(4, 5, dtype=torch.long), labels=["a", "b", "a", "b"]),
        (TypeError, "got strings such as 'a'"),
    ),
    (
        "hc.set_attention",
        'weights="uniform"',
        lambda t: hc.set_attention(tiny(), head="L0H0", weights="uniform").__enter__(),
        (TypeError, "got 'uniform'"),
    ),
    (
        "hc.qk",
        "a user hook on hook_q",
        lambda t: qk_under_a_hook(),
        (ValueError, "hooks installed at blocks.0.attn.hook_q"),
    ),
    (
        "hc.save",
        "a 256-character name",
        lambda t: hc.save(tiny(), t / ("a" * 256)),
        (ValueError, "255-byte limit on a name"),
    ),
    ("hc.save", "a NUL in the name", lambda t: hc.save(tiny(), str(t) + "/a\x00b"), (ValueError, "NUL character")),
    (
        "hc.patch",
        "a task whose answer id is past the vocabulary",
        lambda t: hc.patch(with_task(hc.contrast([[1, 2, 3]], [[1, 4, 3]], [50], [6]))),
        (ValueError, r"answer ids \[50\] are outside"),
    ),
]


def with_task(task):
    model = tiny()
    model.task = task  # set by hand, past attach()'s check
    return model


CATALOGUE += ROUND_THREE


def plain_model_out(d_vocab, d_vocab_out):
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(n_layers=1, d_model=8, n_ctx=6, d_head=4, n_heads=2, d_vocab=d_vocab,
                                  d_vocab_out=d_vocab_out, attn_only=True, act_fn="relu", seed=0)  # fmt: skip
    return HookedTransformer(cfg)


@pytest.mark.parametrize("surface, case, action, expected", CATALOGUE, ids=[f"{s}: {c}" for s, c, _, _ in CATALOGUE])
def test_catalogue(surface, case, action, expected, tmp_path):
    if expected == "ok":
        action(tmp_path)
        return
    kind, message = expected
    with pytest.raises(kind, match=message):
        action(tmp_path)


def test_the_catalogue_counts():
    """The table's classes, for the closing note: how many cases end in each."""
    counts = {}
    for _, _, _, expected in CATALOGUE:
        key = "ok" if expected == "ok" else expected[0].__name__
        counts[key] = counts.get(key, 0) + 1
    assert sum(counts.values()) == len(CATALOGUE) >= 55, counts


# --- data loss: state checked after the call --------------------------------------------------------------
def test_a_users_files_survive_every_refused_save(tmp_path):
    (tmp_path / "u1").mkdir()
    (tmp_path / "u1" / META).write_text('{"mine": 1}')
    (tmp_path / "u2" / WEIGHTS).mkdir(parents=True)
    (tmp_path / "u2" / WEIGHTS / "keep.txt").write_text("precious")
    for folder in ("u1", "u2"):
        with pytest.raises(ValueError):
            hc.save(tiny(), tmp_path / folder)
    assert (tmp_path / "u1" / META).read_text() == '{"mine": 1}'
    assert (tmp_path / "u2" / WEIGHTS / "keep.txt").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["u1", "u2"]  # no hidden leftovers


def test_load_leaves_a_users_folder_that_matches_the_temporary_pattern(tmp_path):
    path = hc.save(tiny(), tmp_path / "ck", metrics={})
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    mine = tmp_path / f".ck.tmp-{checkpoints._HOST}-{proc.pid}-abc"
    mine.mkdir()
    (mine / "notes.txt").write_text("precious")
    hc.load(path)
    hc.save(tiny(), path, metrics={})
    assert (mine / "notes.txt").read_text() == "precious"


def test_saving_to_a_symlink_writes_nothing(tmp_path):
    path = hc.save(tiny(), tmp_path / "ck", metrics={"v": 1})
    os.symlink(path, tmp_path / "link")
    with pytest.raises(ValueError, match="symbolic link"):
        hc.save(tiny().double(), tmp_path / "link")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "link"]
    assert hc.load(path).checkpoint_meta["metrics"] == {"v": 1}


UNPRIVILEGED = textwrap.dedent(
    """
    import os, sys
    import headcoop as hc
    root = sys.argv[1]
    old, new = (hc.Count01(max_len=6).model(seed=s, n_heads=2, d_model=4) for s in (1, 2))
    ck = os.path.join(root, "ck")
    hc.save(old, ck, metrics={"v": 1})
    os.chmod(ck, 0o555)
    try:
        hc.save(new, ck, metrics={"v": 2})
        print("saved")
    except PermissionError as err:
        print("refused:", err)
    print("after:", hc.load(ck).checkpoint_meta["metrics"]["v"], sorted(os.listdir(root)))
    os.mkdir(os.path.join(root, "ro")); os.chmod(os.path.join(root, "ro"), 0o555)
    try:
        hc.save(new, os.path.join(root, "ro", "x"))
    except PermissionError as err:
        print("parent:", err)
    os.chmod(os.path.join(ck, "headcoop.json"), 0)
    try:
        hc.load(ck)
    except PermissionError as err:
        print("unreadable:", err)
    """
)


@pytest.mark.slow
def test_as_an_unprivileged_user_a_read_only_checkpoint_survives_a_save(tmp_path):
    """As a user without root's override of file permissions (root runs it with those capabilities dropped):
    saving over a read-only checkpoint is refused before anything moves, and the old one loads where it was,
    also after the next load; a read-only parent and an unreadable file are one-line PermissionErrors."""
    script = tmp_path / "unprivileged.py"
    script.write_text(UNPRIVILEGED)
    root = tmp_path / "root"
    root.mkdir()
    prefix = []
    if os.geteuid() == 0:
        assert shutil.which("setpriv"), "setpriv (util-linux) drops root's file-permission override for this test"
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    proc = subprocess.run(
        [*prefix, sys.executable, str(script), str(root)], capture_output=True, text=True, timeout=120
    )
    for folder in (root / "ck", root / "ro"):
        os.chmod(folder, 0o755)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "refused: cannot save to" in out and "is not writable by this user; nothing was written" in out
    assert "after: 1 ['ck']" in out
    assert "parent: cannot save to" in out and "'ro' is not writable" in out.replace(str(root) + "/", "'")
    assert "unreadable:" in out and "permission denied" in out


def test_two_first_saves_into_one_new_folder_leave_one_whole_checkpoint(tmp_path, monkeypatch):
    """The race of two first saves: the second's rename finds the folder the first just made (simulated by
    checking the target before the first save exists); it replaces that checkpoint instead of failing with
    a raw OSError."""
    target = tmp_path / "ck"
    real = checkpoints._replaceable
    seen = []

    def checked_before_the_other_save(path):
        if not seen:
            seen.append(path)
            result = real(path)
            hc.save(tiny(), target, metrics={"v": "other"})  # the other process wins the race
            return result
        return real(path)

    monkeypatch.setattr(checkpoints, "_replaceable", checked_before_the_other_save)
    hc.save(tiny().double(), target, metrics={"v": "mine"})
    assert hc.load(target).checkpoint_meta["metrics"] == {"v": "mine"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck"]


def test_report_never_replaces_a_special_file(tmp_path):
    pipe = fifo(tmp_path)
    with pytest.raises(ValueError, match="special file"):
        hc.report("count01", pipe, progress=False)
    assert os.path.exists(pipe) and not os.path.isfile(pipe)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


def test_report_through_a_link_writes_the_file_and_keeps_the_link(tmp_path):
    (tmp_path / "page.html").write_text("old")
    os.symlink(tmp_path / "page.html", tmp_path / "link.html")
    hc.report(plain_model(), tmp_path / "link.html", task=ids_contrast(), progress=False)
    assert os.path.islink(tmp_path / "link.html") and "<html" in (tmp_path / "page.html").read_text()


# --- silently wrong: the numbers checked -------------------------------------------------------------------
def test_duplicate_clean_prompts_keep_their_own_corrupt_prompts():
    model = attn_only_2l_like(seed=1)
    clean, corrupt = [[1, 2, 3, 4], [1, 2, 3, 4]], [[1, 5, 3, 4], [1, 6, 3, 4]]
    task = hc.contrast(clean, corrupt, [7, 8], [9, 10])
    task.attach(model)
    sampled = task.sample(2)
    paired = task.corrupt(sampled)
    assert paired.tokens.tolist() == corrupt and paired.answer.tolist() == [9, 10]
    given = hc.patch(model, clean=task.clean, corrupt=task.corrupted)
    from_sample = hc.patch(model, clean=sampled, corrupt=paired)
    torch.testing.assert_close(given.values, from_sample.values)


@pytest.mark.slow
def test_a_head_map_caption_counts_what_this_model_shows():
    from headcoop.studies.count01 import map_agreement, report_head_metrics

    model = hc.load("count01")
    text = map_agreement(report_head_metrics(model, model.task))
    assert "does not match the picture" in text and "0 have w02 &gt; 10" in text  # the shipped model: median w02 1.9


def test_multi_panel_figures_share_one_colour_scale():
    model = attn_only_2l_like(seed=2)
    result = path(model)
    fig = result.plot()
    assert {trace.coloraxis for trace in fig.data} == {"coloraxis"}
    bound = max(abs(v) for v in result.to_dataframe().normalized)
    assert fig.layout.coloraxis.cmax == pytest.approx(bound) and fig.layout.coloraxis.cmin == pytest.approx(-bound)
    fig = hc.composition(model).plot()
    assert {trace.coloraxis for trace in fig.data} == {"coloraxis"}


def test_a_results_html_is_its_repr_and_table_without_plotly_js():
    """The figure is shown by plotly's renderer (tests/test_notebook_use.py); the HTML of a result carries no
    plotly.js (before: 3.6 MB inlined into the first display of every process)."""
    model = hc.load("count01")
    page = hc.qk(model, head=0)._repr_html_()
    assert "QKTable(L0H0" in page and "<table" in page and len(page) < 100_000 and "plotly" not in page


def test_without_transformer_lens_headcoop_names_the_install():
    """TransformerLens missing: an ImportError naming the pip command (it was a PackageNotFoundError raised
    inside the ImportError meant to explain the 4.x case)."""
    code = textwrap.dedent(
        """
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "transformer_lens" or name.startswith("transformer_lens."):
                    raise ModuleNotFoundError("No module named 'transformer_lens'", name="transformer_lens")
        sys.meta_path.insert(0, Block())
        import headcoop as hc
        try:
            hc.patch
        except ImportError as err:
            print(err)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "pip install 'transformer-lens>=3.5,<4'" in out.stdout, out.stdout + out.stderr


def test_an_unreadable_checkpoint_is_named_for_an_unprivileged_user(tmp_path, monkeypatch):
    """As an unprivileged user (simulated: this suite runs as root, which no permission stops, so os.access
    answers as for a user without the rights): the folder or a file of it named, with "permission denied"."""
    path = hc.save(tiny(), tmp_path / "ck", metrics={})
    real = os.access
    for locked in (path, path / META, path / "weights.safetensors"):
        monkeypatch.setattr(
            os, "access", lambda p, mode, locked=locked: False if str(p) == str(locked) else real(p, mode)
        )
        with pytest.raises(PermissionError, match="permission denied"):
            hc.load(path)
        monkeypatch.setattr(os, "access", real)
