"""hc.contrast: a task from a user's own prompts, on a model headcoop never trained (attn-only-2l's shape,
a real Hugging Face tokenizer built locally). Every analysis takes its defaults from it and matches its
reference; bad prompts are refused by name."""

import pytest
import torch
from helpers import attn_only_2l_like, name_prompts, tiny_tokenizer
from transformer_lens import patching

import headcoop as hc

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def setup():
    tokenizer = tiny_tokenizer()
    clean, corrupt, answer, wrong, labels = name_prompts()
    task = hc.contrast(clean, corrupt, answer, wrong, labels=labels, vocab=tokenizer)
    model = task.attach(attn_only_2l_like())
    return model, task, tokenizer


def test_prompts_are_encoded_by_the_tokenizer(setup):
    model, task, tokenizer = setup
    clean, corrupt, answer, _, _ = name_prompts()
    assert task.clean.tokens[0].tolist() == tokenizer.encode(clean[0])
    assert task.corrupted.tokens[0].tolist() == tokenizer.encode(corrupt[0])
    assert task.clean.answer[0].item() == tokenizer.convert_tokens_to_ids(answer[0])
    assert task.decode(task.clean.tokens[0]) == clean[0]
    assert (task.clean.answer_pos == 7).all() and torch.equal(
        task.corrupt(task.clean[:3]).tokens, task.corrupted.tokens[:3]
    )


def test_patch_defaults_match_transformer_lens(setup):
    model, task, _ = setup
    result = hc.patch(model, positions="each")
    _, cache = model.run_with_cache(task.clean.tokens)

    def metric(logits):
        return task.metric(logits, task.clean)

    reference = patching.get_act_patch_attn_head_out_by_pos(model, task.corrupted.tokens, cache, metric)
    torch.testing.assert_close(result.values, reference, atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        assert result.clean_value == pytest.approx(float(metric(model(task.clean.tokens))), abs=1e-6)


def test_dla_reads_the_answer_and_sums_to_the_logits(setup):
    model, task, _ = setup
    result = hc.dla(model)
    logits = model(task.clean.tokens)[torch.arange(len(task.clean)), task.clean.answer_pos]
    torch.testing.assert_close(result.total(), logits, atol=1e-4, rtol=0)
    expected = logits.gather(1, task.clean.answer[:, None]) - logits.gather(1, task.clean.wrong[:, None])
    torch.testing.assert_close(result.logit_diff().sum(1), expected[:, 0], atol=1e-4, rtol=0)


def test_mean_ablation_uses_the_clean_prompts(setup):
    model, task, _ = setup
    _, cache = model.run_with_cache(task.clean.tokens)
    mean_z = cache["blocks.0.attn.hook_z"][:, :, 1].mean(0)  # [pos, d_head]
    seen = {}

    def record(z, hook):
        seen["z"] = z[:, :, 1].clone()

    with hc.ablate(model, heads="L0H1", how="mean"):
        model.run_with_hooks(task.clean.tokens, fwd_hooks=[("blocks.0.attn.hook_z", record)])
    torch.testing.assert_close(seen["z"], mean_z.expand_as(seen["z"]), atol=1e-6, rtol=0)


def test_probe_reads_the_labels(setup):
    model, task, _ = setup
    result = hc.probe(model, task.clean, site="z")
    assert len(result.names) == 8 and set(result.classes.tolist()) == {0, 1}


def test_bad_prompts_are_refused(setup):
    model, _, tokenizer = setup
    clean, corrupt, answer, wrong, _ = name_prompts()
    with pytest.raises(ValueError, match="encodes to 2 tokens"):
        hc.contrast(clean, corrupt, "John Mary", wrong, vocab=tokenizer)
    with pytest.raises(ValueError, match="length of its clean prompt"):
        hc.contrast(clean[:1], ["when John and Mary"], answer[:1], wrong[:1], vocab=tokenizer)
    with pytest.raises(ValueError, match="needs vocab="):
        hc.contrast(clean, corrupt, answer, wrong)
    with pytest.raises(ValueError, match="one corrupt prompt per clean one"):
        hc.contrast(clean, corrupt[:2], answer, wrong, vocab=tokenizer)
    narrow = attn_only_2l_like(n_ctx=4)
    with pytest.raises(ValueError, match="n_ctx 4"):
        hc.contrast(clean, corrupt, answer, wrong, vocab=tokenizer).attach(narrow)
    with pytest.raises(TypeError, match="tokenizer .* or a list of token strings"):
        hc.contrast(clean, corrupt, answer, wrong, vocab=42)


def test_ids_and_a_word_list_work_without_a_tokenizer(setup):
    model, _, _ = setup
    from helpers import WORDS

    task = hc.contrast(["when John and Mary gave the cat to"], ["when Mary and John gave the cat to"], "Mary",
                       "John", vocab=WORDS)  # fmt: skip
    ids = hc.contrast(task.clean.tokens, task.corrupted.tokens, task.clean.answer, task.clean.wrong)
    assert torch.equal(ids.clean.tokens, task.clean.tokens) and ids.decode(ids.clean.tokens[0]).startswith("1 11")


def test_a_model_with_a_contrast_is_not_saved_with_it(setup, tmp_path):
    model, _, _ = setup
    with pytest.raises(ValueError, match="not saved with a checkpoint"):
        hc.save(model, tmp_path / "ckpt")


@pytest.mark.slow
def test_headcoop_report_on_an_exported_model_with_a_prompts_file(tmp_path):
    """The command line: a plain TransformerLens export (config.json, model.safetensors, tokenizer.json)
    and a JSON prompts file make a report; a .pt state_dict works too; missing --prompts is one line."""
    import json
    import subprocess
    import sys

    from headcoop.storage.foreign import export, load_model

    model = attn_only_2l_like(seed=3)
    folder = export(model, tmp_path / "exported", tokenizer=tiny_tokenizer())
    loaded = load_model(folder)
    for name, param in model.state_dict().items():
        assert torch.equal(param, loaded.state_dict()[name]), name
    (folder.parent / "pt").mkdir()
    (folder.parent / "pt" / "config.json").write_text((folder / "config.json").read_text())
    torch.save(model.state_dict(), folder.parent / "pt" / "model.pt")
    assert torch.equal(load_model(folder.parent / "pt").W_Q, model.W_Q)

    clean, corrupt, answer, wrong, labels = name_prompts()
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps(dict(clean=clean, corrupt=corrupt, answer=answer, wrong=wrong, labels=labels)))
    out = tmp_path / "report.html"
    done = subprocess.run(
        [sys.executable, "-m", "headcoop.cli", "report", str(folder), "--prompts", str(prompts), "--out", str(out),
         "--examples", "1", "--no-progress"], capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    page = out.read_text(encoding="utf-8")
    assert "hc-sec-patching" in page and f"Contrast({len(clean)} prompts" in page
    bare = subprocess.run([sys.executable, "-m", "headcoop.cli", "report", str(folder), "--out", str(out)],
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    assert bare.returncode == 2 and "pass task=" in bare.stderr and len(bare.stderr.strip().splitlines()) == 1


def test_export_never_overwrites_and_mismatched_weights_are_named(tmp_path):
    from headcoop.storage.foreign import export, load_model

    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "config.json").write_text("my own notes")
    with pytest.raises(ValueError, match="already holds config.json"):
        export(attn_only_2l_like(), folder)
    assert (folder / "config.json").read_text() == "my own notes" and not (folder / "model.safetensors").exists()
    exported = export(attn_only_2l_like(), tmp_path / "exported")
    wider = tmp_path / "wider"
    wider.mkdir()
    (wider / "config.json").write_text((exported / "config.json").read_text().replace('"d_model": 32', '"d_model": 48'))
    (wider / "model.safetensors").write_bytes((exported / "model.safetensors").read_bytes())
    with pytest.raises(ValueError, match="do not match its config"):
        load_model(wider)


def test_labels_must_be_class_ids():
    clean, corrupt, answer, wrong, _ = name_prompts()
    with pytest.raises(ValueError, match="non-negative integer class ids"):
        hc.contrast(clean, corrupt, answer, wrong, labels=[-1] * len(clean), vocab=tiny_tokenizer())


def test_attention_views_label_tokens_by_word_from_the_tokenizer(setup):
    """Issue 51: the report's attention views labelled tokens by id while its prompt table showed words."""
    model, task, tokenizer = setup
    from headcoop.analysis.nodes.attention import attention_data

    views = attention_data(model, task.clean, layer=0, max_examples=1)
    labels = views[0][1]["tokens"]
    ids = task.clean.tokens[0, : len(labels)].tolist()
    assert labels == [tokenizer.decode([i]) for i in ids] and any(not x.isdigit() for x in labels)
    assert task.token_strings(ids) == labels
    bare = hc.contrast(task.clean.tokens, task.corrupted.tokens, task.clean.answer, task.clean.wrong)
    assert bare.token_strings(ids[:2]) == [str(i) for i in ids[:2]]  # no tokenizer, no vocabulary: the ids


def test_an_export_with_its_tokenizer_labels_tokens_by_their_text(tmp_path):
    """Issue 77, item 5: a folder with tokenizer.json gives the model its tokenizer, so QK / OV tables and the
    report's lists show the words, not token ids; a folder without one still shows ids."""
    from helpers import WORDS

    from headcoop.storage.foreign import export, load_model

    model = attn_only_2l_like(seed=3)
    words = load_model(export(model, tmp_path / "with", tokenizer=tiny_tokenizer()))
    frame = hc.ov(words, "L0H1").to_dataframe()
    assert set(WORDS) <= set(map(str, frame.columns)) and set(WORDS) <= set(map(str, frame.index))
    ids = load_model(export(model, tmp_path / "without"))
    assert getattr(ids, "tokenizer", None) is None
    assert "Mary" not in set(map(str, hc.ov(ids, "L0H1").to_dataframe().columns))
