"""The README's table of the agent's settings is the one built from their declarations in agent/config.py.

After adding or changing a setting, rewrite the table with `python tests/agent/test_settings_doc.py`.
"""

from pathlib import Path

from gpulens.agent.config import SETTINGS

README = Path(__file__).resolve().parents[2] / "README.md"
BEGIN = "<!-- settings table: generated from agent/config.py by `python tests/agent/test_settings_doc.py` -->\n\n"
END = "\n<!-- end of the settings table -->\n"


def settings_table() -> str:
    """Return the markdown table: one row per setting, with its flag, variable, file key, default and help."""
    rows = [
        "| flag | environment | config file | default | what it sets |",
        "|---|---|---|---|---|",
        "| `--config.file PATH` | `GPULENS_CONFIG_FILE` | | none | a YAML file with any of the settings below |",
    ]
    for s in SETTINGS.values():
        flag = f"`{s.flag} {s.metavar}`" if s.metavar else f"`{s.flag}`, `--no-{s.flag[2:]}`"
        section, _, key = s.file_key.partition(".")
        in_file = f"`{section}: {{{key}: ...}}`" if key else f"`{section}: ...`"
        default = s.shown_default or (f"`{s.default}`" if s.default else "none")
        rows.append(f"| {flag} | `{s.env}` | {in_file} | {default} | {s.help} |")
    rows.append(
        "| `--collector.NAME`, `--no-collector.NAME` | `GPULENS_COLLECTOR_NAME` | `collectors: {NAME: true}` "
        "| see [metrics](docs/metrics.md) | switch one collector on or off |"
    )
    return "\n".join(rows) + "\n"


def _parts(text: str) -> tuple[str, str, str]:
    """Return (before, table, after) around the generated table."""
    before, begin, rest = text.partition(BEGIN)
    table, end, after = rest.partition(END)
    assert begin and end, f"README.md lacks the lines {BEGIN.strip()} and {END.strip()} around the settings table"
    return before, table, after


def test_the_readme_table_is_the_declared_settings():
    _, table, _ = _parts(README.read_text(encoding="utf-8"))
    assert table == settings_table(), "README.md's settings table is stale: run python tests/agent/test_settings_doc.py"


if __name__ == "__main__":
    before, _, after = _parts(README.read_text(encoding="utf-8"))
    README.write_text(before + BEGIN + settings_table() + END + after, encoding="utf-8")
