"""Mutation testing on every database: every mutant on SQLite, the survivors on the servers.

Each database runs code the others never reach (PostgreSQL's advisory locks and one-round-trip
transactions, MariaDB's lock timeouts and error numbers), and CI runs the suite on all three: a
mutant counts as killed when the suite on any of them kills it. The first database runs every
mutant of the packages asked for; each next one runs only what is still alive (survivors and
mutants no test reached there), with the tests that reach each function on that database
(mutmut's stats are collected again per database). Then the gate (scripts/mutation_gate.py).

    python scripts/mutation.py                      # core, stores and http on all three
    python scripts/mutation.py http --databases sqlite
    python scripts/mutation.py --children 2         # two mutants at once
    python scripts/mutation.py --alive              # after new tests: only what is still alive
    python scripts/mutation.py --alive --databases postgresql,mariadb \
        --servers-only stores.database stores.dialects stores.statements stores.batches \
        stores.connections http.problems          # the servers, where their code differs

PG_URL and MARIADB_URL name the servers as for tox (scripts/services.sh starts them); each
mutant's run makes test databases of its own there (`test_idem_mutation_<pid>`). REDIS_URL, when
set, names the Redis of the Redis store's and the cache tier's tests.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tomllib

from mutation_gate import BARS, KILLED, MUTANTS, ROOT, read_results
from mutation_gate import main as gate

SERVERS = {
    "postgresql": os.environ.get("PG_URL", "postgres://postgres@127.0.0.1:54329"),
    "mariadb": os.environ.get("MARIADB_URL", "mysql://root@127.0.0.1:33069"),
}
DATABASES = ("sqlite", "postgresql", "mariadb")


def database_url(database: str) -> str:
    return "" if database == "sqlite" else f"{SERVERS[database]}/idem_mutation"


def alive(packages: list[str]) -> list[str]:
    """The mutants of these packages no database has killed yet."""
    results = read_results(MUTANTS)
    return sorted(
        name
        for package in packages
        for name, code in results[package].items()
        if code not in KILLED
    )


def run_mutmut(database: str, names: list[str], children: int) -> None:
    # The tests that reach a function differ per database (tests marked for one database only
    # run there): mutmut collects them again when its stats file is gone.
    (MUTANTS / "mutmut-stats.json").unlink(missing_ok=True)
    # Each mutant's run creates test databases of its own name (tests/conftest.py), so several
    # can run side by side on one server.
    env = {**os.environ, "DATABASE_URL": database_url(database), "TEST_DATABASE_PER_PROCESS": "1"}
    print(f"mutmut on {database}: {len(names)} mutants or globs", flush=True)
    command = ["mutmut", "run", "--max-children", str(children), *names]
    if code := subprocess.run(command, cwd=ROOT, env=env, check=False).returncode:
        sys.exit(f"mutmut stopped on {database} (exit {code}). {_why(env['DATABASE_URL'])}")


def _why(url: str) -> str:
    """What to do when mutmut stops: it hides the output of the pytest runs it makes."""
    with (ROOT / "pyproject.toml").open("rb") as file:
        mutmut = tomllib.load(file)["tool"]["mutmut"]
    pytest = ["python", "-m", "pytest", "-x", *mutmut["pytest_add_cli_args"]]
    pytest += mutmut["pytest_add_cli_args_test_selection"]
    return (
        "When it failed to collect stats or to run the clean tests, a test fails inside mutants/,"
        " where mutmut hides pytest's output; see which with\n"
        f"    cd mutants && DATABASE_URL={shlex.quote(url)} {shlex.join(pytest)}\n"
        "A file the tests read that mutmut does not copy goes in also_copy ([tool.mutmut] in"
        " pyproject.toml)."
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="*", help=f"some of {', '.join(BARS)} (default: all)")
    parser.add_argument("--databases", default=",".join(DATABASES))
    parser.add_argument("--children", type=int, default=1, help="mutants run at once")
    parser.add_argument(
        "--alive",
        action="store_true",
        help="only what an earlier run left alive, from the first database on (after new tests)",
    )
    parser.add_argument(
        "--servers-only",
        nargs="+",
        metavar="MODULE",
        help="on the servers, only the mutants of these modules (stores.database, ...)",
    )
    args = parser.parse_args()
    packages = args.packages or list(BARS)
    databases = args.databases.split(",")
    if unknown := set(databases) - set(DATABASES):
        parser.error(f"unknown databases {sorted(unknown)}: choose from {', '.join(DATABASES)}")

    for number, database in enumerate(databases):
        if number == 0 and not args.alive:
            # Every mutant again: a named mutant is rerun even where mutmut has a verdict.
            names = [f"django_idempotency.{package}.*" for package in packages]
        else:
            names = alive(packages)
            if database != "sqlite" and args.servers_only:
                names = [n for n in names if _in_modules(n, args.servers_only)]
            if not names:
                break
        run_mutmut(database, names, args.children)
    return gate(packages)


def _in_modules(name: str, modules: list[str]) -> bool:
    return any(name.startswith(f"django_idempotency.{module}.") for module in modules)


if __name__ == "__main__":
    sys.exit(main())
