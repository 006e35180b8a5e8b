"""Everything an AppTest run put on the page, as text: every element's message, charts and tables included."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest


def everything(at: AppTest) -> str:
    """Return the text form of every element and block in the run's tree, sidebar included."""
    parts: list[str] = []

    def walk(node) -> None:
        proto = getattr(node, "proto", None)
        if proto is not None:
            parts.append(str(proto))
        for child in getattr(node, "children", {}).values():
            walk(child)

    walk(at._tree)
    return "\n".join(parts)
