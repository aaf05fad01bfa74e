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
import pickle
import reprlib
from collections import Counter
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from headcoop.checks import check_out_folder
from headcoop.models.tl import HookedTransformer, HookedTransformerConfig
from headcoop.storage.checkpoints import DTYPES, META, check_config_fields, check_config_shapes, config_to_dict
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
    """A headcoop checkpoint (`hc.load`) or a plain export (module docstring) from `folder`, with the folder's
    tokenizer.json as `model.tokenizer` where it has one (ValueError naming a damaged one)."""
    folder = Path(folder)
    if (folder / META).is_file():
        from headcoop.storage.checkpoints import load

        return load(folder)
    if not (folder / CONFIG).is_file():
        raise FileNotFoundError(
            f"{str(folder)!r} holds neither a headcoop checkpoint ({META}) nor a TransformerLens export ({CONFIG} "
            f"with {SAFETENSORS} or {PICKLE})"
        )
    try:
        config = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read {folder / CONFIG} as JSON: {err}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{folder / CONFIG} must hold a JSON object of HookedTransformerConfig fields, got "
                         f"{type(config).__name__}")  # fmt: skip
    dtype_name = config.pop("dtype", "float32")
    if dtype_name not in DTYPES:
        raise ValueError(f"{folder / CONFIG}: dtype {dtype_name!r} is not one of {sorted(DTYPES)}")
    config.pop("device", None)
    check_config_fields(config, str(folder / CONFIG))
    state = _read_state(folder)
    check_config_shapes(config, {k: tuple(v.shape) for k, v in state.items()}, f"the export in {str(folder)!r}")
    try:
        cfg = HookedTransformerConfig(**config, dtype=DTYPES[dtype_name])
    except (ValueError, TypeError, KeyError, AssertionError) as err:
        raise ValueError(f"{folder / CONFIG} is not a HookedTransformerConfig: {err}") from None
    not_float = {k: str(v.dtype).removeprefix("torch.") for k, v in state.items() if not v.is_floating_point()
                 and not k.endswith(("mask", "IGNORE"))}  # fmt: skip
    if not_float:
        shown = ", ".join(f"{k} ({d})" for k, d in list(not_float.items())[:4])
        raise ValueError(f"the weights in {folder} are not floating point: {shown}; headcoop does not load quantized "
                         "weights (casting them to float would silently change the model): export the float model")  # fmt: skip
    model = build_model(cfg, seed=0)
    params = dict(model.named_parameters())
    mixed = [k for k, v in state.items() if k in params and v.dtype != cfg.dtype]
    if mixed:
        raise ValueError(f"the weights in {folder} are not all {dtype_name} as {CONFIG} says: {mixed[:4]} are "
                         f"{state[mixed[0]].dtype}; set \"dtype\" in {CONFIG} to the weights' dtype")  # fmt: skip
    try:
        missing, unexpected = model.load_state_dict(state, strict=False)
    except RuntimeError as err:  # shapes that do not fit the config
        raise ValueError(
            f"the weights in {folder} do not match its config: {str(err).splitlines()[-1].strip()}"
        ) from None
    missing = [k for k in missing if k in dict(model.named_parameters())]  # buffers are rebuilt from the config
    if missing or unexpected:
        raise ValueError(f"the weights in {folder} do not match its config: missing {missing}, unexpected {unexpected}")
    if (folder / TOKENIZER).is_file():  # the folder's tokenizer: analyses label tokens by their text, not ids
        model.tokenizer = load_tokenizer(folder / TOKENIZER)  # assigned: set_tokenizer would reload it from a hub
    return model.eval()


def _read_state(folder: Path) -> dict[str, torch.Tensor]:
    """The state dict of an export: model.safetensors, else model.pt read with `weights_only=True`;
    ValueError naming the file when it is damaged or holds pickled objects beyond tensors."""
    if (folder / SAFETENSORS).is_file():
        try:
            return load_file(str(folder / SAFETENSORS))
        except (SafetensorError, OSError, ValueError) as err:
            raise ValueError(f"{folder / SAFETENSORS} is not a readable safetensors file (truncated or damaged?): "
                             f"{err}") from None  # fmt: skip
    if (folder / PICKLE).is_file():
        try:
            state = torch.load(folder / PICKLE, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError:
            raise ValueError(f"{folder / PICKLE} holds Python objects beyond tensors; headcoop reads .pt files with "
                             "weights_only=True and runs no pickled code: save the plain state_dict, or "
                             f"{SAFETENSORS}") from None  # fmt: skip
        except (RuntimeError, OSError, EOFError, ValueError) as err:
            raise ValueError(f"{folder / PICKLE} is not a readable torch file (truncated or damaged?): {err}") from None
        if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                                  for k, v in state.items()):  # fmt: skip
            raise ValueError(f"{folder / PICKLE} must hold a state_dict (parameter name -> tensor), got "
                             f"{type(state).__name__}")  # fmt: skip
        return state
    raise FileNotFoundError(f"{folder} has {CONFIG} but no weights ({SAFETENSORS} or {PICKLE})")


def word_tokenizer(words: list[str], pad: str | None = None):
    """A Hugging Face fast tokenizer that splits on whitespace only ("[BOS] 0 1" is three words) and maps each
    word to its index in `words` (built locally: nothing is downloaded). `pad` (default: the first word) is
    the padding token. A word not in `words` is an error when encoded, never a stand-in id: the tokenizer
    has no unknown token."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if isinstance(words, str) or not isinstance(words, (list, tuple)) or not all(isinstance(w, str) for w in words):
        raise TypeError(f"words must be a list of token strings, got {reprlib.repr(words)}")
    if not words:
        raise ValueError("words is empty; give the model's tokens, one string per id")
    twice = sorted(w for w, k in Counter(words).items() if k > 1)
    spaced = [w for w in words if not w or len(w.split()) != 1 or w != w.strip()]
    if twice or spaced:
        raise ValueError(
            f"words must be distinct and hold no whitespace: repeated {twice[:5]}, with spaces {spaced[:5]}"
        )
    pad = words[0] if pad is None else pad
    if pad not in words:
        raise ValueError(f"pad {pad!r} is not one of the words")
    missing = "\x00<not a word>"  # an unknown word makes encode() raise (no such entry), never maps to a real id
    core = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token=missing))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token=pad)


def load_tokenizer(path: str | os.PathLike):
    """A Hugging Face fast tokenizer from a tokenizer.json file; ValueError naming the file when it is missing
    or not a `tokenizers` JSON file."""
    from transformers import PreTrainedTokenizerFast

    if not Path(path).is_file():
        raise ValueError(f"the tokenizer file {str(path)!r} does not exist (--tokenizer takes a tokenizer.json)")
    try:
        unk = (json.loads(Path(path).read_text(encoding="utf-8")).get("model") or {}).get("unk_token")
    except (OSError, ValueError, AttributeError):
        unk = None
    try:  # the model's unknown token named, so that a word the tokenizer does not know is caught, not encoded
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_file=str(path), **({"unk_token": unk} if isinstance(unk, str) else {})
        )
        tokenizer.headcoop_file = str(Path(path).resolve())  # where it came from: the report's advice reloads it
        return tokenizer
    except Exception as err:  # noqa: BLE001 - the tokenizers library raises a bare Exception
        raise ValueError(
            f"{str(path)!r} is not a Hugging Face tokenizer.json ({' '.join(str(err).split())[:120]})"
        ) from None


def read_prompts(path: str | os.PathLike, tokenizer=None) -> Contrast:
    """The contrast task of a prompts file (module docstring); texts need `tokenizer`."""
    path = Path(path)
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"cannot read the prompts file {path}: {err}") from None
    shape = (
        'a JSON object of lists, one entry per prompt: {"clean": [...], "corrupt": [...], "answer": [...], '
        '"wrong": [...]} (and optionally "labels"); prompts are texts or lists of token ids'
    )
    if not isinstance(spec, dict):
        raise ValueError(f"the prompts file {path} holds {json.dumps(spec)[:40]}; it must hold {shape}")
    missing = [k for k in ("clean", "corrupt", "answer", "wrong") if k not in spec]
    if missing:
        raise ValueError(f"the prompts file {path} lacks {missing}; it must hold {shape}")
    unknown = sorted(set(spec) - {"clean", "corrupt", "answer", "wrong", "labels"})
    if unknown:
        raise ValueError(f"the prompts file {path} has unknown fields {unknown}; it must hold {shape}")
    for key, value in spec.items():
        if key == "labels" and value is None:
            continue
        if not isinstance(value, list) or not value:
            raise ValueError(f"the prompts file {path}: {key!r} is {json.dumps(value)[:40]}, not a non-empty list; "
                             f"it must hold {shape}")  # fmt: skip
    lengths = {key: len(value) for key, value in spec.items() if isinstance(value, list)}
    if len(set(lengths.values())) > 1:
        raise ValueError(f"the prompts file {path} gives lists of different lengths {lengths}; one entry per prompt")
    task = Contrast(spec["clean"], spec["corrupt"], spec["answer"], spec["wrong"], labels=spec.get("labels"),
                    vocab=tokenizer)  # fmt: skip
    # where the task came from, so that the report's advice ("Run it with ...") rebuilds it as it was read
    setattr(task, "prompts_file", str(path.resolve()))  # noqa: B010 (an attribute of this reading, not the class's)
    setattr(task, "tokenizer_file", getattr(tokenizer, "headcoop_file", None))  # noqa: B010
    return task
