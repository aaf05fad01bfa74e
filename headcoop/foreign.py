"""Models and prompts from outside headcoop, for `headcoop report FOLDER --prompts FILE`.

A model folder is a headcoop checkpoint (`hc.save(model, folder)` saves any HookedTransformer: config and
weights with a checksum) or a plain TransformerLens export, as `export` writes it:

    config.json         the HookedTransformerConfig's fields (`cfg.to_dict()`, dtype as a string, no device)
    model.safetensors   the state_dict (`safetensors.torch.save_file(model.state_dict(), ...)`), or
    model.pt            the state_dict saved by `torch.save` (read with `weights_only=True`)
    tokenizer.json      optional: a Hugging Face `tokenizers` file that encodes text prompts

A prompts file is JSON, one list per field, one entry per prompt:

    {"clean": ["when John and Mary gave the cat to", ...], "corrupt": ["when Mary and John gave ...", ...],
     "answer": ["Mary", ...], "wrong": ["John", ...], "labels": [0, ...]}

with texts (encoded by the tokenizer) or lists of token ids; "labels" is optional. It becomes a
`hc.contrast` task (`headcoop.tasks.contrast`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformer_lens import HookedTransformer, HookedTransformerConfig

from headcoop.checkpoints import _DTYPES, META, config_to_dict
from headcoop.checks import check_out_folder
from headcoop.tasks.base import build_model
from headcoop.tasks.contrast import Contrast

CONFIG, SAFETENSORS, PICKLE, TOKENIZER = "config.json", "model.safetensors", "model.pt", "tokenizer.json"


def export(model: HookedTransformer, folder: str | os.PathLike, tokenizer=None) -> Path:
    """Write `model` as a plain TransformerLens export (config.json, model.safetensors and, for a Hugging
    Face fast tokenizer, tokenizer.json) into `folder` (created); returns the folder. ValueError, before
    anything is written, when any of those files already exists there (nothing is overwritten)."""
    folder = check_out_folder(folder, "export")
    names = [CONFIG, SAFETENSORS] + ([TOKENIZER] if tokenizer is not None else [])
    taken = [name for name in names if (folder / name).exists()]
    if taken:
        raise ValueError(f"export: {str(folder)!r} already holds {', '.join(taken)}; choose a new folder")
    folder.mkdir(parents=True, exist_ok=True)
    config = dict(config_to_dict(model.cfg), dtype=str(model.cfg.dtype).removeprefix("torch."))
    (folder / CONFIG).write_text(json.dumps(config, indent=1), encoding="utf-8")
    save_file({k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}, str(folder / SAFETENSORS))
    if tokenizer is not None:
        tokenizer.backend_tokenizer.save(str(folder / TOKENIZER))
    return folder


def load_model(folder: str | os.PathLike) -> HookedTransformer:
    """A headcoop checkpoint (`hc.load`) or a plain export (module docstring) from `folder`."""
    folder = Path(folder)
    if (folder / META).is_file():
        from headcoop.checkpoints import load

        return load(folder)
    if not (folder / CONFIG).is_file():
        raise FileNotFoundError(
            f"{str(folder)!r} holds neither a headcoop checkpoint ({META}) nor a TransformerLens export ({CONFIG} "
            f"with {SAFETENSORS} or {PICKLE})"
        )
    try:
        config = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
        dtype = _DTYPES[config.pop("dtype", "float32")]
        config.pop("device", None)
        cfg = HookedTransformerConfig(**config, dtype=dtype)
    except (ValueError, TypeError, KeyError, AssertionError) as err:
        raise ValueError(f"{folder / CONFIG} is not a HookedTransformerConfig: {err}") from None
    if (folder / SAFETENSORS).is_file():
        state = load_file(str(folder / SAFETENSORS))
    elif (folder / PICKLE).is_file():
        state = torch.load(folder / PICKLE, map_location="cpu", weights_only=True)
    else:
        raise FileNotFoundError(f"{folder} has {CONFIG} but no weights ({SAFETENSORS} or {PICKLE})")
    model = build_model(cfg, seed=0)
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as err:  # shapes that do not fit the config
        raise ValueError(f"the weights in {folder} do not match its config: {str(err).splitlines()[-1].strip()}") from None
    missing = [k for k in missing if k in dict(model.named_parameters())]  # buffers are rebuilt from the config
    if missing or unexpected:
        raise ValueError(f"the weights in {folder} do not match its config: missing {missing}, unexpected {unexpected}")
    return model.eval()


def word_tokenizer(words: list[str], pad: str | None = None):
    """A Hugging Face fast tokenizer that splits on whitespace and maps each word to its index in `words`
    (built locally: nothing is downloaded). `pad` (default: the first word) pads and stands for unknowns."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    pad = words[0] if pad is None else pad
    core = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token=pad))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token=pad)


def load_tokenizer(path: str | os.PathLike):
    """A Hugging Face fast tokenizer from a tokenizer.json file."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(path))


def read_prompts(path: str | os.PathLike, tokenizer=None) -> Contrast:
    """The contrast task of a prompts file (module docstring); texts need `tokenizer`."""
    path = Path(path)
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read the prompts file {path}: {err}") from None
    missing = [k for k in ("clean", "corrupt", "answer", "wrong") if k not in spec]
    if not isinstance(spec, dict) or missing:
        raise ValueError(f"the prompts file {path} needs the lists clean, corrupt, answer and wrong; missing {missing}")
    unknown = sorted(set(spec) - {"clean", "corrupt", "answer", "wrong", "labels"})
    if unknown:
        raise ValueError(f"the prompts file {path} has unknown fields {unknown}")
    return Contrast(spec["clean"], spec["corrupt"], spec["answer"], spec["wrong"], labels=spec.get("labels"),
                    vocab=tokenizer)  # fmt: skip
