"""The documentation site: it builds strictly (a broken link, a missing reference or a page left
out of the navigation fails), its CLI reference is the parser's, and every piece of Python on a
user page and in the README is run as pasted (tests/project/test_snippets.py) or says why not; an
excerpt is checked against a file a test runs, so no snippet can rot."""

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.support.snippets import all_blocks, blocks_of, user_pages

# Files a page may show an excerpt of (``<!-- excerpt: PATH -->``), and the test that runs each.
TESTED_EXAMPLES = {
    "examples/from_python.py":
        "tests/api/test_python_api.py::test_a_model_defined_in_main_tunes_and_its_pick_applies",
    "examples/apply_config.py": "tests/project/test_docs.py::test_the_apply_example_runs_as_shown",
    "examples/dcgan.py": "tests/e2e/test_own_compile_e2e.py::test_the_guides_gan_tunes_end_to_end",
    "examples/gan_loop.py":
        "tests/e2e/test_custom_loop_e2e.py::"
        "test_the_gan_loop_example_tunes_and_then_trains_guarded_under_its_pick",
}


def _build(root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
                          cwd=root, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    built = _build(ROOT, site)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return site


def _text(html_file: Path) -> str:
    import html

    return html.unescape(re.sub(r"<[^>]+>", "", html_file.read_text()))


def test_the_cli_reference_holds_every_command_and_flag_of_the_parser(site):
    import argparse

    from tuner.cli.app import build_parser

    page = _text(site / "reference" / "cli" / "index.html")
    seen = []

    def walk(parser, name):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, subparser in action.choices.items():
                    walk(subparser, f"{name} {sub}")
            elif action.help != argparse.SUPPRESS:
                seen.extend(action.option_strings)
                for flag in action.option_strings:
                    assert flag in page, (name, flag)
        assert name in page, name

    walk(build_parser(), "precision-tuner")
    assert "--keep-slow-policies" in seen and "--against" in seen   # tune's and train's


def test_the_api_reference_is_generated_from_the_docstrings(site):
    page = _text(site / "reference" / "api" / "index.html")
    for name in ("PrecisionConfig", "wrap_optimizer", "PrecisionGuard", "GuardError",
                 "GuardEvent", "TuneResult", "load_result"):
        assert name in page, name
    from tuner import PrecisionConfig

    docstring = PrecisionConfig.guard.__doc__.replace("`", "")   # ``x`` renders as code
    assert " ".join(docstring.split()[:6]) in " ".join(page.split())


def _copy_of_the_docs(tmp_path: Path) -> Path:
    """The site's sources in ``tmp_path`` (the code it reads linked, not copied)."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    for name in ("examples", "tuner", "CHANGELOG.md"):
        (tmp_path / name).symlink_to(ROOT / name)
    return tmp_path


@pytest.mark.parametrize("breakage, said", [
    # Two of the three builds in the slow tier: the quick tier keeps its five minutes.
    pytest.param("link", "the target 'how-to/no-such-page.md' is not found among documentation "
                 "files", marks=pytest.mark.slow),
    pytest.param("nav", "are not included in the \"nav\" configuration",
                 marks=pytest.mark.slow),
    ("snippet", "Snippet at path 'examples/no_such_example.py' could not be found"),
])
def test_a_broken_link_a_page_outside_the_nav_or_a_missing_snippet_fails_the_build(
        tmp_path, breakage, said):
    root = _copy_of_the_docs(tmp_path / "src")
    if breakage == "link":
        page = root / "docs" / "how-to" / "resume.md"
        page.write_text(page.read_text() + "\nSee [nowhere](no-such-page.md).\n")
    elif breakage == "nav":
        (root / "docs" / "orphan.md").write_text("# An orphan\n")
    else:
        page = root / "docs" / "how-to" / "apply.md"
        page.write_text(page.read_text() + '\n```python\n--8<-- "examples/no_such_example.py"\n'
                                           '```\n')
    built = _build(root, tmp_path / "site")
    assert built.returncode != 0
    assert said in " ".join((built.stdout + built.stderr).split())


def test_every_python_block_on_a_user_page_runs_or_is_an_excerpt_or_says_why_not():
    blocks = all_blocks()
    assert blocks
    for block in blocks:
        assert block.kind in ("run", "not run", "excerpt"), block.where
        if block.kind == "excerpt":
            assert block.argument in TESTED_EXAMPLES, \
                f"{block.where}: {block.argument} is run by no test (TESTED_EXAMPLES)"
    for page in user_pages():   # GitHub shows an include as its raw line
        assert "--8<--" not in page.read_text(), \
            f"{page}: an --8<-- include shows as a raw line on GitHub: write the code itself"


def test_every_tested_example_names_a_test_that_exists_and_runs_it():
    """Each TESTED_EXAMPLES entry is a node id whose test is defined in its file (read as
    source: collecting it would import TensorFlow) and whose own code names the example, so a
    renamed test or one that stopped running the example fails here, not silently.
    Mutation caught: the test that runs examples/from_python.py renamed
    (tests/api/test_python_api.py)."""
    for example, node in TESTED_EXAMPLES.items():
        assert (ROOT / example).is_file(), f"TESTED_EXAMPLES: {example} does not exist"
        path, *names = node.split("::")
        assert (ROOT / path).is_file(), f"TESTED_EXAMPLES[{example!r}]: no file {path}"
        scope: list[ast.stmt] = ast.parse((ROOT / path).read_text()).body
        found = None
        for name in names:   # a class, then its test; or the test at the top
            found = next((item for item in scope if getattr(item, "name", None) == name), None)
            assert found is not None, f"TESTED_EXAMPLES[{example!r}]: {node} does not exist " \
                                      f"({name} is not defined in {path})"
            scope = getattr(found, "body", [])
        assert isinstance(found, (ast.FunctionDef, ast.AsyncFunctionDef)) \
            and found.name.startswith("test_"), f"{node} is not a test"
        source = ast.get_source_segment((ROOT / path).read_text(), found)
        assert Path(example).name in source, \
            f"TESTED_EXAMPLES[{example!r}]: {node} does not name {Path(example).name}"


def test_the_readme_is_short_and_its_python_blocks_run_as_pasted():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    assert "make demo" in readme and "make test" in readme      # the two quick-start commands
    blocks = blocks_of(ROOT / "README.md")
    assert len(blocks) >= 2 and {block.kind for block in blocks} == {"run"}, \
        [(block.where, block.kind) for block in blocks]


@pytest.mark.slow
def test_the_apply_example_runs_as_shown(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "apply_config.py")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "applied mixed_bfloat16: 0 guard events" in done.stdout
    from tuner import PrecisionConfig

    assert PrecisionConfig.load(tmp_path / "repaired.json").policy == "mixed_bfloat16"


def test_the_benchmark_plots_on_the_site_are_their_results_files(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("plots", ROOT / "benchmarks" / "plots.py")
    plots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plots)
    drawn = plots.render(out=tmp_path)
    assert drawn
    for image in drawn:
        committed = ROOT / "docs" / "img" / "benchmarks" / image.name
        assert committed.read_bytes() == image.read_bytes(), \
            f"{committed} is not its results file's: run python benchmarks/plots.py"
        overview = (ROOT / "docs" / "benchmarks-overview.md").read_text()
        assert f"img/benchmarks/{image.name}" in overview


def test_the_exit_code_table_is_what_the_command_line_returns(tmp_path, monkeypatch):
    """reference/cli.md's table of exit codes lists the codes ``precision-tuner`` returns, and
    each is returned where the table says."""
    from tuner.cli import app, commands
    from tuner.errors import ServiceOutage, TaskError, TunerError, UsageError

    page = (ROOT / "docs" / "reference" / "cli.md").read_text()
    table = page[page.index("## Exit codes"):page.index("<!-- cli-reference -->")]
    assert [int(code) for code in re.findall(r"^\| (\d+) \|", table, re.M)] == [0, 1, 2, 3, 130]

    def raising(error):
        def command(args):
            raise error
        return command

    for error, code in ((TunerError("x"), 1), (ServiceOutage("x"), 1), (UsageError("x"), 2),
                        (TaskError("x"), 2), (KeyboardInterrupt(), 130)):
        monkeypatch.setattr(commands, "spaces", raising(error))
        assert app.main(["spaces"]) == code, error
    assert app.main([]) == 2                                       # no command: the help
    for argv, code in ((["--no-such-flag"], 2), (["--version"], 0), (["tune", "--help"], 0)):
        with pytest.raises(SystemExit) as exited:
            app.main(argv)
        assert exited.value.code == code, argv
    assert app.main(["service", "status", "--dir", str(tmp_path)]) == 3
    assert app.main(["service", "stop", "--dir", str(tmp_path)]) == 0
    task, config = tmp_path / "task.py", tmp_path / "best.json"
    task.write_text("")
    monkeypatch.setattr(commands, "require_tensorflow", lambda: None)
    for worse, code in ((True, 1), (False, 0)):
        monkeypatch.setattr(commands, "train_guarded",
                            lambda *args, worse=worse, **kwargs: {"verdict": {"worse": worse}})
        assert app.main(["train", str(task), "--config", str(config),
                         "--against", "float32"]) == code


def test_no_two_paths_of_the_repository_differ_only_by_case():
    """macOS and Windows file systems ignore case: two such paths collide in a checkout (as
    docs/benchmarks.md and docs/BENCHMARKS.md did), and so would their pages in a built site."""
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.splitlines()
    paths = {str(Path(*Path(name).parts[:depth])) for name in listed
             for depth in range(1, len(Path(name).parts) + 1)}
    by_case: dict[str, set[str]] = {}
    for path in paths:
        by_case.setdefault(path.lower(), set()).add(path)
    assert not [sorted(same) for same in by_case.values() if len(same) > 1]
