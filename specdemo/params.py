"""Decoding parameters, validated once here for the API, the CLI and the page.

Every check raises `ValueError` naming the field and what it accepts, so each front
end can show the message as it is.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from .sampling import SamplingConfig

NGRAM_STORAGES = ("basic", "onelevel")
# A hard ceiling for any caller; public deployments set a lower one (see specdemo.limits).
MAX_NEW_TOKENS_LIMIT = 4096


@dataclass(frozen=True)
class DecodeParams:
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    gamma: int = 4
    gamma_min: int = 1
    gamma_max: int = 6
    ema: float = 0.9
    ngram_n: int = 3
    ngram_storage: str = "basic"
    top_k_filler: int = 3
    chat: bool = False

    @classmethod
    def from_values(cls, **values: Any) -> "DecodeParams":
        """Coerce loosely typed values (strings from a form or a command line) and validate."""
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"unknown parameter(s): {', '.join(unknown)}; allowed: {', '.join(known)}")
        coerced = {}
        for name, value in values.items():
            if value is None:
                continue  # keep the default
            coerced[name] = _coerce(name, value, known[name].type)
        return cls(**coerced)

    def __post_init__(self) -> None:
        _check_int("max_new_tokens", self.max_new_tokens, 1, MAX_NEW_TOKENS_LIMIT)
        _check_number("temperature", self.temperature, 0.0, None, "a number ≥ 0 (0 = greedy)")
        _check_int("top_k", self.top_k, 0, None, "an integer ≥ 0 (0 = off)")
        _check_number("top_p", self.top_p, 0.0, 1.0, "a number in (0, 1] (1 = off)")
        if self.top_p <= 0.0:
            raise ValueError(f"top_p must be a number in (0, 1] (1 = off), got {self.top_p!r}")
        if self.seed is not None:
            _check_int("seed", self.seed, 0, 2**63 - 1, "an integer ≥ 0 or empty")
        _check_int("gamma", self.gamma, 1, 64, "an integer from 1 to 64")
        _check_int("gamma_min", self.gamma_min, 1, 64, "an integer from 1 to 64")
        _check_int("gamma_max", self.gamma_max, 1, 64, "an integer from 1 to 64")
        if self.gamma_min > self.gamma_max:
            raise ValueError(f"gamma_min ({self.gamma_min}) must not exceed gamma_max ({self.gamma_max})")
        _check_number("ema", self.ema, 0.0, None, "a number in [0, 1) (0 = no smoothing)")
        if self.ema >= 1.0:
            raise ValueError(f"ema must be a number in [0, 1) (0 = no smoothing), got {self.ema!r}")
        _check_int("ngram_n", self.ngram_n, 2, 16, "an integer from 2 to 16")
        if self.ngram_storage not in NGRAM_STORAGES:
            raise ValueError(f"ngram_storage must be one of {', '.join(NGRAM_STORAGES)}, got {self.ngram_storage!r}")
        _check_int("top_k_filler", self.top_k_filler, 0, 64, "an integer from 0 to 64")
        if not isinstance(self.chat, bool):
            raise ValueError(f"chat must be true or false, got {self.chat!r}")

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_k, self.top_p)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _coerce(name: str, value: Any, annotation: Any) -> Any:
    text = str(annotation)
    try:
        if "bool" in text:
            if isinstance(value, str):
                lowered = value.strip().lower()
                if lowered in ("1", "true", "yes", "on"):
                    return True
                if lowered in ("0", "false", "no", "off"):
                    return False
                raise ValueError
            return bool(value)
        if "int" in text:
            if isinstance(value, str) and value.strip() == "" and "None" in text:
                return None
            if isinstance(value, bool):
                raise ValueError
            number = float(value)
            if not number.is_integer():
                raise ValueError
            return int(number)
        if "float" in text:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        return str(value)
    except (TypeError, ValueError, OverflowError):
        kind = "true or false" if "bool" in text else "an integer" if "int" in text else "a number"
        raise ValueError(f"{name} must be {kind}, got {value!r}") from None


def _check_int(name: str, value: Any, low: int, high: int | None, allowed: str | None = None) -> None:
    allowed = allowed or (f"an integer from {low} to {high}" if high is not None else f"an integer ≥ {low}")
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name} must be {allowed}, got {value}")


def _check_number(name: str, value: Any, low: float, high: float | None, allowed: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    if value < low or (high is not None and value > high):
        raise ValueError(f"{name} must be {allowed}, got {value}")
