"""What the tabs share (specdemo/app/page.py): here, the words the page may show as labels and choices."""

from __future__ import annotations

import re
from pathlib import Path

import gradio as gr

from specdemo.app import page, ui
from tests.uiserver import tiny_loader, tiny_presets


def gradio_message_groups() -> set[str]:
    """The groups of the installed Gradio's English messages, read from its browser bundle's exports."""
    assets = Path(gr.__file__).parent / "templates" / "frontend" / "assets"
    bundles = [p for p in assets.glob("en-*.js") if "export{" in p.read_text(encoding="utf-8")]
    assert bundles, f"no English message bundle in {assets}"
    exports = re.search(r"export\{([^}]*)\}", bundles[0].read_text(encoding="utf-8")).group(1)
    return {name for name in re.findall(r"\bas (\w+)", exports) if not name.startswith("_")} - {"default"}


def test_the_page_knows_every_group_of_gradios_messages():
    assert page.GRADIO_MESSAGE_GROUPS == gradio_message_groups()


def test_a_category_named_like_a_message_group_is_shown_by_another_label_and_keeps_its_value():
    assert page.shown_choices(["chat", "code"]) == [("chat", "chat"), ("code (programming)", "code")]


def test_no_label_or_choice_on_the_page_is_one_of_gradios_message_groups(tmp_path):
    """Gradio's browser side looks each label and choice up among its messages; one that names a group of
    them ("code", "status") makes the console warn on load."""
    demo = ui.build_demo(pair_loader=tiny_loader, presets=tiny_presets(tmp_path))
    try:
        shown = []
        for component in demo.config["components"]:
            props = component.get("props", {})
            shown += [props.get("label"), props.get("value") if component.get("type") == "button" else None]
            shown += [choice[0] if isinstance(choice, (list, tuple)) else choice for choice in props.get("choices") or []]
        words = {text for text in shown if isinstance(text, str)}
        assert "code (programming)" in words and "status_line" in words  # the two that collided
        assert words & page.GRADIO_MESSAGE_GROUPS == set()
    finally:
        demo.close()
