"""Under CI, a skipped test fails the run (tests/ci_no_skips.py); elsewhere a skip is a skip."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

SKIPPING = """
import pytest

def test_runs():
    pass

def test_needs_something_missing():
    pytest.skip("the frobnicator is not installed")
"""


def _pytest(pytester: pytest.Pytester) -> pytest.RunResult:
    """A pytest session of its own, with the plugin alone (no Django), on a skipped test."""
    pytester.makepyfile(test_skipping=SKIPPING)
    return pytester.runpytest_inprocess("-p", "no:django", "-p", "tests.ci_no_skips", "-rs")


def test_the_suite_runs_with_the_plugin(request: pytest.FixtureRequest) -> None:
    assert request.config.pluginmanager.has_plugin("tests.ci_no_skips")


def test_a_skip_under_ci_fails_the_run_and_says_what_and_why(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CI", "true")

    result = _pytest(pytester)

    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "*skipped under CI*",
            "test_skipping.py::test_needs_something_missing: Skipped: the frobnicator is not "
            "installed",
            "1 test(s) skipped with CI=true: CI runs every test.*",
        ]
    )


@pytest.mark.parametrize("ci", [None, "false"])
def test_a_skip_outside_ci_is_a_skip(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, ci: str | None
) -> None:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)

    result = _pytest(pytester)

    assert result.ret == pytest.ExitCode.OK
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.no_fnmatch_line("*skipped under CI*")
