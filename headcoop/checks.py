"""Argument checks shared by every layer: each error names the argument and the bad value.

Python's own coercions hide mistakes (`bool("no")` is True, `int(20.7)` is 20), so nothing here
coerces: a value of the wrong type is a TypeError, one out of range a ValueError.
"""

from __future__ import annotations

import errno
import functools
import math
import numbers
import os
from pathlib import Path

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from headcoop.paths import check_out_file, check_out_folder  # noqa: F401  (torch-free: the CLI checks --out first)

MAX_SEED = 2**63 - 1


def check_int(name: str, value, low: int | None = None, high: int | None = None) -> int:
    """`value` as an int when it is an integer (not a bool, not a float) within [low, high]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    value = int(value)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f">= {low}" if high is None else (f"<= {high}" if low is None else f"in {low}..{high}")
        raise ValueError(f"{name} must be {bounds}, got {value!r}")
    return value


def check_seed(value, name: str = "seed") -> int:
    """A seed: an int in 0..2**63 - 1 (what torch.Generator.manual_seed accepts without wrapping)."""
    return check_int(name, value, 0, MAX_SEED)


def check_bool(name: str, value) -> bool:
    """`value` when it is a bool (or numpy bool); strings such as "no" or "false" are refused."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return bool(value)


def check_float(
    name: str,
    value,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
) -> float:
    """`value` as a finite float (ints accepted, bools and strings refused) within [low, high];
    `low_open` excludes `low` itself."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if low is not None and (value < low or (low_open and value == low)):
        raise ValueError(f"{name} must be {'>' if low_open else '>='} {low}, got {value!r}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be <= {high}, got {value!r}")
    return value


MAX_STEPS = 1000  # integrated gradients' interpolation steps: beyond this the integral does not move, the time does


def check_steps(value) -> int:
    """The interpolation steps of an integrated-gradients estimate (`hc.attribute`'s "ig", `hc.edges`'
    "eap-ig"): an int in 1..MAX_STEPS, each step one forward and one backward pass."""
    return check_int("steps", value, 1, MAX_STEPS)


@functools.cache  # asked by every chunk size the engine computes: the machine does not change during a process
def machine_memory_mb() -> float:
    """The most memory an analysis here can use, in MB: this machine's RAM, or the largest CUDA device's
    memory where that is more (a budget above it cannot be honoured)."""
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    except (ValueError, OSError, AttributeError):  # not POSIX: a bound that keeps the arithmetic finite
        ram = 2.0**40
    devices = [torch.cuda.get_device_properties(i).total_memory / 2**20 for i in range(torch.cuda.device_count())] \
        if torch.cuda.is_available() else []  # fmt: skip
    return float(max([ram, *devices]))


def check_memory_budget(value, name: str = "memory_budget_mb") -> float:
    """A memory budget in MB: a finite number above 0 (TypeError / ValueError naming it otherwise), clamped
    to what the machine has (`machine_memory_mb`) with a warning that says so. Every analysis's budget goes
    through here (the engine's chunk sizes too), so none reaches the arithmetic as inf or NaN."""
    value = check_float(name, value, 0, low_open=True)
    ceiling = machine_memory_mb()
    if value > ceiling:
        import warnings

        warnings.warn(f"{name}={value:g} is more than this machine has ({ceiling:,.0f} MB); using {ceiling:,.0f} MB",
                      stacklevel=3)  # fmt: skip
        return ceiling
    return value


def check_time_budget(name: str, value) -> float | None:
    """A time budget in seconds, with one meaning in the API and on the command line (`--budget`): None or 0
    is no limit, else a finite number of seconds above 0; ValueError naming a bad one."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"{name} must be a number of seconds (0 or None: no limit), got {value!r} ({type(value).__name__})"
        )
    if not math.isfinite(float(value)) or value < 0:
        raise ValueError(f"{name} must be 0 (no limit) or more seconds (a finite number), got {value!r}")
    return None if value == 0 else float(value)


def check_device(device) -> str | None:
    """`device` as a string torch understands ("cpu", "cuda:0", ...), or None; ValueError naming a bad one."""
    if device is None:
        return None
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a str such as 'cpu' or 'cuda', got {device!r} ({type(device).__name__})")
    try:
        return str(torch.device(device))
    except RuntimeError:
        raise ValueError(f"unknown device {device!r}; use 'cpu', 'cuda', 'cuda:1', 'mps', ...") from None


def check_choice(name: str, value: str, valid) -> str:
    """`value` itself, or ValueError listing the valid names."""
    if value not in valid:
        raise ValueError(f"unknown {name} {value!r}; valid values are {list(valid)}")
    return value


def usable_device(device) -> str | None:
    """`check_device`, and a device this machine has: RuntimeError for CUDA (or MPS) where torch finds
    none, so nothing falls back to the CPU silently."""
    device = check_device(device)
    if device is None:
        return None
    kind = torch.device(device)
    if kind.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"device {device!r}: torch finds no CUDA device on this machine "
                               f"(torch {torch.__version__}, built for CUDA {torch.version.cuda}); pass device='cpu'")  # fmt: skip
        if kind.index is not None and kind.index >= torch.cuda.device_count():
            raise RuntimeError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if kind.type == "mps" and not torch.backends.mps.is_available():
        raise RuntimeError(f"device {device!r}: MPS is not available on this machine; pass device='cpu'")
    return device


def nonfinite_parameters(model: nn.Module) -> list[str]:
    """Names of the parameters of `model` holding NaN or inf. Each parameter is summed first (one read, no
    mask written: NaN and inf propagate through a sum, so a finite sum proves a finite parameter); only a
    parameter whose sum is not finite (NaN, inf, or a sum that overflowed) is scanned element by element.
    About 0.07 forward-pass equivalents on the GPT-2-small shape against 1.6 for the element scan alone."""
    params = [(name, p.detach()) for name, p in model.named_parameters() if p.is_floating_point() and not p.is_meta]
    if not params:
        return []
    with torch.no_grad():
        sums = torch.stack([p.sum().to(device="cpu", dtype=torch.float32) for _, p in params])
    suspects = (~torch.isfinite(sums)).nonzero().flatten().tolist()
    return [params[i][0] for i in suspects if not bool(torch.isfinite(params[i][1]).all())]


def check_finite(model: nn.Module, what: str) -> None:
    """ValueError naming the parameters that hold NaN or inf.

    TransformerLens turns a NaN attention pattern into zeros, so a NaN head would otherwise be
    silently switched off and every measurement on the model would look plausible.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"{what} needs a HookedTransformer, got {type(model).__name__}")
    bad = nonfinite_parameters(model)
    if bad:
        raise ValueError(
            f"{what} refuses a model with non-finite weights: {', '.join(bad)} hold NaN or inf "
            "(a NaN head is silently switched off by TransformerLens)"
        )


def check_metric_value(value, what: str = "the metric") -> torch.Tensor:
    """A metric's return value as a 0-dim tensor; TypeError/ValueError for anything else
    (None, a string, a vector)."""
    if isinstance(value, bool) or value is None or isinstance(value, (str, bytes)):
        raise TypeError(f"{what} must return a scalar (a 0-dim tensor or a number), got {value!r}")
    if isinstance(value, numbers.Real):
        return torch.tensor(float(value))
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{what} must return a scalar (a 0-dim tensor or a number), got {type(value).__name__}")
    if value.numel() != 1:
        raise ValueError(
            f"{what} must return a scalar, got a tensor of shape {tuple(value.shape)}; reduce it (e.g. .mean())"
        )
    if value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"{what} must return a real scalar, got dtype {value.dtype}")
    return value.reshape(())


def installed_hooks(model: nn.Module) -> list[str]:
    """Where forward or backward hooks sit on `model` or its modules (TransformerLens hook points included),
    and the global module hooks of torch.nn, by name."""
    found = [name or "<model>" for name, module in model.named_modules() if has_hooks(module)]
    return found + global_hooks()


def has_hooks(module: nn.Module) -> bool:
    """Whether a forward or backward hook sits on `module` itself."""
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or getattr(module, "_backward_pre_hooks", None))  # fmt: skip


def global_hooks() -> list[str]:
    """The global module hooks of torch.nn that are set, by name."""
    glob = nn.modules.module
    attrs = (
        "_global_forward_hooks",
        "_global_forward_pre_hooks",
        "_global_backward_hooks",
        "_global_backward_pre_hooks",
    )
    return [f"torch.nn global {attr.strip('_')}" for attr in attrs if getattr(glob, attr, None)]


def weight_shapes(file: Path) -> dict[str, tuple[int, ...]]:
    """Parameter name -> shape from a safetensors file's header, reading no tensor; ValueError for a
    damaged file, PermissionError for one this user cannot read."""
    try:
        with safe_open(str(file), framework="pt") as f:
            return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    except PermissionError:
        raise PermissionError(errno.EACCES, f"cannot read {str(file)!r}: permission denied") from None
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"damaged weights file {file}: it is not a safetensors file ({err})") from None
