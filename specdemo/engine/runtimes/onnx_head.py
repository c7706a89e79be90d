"""The feature head's draft steps on ONNX Runtime, beside a target on it (runtime="onnx").

On the CPU one head step (its decoder layer and the subset's LM-head product, one position) took
2.6 ms in torch and 1.4 ms as the same graph in ONNX Runtime, both on one thread (docs/runtime.md).
A round drafts several tokens between two target forwards, so the head runs on the runtime too.

The step is exported once per head (`torch.onnx.export`, written under the runtime's cache folder)
with the cache outside the graph: it takes the embeddings of the next ids, the input features,
their positions and the cached keys and values, and returns the predicted features, their subset
logits and the new keys and values, which the drafter writes into the head's own `HeadCache`.
Rolling back stays an index into that cache. A round's first read over an empty cache (the
prompt) runs in torch: it happens once a generation. The step's session takes the thread count
asked for, as the target's does.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import logging
import os
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..drafters.feature_drafter import FeatureDrafter
from ..drafters.feature_head import FeatureHead

HEAD_STEP_FILE = "head_step.onnx"


class _HeadStep(nn.Module):
    """One head forward over T positions after P cached ones, as a graph without state.

    Its attention reads the cached keys and values where they lie: the query heads of one KV head are
    stacked as rows against that KV head's keys, and the past and the new positions are scored apart and
    share one softmax. torch's own attention (FeatureHead.finish) repeats every cached key and value for
    each query head and appends the new ones, which in the graph copied the whole cache a few times a
    step: at 2,000 cached positions that was most of a step's time (docs/runtime.md)."""

    def __init__(self, head: FeatureHead):
        super().__init__()
        self.head = head

    def forward(self, embedded, features, positions, past_k, past_v):
        residual, q, k, v = self.head.project(features, None, positions, embedded=embedded)
        return (*self.predict(residual, q, k, v, past_k, past_v), k, v)

    def predict(self, residual, q, k, v, past_k, past_v):
        c = self.head.config
        kv_heads, groups, t = c.num_kv_heads, c.num_heads // c.num_kv_heads, q.shape[2]
        rows = q.reshape(1, kv_heads, groups * t, c.head_dim) * c.head_dim ** -0.5  # row g·t + i: query i of head g
        on_past = rows @ past_k.transpose(2, 3)  # [1, kv_heads, groups·t, P]: every past position is seen
        on_new = (rows @ k.transpose(2, 3)).view(1, kv_heads, groups, t, t)  # causal among the new positions
        later = torch.arange(t)[None, :] > torch.arange(t)[:, None]
        on_new = on_new.masked_fill(later, float("-inf")).view(1, kv_heads, groups * t, t)
        weights = torch.softmax(torch.cat((on_past, on_new), -1), -1)
        past = past_k.shape[2]
        attended = weights[..., :past] @ past_v + weights[..., past:] @ v
        predicted = self.head.after_attention(residual, attended.reshape(1, c.num_heads, t, c.head_dim))
        return predicted, self.head.subset_logits(predicted)


# The step graph's layout; part of the export's folder name, so a changed graph is exported afresh.
HEAD_STEP_VERSION = "2"


def head_digest(head: FeatureHead) -> str:
    """A name for the head's export: its weights and the target's rows it was bound to."""
    digest = hashlib.sha1(HEAD_STEP_VERSION.encode())
    for tensor in (*head.state_dict().values(), head.head_columns):
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def export_head_step(head: FeatureHead, folder: Path) -> Path:
    """The head's step graph in `folder`, exported now if it is not there yet."""
    path = Path(folder) / HEAD_STEP_FILE
    if path.is_file():
        return path
    c = head.config
    d = c.hidden_size
    # Example sizes unlike any of the head's own (a size equal to one, as 3 to three KV heads, is taken
    # for the same size and fixed).
    rows, cached = 13, 29
    examples = (torch.zeros(1, rows, d), torch.zeros(1, rows, d), torch.arange(cached, cached + rows),
                torch.zeros(1, c.num_kv_heads, cached, c.head_dim), torch.zeros(1, c.num_kv_heads, cached, c.head_dim))
    new, past = torch.export.Dim("new", min=1, max=8192), torch.export.Dim("past", min=1, max=8192)
    shapes = ({1: new}, {1: new}, {0: new}, {2: past}, {2: past})
    path.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="head.tmp-", dir=path.parent))
    try:
        # The exporter reports each stage on stdout and warns and logs about its own internals (operators of
        # packages that are not installed): none of it is the user's.
        with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings(), _quiet_logger("torch.onnx"):
            warnings.simplefilter("ignore")
            exported = torch.onnx.export(_HeadStep(head).eval(), examples, dynamo=True, dynamic_shapes=shapes,
                                         input_names=["embedded", "features", "positions", "past_k", "past_v"],
                                         output_names=["predicted", "logits", "k", "v"], verbose=False)
        exported.save(str(work / HEAD_STEP_FILE))
        os.replace(work / HEAD_STEP_FILE, path)
    finally:
        for leftover in work.iterdir():
            leftover.unlink()
        work.rmdir()
    return path


@contextlib.contextmanager
def _quiet_logger(name: str):
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def head_session(path: Path, threads: int, config_entries: dict[str, str]):
    """A session of the head's step on `threads` threads with the target's session config entries. Its pool
    must spin within a step and stop after it, as the target's does (onnx_lm.SPIN_WITHIN_A_FORWARD): at 2
    threads on 2 cores a pool left spinning took the target's cores and SD fell from 61 to 39 tok/s;
    spinning only within a step, the head's 2 threads took SD from 61 (1 thread) to 65 (docs/runtime.md)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    for key, value in config_entries.items():
        options.add_session_config_entry(key, value)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class OnnxFeatureDrafter(FeatureDrafter):
    """A `FeatureDrafter` whose head steps run the exported graph; the subset logits of a step's
    last position come back with it, so the draft's q costs no second product."""

    def __init__(self, head: FeatureHead, session):
        super().__init__(head)
        self.session = session
        self._last: tuple[torch.Tensor, torch.Tensor] | None = None  # (predicted row, its subset logits)

    def head_step(self, features: torch.Tensor, next_ids, first_position: int) -> torch.Tensor:
        cache = self.cache
        if cache.length == 0:  # the prompt's read: once a generation, in torch
            return super().head_step(features, next_ids, first_position)
        ids = torch.as_tensor(next_ids).view(-1)
        t = ids.shape[0]
        cache.ensure(cache.length + t)
        feeds = {"embedded": self.head.embed[ids].float().view(1, t, -1).numpy(),
                 "features": features.detach().float().reshape(1, t, -1).numpy(),
                 "positions": np.arange(first_position + 1, first_position + 1 + t, dtype=np.int64),
                 "past_k": cache.k[:, :, : cache.length].detach().contiguous().numpy(),
                 "past_v": cache.v[:, :, : cache.length].detach().contiguous().numpy()}
        predicted, logits, k, v = self.session.run(None, feeds)
        cache.k[:, :, cache.length : cache.length + t] = torch.from_numpy(k)
        cache.v[:, :, cache.length : cache.length + t] = torch.from_numpy(v)
        cache.length += t
        self._forwards += 1
        self._counts.add(t, 1)
        rows = torch.from_numpy(predicted)[0]
        self._last = (rows[-1], torch.from_numpy(logits)[0, -1])
        return rows

    def logits_of(self, predicted: torch.Tensor) -> torch.Tensor:
        last = self._last
        if last is not None and predicted.shape == last[0].shape and predicted.data_ptr() == last[0].data_ptr():
            return last[1]
        return super().logits_of(predicted)


def runs_on_the_runtime(head: FeatureHead) -> bool:
    """Whether the head's steps can run on the runtime: a float32 head that reads the final state (a
    fused head reads intermediate layers, which the runtime's target does not export, and the target
    refuses it with the reason), where torch's exporter has what it needs (onnxscript)."""
    return (not head.config.feature_layers and head.fc.weight.dtype == torch.float32
            and importlib.util.find_spec("onnxscript") is not None)


def open_head_step(head: FeatureHead, folder: Path, threads: int, config_entries: dict[str, str]):
    """A runtime session of the head's step, exported into `folder` (one subfolder per head) first if needed."""
    return head_session(export_head_step(head, Path(folder) / head_digest(head)), threads, config_entries)

