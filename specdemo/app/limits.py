"""What a deployment lets its visitors do: the public-mode allow-list and caps.

Public mode is on for a Hugging Face Space (SPACE_ID is set) or when asked for
(`--public`, SPECDEMO_PUBLIC=1). Visitors then pick presets from an allow-list,
never type model ids or paths, and get capped prompts and generations.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping

from ..models.loading import EMBEDDED, PRESETS
from ..engine.params import MAX_NEW_TOKENS_LIMIT


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

    @classmethod
    def from_env(cls, public: bool | None = None) -> "Limits":
        if public is None:
            public = bool(os.environ.get("SPACE_ID")) or os.environ.get("SPECDEMO_PUBLIC", "") in ("1", "true", "yes")
        if not public:
            return cls(public=False, queue_size=_env_int("SPECDEMO_QUEUE_SIZE", 32))
        allowed = os.environ.get("SPECDEMO_ALLOWED_PRESETS", EMBEDDED)
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
