"""The mutation smoke: mutmut starts, runs a small sample of mutants, and the gate counts right.

The full mutation run (scripts/mutation.py) takes hours, so CI cannot run it; this keeps it from
rotting unseen, in about a minute of CPU (tox -e mutation-smoke):

1. mutmut copies into mutants/, where it runs the tests, every file they read: also_copy
   ([tool.mutmut]) holds every path of the copy the wheel's env runs the whole suite from (SUITE
   in scripts/check_dist.py), so a file a test starts reading fails there first, then here.
2. In a scratch copy of the repository (the checkout's mutants/, perhaps hours of results, is
   left alone), with the project's [tool.mutmut] but for two keys: the mutants are those of a
   planted module, whose fate is known in advance, and of the real modules of SAMPLE; the tests,
   the planted test module and the test modules that mirror SAMPLE's. scripts/mutation.py runs
   them on SQLite: mutmut collects its stats, runs the clean tests and the forced failure, then
   every mutant, each in a process of its own; then the gate. It fails here when mutmut cannot
   collect stats or run a mutant.
3. Every mutant has a verdict and a real one is killed; the planted module's mutants are killed,
   survive or have no tests exactly as planted; the gate classes each mutant as mutmut's own
   results do, counts each package from them, takes the listed equivalent for killed, and names
   the stale lines of the equivalents list.

    python scripts/mutation_smoke.py WORKDIR [--children 2]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections import Counter
from pathlib import Path

from check_dist import NOT_COPIED, SUITE
from mutation_gate import BARS, KILLED, NO_TESTS, SURVIVED, read_results

ROOT = Path(__file__).resolve().parent.parent
# What mutmut copies into mutants/ whatever also_copy says (mutmut/configuration.py).
COPIED_BY_MUTMUT = {"tests", "pyproject.toml", "setup.cfg"}
# The real sample: every mutant of these small modules, with the test modules that mirror them
# (tests/test_<module>.py), whose tests send requests through Django's test client. Each mutant
# is a pytest run in a process of its own that sets up a test database of its own, as in the
# full run: a second or two each, so the sample stays small.
SAMPLE = ("django_idempotency/http/credentials.py",)
PLANTED_MODULE = "django_idempotency/stores/mutation_smoke_planted.py"
PLANTED_TESTS = "tests/test_mutation_smoke_planted.py"
PLANTED_NAME = "django_idempotency.stores.mutation_smoke_planted"
# The planted module's package, where SAMPLE has no module: the gate's figures for it are the
# planted mutants' alone, and its planted survivors put it under the bar.
PLANTED_PACKAGE = "stores"

PLANTED_SOURCE = '''\
"""Planted by the mutation smoke in its scratch copy: the fate of each mutant is known."""

from __future__ import annotations


def checked_total(first: int, second: int) -> int:
    """Its test checks every answer: each of its mutants is killed."""
    return first + second


def unchecked_total(first: int, second: int) -> int:
    """Its test calls it and checks nothing: each of its mutants survives."""
    return first - second + 1


def untested_total(first: int, second: int) -> int:
    """No test calls it: no test reaches its mutants."""
    return first * second
'''

PLANTED_TEST_SOURCE = '''\
"""The planted module's tests (the mutation smoke): one checks, one only calls."""

from __future__ import annotations

import contextlib

from django_idempotency.stores import mutation_smoke_planted as planted


def test_checked_total_is_checked() -> None:
    assert planted.checked_total(3, 5) == 8


def test_unchecked_total_is_only_called() -> None:
    with contextlib.suppress(Exception):
        planted.unchecked_total(3, 5)
'''

# mutmut's words for its verdicts (`mutmut results --all true`), against the gate's classes.
MUTMUT_KILLED = {"killed", "timeout", "caught by type check"}


class SmokeFailure(Exception):
    """The mutation tooling is broken: the message says where and what to do."""


def check_also_copy(mutmut: dict[str, object]) -> None:
    also_copy = mutmut.get("also_copy", [])
    assert isinstance(also_copy, list)
    if missing := sorted(set(SUITE) - set(also_copy) - COPIED_BY_MUTMUT):
        raise SmokeFailure(
            f"mutmut does not copy {missing} into mutants/, where its tests run, but the whole"
            " suite is run from a copy that holds them (SUITE in scripts/check_dist.py): add them"
            " to also_copy in [tool.mutmut] (pyproject.toml)."
        )


def mirrored_tests(module: str) -> str:
    tests = f"tests/test_{Path(module).stem}.py"
    for path in (module, tests):
        if not (ROOT / path).is_file():
            raise SmokeFailure(
                f"{path} is gone: name another small module with a test module that mirrors it"
                " in SAMPLE (scripts/mutation_smoke.py)."
            )
    return tests


def copy_repository(scratch: Path) -> None:
    shutil.rmtree(scratch, ignore_errors=True)
    shutil.copytree(ROOT, scratch, ignore=shutil.ignore_patterns(*NOT_COPIED, "mutants"))
    (scratch / PLANTED_MODULE).write_text(PLANTED_SOURCE, encoding="utf-8")
    (scratch / PLANTED_TESTS).write_text(PLANTED_TEST_SOURCE, encoding="utf-8")


def narrow_configuration(scratch: Path, tests: list[str]) -> None:
    """The project's [tool.mutmut], but for which modules are mutated and which tests run."""
    pyproject = scratch / "pyproject.toml"
    text = pyproject.read_text(encoding="utf-8")
    for key, value in (
        ("only_mutate", [PLANTED_MODULE, *SAMPLE]),
        ("pytest_add_cli_args_test_selection", [PLANTED_TESTS, *tests]),
    ):
        text, found = re.subn(
            rf"^{key} = \[.*?\]$", f"{key} = {_toml_list(value)}", text, flags=re.M | re.S
        )
        if found != 1:
            raise SmokeFailure(f"[tool.mutmut] in pyproject.toml has no one `{key} = [...]`")
    pyproject.write_text(text, encoding="utf-8")
    narrowed = tomllib.loads(text)["tool"]["mutmut"]
    assert narrowed["only_mutate"] == [PLANTED_MODULE, *SAMPLE], narrowed


def _toml_list(values: list[str]) -> str:
    return "[" + ", ".join(f'"{value}"' for value in values) + "]"


def plant_equivalents(scratch: Path) -> dict[str, str]:
    """The scratch equivalents list: one true survivor, one killed mutant, one that never was.

    Returns the planted mutants by role; the gate must count the first as killed and call the
    other two stale.
    """
    planted = {
        "equivalent": f"{PLANTED_NAME}.x_unchecked_total__mutmut_1",
        "killed": f"{PLANTED_NAME}.x_checked_total__mutmut_1",
        "missing": f"{PLANTED_NAME}.x_untested_total__mutmut_999",
    }
    (scratch / "tests" / "mutation" / "equivalent.txt").write_text(
        "".join(
            f"{name} Planted by the mutation smoke ({role}).\n" for role, name in planted.items()
        ),
        encoding="utf-8",
    )
    return planted


def run_sample(scratch: Path, children: int) -> str:
    """scripts/mutation.py on SQLite in the scratch copy; its output, also shown as it comes."""
    packages = sorted({PLANTED_PACKAGE, *(Path(m).parent.name for m in SAMPLE)})
    command = [sys.executable, "scripts/mutation.py", "--databases", "sqlite"]
    command += ["--children", str(children), *packages]
    print("$", " ".join(command), flush=True)
    process = subprocess.Popen(
        command,
        cwd=scratch,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stdout is not None
    lines = []
    for line in process.stdout:
        # mutmut redraws its progress line with carriage returns: only the last state shows.
        shown = line.rsplit("\r", 1)[-1]
        lines.append(shown)
        print(shown, end="", flush=True)
    process.wait()
    output = "".join(lines)
    if "\nFAIL " not in output and not output.startswith("FAIL "):
        raise SmokeFailure(
            f"scripts/mutation.py stopped before the gate (exit {process.returncode}): see its"
            f" output above; it ran in {scratch}."
        )
    return output


def mutmut_verdicts(scratch: Path) -> dict[str, str]:
    """mutmut's own verdict of every mutant, as `mutmut results` prints it."""
    result = subprocess.run(
        ["mutmut", "results", "--all", "true"],
        cwd=scratch,
        capture_output=True,
        text=True,
        check=True,
    )
    verdicts = {}
    for line in result.stdout.splitlines():
        name, separator, verdict = line.strip().partition(": ")
        if separator:
            verdicts[name] = verdict
    return verdicts


def check_verdicts(scratch: Path, planted: dict[str, str]) -> None:
    results = read_results(scratch / "mutants")
    codes = {name: code for package in results.values() for name, code in package.items()}
    sampled = {name: code for name, code in codes.items() if not name.startswith(PLANTED_NAME)}
    unrun = sorted(name for name, code in codes.items() if code not in KILLED | SURVIVED | NO_TESTS)
    if unrun:
        raise SmokeFailure(f"mutmut gave no verdict (not run, suspicious, crashed) to {unrun}")
    if not sampled or not any(code in KILLED for code in sampled.values()):
        raise SmokeFailure(f"no mutant of {SAMPLE} was killed: {sampled}")

    by_function = {
        function: {n: c for n, c in codes.items() if n.startswith(f"{PLANTED_NAME}.x_{function}_")}
        for function in ("checked_total", "unchecked_total", "untested_total")
    }
    expected = {"checked_total": KILLED, "unchecked_total": SURVIVED, "untested_total": NO_TESTS}
    for function, mutants in by_function.items():
        wrong = {name: code for name, code in mutants.items() if code not in expected[function]}
        if not mutants or wrong:
            raise SmokeFailure(f"the planted {function}'s mutants are not as planted: {mutants}")
    if len(by_function["unchecked_total"]) < 2 or planted["equivalent"] not in codes:
        raise SmokeFailure(f"the planted unchecked_total has too few mutants: {by_function}")

    # The gate's classes against mutmut's own words for the same mutants.
    verdicts = mutmut_verdicts(scratch)
    if set(verdicts) != set(codes):
        raise SmokeFailure("`mutmut results` and the gate do not see the same mutants")
    for name, code in codes.items():
        if (code in KILLED) != (verdicts[name] in MUTMUT_KILLED) or (code in SURVIVED) != (
            verdicts[name] == "survived"
        ):
            raise SmokeFailure(f"{name}: the gate reads exit code {code}, mutmut says {verdicts}")


LINE = re.compile(
    r"^(?P<package>\w+) +(?P<scored>\d+)/(?P<total>\d+) killed = (?P<share>[\d.]+)% "
    r"\((?P<equivalent>\d+) equivalent; [\d.]+% without them\); (?P<survived>\d+) survived, "
    r"(?P<no_tests>\d+) without tests, (?P<other>\d+) not run or suspicious; bar (?P<bar>\d+)%$",
    re.M,
)


def check_gate(output: str, scratch: Path, planted: dict[str, str]) -> None:
    """The gate's figures, from what mutmut recorded, and the failures it must name."""
    codes = {
        name: code
        for package in read_results(scratch / "mutants").values()
        for name, code in package.items()
    }
    lines = {match["package"]: match for match in LINE.finditer(output)}
    packages = sorted({PLANTED_PACKAGE, *(Path(m).parent.name for m in SAMPLE)})
    if sorted(lines) != packages:
        raise SmokeFailure(f"the gate printed figures for {sorted(lines)}, not {packages}")

    for package, line in lines.items():
        mine = {n: c for n, c in codes.items() if n.startswith(f"django_idempotency.{package}.")}
        kinds = Counter(
            "killed" if code in KILLED else "survived" if code in SURVIVED else "no tests"
            for code in mine.values()
        )
        equivalent = int(planted["equivalent"] in mine)
        expected = {
            "scored": kinds["killed"] + equivalent,
            "total": len(mine),
            "equivalent": equivalent,
            "survived": kinds["survived"] - equivalent,
            "no_tests": kinds["no tests"],
            "other": 0,
            "bar": round(BARS[package] * 100),
        }
        printed = {key: int(line[key]) for key in expected}
        share = 100 * expected["scored"] / expected["total"]
        if printed != expected or line["share"] != f"{share:.1f}":
            raise SmokeFailure(f"the gate counts {package} as {line[0]!r}; expected {expected}")

    stale = [
        f"FAIL {planted['killed']} is listed as equivalent but is not a survivor: remove it",
        f"FAIL {planted['missing']} is listed as equivalent but mutmut has no such mutant",
        f"FAIL {PLANTED_PACKAGE}: ",  # Planted survivors: under the bar.
    ]
    if missing := [failure for failure in stale if failure not in output]:
        raise SmokeFailure(f"the gate did not say {missing}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workdir", type=Path, help="scratch folder (emptied first)")
    parser.add_argument("--children", type=int, default=2, help="mutants run at once")
    args = parser.parse_args()
    started = time.monotonic()
    mutmut = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mutmut"]
    scratch = args.workdir.resolve() / "repository"
    try:
        check_also_copy(mutmut)
        tests = [mirrored_tests(module) for module in SAMPLE]
        copy_repository(scratch)
        narrow_configuration(scratch, tests)
        planted = plant_equivalents(scratch)
        output = run_sample(scratch, args.children)
        check_verdicts(scratch, planted)
        check_gate(output, scratch, planted)
    except SmokeFailure as failure:
        print(f"MUTATION SMOKE FAILED: {failure}", file=sys.stderr)
        return 1
    seconds = time.monotonic() - started
    print(f"mutation smoke passed in {seconds:.0f} s (the FAIL lines above are the planted ones)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
