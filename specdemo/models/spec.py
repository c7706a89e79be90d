"""What identifies a pair, without loading it: the names and load options another process needs
to load the same pair (a worker of a cluster loads its own copy, once).
"""

from __future__ import annotations

from dataclasses import dataclass

from .loading import EMBEDDED, PRESETS, ModelPair, load_pair


@dataclass(frozen=True)
class PairSpec:
    """`load_pair`'s arguments: a preset, hub id, folder or .gguf file for the target, an optional
    draft (None: the preset's own), the device (None: the loader's choice where the pair is loaded)
    and the precisions and runtime."""

    target: str = EMBEDDED
    draft: str | None = None
    device: str | None = None
    dtype: str | None = None
    target_dtype: str | None = None
    draft_dtype: str | None = None
    runtime: str = "torch"

    def __post_init__(self) -> None:
        if not isinstance(self.target, str) or not self.target.strip():
            raise ValueError(f"a pair's target must be a preset, hub id, folder or .gguf file, got {self.target!r}")

    @classmethod
    def of(cls, pair: "PairSpec | str") -> "PairSpec":
        """A spec as given, or the spec of a preset or target name."""
        if isinstance(pair, PairSpec):
            return pair
        if isinstance(pair, str):
            return cls(pair)
        raise ValueError(f"a pair to load elsewhere is a PairSpec or a preset/target name, not a loaded "
                         f"{type(pair).__name__}: each worker loads its own copy")

    @classmethod
    def for_preset_draft(cls, preset: str | None, draft: str, **options) -> "PairSpec":
        """A preset's target with another draft (e.g. the embedded target drafted by self:int8)."""
        return cls(PRESETS[preset or EMBEDDED].target, draft, **options)

    def load(self) -> ModelPair:
        return load_pair(self.target, self.draft, device=self.device, dtype=self.dtype,
                         target_dtype=self.target_dtype, draft_dtype=self.draft_dtype, runtime=self.runtime)
