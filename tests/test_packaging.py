"""What the published package declares: its extras, its classifiers, its long description."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent


def project() -> dict[str, Any]:
    with (ROOT / "pyproject.toml").open("rb") as file:
        return tomllib.load(file)["project"]  # type: ignore[no-any-return]


def test_the_celery_extra_installs_what_a_redis_broker_needs() -> None:
    # kombu's Redis transport imports redis-py and packaging: celery[redis] brings both.
    [celery] = [Requirement(line) for line in project()["optional-dependencies"]["celery"]]

    assert celery.name == "celery"
    assert "redis" in celery.extras


def test_the_classifiers_say_how_mature_the_package_is() -> None:
    statuses = [c for c in project()["classifiers"] if c.startswith("Development Status :: ")]

    assert len(statuses) == 1


README = (ROOT / "README.md").read_text()


def test_every_link_of_the_long_description_is_absolute() -> None:
    # PyPI shows the README away from the repository: a relative link leads nowhere there.
    links = re.findall(r"\]\(([^)]+)\)", README)

    assert links
    assert [link for link in links if not link.startswith("https://")] == []


def test_the_scripts_the_package_does_not_ship_are_run_from_a_clone() -> None:
    # The sdist and the wheel hold the package only: each paragraph leading to a ./scripts/
    # command says that it is run from a clone of the repository.
    paragraphs = README.split("\n\n")
    leads = [
        paragraphs[index - 1]
        for index, paragraph in enumerate(paragraphs)
        if "./scripts/" in paragraph
    ]

    assert leads
    assert all("clone" in lead for lead in leads), leads
