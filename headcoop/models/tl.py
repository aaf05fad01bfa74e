"""The TransformerLens names headcoop uses, whichever TransformerLens is installed.

TransformerLens 3.x has both `HookedTransformer` and `TransformerBridge`; 4.0 removed `HookedTransformer`,
`HookedTransformerConfig` and `transformer_lens.components`. With 4.x, headcoop still imports, and every
analysis runs on a `TransformerBridge` in compatibility mode (docs/transformer_lens_4.md lists what was
measured there); the toy tasks, training and checkpoints need a HookedTransformer and say so. Here the two
removed classes become placeholders that no model is an instance of, and constructing one is an error that
names the fix.
"""

from __future__ import annotations

try:
    import transformer_lens  # noqa: F401
except ModuleNotFoundError as err:
    if err.name != "transformer_lens":
        raise
    from headcoop import TL_MISSING

    raise ImportError(TL_MISSING) from None

try:
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    HAS_HOOKED_TRANSFORMER = True
except ImportError:  # TransformerLens >= 4.0
    HAS_HOOKED_TRANSFORMER = False
    _WHY = ("TransformerLens {version} has no {name} (removed in 4.0); headcoop's toy tasks, training and "
            "checkpoints need it: pip install 'transformer-lens>=3.5,<4'. Every analysis also takes a "
            "TransformerBridge in compatibility mode.")  # fmt: skip

    def _version() -> str:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("transformer-lens")
        except PackageNotFoundError:  # importable but not installed as a distribution (a source tree)
            return "(version unknown)"

    class HookedTransformer:  # type: ignore[no-redef]  # 4.x: a placeholder under the name 3.x exports
        """Placeholder for TransformerLens 4.x, where HookedTransformer was removed: nothing is an instance."""

        def __init__(self, *args, **kwargs):
            raise ImportError(_WHY.format(version=_version(), name="HookedTransformer"))

    class HookedTransformerConfig:  # type: ignore[no-redef]  # 4.x: a placeholder under the name 3.x exports
        """Placeholder for TransformerLens 4.x, where HookedTransformerConfig was removed."""

        __dataclass_fields__: dict = {}

        def __init__(self, *args, **kwargs):
            raise ImportError(_WHY.format(version=_version(), name="HookedTransformerConfig"))


__all__ = [
    "HookedTransformer",
    "HookedTransformerConfig",
    "HAS_HOOKED_TRANSFORMER",
    "require_hooked_transformer",
    "attach",
]


def attach(model, **values) -> None:
    """headcoop's own attributes on a model (`task`, `history`, `train_settings`, `checkpoint_meta`): set as plain
    attributes, which nn.Module's `__setattr__` (typed for tensors and modules) keeps as such."""
    for name, value in values.items():
        setattr(model, name, value)


def require_hooked_transformer(what: str) -> None:
    """ImportError naming the fix when this TransformerLens has no HookedTransformer (4.x)."""
    if not HAS_HOOKED_TRANSFORMER:
        HookedTransformer()  # type: ignore[call-arg]  # the 4.x placeholder takes no config and raises the message
