"""Every Python block on a user page runs as a reader would paste it: the block's exact text,
written to a file in an empty directory and run by a fresh interpreter (``python snippet.py``),
nothing shared between blocks. A block that is not meant to run says so in the comment before
it, and an excerpt is checked line by line against the file it comes from (the markers:
tests/support/snippets.py). Blocks with the same text on several pages run once, named by all of
them.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.snippets import ROOT, all_blocks, in_order

BLOCKS = all_blocks()
TIMEOUT_S = 300


def _runs():
    by_text: dict[str, list] = {}
    for block in BLOCKS:
        if block.kind == "run":
            by_text.setdefault(block.text, []).append(block)
    return [pytest.param(blocks, id=blocks[0].where) for blocks in by_text.values()]


def test_the_pages_have_python_blocks_and_most_of_them_run():
    runs = [block for block in BLOCKS if block.kind == "run"]
    assert len(runs) >= 6 and len(runs) > len(BLOCKS) // 2, [b.where for b in BLOCKS]


def test_a_block_not_run_says_why_and_an_excerpt_is_its_files_lines_in_order():
    for block in BLOCKS:
        assert "--8<--" not in block.text, \
            f"{block.where}: an include shows as a raw line on GitHub: write the code itself"
        if block.kind == "not run":
            assert len(block.argument) >= 10, f"{block.where}: say why it is not run"
        elif block.kind == "excerpt":
            source = ROOT / block.argument
            assert source.is_file(), f"{block.where}: no file {block.argument}"
            assert in_order(block.text.splitlines(), source.read_text().splitlines()), \
                f"{block.where}: the block is not {block.argument}'s lines, in order"


@pytest.mark.slow
@pytest.mark.parametrize("blocks", _runs())
def test_the_block_runs_as_pasted(blocks, tmp_path):
    block = blocks[0]
    (tmp_path / block.run_as).write_text(block.text)
    for name, text in block.given.items():
        (tmp_path / name).write_text(text)
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": bin_dir + os.pathsep + os.environ["PATH"],
           "TF_CPP_MIN_LOG_LEVEL": "2"}
    command = block.then if block.then else f"{sys.executable} {block.run_as}"
    try:
        done = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{', '.join(b.where for b in blocks)}: still running after {TIMEOUT_S} s")
    assert done.returncode == 0, (f"{', '.join(b.where for b in blocks)}: the block fails as "
                                  f"pasted (exit {done.returncode}):\n{done.stdout[-2000:]}\n"
                                  f"{done.stderr[-3000:]}")
