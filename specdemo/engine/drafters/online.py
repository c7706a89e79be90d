"""Online speculative decoding (OSD): the feature head learns from the target while serving.

The `osd` method drafts with an online copy of the pair's feature head. After each request, off
the timed path, the copy takes a few distillation steps on what the target just verified: the
target's states over the prompt and the answer (one forward without a cache) and its next-token
distributions, with the loss the head was trained with offline (`head_loss.head_losses`). The
copy lives as long as the loaded head, so a stream of requests (a benchmark run, a page's
visitors) adapts one head, and every request drafts with what the ones before it taught. The
target verifies every draft, so outputs stay the target's whatever the head has learnt.
"""

from __future__ import annotations

import copy
import threading
import time
import weakref
from dataclasses import dataclass, field

import torch

from .feature_drafter import FeatureDrafter
from .feature_head import FeatureHead
from .head_loss import collate, head_losses
from ..targets.lm import forward_with_features

STREAM_WINDOW = 5  # requests at each end of the stream that a lesson's note compares


@dataclass
class VerifiedSequence:
    """One request's prompt and verified answer, as the head's loss reads it."""

    ids: torch.Tensor  # [L]
    features: torch.Tensor  # [L − 1, d]: the target's states at every position but the last
    answer_start: int
    weights: torch.Tensor | None = None


@dataclass
class Lesson:
    """What one request taught the online head, reported beside (never inside) the decode's time."""

    request: int  # 1 for the stream's first request
    tokens: int  # verified answer tokens learnt from
    loss: float  # the last step's loss
    seconds: float
    drafted: int
    accepted: int
    first_acceptance: float = float("nan")  # pooled over the stream's first STREAM_WINDOW requests
    recent_acceptance: float = float("nan")  # pooled over its last STREAM_WINDOW requests, this one included

    def describe(self) -> str:
        trend = (f" Acceptance over the stream's first {STREAM_WINDOW} requests {self.first_acceptance:.2f}, over "
                 f"the last {STREAM_WINDOW} {self.recent_acceptance:.2f}." if self.request > STREAM_WINDOW else "")
        return (f"OSD: request {self.request} of this head's stream; after it the head learnt from its {self.tokens} "
                f"verified tokens in {self.seconds:.2f} s (not counted in tokens/s).{trend}")


@dataclass
class OnlineHead:
    """A trainable copy of a feature head and its optimiser; `lessons` is the stream so far."""

    head: FeatureHead
    optimizer: torch.optim.Optimizer
    lessons: list[Lesson] = field(default_factory=list)
    cls_weight: float = 1.0  # the distribution term's weight in the loss (1, as the installed head was trained)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def of(cls, head: FeatureHead, target: torch.nn.Module, lr: float) -> "OnlineHead":
        # The target's embedding and LM-head rows are read, never learnt: shared, not copied.
        shared = {id(value): value for value in (getattr(head, "embed", None), getattr(head, "head_columns", None))
                  if value is not None}
        online = copy.deepcopy(head, memo=shared)
        online.bind(target)
        online.eval()
        trainable = [p for p in online.parameters() if p.requires_grad]
        return cls(online, torch.optim.Adam(trainable, lr=lr))

    def learn(self, target: torch.nn.Module, ids: list[int], answer_start: int, steps: int, *, drafted: int = 0,
              accepted: int = 0, unroll: int = 2) -> Lesson:
        """`steps` distillation steps on one verified sequence; the lesson, appended to the stream."""
        started = time.perf_counter()
        with self.lock, torch.inference_mode(False), torch.enable_grad():
            loss = self._steps(target, ids, answer_start, steps, unroll) if steps else float("nan")
            lesson = Lesson(len(self.lessons) + 1, len(ids) - answer_start, loss, time.perf_counter() - started,
                            drafted, accepted)
            self.lessons.append(lesson)
            lesson.first_acceptance = self.acceptance(first=STREAM_WINDOW)
            lesson.recent_acceptance = self.acceptance(last=STREAM_WINDOW)
        return lesson

    def _steps(self, target, ids, answer_start, steps, unroll) -> float:
        weight = self.head.fc.weight
        batch = collate([VerifiedSequence(torch.tensor(ids), target_states(target, ids, self.head), answer_start)])
        batch = {name: value.to(weight.device) for name, value in batch.items()}
        batch["features"] = batch["features"].to(weight.dtype)
        self.head.train()
        try:
            for _ in range(steps):
                self.optimizer.zero_grad()
                loss, _ = head_losses(self.head, batch, noise=0.0, unroll=unroll, cls_weight=self.cls_weight)
                loss.backward()
                self.optimizer.step()
        finally:
            self.head.eval()
        return float(loss.detach())

    def acceptance(self, first: int | None = None, last: int | None = None) -> float:
        """Pooled acceptance (accepted ÷ drafted) over the stream's first or last requests (all by default)."""
        lessons = self.lessons[:first] if first else self.lessons[-last:] if last else self.lessons
        drafted = sum(lesson.drafted for lesson in lessons)
        return sum(lesson.accepted for lesson in lessons) / drafted if drafted else float("nan")


def target_states(target: torch.nn.Module, ids: list[int], head: FeatureHead) -> torch.Tensor:
    """[len(ids) − 1, d]: the states the head reads (its layers, then the final state) at every
    position but the last, from one forward without a cache."""
    with torch.no_grad():
        _, states = forward_with_features(target, tuple(head.config.feature_layers),
                                          input_ids=torch.tensor([ids], device=head.fc.weight.device), use_cache=False)
    return states[0, :-1].float()


# The loaded head → its online copy: the copy lives while the pair is loaded, and goes with it.
_ONLINE: "weakref.WeakKeyDictionary[FeatureHead, OnlineHead]" = weakref.WeakKeyDictionary()
_ONLINE_LOCK = threading.Lock()


def online_head(head: FeatureHead, target: torch.nn.Module, lr: float) -> OnlineHead:
    """The online copy of `head`, made at its first request (later requests keep learning it)."""
    with _ONLINE_LOCK:
        online = _ONLINE.get(head)
        if online is None:
            online = _ONLINE[head] = OnlineHead.of(head, target, lr)
        for group in online.optimizer.param_groups:
            group["lr"] = lr
        return online


def forget_online(head: FeatureHead) -> None:
    """Start the stream again: the next `osd` request drafts with the loaded head as it was."""
    with _ONLINE_LOCK:
        _ONLINE.pop(head, None)


class OnlineDrafter(FeatureDrafter):
    """The online head as a drafter; after the request it learns from the verified answer."""

    learns_online = True

    def __init__(self, online: OnlineHead, steps: int):
        super().__init__(online.head)
        self.online = online
        self.steps = steps

    def describe(self, model_name: str | None) -> str:
        return f"online copy of {model_name or 'the feature head'} (OSD, {len(self.online.lessons)} requests learnt)"

    def learn(self, target: torch.nn.Module, sequence: list[int], answer_start: int, drafted: int,
              accepted: int) -> Lesson:
        return self.online.learn(target, sequence, answer_start, self.steps, drafted=drafted, accepted=accepted)
