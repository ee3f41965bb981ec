"""The Python blocks of the user pages (README.md and docs/, contributor pages aside), as a
reader sees them, for tests/project/test_snippets.py (which runs them) and
tests/project/test_docs.py.

Every ```python block is run as it stands, in a fresh process, in an empty directory, unless
the HTML comment on the line before it says otherwise (invisible on GitHub and on the site):

- ``<!-- not run: REASON -->``: not run (a shape to fill in, not code);
- ``<!-- excerpt: PATH -->``: lines of PATH, a file a test runs; every line of the block must
  be in PATH, in order (a method, a fragment that needs its class around it);
- ``<!-- run: CLAUSE; CLAUSE -->``: run, with any of ``as NAME`` (the file the block is written
  to, default ``snippet.py``), ``with FILE`` (put beside it first: a file from ``GIVEN``, or
  an earlier block of the same page run ``as FILE``, the tutorial's task file) and
  ``then COMMAND`` (a shell command run instead of ``python NAME``, with the tuner's commands
  on the PATH).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Pages for contributors, not users: their code is not theirs to paste.
CONTRIBUTOR_PAGES = ("docs/ARCHITECTURE.md", "docs/contributing/")
MARKER = re.compile(r"^<!--\s*(not run|excerpt|run):\s*(.*?)\s*-->$")
# Files a block may ask for with ``<!-- run: with NAME -->``: a config as `tune` exports one.
GIVEN = {
    "best_precision.json": '{"schema_version": 1, "policy": "mixed_float16", '
                           '"loss_scale": {"kind": "dynamic"}, '
                           '"float32": {"groups": ["softmax"]}}\n',
}


@dataclass
class Block:
    page: str          # relative to the repository root
    line: int          # of the opening fence
    text: str
    kind: str = "run"  # run, not run, excerpt
    argument: str = ""  # the reason, the excerpt's path, or the run's clauses
    run_as: str = "snippet.py"
    given: dict[str, str] = field(default_factory=dict)   # file name -> its text
    then: str | None = None

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def user_pages() -> list[Path]:
    pages = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
    return [page for page in pages
            if not str(page.relative_to(ROOT)).startswith(CONTRIBUTOR_PAGES)]


def blocks_of(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    found, index = [], 0
    while index < len(lines):
        opening = lines[index].strip()
        if not re.fullmatch(r"```\s*(python|py)\b.*", opening):
            index += 1
            continue
        end = next((j for j in range(index + 1, len(lines)) if lines[j].strip() == "```"), None)
        assert end is not None, f"{page}:{index + 1}: a ```python block that is never closed"
        indent = len(lines[index]) - len(lines[index].lstrip())
        text = "\n".join(line[indent:] for line in lines[index + 1:end]) + "\n"
        block = Block(str(page.relative_to(ROOT)), index + 1, text)
        before = next((lines[j].strip() for j in range(index - 1, -1, -1) if lines[j].strip()),
                      "")
        marker = MARKER.match(before)
        if marker:
            block.kind, block.argument = marker.group(1), marker.group(2)
            if block.kind == "run":
                _clauses(block)
        elif before.startswith("<!--"):
            raise AssertionError(f"{block.where}: a comment before a block that is not a "
                                 f"marker (not run: / excerpt: / run:): {before}")
        found.append(block)
        index = end + 1
    for block in found:   # ``with NAME``: a given file, or an earlier block written as NAME
        for name in block.given:
            earlier = [b.text for b in found[:found.index(block)] if b.run_as == name]
            assert name in GIVEN or earlier, \
                f"{block.where}: with {name}: neither a given file nor an earlier block as {name}"
            block.given[name] = GIVEN.get(name) or earlier[-1]
    return found


def _clauses(block: Block) -> None:
    for clause in filter(None, (part.strip() for part in block.argument.split(";"))):
        word, _, rest = clause.partition(" ")
        if word == "as" and rest:
            block.run_as = rest.strip()
        elif word == "with" and rest.strip():
            block.given[rest.strip()] = ""
        elif word == "then" and rest:
            block.then = rest.strip()
        else:
            raise AssertionError(f"{block.where}: unknown run clause {clause!r} (as NAME, "
                                 f"with FILE, then COMMAND)")


def all_blocks() -> list[Block]:
    return [block for page in user_pages() for block in blocks_of(page)]


def in_order(lines: list[str], source: list[str]) -> bool:
    """Every line of ``lines`` (blank ones aside) in ``source``, in that order (indentation
    aside: an excerpted method is shown dedented)."""
    stripped, position = [s.strip() for s in source], 0
    for line in (line.strip() for line in lines if line.strip()):
        try:
            position = stripped.index(line, position) + 1
        except ValueError:
            return False
    return True
