"""The docs hold together: the README stays short with the Space's front matter first, every
relative link and anchor in the README, docs/ and the head's model card lands, and every command
they quote names subcommands and flags that exist (parsed by the CLI's own parsers, never run)."""

from __future__ import annotations

import importlib.util
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
CARDS = [ROOT / "specdemo" / "models" / "assets" / name / "README.md" for name in ("smollm2-head", "smollm2-draft")]
PAGES = [README, ROOT / "CHANGELOG.md", *DOCS, *CARDS]
MAX_README_BYTES = 14 * 1024

FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"`([^`\n]+)`")


def prose(text: str) -> str:
    """The text without its fenced code blocks (a `#` comment in a shell block is no heading)."""
    return FENCE.sub("", text)


def code_blocks(text: str) -> list[str]:
    return [block.split("\n", 1)[1].rsplit("```", 1)[0] for block in FENCE.findall(text)]


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {anchor(line.lstrip("#")) for line in prose(path.read_text(encoding="utf-8")).splitlines()
            if line.startswith("#")}


def relative_links(path: Path) -> list[str]:
    return [target for target in LINK.findall(prose(path.read_text(encoding="utf-8")))
            if not re.match(r"[a-z]+:", target)]


def quoted_commands(path: Path) -> list[str]:
    """Every `python …` command line in the page's shell blocks and inline code, one command each."""
    text = path.read_text(encoding="utf-8")
    lines = []
    for block in code_blocks(text):
        lines += block.replace("\\\n", " ").splitlines()
    lines += INLINE_CODE.findall(prose(text))
    commands = []
    for line in lines:
        line = re.sub(r"(^|\s)#.*$", "", line)  # a shell comment
        for match in re.finditer(r"python3? (?:-m \S+|app\.py)[^;&|)]*", line):
            commands.append(match.group(0).strip())
    return commands


def test_the_readme_fits_a_screen_or_two():
    size = len(README.read_bytes())
    assert size <= MAX_README_BYTES, f"README.md is {size} bytes; move depth to docs/"


def test_the_space_front_matter_comes_first_in_the_readme():
    import yaml

    text = README.read_text(encoding="utf-8")
    assert text.startswith("---\n")
    front = yaml.safe_load(text.split("---\n")[1])
    assert front["sdk"] == "gradio" and front["app_file"] == "app.py" and front["title"] == "specdemo"


def test_the_readme_links_every_docs_page():
    linked = {(README.parent / target.split("#")[0]).resolve() for target in relative_links(README)}
    assert [page.name for page in DOCS if page.resolve() not in linked] == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_lands(page):
    broken = []
    for target in relative_links(page):
        file, _, fragment = target.partition("#")
        destination = (page.parent / file).resolve() if file else page
        if not destination.exists():
            broken.append(target)
        elif fragment and destination.suffix == ".md" and fragment not in anchors(destination):
            broken.append(target)
    assert broken == [], f"{page.name}: links to nothing: {broken}"


def test_the_anchor_rule_is_githubs():
    assert anchor("The page's endpoints") == "the-pages-endpoints"
    assert anchor("Engine options: how tokens are computed, never which") == \
        "engine-options-how-tokens-are-computed-never-which"
    assert anchor("The suite on the embedded pair, CPU") == "the-suite-on-the-embedded-pair-cpu"


def test_the_readme_quotes_the_ci_test_command_exactly():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    command = next(line for line in ci.splitlines() if line.startswith("python3 -m venv"))
    assert command in [line.strip() for block in code_blocks(README.read_text(encoding="utf-8"))
                       for line in block.splitlines()]


def all_commands() -> list[tuple[str, str]]:
    return [(page.name, command) for page in PAGES for command in quoted_commands(page)]


def test_the_pages_quote_commands_at_all():
    names = {command.split()[2] for _, command in all_commands() if command.startswith("python -m ")}
    assert {"specdemo", "specdemo.training.curve", "specdemo.bench.synthetic"} <= names


def cli_commands() -> list[tuple[str, str]]:
    return [(page, command) for page, command in all_commands()
            if command.startswith("python -m specdemo ") or command == "python -m specdemo"]


@pytest.mark.parametrize("page,command", cli_commands())
def test_quoted_cli_commands_parse(page, command):
    from specdemo.cli import build_parser

    try:
        args = build_parser().parse_args(shlex.split(command)[3:])
    except SystemExit as error:
        if error.code != 0:  # --help exits 0
            pytest.fail(f"{page}: `{command}` does not parse (exit {error.code})")
        return
    assert args.command in {"compare", "bench", "sweep"}


def app_commands() -> list[tuple[str, str]]:
    return [(page, command) for page, command in all_commands() if command.startswith("python app.py")]


@pytest.mark.parametrize("page,command", app_commands())
def test_quoted_app_commands_parse(page, command):
    spec = importlib.util.spec_from_file_location("specdemo_app_entry", ROOT / "app.py")
    app = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(app)
    try:
        app.build_parser().parse_args(shlex.split(command)[2:])
    except SystemExit as error:
        if error.code != 0:  # --help exits 0
            pytest.fail(f"{page}: `{command}` does not parse (exit {error.code})")


def module_commands() -> list[tuple[str, str]]:
    return [(page, command) for page, command in all_commands() if command.startswith("python -m specdemo.")]


@pytest.mark.parametrize("page,command", module_commands())
def test_quoted_module_commands_name_flags_their_module_declares(page, command):
    """The training and bench modules build their parsers inside main(), so their flags are read
    from the source: each quoted --flag must be declared there (or its --no- form's base)."""
    module = shlex.split(command)[2]
    path = ROOT / Path(*module.split("."))
    source_file = path.with_suffix(".py") if path.with_suffix(".py").is_file() else path / "__main__.py"
    assert source_file.is_file(), f"{page}: `{command}` names no module"
    source = source_file.read_text(encoding="utf-8")
    # Flags a module shares with its siblings are declared in the sibling it imports them from.
    for sibling in re.findall(r"^from \.(\w+) import", source, flags=re.MULTILINE):
        sibling_file = source_file.parent / f"{sibling}.py"
        if sibling_file.is_file():
            source += sibling_file.read_text(encoding="utf-8")
    flags = re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", command)
    unknown = [flag for flag in flags if f'"{flag}"' not in source and f'"{flag.replace("--no-", "--", 1)}"' not in source]
    assert unknown == [], f"{page}: `{command}` uses flags {module} does not declare"
