"""Several generated tables in one markdown file, one `## NAME` section each, so a study with many
small variants tracks one file instead of one per variant. A script writes its section with
`put_section` (replacing the section of that name, or appending it); `sections` reads them back in
file order, e.g. for rltok_lab.regenerate to replay each section's command."""

from __future__ import annotations

from pathlib import Path


def sections(text: str) -> dict[str, str]:
    """{name: body} of every `## name` section, in file order; the body without its heading line."""
    out: dict[str, str] = {}
    name = None
    for line in text.splitlines(keepends=True):
        if line.startswith("## "):
            name = line[3:].strip()
            out[name] = ""
        elif name is not None:
            out[name] += line
    return {k: v.strip("\n") + "\n" for k, v in out.items()}


def put_section(path: Path, name: str, body: str, preamble: str) -> None:
    """Write `body` as section `name` of the file at `path`, keeping every other section and their
    order; a new file starts with `preamble`, a new section goes last."""
    text = path.read_text() if path.exists() else preamble.rstrip("\n") + "\n"
    head = text.split("\n## ", 1)[0].rstrip("\n") + "\n" if not text.startswith("## ") else ""
    parts = sections(text)
    parts[name] = body.strip("\n") + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head + "".join(f"\n## {k}\n\n{v}" for k, v in parts.items()))


def commanded_table(script: str, argv: list[str], lines: list[str], out: str | None) -> str:
    """A script's markdown table under the command that made it (`python lab/scripts/SCRIPT ARGS`),
    printed and, with `out`, written there; the text."""
    command = " ".join(["python", f"lab/scripts/{script}", *argv])
    text = f"Command: `{command}`\n\n" + "\n".join(lines) + "\n"
    print(text)
    if out:
        Path(out).write_text(text)
    return text
