"""`manage.py idempotency_purge`: its options, its output, and the errors it gives."""

from __future__ import annotations

import re
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command, load_command_class
from django.core.management.base import CommandError
from django.utils import timezone

from django_idempotency.models import IdempotencyRecord
from tests.factories import IdempotencyRecordFactory

pytestmark = pytest.mark.django_db

SECONDS = r"\d+\.\d\d s"


def _purge(*args: str, **options: object) -> str:
    stdout = StringIO()
    call_command("idempotency_purge", *args, stdout=stdout, **options)
    return stdout.getvalue()


@pytest.fixture
def records() -> None:
    """Three expired records and one expired abandoned claim in "default", one expired in
    "refunds", and one live record, one live claim and one crashed claim not yet expired (its
    retry resumes it) that must survive every purge."""
    past = timezone.now() - timedelta(minutes=5)
    IdempotencyRecordFactory.create_batch(3, expires_at=past)
    IdempotencyRecordFactory(in_progress=True, lease_expires_at=past, expires_at=past)
    IdempotencyRecordFactory(expires_at=past, namespace="refunds")
    IdempotencyRecordFactory(key="live")
    IdempotencyRecordFactory(key="running", in_progress=True)
    IdempotencyRecordFactory(key="crashed", in_progress=True, lease_expires_at=past)


def _keys() -> set[str]:
    return set(IdempotencyRecord.objects.values_list("key", flat=True))


def test_purges_and_prints_the_counts_and_duration(records: None) -> None:
    output = _purge()

    assert re.fullmatch(rf"Purged 5 records \(4 expired, 1 abandoned\) in {SECONDS}\.\n", output), (
        output
    )
    assert _keys() == {"live", "running", "crashed"}


def test_dry_run_says_what_would_go_and_deletes_nothing(records: None) -> None:
    output = _purge("--dry-run")

    assert re.fullmatch(
        rf"Would purge 5 records \(4 expired, 1 abandoned\); dry run, nothing deleted "
        rf"\({SECONDS}\)\.\n",
        output,
    ), output
    assert IdempotencyRecord.objects.count() == 8


def test_namespace_purges_only_that_namespace(records: None) -> None:
    output = _purge("--namespace", "refunds")

    assert re.fullmatch(
        rf"Purged 1 record \(1 expired, 0 abandoned\) in namespace 'refunds' in {SECONDS}\.\n",
        output,
    ), output
    assert IdempotencyRecord.objects.count() == 7


def test_counts_are_grouped_by_thousands() -> None:
    IdempotencyRecordFactory.create_batch(1234, expires_at=timezone.now() - timedelta(hours=1))

    output = _purge("--batch-size", "500")

    assert output.startswith("Purged 1,234 records (1,234 expired, 0 abandoned) in "), output
    assert IdempotencyRecord.objects.count() == 0


def test_verbosity_2_shows_a_line_per_batch_with_the_running_total(records: None) -> None:
    output = _purge("--batch-size", "2", "--verbosity", "2")

    *batches, summary = output.splitlines()
    progress = [
        re.fullmatch(
            r"Batch (\d+): (\d+) records? purged so far \((\d+) expired, (\d+) abandoned\)\.", line
        )
        for line in batches
    ]
    assert all(progress), batches
    counts = [tuple(int(n) for n in match.groups()) for match in progress if match]
    # Which rows a batch takes is the database's choice; the running totals are not.
    assert [(batch, total) for batch, total, _, _ in counts] == [(1, 2), (2, 4), (3, 5)]
    assert all(expired + abandoned == total for _, total, expired, abandoned in counts)
    assert counts[-1][2:] == (4, 1)
    assert summary.startswith("Purged 5 records (4 expired, 1 abandoned) in ")


def test_verbosity_1_shows_only_the_summary(records: None) -> None:
    assert len(_purge("--batch-size", "1").splitlines()) == 1


def test_verbosity_0_prints_nothing(records: None) -> None:
    assert _purge("--verbosity", "0") == ""
    assert _keys() == {"live", "running", "crashed"}


def test_nothing_to_purge() -> None:
    assert _purge().startswith("Purged 0 records (0 expired, 0 abandoned) in ")


def test_options_can_be_passed_as_keyword_arguments(records: None) -> None:
    output = _purge(batch_size=1, namespace="default", dry_run=True)

    assert output.startswith(
        "Would purge 4 records (3 expired, 1 abandoned) in namespace 'default'; dry run"
    ), output
    assert IdempotencyRecord.objects.count() == 8


@pytest.mark.parametrize("value", ["0", "-5", "ten", "1.5", ""])
def test_a_batch_size_that_is_not_a_positive_integer_is_an_error(records: None, value: str) -> None:
    with pytest.raises(CommandError, match=r"--batch-size: must be a positive whole number"):
        _purge("--batch-size", value)

    assert IdempotencyRecord.objects.count() == 8


@pytest.mark.parametrize("value", [0, -1, "100"])
def test_a_bad_batch_size_keyword_is_an_error(records: None, value: object) -> None:
    with pytest.raises(CommandError, match=r"--batch-size must be a positive whole number"):
        _purge(batch_size=value)

    assert IdempotencyRecord.objects.count() == 8


def test_the_help_lists_the_options() -> None:
    command = load_command_class("django_idempotency", "idempotency_purge")
    usage = command.create_parser("manage.py", "idempotency_purge").format_usage()

    for option in ("--dry-run", "--batch-size N", "--namespace NS"):
        assert option in usage


@pytest.mark.usefixtures("database_down")
def test_a_lost_database_is_a_clear_error_not_a_traceback() -> None:
    with pytest.raises(CommandError) as error:
        _purge()

    message = str(error.value)
    assert message.startswith("The database holding idempotency records cannot be reached: ")
    assert message.endswith("Retry the purge when the database is back.")


@pytest.mark.usefixtures("database_down")
def test_from_the_command_line_a_lost_database_exits_non_zero(
    capsys: pytest.CaptureFixture[str],
) -> None:
    command = load_command_class("django_idempotency", "idempotency_purge")

    with pytest.raises(SystemExit) as exit_:
        command.run_from_argv(["manage.py", "idempotency_purge"])

    assert exit_.value.code == 1
    stderr = capsys.readouterr().err
    assert stderr.startswith("CommandError: The database holding idempotency records cannot be")
    assert "Traceback" not in stderr
