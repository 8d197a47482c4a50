"""Build the sdist and the wheel, check what they hold, and run smoke tests against the wheel.

Usage: python scripts/check_dist.py WORKDIR [pytest arguments...]
       python scripts/check_dist.py --suite SUITEDIR

1. Copies the source tree to WORKDIR/src (so the build never races a tox build in the checkout)
   and runs `python -m build` there: an sdist, then a wheel built from that sdist.
2. `twine check --strict` on both, and a listing check: every file of the package in the source
   tree (modules, migrations, templates, py.typed) is in the wheel and in the sdist; the wheel
   holds nothing outside the package and its metadata (no tests/, no testproject/).
3. Installs the wheel and the `dev` dependency group into a new virtualenv (with uv), copies
   tests/, testproject/, docs/, manage.py and pyproject.toml (no package source) to
   WORKDIR/suite, proves that `django_idempotency` is imported from site-packages there, with its
   py.typed, and runs the smoke tests (SMOKE) there, with pytest's `pythonpath` emptied so that
   nothing but the installed copy can be imported. Extra pytest arguments go to that run.

With --suite, only copies the suite to SUITEDIR and proves that the running interpreter imports
its installed copy there: the py313-django6-notz-sqlite tox env runs the whole suite from that copy
against the wheel tox installed (tox.ini), so the smoke tests here need only prove what that env
cannot: that the sdist builds a complete, working wheel.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "django_idempotency"
NOT_COPIED = (
    ".git",
    ".tox",
    ".venv*",
    ".services*",
    "*_cache",
    ".hypothesis",
    "__pycache__",
    "*.pyc",
    "*.egg-info",
    "build",
    "dist",
    "site",
    "*.sqlite3",
)
SUITE = ("tests", "testproject", "docs", "manage.py", "pyproject.toml", "README.md", "mkdocs.yml")
# What only an installed wheel can get wrong is a file left out of it; these tests reach every
# kind of file the package ships (a few seconds in all): the migrations, applied and checked
# against the models; the admin's three templates, rendered; the pytest plugin, loaded through its
# entry point (the `assert_idempotent` fixture); and a request and its retry on every store
# (database, Redis, memory) and every kind of view.
SMOKE = (
    "tests/test_migrations.py",
    "tests/test_admin.py::test_the_list_says_where_another_store_keeps_the_records",
    "tests/test_admin.py::test_the_detail_page_is_read_only",
    "tests/test_admin.py::test_purge_selected_asks_first",
    "tests/test_testing.py::test_the_fixture_passes_on_an_idempotent_endpoint",
    "tests/test_testing.py::test_the_fixture_fails_on_an_endpoint_that_runs_twice",
    "tests/test_http.py::test_retry_replays_status_headers_and_body_without_running_the_view",
)


def run(*args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
    print("+", " ".join(str(arg) for arg in args), flush=True)
    subprocess.run([str(arg) for arg in args], cwd=cwd, env=env, check=True)


def fail(message: str) -> None:
    sys.exit(f"check_dist: {message}")


def ignore(_directory: str, names: list[str]) -> set[str]:
    return {name for name in names if any(fnmatch.fnmatch(name, p) for p in NOT_COPIED)}


def package_files() -> set[str]:
    """Every file of the package in the source tree, as a path relative to the tree."""
    return {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / PACKAGE).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


def build(workdir: Path) -> tuple[Path, Path]:
    source = workdir / "src"
    shutil.copytree(ROOT, source, ignore=ignore)
    dist = workdir / "dist"
    # uv (tox.ini: build[uv]) makes the isolated build environments in a second, not pip.
    run(sys.executable, "-m", "build", "--installer", "uv", "--outdir", dist, source)
    (sdist,) = dist.glob("*.tar.gz")
    (wheel,) = dist.glob("*.whl")
    run(sys.executable, "-m", "twine", "check", "--strict", sdist, wheel)
    return sdist, wheel


def check_contents(sdist: Path, wheel: Path) -> None:
    expected = package_files()
    for required in (
        f"{PACKAGE}/py.typed",
        f"{PACKAGE}/migrations/0001_initial.py",
        f"{PACKAGE}/templates/{PACKAGE}/admin/change_list.html",
    ):
        if required not in expected:
            fail(f"{required} is missing from the source tree")

    with zipfile.ZipFile(wheel) as archive:
        in_wheel = set(archive.namelist())
    metadata = {name for name in in_wheel if name.split("/")[0].endswith(".dist-info")}
    if missing := expected - in_wheel:
        fail(f"the wheel lacks {sorted(missing)}: add them to [tool.setuptools.package-data]")
    if stray := in_wheel - expected - metadata:
        fail(f"the wheel holds files that are not part of the package: {sorted(stray)}")

    with tarfile.open(sdist) as archive:
        top = archive.getnames()[0].split("/")[0]
        in_sdist = {
            name.removeprefix(top + "/")
            for name in archive.getnames()
            if archive.getmember(name).isfile()
        }
    if missing := expected - in_sdist:
        fail(f"the sdist lacks {sorted(missing)}")
    if missing := {"pyproject.toml", "README.md", "LICENSE", "PKG-INFO"} - in_sdist:
        fail(f"the sdist lacks {sorted(missing)}")
    if partial := sorted(name for name in in_sdist if name.startswith("tests/")):
        # Half a suite (test modules without their conftest and settings) cannot run.
        fail(f"the sdist holds test files without the suite around them: {partial[:5]}")
    print(f"check_dist: {len(expected)} package files in the wheel and the sdist", flush=True)


def copy_suite(suite: Path) -> None:
    """The suite without the package source, so that only an installed copy can be imported."""
    shutil.rmtree(suite, ignore_errors=True)
    suite.mkdir(parents=True)
    for name in SUITE:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, suite / name, ignore=ignore)
        else:
            shutil.copy2(source, suite / name)


def prove_installed(python: Path | str, suite: Path, env: dict[str, str]) -> None:
    """Fail unless `python`, in `suite`, imports the installed copy, with its py.typed."""
    run(
        python,
        "-c",
        "import sysconfig, django_idempotency as package; from pathlib import Path; "
        "site = Path(sysconfig.get_paths()['purelib']).resolve(); "
        "here = Path(package.__file__).resolve(); print('check_dist: testing', here); "
        "assert here.is_relative_to(site), f'{here} is not the installed copy in {site}'; "
        "assert (here.parent / 'py.typed').is_file(), 'the installed copy has no py.typed'",
        cwd=suite,
        env=env,
    )


def without_pythonpath() -> dict[str, str]:
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


def run_smoke_tests(wheel: Path, workdir: Path, pytest_args: list[str]) -> None:
    environment = workdir / "venv"
    uv = (sys.executable, "-m", "uv")
    run(*uv, "venv", "--quiet", "--python", sys.executable, environment)
    python = environment / "bin" / "python"
    # The dev dependency group (PEP 735), read here, installed with the wheel by uv.
    groups = tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]
    run(*uv, "pip", "install", "--quiet", "--python", python, wheel, *groups["dev"])

    suite = workdir / "suite"
    copy_suite(suite)
    env = without_pythonpath()
    prove_installed(python, suite, env)
    pytest = (python, "-m", "pytest", "-p", "no:cacheprovider", "-o", "pythonpath=")
    run(*pytest, *SMOKE, *pytest_args, cwd=suite, env=env)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--suite":
        # For a tox env that runs the whole suite against the wheel it installed.
        suite = Path(sys.argv[2]).resolve()
        copy_suite(suite)
        prove_installed(sys.executable, suite, without_pythonpath())
        return
    if len(sys.argv) < 2:
        fail(__doc__ or "")
    workdir = Path(sys.argv[1]).resolve()
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    sdist, wheel = build(workdir)
    check_contents(sdist, wheel)
    run_smoke_tests(wheel, workdir, sys.argv[2:])


if __name__ == "__main__":
    main()
