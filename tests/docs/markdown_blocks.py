"""The fenced code blocks of the project's Markdown files, and the claims the doc tests make.

A block's info string says what it is (tests/docs/__init__.py): `sh`/`bash`/`shell` hold
commands, `console` a transcript (`$ ` commands, each followed by what it prints), anything
else (`text`, `json`, `python`, ...) is not a shell block. A shell block is either claimed
by a test in tests/docs (`claim(...)`, at a module's top level) or begins with the visible
line `# not run by tests: <reason>`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHELL_LANGS = frozenset({"sh", "bash", "shell", "console"})
NOT_RUN = re.compile(r"^#\s*not run by tests:\s*(?P<reason>\S.*)$")
_FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)(?P<info>.*)$")
_HEADING = re.compile(r"^#{1,6}\s+(?P<text>.+?)\s*#*\s*$")


@dataclass(frozen=True, slots=True)
class Command:
    """One command as a shell reads it: continuation lines kept (`text` runs as is)."""

    text: str
    line: int  # 1-based line in the doc
    context: str  # the last comment line above it in the block ("" if none)
    output: tuple[str, ...] = ()  # console blocks: the lines printed after it

    @property
    def first_line(self) -> str:
        return self.text.split("\n", 1)[0].strip()


@dataclass(frozen=True, slots=True)
class Block:
    doc: str  # path relative to the repository root
    line: int  # 1-based line of the opening fence
    heading: str  # the nearest heading above, without the #'s
    lang: str  # the info string's first word ("" for a bare fence)
    lines: tuple[str, ...] = field(repr=False)

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line} ({self.heading!r})"

    @property
    def is_shell(self) -> bool:
        return self.lang in SHELL_LANGS

    @property
    def not_run_reason(self) -> str | None:
        first = next((line.strip() for line in self.lines if line.strip()), "")
        match = NOT_RUN.match(first)
        return match["reason"] if match else None

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def commands(self) -> list[Command]:
        return _console_commands(self) if self.lang == "console" else _sh_commands(self)

    def command(self, first: str) -> Command:
        """The one command whose first line starts with `first`."""
        found = [c for c in self.commands() if c.first_line.startswith(first)]
        if len(found) != 1:
            raise LookupError(f"{self.where}: {len(found)} commands start with {first!r}")
        return found[0]


def _sh_commands(block: Block) -> list[Command]:
    commands: list[Command] = []
    context = ""
    i = 0
    while i < len(block.lines):
        line = block.lines[i]
        stripped = line.strip()
        if not stripped:
            i += 1
            continue
        if stripped.startswith("#"):
            context = stripped
            i += 1
            continue
        start = i
        while block.lines[i].rstrip().endswith("\\") and i + 1 < len(block.lines):
            i += 1
        text = "\n".join(block.lines[start : i + 1])
        commands.append(Command(text, block.line + 1 + start, context))
        i += 1
    return commands


def _console_commands(block: Block) -> list[Command]:
    commands: list[Command] = []
    i = 0
    while i < len(block.lines):
        if not block.lines[i].startswith("$ "):
            i += 1
            continue
        start = i
        parts = [block.lines[i][2:]]
        while parts[-1].rstrip().endswith("\\") and i + 1 < len(block.lines):
            i += 1
            parts.append(block.lines[i])
        i += 1
        out_start = i
        while i < len(block.lines) and not block.lines[i].startswith("$ "):
            i += 1
        output = tuple(block.lines[out_start:i])
        commands.append(Command("\n".join(parts), block.line + 1 + start, "", output))
    return commands


def blocks(doc: str) -> list[Block]:
    """Every fenced block of `doc` (a path relative to the repository root)."""
    lines = (REPO / doc).read_text().split("\n")
    found: list[Block] = []
    heading = ""
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if match is None:
            head = _HEADING.match(lines[i])
            if head:
                heading = head["text"]
            i += 1
            continue
        indent, fence = len(match["indent"]), match["fence"]
        end = i + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        if end == len(lines):
            raise ValueError(f"{doc}:{i + 1}: unclosed code fence")
        pad = " " * indent
        body = tuple(
            line[indent:] if line.startswith(pad) else line.lstrip() for line in lines[i + 1 : end]
        )
        lang = match["info"].strip().split(" ", 1)[0]
        found.append(Block(doc, i + 1, heading, lang, body))
        i = end + 1
    return found


def documented_files() -> list[str]:
    """The Markdown files whose shell blocks are promises: the README and docs/."""
    return ["README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md"))]


# Claims: (doc, line of the block's fence) -> the test modules that run it.
CLAIMS: dict[tuple[str, int], set[str]] = {}


def claim(doc: str, heading: str, first: str, *, by: str) -> Block:
    """The shell block of `doc` under `heading` whose first command starts with `first`,
    registered as run by module `by` (pass `__name__`). Fails at import if the doc changed
    so that no block, or more than one, matches: the test must follow the doc."""
    matches = [
        b
        for b in blocks(doc)
        if b.heading == heading and b.is_shell and b.commands()
        and b.commands()[0].first_line.startswith(first)
    ]
    if len(matches) != 1:
        raise LookupError(
            f"{doc}: {len(matches)} shell blocks under {heading!r} begin with {first!r}"
        )
    block = matches[0]
    CLAIMS.setdefault((block.doc, block.line), set()).add(by)
    return block
