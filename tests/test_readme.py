"""The README speaks to users: it stays short, holds no study tables, and every command and import it
shows is one the package has (the command lines parse with the real parser, the names import)."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def code_blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def command_lines(text: str) -> list[list[str]]:
    """The `rltok ...` commands of a document's bash blocks (comments and continuations handled)."""
    out = []
    for block in code_blocks(text, "bash"):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split(" #")[0].strip()
            line = re.sub(r"\$\{?\w+\}?", "1", line)  # shell variables: any value of theirs
            words = shlex.split(line) if line else []
            if "rltok" in words[:1] or words[:3] == ["-m", "rltok.cli", "train"]:
                out.append(words[1:])
            elif "-m" in words and "rltok.cli" in words:
                out.append(words[words.index("rltok.cli") + 1:])
    return out


def test_the_readme_is_a_users_page():
    assert len(README.splitlines()) <= 140
    assert "scaling-results:begin" not in README and "| flat bytes |" not in README  # no study tables
    for section in ("## Install", "## Python API", "## Presets", "## Adding a component", "## What we found"):
        assert section in README


@pytest.mark.parametrize("doc", ["README.md", "docs/SCALING.md"])
def test_every_command_shown_parses(doc):
    from rltok.cli import build_parser

    parser = build_parser()
    commands = command_lines((REPO / doc).read_text())
    assert commands
    for argv in commands:
        try:
            args, extra = parser.parse_known_args(argv)
        except SystemExit:  # pragma: no cover - the message says which
            pytest.fail(f"{doc}: `rltok {' '.join(argv)}` does not parse")
        assert not [a for a in extra if a.startswith("-")], f"{doc}: unknown flags in {argv}"


def test_every_name_the_python_example_imports_exists():
    import importlib

    for block in code_blocks(README, "python"):
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.ImportFrom):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name), f"{node.module}.{alias.name}"


def test_every_relative_link_of_the_docs_and_the_lab_resolves():
    docs = [REPO / "README.md", *(REPO / "docs").rglob("*.md"), *(REPO / "lab").glob("*.md"),
            *(REPO / "lab" / "notes").glob("*.md"), *(REPO / "lab" / "reports").glob("*.md")]
    broken = []
    for doc in docs:
        for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)", doc.read_text()):
            if not re.match(r"^[a-z]+:", target) and not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(REPO)} -> {target}")
    assert not broken, broken
