"""SpecDec++'s acceptance-prediction head: a small MLP that reads the drafter's statistics at a
draft position and predicts the probability that the target refuses that draft, given that it
kept every draft before it.

Its input is what the per-token hook sees while drafting (`ROUND_FEATURES`), so it costs no
extra read from the device: the normalised entropy, the top probability (and its log), the
position in the round, q of the previous draft, and the smallest top probability of the round
so far. Training (from traces of the target and its draft) is `specdemo.training.specdecpp`;
the embedded pair's head ships in specdemo/models/assets/specdecpp-head/.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import nn

FEATURES = ("entropy", "top_prob", "log_top_prob", "position", "last_q", "min_top_prob")
# The folder is read as files, not imported: the engine knows no model pair.
DEFAULT_HEAD = Path(__file__).resolve().parents[2] / "models" / "assets" / "specdecpp-head"
CONFIG, WEIGHTS = "head.json", "head.pt"


def round_features(entropy: float, top_prob: float, position: int, last_q: float | None,
                   min_top_prob: float) -> list[float]:
    """One draft position's inputs, in FEATURES order (last_q is 1 at the round's first position)."""
    return [entropy, top_prob, math.log(max(top_prob, 1e-9)), float(position),
            1.0 if last_q is None else last_q, min(min_top_prob, top_prob)]


class AcceptanceHead(nn.Module):
    """Standardised features → two hidden layers → the logit of a rejection."""

    def __init__(self, hidden: int = 48, mean: list[float] | None = None, std: list[float] | None = None):
        super().__init__()
        width = len(FEATURES)
        self.hidden = hidden
        self.register_buffer("mean", torch.tensor(mean or [0.0] * width, dtype=torch.float32))
        self.register_buffer("std", torch.tensor(std or [1.0] * width, dtype=torch.float32))
        self.net = nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU(),
                                 nn.Linear(hidden, 1))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """[n, len(FEATURES)] → [n] rejection logits."""
        return self.net((features - self.mean) / self.std).squeeze(-1)

    @torch.inference_mode()
    def reject_probability(self, features: list[float]) -> float:
        return float(torch.sigmoid(self(torch.tensor([features], dtype=torch.float32)))[0])

    def save(self, folder: str | Path, **extra) -> Path:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        torch.save({k: v.detach().cpu() for k, v in self.state_dict().items()}, folder / WEIGHTS)
        config = {"features": list(FEATURES), "hidden": self.hidden, **extra}
        (folder / CONFIG).write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
        return folder


def load_acceptance_head(folder: str | Path | None = None) -> AcceptanceHead:
    folder = Path(folder) if folder else DEFAULT_HEAD
    if not (folder / WEIGHTS).is_file():
        raise ValueError(f"specdecpp: no acceptance head in {str(folder)!r}; train one with "
                         "`python -m specdemo.training.specdecpp`")
    config = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
    if tuple(config["features"]) != FEATURES:
        raise ValueError(f"specdecpp: the head in {str(folder)!r} reads {config['features']}, not {list(FEATURES)}")
    head = AcceptanceHead(config["hidden"])
    head.load_state_dict(torch.load(folder / WEIGHTS, weights_only=True))
    return head.eval()


_LOADED: dict[str, AcceptanceHead] = {}


def cached_acceptance_head(folder: str | Path | None = None) -> AcceptanceHead:
    """The head in `folder` (the shipped one by default), loaded once per process."""
    key = str(Path(folder).resolve()) if folder else ""
    if key not in _LOADED:
        _LOADED[key] = load_acceptance_head(folder)
    return _LOADED[key]
