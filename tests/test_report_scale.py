"""The report on a researcher's own model: a time budget that leaves out (and names) what would overrun it,
--heads / --sections / --device, QK and OV top entries for large vocabularies, the task described from its
prompts, one verdict per section, and titles without HTML entities. (benchmarks/report.py measures the
report at GPT-2-small shape: time and size.)"""

import importlib
import re

import pytest
import torch
from helpers import attn_only_2l_like
from transformer_lens import HookedTransformer, HookedTransformerConfig

import headcoop as hc
from headcoop.cli import main

report_module = importlib.import_module("headcoop.reporting.page")
report_budget = importlib.import_module("headcoop.reporting.budget")
report_context = importlib.import_module("headcoop.reporting.context")
report_sections = importlib.import_module("headcoop.reporting.sections")
report_cooperation = importlib.import_module("headcoop.reporting.cooperation")


def _big_vocab_model():
    """Two layers with MLPs and learned positions over 200 tokens: tables too large to draw as heatmaps."""
    cfg = HookedTransformerConfig(n_layers=2, d_model=32, d_head=8, n_heads=3, d_mlp=64, n_ctx=12, d_vocab=200,
                                  act_fn="gelu", normalization_type="LN", positional_embedding_type="standard", seed=0)  # fmt: skip
    return HookedTransformer(cfg).eval()


def _contrast(model, n=8, width=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    clean = torch.randint(0, model.cfg.d_vocab, (n, width), generator=gen)
    corrupt = clean.clone()
    corrupt[:, 2] = (clean[:, 2] + 5) % model.cfg.d_vocab
    return hc.contrast(clean, corrupt, answer=[4] * n, wrong=[7] * n, labels=[0, 1] * (n // 2))


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    model = _big_vocab_model()
    task = _contrast(model)
    path = hc.report(model, out=tmp_path_factory.mktemp("big") / "r.html", task=task, progress=False, budget_s=None)
    return model, task, path.read_text(encoding="utf-8")


def _section(page: str, anchor: str) -> str:
    start = page.index(f"<section id='hc-sec-{anchor}'")
    return page[start : page.index("</section>", start)]


def test_a_task_of_fixed_prompts_is_described_from_its_prompts(big):
    model, task, page = big
    overview, accuracy = _section(page, "overview"), _section(page, "accuracy")
    assert "8 fixed prompts (the same every run), 8 tokens long" in overview
    for column in ("clean prompt", "corrupt prompt", "answer", "alternative"):
        assert column in overview
    assert "A task built from your own inputs" not in page  # hc.contrast's module docstring is not the task
    assert "fresh samples" not in accuracy and "on its 8 fixed prompts" in accuracy
    assert "200 tokens" in overview


def test_large_vocabularies_list_each_heads_top_entries(big):
    model, task, page = big
    circuits = _section(page, "circuits")
    assert "too large to draw (200 tokens, and positions" in circuits
    assert circuits.count("largest |score|") == 6 and circuits.count("largest |effect|") == 6
    assert "hc.ov(model, &#34;L0H0&#34;, positional=False, tokens=ids)" in circuits or "tokens=ids" in circuits
    # the top entry listed for L1H2's OV is the table's largest |effect| over the prompts' tokens
    ids = sorted(set(task.clean.tokens.flatten().tolist()) | set(task.corrupt(task.clean).tokens.flatten().tolist()))
    table = hc.ov(model, "L1H2", positional=False, tokens=ids)
    best = float(table.effects.abs().max())
    block = circuits[circuits.index("<summary>L1H2") :]
    assert f"{best:.3f}" in block.replace("-", "")


def test_figure_titles_hold_no_html_entities(big):
    model, task, page = big
    titles = re.findall(r'"title":\{"text":"([^"]*)"', page)
    assert titles and not [t for t in titles if re.search(r"&[a-z]+;", t)], titles


def test_one_overall_verdict_per_section(big):
    cooperation = _section(big[2], "cooperation")
    assert cooperation.count("The section's verdict") == 1 and "Overall" not in cooperation


def test_the_budget_leaves_out_what_would_overrun_it_and_says_how_to_run_it(tmp_path):
    model = _big_vocab_model()
    task = _contrast(model)
    ctx = report_context.Context(model=model, task=task, source="m", examples=1, clean=task.clean,
                                 corrupt=task.corrupt(task.clean), budget=report_budget.Budget(20.0, 1.0))  # fmt: skip
    # at a predicted 1 s per forward pass, exact patching (2 + 4.5 passes) fits 20 s less the 7 s reserve; AtP* (44) not
    blocks = report_sections.section_patching(ctx)
    left = [row[0] for row in ctx.budget.left_out]
    assert "exact head patching (all positions)" not in left
    assert "head patching one position at a time (AtP* estimates, 40 cells verified)" in left
    text = " ".join(str(getattr(b, "text", "")) for b in blocks)
    assert "Left out to stay within the report's budget" in text and "hc.attribute(model, clean, corrupt" in text
    # no budget: nothing is left out
    free = report_context.Context(model=model, task=task, source="m", examples=1, clean=task.clean,
                                  corrupt=task.corrupt(task.clean))  # fmt: skip
    report_sections.section_patching(free)
    report_cooperation.section_cooperation(free)
    assert free.budget.left_out == []


def test_heads_and_sections_narrow_the_report(tmp_path):
    model = attn_only_2l_like()
    task = _contrast(model)
    path = hc.report(model, out=tmp_path / "r.html", task=task, progress=False, heads=["L0H1", "L1H3"],
                     sections="overview,heads,patching,circuits")  # fmt: skip
    page = path.read_text(encoding="utf-8")
    assert re.findall(r"<section id='hc-sec-([^']+)'", page) == ["overview", "heads", "patching", "circuits"]
    heads = _section(page, "heads")
    assert "L0H1" in heads and "L1H3" in heads and "L0H0" not in heads
    assert "L0H1, L1H3 of 8" in _section(page, "overview")
    circuits = _section(page, "circuits")
    assert "<summary>L0H1" in circuits and "<summary>L1H3" in circuits and "<summary>L0H0" not in circuits
    with pytest.raises(ValueError, match=r"unknown report sections \['nope'\]"):
        hc.report(model, out=tmp_path / "x.html", task=task, progress=False, sections=["nope"])
    with pytest.raises(TypeError, match="sections must be section names"):
        hc.report(model, out=tmp_path / "x.html", task=task, progress=False, sections=3)
    with pytest.raises(ValueError, match="no heads given"):
        hc.report(model, out=tmp_path / "x.html", task=task, progress=False, heads=[])
    with pytest.raises(ValueError, match=r"budget_s must be 0 \(no limit\) or more seconds"):  # as --budget says
        hc.report(model, out=tmp_path / "x.html", task=task, progress=False, budget_s=-1)
    with pytest.raises(ValueError, match="not a torch device"):
        hc.report(model, out=tmp_path / "x.html", task=task, progress=False, device="gpu9")


def test_patch_of_chosen_heads_equals_the_full_sweep_there():
    model = attn_only_2l_like()
    task = _contrast(model)
    clean, corrupt = task.clean, task.corrupt(task.clean)
    metric = lambda logits: logits[:, -1, 4].mean() - logits[:, -1, 7].mean()  # noqa: E731
    full = hc.patch(model, clean=clean, corrupt=corrupt, metric=metric, positions="each")
    some = hc.patch(model, clean=clean, corrupt=corrupt, metric=metric, positions="each", heads=["L0H2", (1, 1)])
    assert torch.equal(some.values[0, :, 2], full.values[0, :, 2]) and torch.equal(
        some.values[1, :, 1], full.values[1, :, 1]
    )
    assert int(some.values.isnan().sum()) == some.values.numel() - 2 * some.values.shape[1]
    with pytest.raises(ValueError, match="heads= or head/layer"):
        hc.patch(model, clean=clean, corrupt=corrupt, metric=metric, heads=["L0H2"], head=1)
    with pytest.raises(ValueError, match="no head axis"):
        hc.patch(model, clean=clean, corrupt=corrupt, metric=metric, heads=["L0H2"], component="resid_pre")


def test_qk_and_ov_of_chosen_tokens_are_those_rows_of_the_whole_table():
    model = _big_vocab_model()
    ids = [5, 17, 3]
    for layer in (0, 1):
        whole, some = hc.ov(model, head=1, layer=layer), hc.ov(model, head=1, layer=layer, tokens=ids)
        torch.testing.assert_close(some.effects, whole.effects[ids], rtol=0, atol=1e-5)
        whole, some = hc.qk(model, head=2, layer=layer), hc.qk(model, head=2, layer=layer, tokens=ids)
        torch.testing.assert_close(some.scores, whole.scores[ids][:, :, ids], rtol=0, atol=1e-4)
        assert some.token_ids == (5, 17, 3) and some.vocab == [whole.vocab[i] for i in ids]
    token_only = hc.qk(model, head=0, layer=0, positional=False, tokens=ids)
    assert "positions left out" in repr(token_only)  # the model adds positions: said, not checked against its cache
    with pytest.raises(ValueError, match=r"token ids \[6\] are not in this table"):
        some.scores_for(torch.tensor([[5, 6]]))
    with pytest.raises(ValueError, match="tokens is empty"):
        hc.ov(model, head=0, layer=0, tokens=[])


def test_the_command_line_takes_heads_sections_and_budget(tmp_path, capsys):
    out = tmp_path / "r.html"
    assert main(["report", "skip-pair", "--out", str(out), "--no-progress", "--heads", "L0H0", "--sections", "overview",
                 "heads", "--budget", "0"]) == 0  # fmt: skip
    page = out.read_text(encoding="utf-8")
    assert re.findall(r"<section id='hc-sec-([^']+)'", page) == ["overview", "heads"] and "no time budget" in page
    assert (
        main(["report", "skip-pair", "--out", str(out), "--no-progress", "--sections", "overview", "--budget", "45"])
        == 0
    )
    page = out.read_text(encoding="utf-8")  # the budget as given, and what went before the report (issue 51: "52 s")
    assert re.search(r"time budget 45 s(, \d+ s of it spent before the report began \(imports, loading\))?\)", page)
    assert main(["report", "skip-pair", "--out", str(out), "--no-progress", "--sections", "nope"]) == 2
    assert "unknown report sections ['nope']" in capsys.readouterr().err
    assert main(["report", "skip-pair", "--out", str(out), "--no-progress", "--budget", "-1"]) == 2
    assert "--budget must be 0 (no limit) or more seconds" in capsys.readouterr().err


def test_a_bridges_positional_table_is_kept_only_while_its_weights_stay(tmp_path):
    """bridge.w_pos runs a forward pass of n_ctx tokens (3 s at GPT-2-small shape), so it is kept per Bridge;
    a changed positional weight, or a hook, computes it again."""
    import warnings

    import transformers

    from headcoop.models.bridge import load_folder, w_pos

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=8,
                                                             vocab_size=50)).save_pretrained(tmp_path / "g")  # fmt: skip
    bridge = load_folder(tmp_path / "g")
    first = w_pos(bridge)
    assert w_pos(bridge) is first  # kept
    weight = next(bridge.pos_embed.parameters())
    with torch.no_grad():
        weight.add_(1.0)
    changed = w_pos(bridge)
    assert changed is not first and torch.allclose(changed, first + 1.0, atol=1e-6)
    bridge.add_hook("hook_pos_embed", lambda act, hook: act * 2)
    try:
        torch.testing.assert_close(w_pos(bridge), 2 * changed)
    finally:
        bridge.reset_hooks()
    torch.testing.assert_close(w_pos(bridge), changed)


def test_too_many_heads_for_cooperation_get_the_pair_map_when_it_fits(tmp_path):
    """Issue 62, item 3: above the pairs hc.cooperation's words cover, the section shows the pair map of every
    head (heatmap, its first lines, the strongest pairs) when its predicted cost fits, and says which it used."""
    cfg = HookedTransformerConfig(n_layers=3, d_model=24, d_head=2, n_heads=12, n_ctx=12, d_vocab=80, act_fn="relu",
                                  attn_only=True, normalization_type="LN", positional_embedding_type="standard", seed=1)  # fmt: skip
    model = HookedTransformer(cfg).eval()
    task = _contrast(model)
    path = hc.report(model, out=tmp_path / "r.html", task=task, progress=False, budget_s=None, sections=["cooperation"])
    cooperation = _section(path.read_text(encoding="utf-8"), "cooperation")
    assert "The pair map" in cooperation and "every one of the 630 pairs" in cooperation
    assert "PairMap(36 heads, 630 pairs" in cooperation and "misses: none possible" in cooperation
    assert "Standing in" not in cooperation and "plotly" in cooperation


def test_too_many_heads_for_cooperation_get_the_top_heads_by_patching_as_a_stand_in(tmp_path, monkeypatch):
    """Issue 51, item 2: above the pairs a page holds, and where the pair map does not fit (here: as if it
    never fits), cooperation runs on the STAND_IN_HEADS heads with the largest patching effect (the patching
    section's), named, with the call that reruns it; QK / OV tables list the heads in that order."""
    cfg = HookedTransformerConfig(n_layers=3, d_model=24, d_head=2, n_heads=12, n_ctx=12, d_vocab=80, act_fn="relu",
                                  attn_only=True, normalization_type="LN", positional_embedding_type="standard", seed=1)  # fmt: skip
    model = HookedTransformer(cfg).eval()
    task = _contrast(model)
    monkeypatch.setattr(report_cooperation, "_pair_map_blocks", lambda ctx, why=None: None)
    path = hc.report(model, out=tmp_path / "r.html", task=task, progress=False, budget_s=None,
                     sections=["patching", "cooperation", "circuits"])  # fmt: skip
    text = path.read_text(encoding="utf-8")
    page = {anchor: _section(text, anchor) for anchor in ("cooperation", "circuits")}
    clean, corrupt = task.patching_inputs()
    exact = hc.patch(model, clean=clean, corrupt=corrupt, metric=report_context.task_score(task, clean), progress=False)
    size = (exact.to_dataframe().set_index(["layer", "head"])["value"] - exact.corrupt_value).abs()
    top = [
        f"L{lay}H{h}"
        for lay, h in size.sort_values(ascending=False, kind="stable").index[: report_cooperation.STAND_IN_HEADS]
    ]
    cooperation = page["cooperation"]
    assert "too many pairs for hc.cooperation" in cooperation and "Standing in" in cooperation
    assert f"heads={top!r}" in cooperation.replace("&#39;", "'")
    assert "section&#39;s verdict" in cooperation or "section's verdict" in cooperation
    circuits = page["circuits"]
    assert "in order of their effect by exact patching" in circuits
    assert circuits.index(f"<summary>{top[0]}") < circuits.index(f"<summary>{top[1]}")


def test_where_the_pair_words_cannot_see_the_section_shows_the_map_on_the_logit_difference(tmp_path):
    """Issue 74, item 4: on the shipped Count01 model no pair changes an answer (a margin of about 18 logits), so
    the words are undetermined on most pairs; the section then shows the pair map on the logit difference, saying
    why, beside the words."""
    path = hc.report(hc.load("count01"), out=tmp_path / "r.html", progress=False, budget_s=None,
                     sections=["cooperation"])  # fmt: skip
    cooperation = _section(path.read_text(encoding="utf-8"), "cooperation")
    assert "Mechanism of each pair of heads" in cooperation  # the words stay
    assert "The pair map" in cooperation and "cannot name" in cooperation and "logit difference" in cooperation
    assert "PairMap(16 heads, 120 pairs, logit_diff" in cooperation
