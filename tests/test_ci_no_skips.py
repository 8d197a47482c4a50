"""Under CI, a skipped test fails the run (tests/ci_no_skips.py); elsewhere a skip is a skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SKIPPING = """
import pytest

def test_runs() -> None:
    pass

def test_needs_something_missing() -> None:
    pytest.skip("the frobnicator is not installed")
"""


def _pytest(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    """pytest with the plugin alone (no Django) on a module with a skipped test."""
    (tmp_path / "test_skipping.py").write_text(SKIPPING)
    env = {key: value for key, value in os.environ.items() if key != "CI"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    if ci is not None:
        env["CI"] = ci
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:django"]
    command += ["-p", "tests.ci_no_skips", "-rs", "test_skipping.py"]
    return subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )


def test_the_suite_runs_with_the_plugin(request: pytest.FixtureRequest) -> None:
    assert request.config.pluginmanager.has_plugin("tests.ci_no_skips")


def test_a_skip_under_ci_fails_the_run_and_says_what_and_why(tmp_path: Path) -> None:
    result = _pytest(tmp_path, "true")

    assert result.returncode == pytest.ExitCode.TESTS_FAILED, result.stdout
    assert "skipped under CI" in result.stdout
    assert "the frobnicator is not installed" in result.stdout
    assert "1 test(s) skipped with CI=true: CI runs every test." in result.stdout


@pytest.mark.parametrize("ci", [None, "false"])
def test_a_skip_outside_ci_is_a_skip(tmp_path: Path, ci: str | None) -> None:
    result = _pytest(tmp_path, ci)

    assert result.returncode == pytest.ExitCode.OK, result.stdout
    assert "1 passed, 1 skipped" in result.stdout
    assert "skipped under CI" not in result.stdout
