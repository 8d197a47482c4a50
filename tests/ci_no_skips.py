"""pytest plugin: under CI (the CI environment variable set), a skipped test fails the run."""

from __future__ import annotations

import os

import pytest

# Values of CI that mean "not CI" (CI=false, CI=0, or set empty).
NOT_CI = ("", "0", "false", "no")


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in NOT_CI


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A skip is a test CI did not run, whatever its reason (a missing package, server or
    browser): CI must run everything, so it fails the run, naming each skipped test and why."""
    if not under_ci():
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if not skipped:
        return
    reporter.section("skipped under CI", sep="!", red=True)
    for report in skipped:
        _, _, reason = report.longrepr if isinstance(report.longrepr, tuple) else ("", 0, "")
        reporter.write_line(f"{report.nodeid}: {reason}")
    reporter.write_line(
        f"{len(skipped)} test(s) skipped with CI={os.environ['CI']}: CI runs every test. Install "
        "or start what they need (scripts/test does), or unset CI to allow skips."
    )
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
