"""Runs the test tiers in order and keeps what each took: ``python -m tests.support.tier_run``.

    quick   lint (ruff) and types (mypy on the public API), then the unit tier on its own (only
            its files collected, so that TensorFlow imported by any of them fails it), then the
            fast, cli and canary tests side by side; fails when it takes more than
            ``--quick-budget`` seconds (300: a contributor's five minutes on 2 cores)
    rest    the slow and system tests that are not canaries
    all     quick, then rest (`make test`, `.ci/run`)

Each pytest phase writes a JUnit file ``test-results/<phase>.xml`` (every test's duration) and
the run ends with ``test-results/durations.txt``: each phase's wall time and its slowest tests.
The tiers are defined in ``tests/conftest.py`` (TIER_OF_PATH, CANARIES).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "test-results"   # --results moves it
# The public API the type checker holds: what `import tuner` exports and the two packages a
# user's code calls (applying a config, tuning from Python).
TYPED = ["tuner/__init__.py", "tuner/apply", "tuner/api"]
LINTED = ["tuner", "tests", "benchmarks", "examples"]


def _pytest(name: str, marks: str, workers: int, results: Path,
            extra: list[str]) -> list[str]:
    command = [sys.executable, "-m", "pytest", "-q", "-m", marks, *extra,
               f"--junitxml={results}/{name}.xml", "-o", "junit_family=xunit1",
               "-p", "no:cacheprovider"]
    if workers > 1:
        command += ["-n", str(workers), "--dist", "loadscope"]
    else:
        command += ["-p", "no:xdist"]
    return command


def _phases(tier: str, workers: int, static: bool, results: Path,
            extra: list[str]) -> list[tuple[str, list[str], dict]]:
    checks = [("lint", [sys.executable, "-m", "ruff", "check", *LINTED], {}),
              ("types", [sys.executable, "-m", "mypy", *TYPED], {})] if static else []
    quick = [
        *checks,
        ("unit", _pytest("unit", "unit", 1, results, extra), {"PT_UNIT_ONLY": "1"}),
        ("quick", _pytest("quick", "fast or cli or canary", workers, results, extra), {}),
    ]
    rest = [("rest", _pytest("rest", "(slow or system) and not canary", workers,
                                 results, extra), {})]
    return {"quick": quick, "rest": rest, "all": quick + rest}[tier]


def _slowest(junit: Path, count: int) -> list[tuple[float, str]]:
    if not junit.exists():
        return []
    cases = []
    for case in ElementTree.parse(junit).iter("testcase"):
        name = f"{case.get('file') or case.get('classname')}::{case.get('name')}"
        cases.append((float(case.get("time") or 0.0), name))
    return sorted(cases, reverse=True)[:count]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.tier_run",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("tier", choices=["quick", "rest", "all"], nargs="?", default="all")
    parser.add_argument("--workers", type=int, default=int(os.environ.get("TEST_WORKERS", 2)),
                        help="pytest-xdist workers for the parallel phases (default 2)")
    parser.add_argument("--quick-budget", type=float,
                        default=float(os.environ.get("QUICK_BUDGET_S", 300)),
                        help="seconds the quick tier may take (default 300; 0: no budget)")
    parser.add_argument("--no-static", dest="static", action="store_false",
                        help="leave out lint and types (the code's, not the environment's: "
                             "`make test-lowest` runs the tests alone at the declared floors)")
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="where the JUnit files and durations.txt go (default test-results)")
    parser.add_argument("--ignore", action="append", default=[], metavar="PATH",
                        help="a test file or folder to leave out (pytest's --ignore); again "
                             "for more")
    args = parser.parse_args(argv)
    results = args.results if args.results.is_absolute() else ROOT / args.results
    results.mkdir(parents=True, exist_ok=True)
    walls: dict[str, float] = {}
    failed: list[str] = []
    quick_started = time.monotonic()
    for name, command, env in _phases(args.tier, args.workers, args.static, results,
                                     [f"--ignore={path}" for path in args.ignore]):
        print(f"\n== {name}: {' '.join(command[1:])}", flush=True)
        started = time.monotonic()
        code = subprocess.call(command, cwd=ROOT, env={**os.environ, **env})
        walls[name] = time.monotonic() - started
        print(f"== {name}: exit {code} in {walls[name]:.0f} s", flush=True)
        if code != 0:
            failed.append(name)
            if name in ("lint", "types", "unit"):
                break   # the cheap checks first: a failure there is the contributor's next step
        if name == "quick":
            walls["quick tier"] = time.monotonic() - quick_started
    lines = [f"{name:>10}: {wall:7.1f} s" for name, wall in walls.items()]
    for phase in ("unit", "quick", "rest"):
        slowest = _slowest(results / f"{phase}.xml", 10)
        if slowest:
            lines.append(f"\nslowest of {phase}:")
            lines += [f"  {seconds:7.1f} s  {name}" for seconds, name in slowest]
    (results / "durations.txt").write_text("\n".join(lines) + "\n")
    print("\n" + "\n".join(lines))
    quick_wall = walls.get("quick tier")
    if quick_wall is not None and 0 < args.quick_budget < quick_wall:
        print(f"\nthe quick tier took {quick_wall:.0f} s, over its budget of "
              f"{args.quick_budget:.0f} s: move what made it slow to the slow tier "
              "(tests/conftest.py TIER_OF_PATH) or make it faster", flush=True)
        failed.append("quick budget")
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
