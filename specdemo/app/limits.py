"""What a deployment lets its visitors do: the public-mode allow-list and caps.

Public mode is on for a Hugging Face Space (SPACE_ID is set) or when asked for
(`--public`, SPECDEMO_PUBLIC=1). Visitors then pick presets from an allow-list,
never type model ids or paths, and get capped prompts and generations.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from ..engine.params import MAX_NEW_TOKENS_LIMIT
from ..models.embedded import EMBEDDED_HEAD, EMBEDDED_LM
from ..models.loading import EMBEDDED, PRESETS

OFFLINE_PRESETS = (EMBEDDED, EMBEDDED_LM, EMBEDDED_HEAD)


# A public sweep's default caps: grid points besides AR, prompts in all, repeats.
PUBLIC_MAX_SWEEP_SETTINGS = 8
PUBLIC_MAX_SWEEP_PROMPTS = 2
PUBLIC_MAX_SWEEP_REPEATS = 1


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {value!r}") from None


@dataclass(frozen=True)
class Limits:
    public: bool = False
    allowed_presets: tuple[str, ...] = tuple(PRESETS)
    max_new_tokens: int = MAX_NEW_TOKENS_LIMIT
    max_prompt_tokens: int | None = None  # None: only the model's context length applies
    queue_size: int = 32
    # Sweeps (the Sweep tab, /sweep): None means no cap here, or the PUBLIC_* cap in public mode.
    max_sweep_settings: int | None = None
    max_sweep_prompts: int | None = None
    max_sweep_repeats: int | None = None

    @classmethod
    def from_env(cls, public: bool | None = None) -> "Limits":
        if public is None:
            public = bool(os.environ.get("SPACE_ID")) or os.environ.get("SPECDEMO_PUBLIC", "") in ("1", "true", "yes")
        if not public:
            return cls(public=False, queue_size=_env_int("SPECDEMO_QUEUE_SIZE", 32))
        # The offline pair with each of its drafts, so a visitor can compare them.
        allowed = os.environ.get("SPECDEMO_ALLOWED_PRESETS", ",".join(OFFLINE_PRESETS))
        names = tuple(n.strip() for n in allowed.split(",") if n.strip())
        unknown = [n for n in names if n not in PRESETS]
        if unknown:
            raise ValueError(f"SPECDEMO_ALLOWED_PRESETS names unknown presets {unknown}; known: {', '.join(PRESETS)}")
        return cls(
            public=True,
            allowed_presets=names or (EMBEDDED,),
            max_new_tokens=_env_int("SPECDEMO_MAX_NEW_TOKENS", 256),
            max_prompt_tokens=_env_int("SPECDEMO_MAX_PROMPT_TOKENS", 2048),
            queue_size=_env_int("SPECDEMO_QUEUE_SIZE", 16),
            max_sweep_settings=_env_int("SPECDEMO_MAX_SWEEP_SETTINGS", PUBLIC_MAX_SWEEP_SETTINGS),
            max_sweep_prompts=_env_int("SPECDEMO_MAX_SWEEP_PROMPTS", PUBLIC_MAX_SWEEP_PROMPTS),
            max_sweep_repeats=_env_int("SPECDEMO_MAX_SWEEP_REPEATS", PUBLIC_MAX_SWEEP_REPEATS),
        )

    def served(self, presets: Mapping[str, object]) -> dict[str, object]:
        """The presets a visitor may pick: all of them, or in public mode the allow-listed ones."""
        if not self.public:
            return dict(presets)
        return {name: preset for name, preset in presets.items() if name in self.allowed_presets}

    def check_models(self, preset: str | None, target: str | None = None, draft: str | None = None,
                     known: Mapping[str, object] = PRESETS) -> None:
        """Refuse what this deployment does not serve, before anything is loaded."""
        typed = [m for m in (target, draft) if m and str(m).strip()]
        if self.public and typed:
            raise ValueError("model: this public demo only serves its presets; typed model ids and paths are refused")
        if not typed:
            served = self.served(known)
            if preset not in known:
                raise ValueError(f"preset: unknown preset {preset!r}; choose from {', '.join(served)}")
            if preset not in served:
                raise ValueError(f"preset: {preset!r} is not served here; choose from {', '.join(served)}")

    def check_new_tokens(self, max_new_tokens: int) -> None:
        if max_new_tokens > self.max_new_tokens:
            raise ValueError(f"max_new_tokens must be at most {self.max_new_tokens} here, got {max_new_tokens}")

    def check_request(self, prompt_ids: list[int], max_new_tokens: int) -> None:
        self.check_new_tokens(max_new_tokens)
        if self.max_prompt_tokens is not None and len(prompt_ids) > self.max_prompt_tokens:
            raise ValueError(
                f"prompt is too long for this demo: {len(prompt_ids)} tokens, at most {self.max_prompt_tokens}"
            )

    def sweep_caps(self) -> dict[str, int | None]:
        """The caps on a sweep's grid points (besides AR), prompts and repeats; None: no cap."""
        public = (PUBLIC_MAX_SWEEP_SETTINGS, PUBLIC_MAX_SWEEP_PROMPTS, PUBLIC_MAX_SWEEP_REPEATS)
        given = (self.max_sweep_settings, self.max_sweep_prompts, self.max_sweep_repeats)
        return {name: value if value is not None else (default if self.public else None)
                for name, value, default in zip(("settings", "prompts", "repeats"), given, public)}

    def check_sweep(self, settings: int, prompts: int, repeats: int) -> None:
        """Refuse a sweep bigger than this deployment runs (settings: grid points besides AR)."""
        caps = self.sweep_caps()
        what = {"settings": ("grid points", settings, "; use fewer values or methods"),
                "prompts": ("prompts", prompts, "; pick fewer categories or prompts per category"),
                "repeats": ("repeats", repeats, "")}
        for name, (label, value, advice) in what.items():
            if caps[name] is not None and value > caps[name]:
                raise ValueError(f"sweep: {value} {label}, at most {caps[name]} here{advice}")
