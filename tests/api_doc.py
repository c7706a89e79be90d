"""docs/api.md's reference of the page's endpoints, written from gradio_client's view_api() of the page
served with the tiny pair (tests/test_forms.py checks that the file says the same):

    python -m tests.api_doc          # rewrites the reference in docs/api.md

Each endpoint gets its description, a table of its parameters (name, type, default, meaning) and its
outputs' names (as view_api() prints them). What depends on where the page is served is written as such: the preset's choices and
default (the served pairs) and the choices of every other list (the methods a pair offers, the
precisions a device serves, the runtimes installed), which view_api() lists itself.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping

from gradio_client.utils import sanitize_parameter_names

DOC = Path(__file__).resolve().parents[1] / "docs" / "api.md"
BEGIN = "<!-- endpoints: written by python -m tests.api_doc from view_api() -->"
END = "<!-- end of endpoints -->"
ENDPOINTS = ("/run", "/compare", "/benchmark", "/sweep")
SERVED_DEFAULT = "the page's default pair"


def parameter_type(python_type: str) -> str:
    """view_api()'s type with its choices left out: they depend on the pair, the device and what is installed."""
    python_type = re.sub(r"list\[Literal\[.*\]\]", "list[str]", python_type)
    return re.sub(r"^Literal\[.*\]$", "str", python_type)


def parameters(endpoint: Mapping[str, Any]) -> list[tuple[str, str, str, str]]:
    """(name, type, default, meaning) a parameter, as the reference writes them."""
    rows = []
    for p in endpoint["parameters"]:
        name = p["parameter_name"]
        default = SERVED_DEFAULT if name == "preset" else json.dumps(p["parameter_default"], ensure_ascii=False)
        rows.append((name, parameter_type(p["python_type"]["type"]), default, p["python_type"]["description"]))
    return rows


def section(api: Mapping[str, Any]) -> str:
    """The reference of `ENDPOINTS`, from view_api(return_format="dict")."""
    named = api["named_endpoints"]
    lines = [BEGIN, ""]
    for path in ENDPOINTS:
        endpoint = named[path]
        lines += [f"### `{path}`", "", endpoint["description"], ""]
        same = next((other for other in ENDPOINTS[:ENDPOINTS.index(path)]
                     if parameters(named[other]) == parameters(endpoint)), None)
        if same:
            lines += [f"Its parameters are `{same}`'s.", ""]
        else:
            lines += ["| parameter | type | default | meaning |", "|---|---|---|---|"]
            lines += [f"| `{name}` | `{kind}` | {'`' + default + '`' if default != SERVED_DEFAULT else default} "
                      f"| {meaning.replace('|', '∣')} |" for name, kind, default, meaning in parameters(endpoint)]
            lines.append("")
        outputs = ", ".join(f"`{sanitize_parameter_names(r['label'])}` ({r['component']})" for r in endpoint["returns"])
        lines += [f"Returns, in this order: {outputs}.", ""]
    return "\n".join([*lines, END])


def written() -> str:
    """The reference as docs/api.md has it now."""
    text = DOC.read_text(encoding="utf-8")
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[start:end]


def view_api() -> dict:
    """view_api() of the page served with the tiny pair and its defaults."""
    import gradio_client

    from tests.uiserver import serve

    with serve(Path(tempfile.mkdtemp())) as (url, _):
        return gradio_client.Client(url, verbose=False).view_api(return_format="dict", print_info=False)


def main() -> int:
    text = DOC.read_text(encoding="utf-8")
    DOC.write_text(text.replace(written(), section(view_api())), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
