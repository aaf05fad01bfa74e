"""On a CUDA device, where there is one (skipped cleanly otherwise): training, sweeps and patching run on
the GPU the model or `device=` names, and agree with their references there."""

import pytest
import torch
from transformer_lens import patching

import headcoop as hc

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")


def test_train_many_and_sweep_on_cuda(tmp_path):
    task = hc.Count01(max_len=6)
    items = [dict(n_heads=2, d_model=8, d_head=2), dict(n_heads=4, d_model=8, d_head=2)]
    on_gpu = hc.train_many(task, items, seeds=[0, 1], steps=60, batch_size=32, progress=False, device="cuda")
    assert all(next(m.parameters()).device.type == "cuda" for m in on_gpu)
    on_cpu = hc.train_many(task, items, seeds=[0, 1], steps=60, batch_size=32, progress=False)
    for gpu, cpu in zip(on_gpu, on_cpu):  # the same seeds and data; kernels differ in the last bits
        for (name, a), b in zip(gpu.state_dict().items(), cpu.state_dict().values()):
            torch.testing.assert_close(a.cpu(), b, atol=2e-3, rtol=2e-3, msg=name)
    table = hc.sweep(task, {"n_heads": [2], "d_model": [8], "d_head": [2]}, [0], tmp_path, steps=30,
                     batch_size=32, progress=False, device="cuda")  # fmt: skip
    loaded = hc.load(tmp_path / table["name"][0], device="cuda")
    assert next(loaded.parameters()).device.type == "cuda"


def test_patch_and_dla_on_cuda_match_their_references():
    model = hc.load("count01", device="cuda")
    clean, corrupt = model.task.patching_inputs(n=32)
    result = hc.patch(model, clean=clean, corrupt=corrupt, positions="each")
    rows = torch.arange(len(clean.tokens), device="cuda")

    def metric(logits):
        at = logits[rows, clean.answer_pos.cuda()]
        return (at[rows, clean.answer.cuda()] - at[rows, clean.wrong.cuda()]).mean()

    _, cache = model.run_with_cache(clean.tokens.cuda())
    theirs = patching.get_act_patch_attn_head_out_by_pos(model, corrupt.tokens.cuda(), cache, metric).cpu()
    torch.testing.assert_close(result.values, theirs, atol=1e-4, rtol=1e-4)
    dla = hc.dla(model, clean)
    with torch.no_grad():
        logits = model(clean.tokens.cuda())[rows, clean.answer_pos.cuda()]
    assert float((dla.total().to(logits.device) - logits).abs().max()) < 1e-3
