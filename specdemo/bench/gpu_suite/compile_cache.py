"""torch.compile's cache artifacts kept in one file between runs (`--compile-cache FILE`), so a
rerun on the same card model skips most of its compiling.

The file is one JSON line saying which device and torch made the artifacts, then their bytes.
Artifacts made on another card model or another torch are ignored (and replaced at the next save):
generated kernels are tuned to the card they were compiled on.

May import torch.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path

import torch


def device_key(device: str) -> dict[str, str]:
    where = torch.device(device)
    name = torch.cuda.get_device_name(where) if where.type == "cuda" else f"cpu {platform.processor() or platform.machine()}"
    return {"device": name, "torch": torch.__version__}


def load(path: Path, key: dict[str, str]) -> str:
    """Load the artifacts of `path` when they were made under `key`; what happened, in words."""
    if not path.is_file():
        return f"no compile cache at `{path}` yet"
    with path.open("rb") as file:
        header = file.readline()
        artifacts = file.read()
    try:
        made = json.loads(header)
    except ValueError:
        return f"`{path}` is not a compile cache: ignored"
    if made != key:
        return f"`{path}` was made on {made.get('device')} with torch {made.get('torch')}: ignored"
    info = torch.compiler.load_cache_artifacts(artifacts)
    count = sum(len(names) for names in info.artifacts.values()) if info is not None else 0
    return f"loaded {count} compile artifact(s) ({len(artifacts) / 2**20:.1f} MiB) from `{path}`"


def save(path: Path, key: dict[str, str]) -> str | None:
    """Write what this process compiled (and loaded) so far; None when there is nothing to write."""
    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        return None
    artifacts, _ = saved
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with partial.open("wb") as file:  # written aside and renamed: a run cut mid-write keeps the last file
        file.write(json.dumps(key).encode() + b"\n")
        file.write(artifacts)
    os.replace(partial, path)
    return f"saved {len(artifacts) / 2**20:.1f} MiB of compile artifacts to `{path}`"
