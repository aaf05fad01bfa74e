"""Model-steps per second: hc.train_many on K primary Count01 models vs the plain loop.

The baseline is headcoop.training.loop.train on one model (HookedTransformer forward + task.loss,
batch 256); both run in this process after a warm-up. Also prints the share of a
train_many step spent sampling, and the equivalence checks of the losses.

    python benchmarks/training.py [--models 8] [--steps 200] [--baseline-steps 30] [--device cpu] [--threads 1]
    python benchmarks/training.py --device cuda --scan [--scan-max 8192] [--scan-steps 20]

--scan doubles the number of models trained at once (1, 2, 4, ...) and prints model-steps/s for each, up
to --scan-max or the first out-of-memory error: how many primary Count01 models one device trains at once,
and at what rate.
"""

from __future__ import annotations

import argparse
import time

import torch

import headcoop as hc
from headcoop.models.fused import fused_logits, stack_parameters
from headcoop.training.fast import sample_streams, train_many
from headcoop.training.loop import step_seed, train


def timed(fn, device: str) -> float:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=int, default=8)
    parser.add_argument("--steps", type=int, default=200, help="train_many steps timed")
    parser.add_argument("--baseline-steps", type=int, default=30, help="plain-loop steps timed")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: leave as is)")
    parser.add_argument("--scan", action="store_true", help="model-steps/s for 1, 2, 4, ... models at once")
    parser.add_argument("--scan-max", type=int, default=8192)
    parser.add_argument("--scan-steps", type=int, default=20)
    args = parser.parse_args()
    if args.scan:
        return scan(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    task, K, B, dev = hc.Count01(), args.models, args.batch_size, args.device
    seeds = list(range(K))
    make = lambda seed: task.model(seed=seed, device=dev)  # noqa: E731  primary size: L1, d32, 16 heads, dh2
    print(f"device {dev}, torch threads {torch.get_num_threads()}, {K} Count01 models "
          f"(1 layer, d_model 32, 16 heads, d_head 2), batch {B}")  # fmt: skip

    # warm-up
    train_many(task, [make(s) for s in seeds], steps=5, batch_size=B, seeds=seeds, progress=False)
    train(task, make(0), steps=5, batch_size=B, progress=False)

    t_many = timed(
        lambda: train_many(task, [make(s) for s in seeds], steps=args.steps, batch_size=B, seeds=seeds, progress=False),
        dev,
    )
    slow = make(0)
    t_loop = timed(lambda: train(task, slow, steps=args.baseline_steps, batch_size=B, seed=0, progress=False), dev)
    t_sample = timed(
        lambda: [sample_streams(task, B, [step_seed(s, i) for s in seeds]).to(dev) for i in range(args.steps)], dev
    )
    fast_rate, slow_rate = K * args.steps / t_many, args.baseline_steps / t_loop
    print(f"train_many : {fast_rate:9.1f} model-steps/s  ({t_many / args.steps * 1e3:.2f} ms per step of {K} models)")
    print(f"plain loop : {slow_rate:9.1f} model-steps/s  ({t_loop / args.baseline_steps * 1e3:.2f} ms per step)")
    print(f"ratio      : {fast_rate / slow_rate:9.1f}x")
    print(f"sampling   : {t_sample / args.steps * 1e3:.2f} ms per step for {K} streams = "
          f"{100 * t_sample / t_many:.1f}% of a train_many step")  # fmt: skip

    # equivalence 1: the fused loss of trained models equals HookedTransformer.forward + task.loss
    models = train_many(task, [make(s) for s in seeds], steps=20, batch_size=B, seeds=seeds, progress=False)
    data = sample_streams(task, B, [10_000 + s for s in seeds]).to(dev)
    fused = task.row_loss(fused_logits(stack_parameters(models), models[0].cfg, data.tokens, data.loss_pos), data)
    with torch.no_grad():
        ref = [task.loss(m(b.tokens), b).item() for m, b in
               zip(models, (task.sample(B, seed=10_000 + s).to(dev) for s in seeds))]  # fmt: skip
    print(f"check      : fused loss vs HookedTransformer + task.loss, max |diff| over {K} models "
          f"= {(fused.detach().cpu() - torch.tensor(ref)).abs().max().item():.2e}")  # fmt: skip

    # equivalence 2: same optimisation as hc.train (b_K aside: its gradient is exactly zero)
    n = args.baseline_steps
    (mine,) = train_many(task, [make(0)], steps=n, batch_size=B, seeds=[0], progress=False)
    batch = task.sample(B, seed=12_345).to(dev)
    with torch.no_grad():
        gap = abs(task.loss(mine(batch.tokens), batch).item() - task.loss(slow(batch.tokens), batch).item())
    theirs = dict(slow.named_parameters())
    worst = max((p - theirs[k]).abs().max().item() for k, p in mine.named_parameters() if not k.endswith("b_K"))
    print(f"check      : after {n} steps from seed 0, train_many vs hc.train: loss |diff| = {gap:.2e}, "
          f"max weight |diff| (b_K aside) = {worst:.2e}")  # fmt: skip


def scan(args) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    task, dev = hc.Count01(), args.device
    print(f"device {dev} ({torch.cuda.get_device_name(dev) if dev.startswith('cuda') else 'CPU'}), torch threads "
          f"{torch.get_num_threads()}, primary Count01 models, batch {args.batch_size}, {args.scan_steps} steps timed")  # fmt: skip
    k, best = 1, (0.0, 0)
    while k <= args.scan_max:
        seeds = list(range(k))
        try:
            models = [task.model(seed=s) for s in seeds]
            train_many(task, models, steps=2, batch_size=args.batch_size, seeds=seeds, progress=False, device=dev)
            t = timed(lambda: train_many(task, models, steps=args.scan_steps, batch_size=args.batch_size, seeds=seeds,
                                         progress=False), dev)  # fmt: skip
        except torch.cuda.OutOfMemoryError:
            print(f"{k:6d} models: out of memory")
            break
        rate = k * args.scan_steps / t
        best = max(best, (rate, k))
        print(f"{k:6d} models: {rate:10.1f} model-steps/s ({t / args.scan_steps * 1e3:.1f} ms per step)", flush=True)
        del models
        if dev.startswith("cuda"):
            torch.cuda.empty_cache()
        k *= 2
    print(f"best: {best[0]:.1f} model-steps/s with {best[1]} models at once")


if __name__ == "__main__":
    main()
