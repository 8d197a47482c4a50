"""The mutation-testing gate: the killed share of mutmut's mutants per package, against its bar.

Reads the results mutmut leaves in ``mutants/`` (one ``<module>.py.meta`` JSON file per mutated
module, the same data ``mutmut results`` prints) and the list of equivalent mutants
(``tests/mutation/equivalent.txt``), prints one line per package, and exits non-zero when a
package is under its bar, when a package has mutants not yet run, or when the list of equivalent
mutants names one that does not survive (a stale line). Usage, after ``mutmut run``:

    python scripts/mutation_gate.py            # every package
    python scripts/mutation_gate.py core       # only these (after a partial run)
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MUTANTS = ROOT / "mutants"
EQUIVALENTS = ROOT / "tests" / "mutation" / "equivalent.txt"

# The killed share each package must reach, equivalent mutants counted as killed.
BARS = {"core": 0.95, "stores": 0.85, "http": 0.85}

# mutmut's exit codes (mutmut/stats.py). A mutant the tests notice is killed: a failing test,
# pytest's internal error, a run past its time limit (the mutant hangs: a test would notice), or
# a mutant mypy rejects. Every other verdict counts against the score.
KILLED = {1, 3, 36, 24, -24, 152, 255, 37}
SURVIVED = {0}
NO_TESTS = {5, 33}
# What the others mean, for the list of mutants without a verdict.
_VERDICTS = {None: "not run", 2: "interrupted", 34: "skipped", 35: "suspicious"}


@dataclass
class Score:
    killed: int = 0
    survived: list[str] = field(default_factory=list)
    no_tests: list[str] = field(default_factory=list)
    other: list[str] = field(default_factory=list)  # Not run yet, suspicious, interrupted, ...
    equivalent: int = 0

    @property
    def total(self) -> int:
        return (
            self.killed
            + self.equivalent
            + len(self.survived)
            + len(self.no_tests)
            + len(self.other)
        )

    def share(self, *, with_equivalents: bool) -> float:
        killed = self.killed + (self.equivalent if with_equivalents else 0)
        return killed / self.total if self.total else 0.0


def read_equivalents(path: Path) -> dict[str, str]:
    """``<mutant id> <reason>`` per line; blank lines and ``#`` comments are skipped."""
    equivalents: dict[str, str] = {}
    if not path.exists():
        return equivalents
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, _, reason = line.partition(" ")
        if not reason.strip():
            sys.exit(
                f"{path}:{number}: {name} has no reason: say in one line why it is equivalent."
            )
        if name in equivalents:
            sys.exit(f"{path}:{number}: {name} is listed twice.")
        equivalents[name] = reason.strip()
    return equivalents


def read_results(mutants: Path) -> dict[str, dict[str, int | None]]:
    """Exit code per mutant id, per package (``core``, ``stores``, ``http``)."""
    results: dict[str, dict[str, int | None]] = {package: {} for package in BARS}
    for meta in sorted((mutants / "django_idempotency").rglob("*.py.meta")):
        package = meta.relative_to(mutants / "django_idempotency").parts[0]
        if package in results:
            results[package].update(
                json.loads(meta.read_text(encoding="utf-8"))["exit_code_by_key"]
            )
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="*", help=f"some of {', '.join(BARS)} (default: all)")
    parser.add_argument("--mutants", type=Path, default=MUTANTS)
    parser.add_argument("--equivalents", type=Path, default=EQUIVALENTS)
    args = parser.parse_args(argv)
    packages = args.packages or list(BARS)
    if unknown := set(packages) - set(BARS):
        parser.error(f"unknown packages {sorted(unknown)}: choose from {', '.join(BARS)}")

    if not args.mutants.is_dir():
        print(f"No {args.mutants}: run `mutmut run --max-children 1` first.")
        return 2
    results = read_results(args.mutants)
    equivalents = read_equivalents(args.equivalents)
    failures: list[str] = []

    known = {name: code for package in results.values() for name, code in package.items()}
    for name in equivalents:
        if name not in known:
            failures.append(f"{name} is listed as equivalent but mutmut has no such mutant")
        elif known[name] not in SURVIVED and known[name] is not None:
            failures.append(f"{name} is listed as equivalent but is not a survivor: remove it")

    for package in packages:
        score = Score()
        for name, code in results[package].items():
            if code in KILLED:
                score.killed += 1
            elif code in SURVIVED and name in equivalents:
                score.equivalent += 1
            elif code in SURVIVED:
                score.survived.append(name)
            elif code in NO_TESTS:
                score.no_tests.append(name)
            else:
                score.other.append(name)
        with_equivalents = score.share(with_equivalents=True)
        print(
            f"{package:7} {score.killed + score.equivalent}/{score.total} killed"
            f" = {with_equivalents:.1%} ({score.equivalent} equivalent;"
            f" {score.share(with_equivalents=False):.1%} without them)"
            f"; {len(score.survived)} survived, {len(score.no_tests)} without tests,"
            f" {len(score.other)} not run or suspicious; bar {BARS[package]:.0%}"
        )
        for name in score.survived:
            print(f"    survived: {name}")
        for name in score.no_tests:
            print(f"    no tests: {name}")
        for name in score.other:
            print(f"    no verdict ({_VERDICTS.get(results[package][name], 'crashed')}): {name}")
        if not score.total:
            failures.append(f"{package}: no mutants: run `mutmut run` first")
        elif score.other:
            failures.append(
                f"{package}: {len(score.other)} mutants without a verdict: finish `mutmut run`, or"
                " run each again (`mutmut run <id>`)"
            )
        elif with_equivalents < BARS[package]:
            failures.append(
                f"{package}: {with_equivalents:.1%} is under the bar of {BARS[package]:.0%}"
            )

    for failure in failures:
        print(f"FAIL {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
