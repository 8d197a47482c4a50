"""Every Python sample in docs/ runs as written, or is declared a fragment where it stands."""

from __future__ import annotations

import ast
import json
import logging
import re
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.contrib import admin
from django.core import checks
from django.dispatch import Signal
from django.test import Client, RequestFactory, override_settings
from standardwebhooks.webhooks import Webhook

from django_idempotency import signals
from django_idempotency.conf import _imported
from django_idempotency.stores import _store_for

DOCS = Path(__file__).resolve().parent.parent / "docs"
FRAGMENT = "<!-- sample: fragment -->"
# A sample that is a module of the reader's project says so on its first line.
MODULE_COMMENT = re.compile(r"#\s*(myproject/\w+)\.py\s*$")
SCRATCH = "docs_samples"

pytestmark = pytest.mark.django_db


@dataclass(frozen=True)
class Sample:
    page: str
    line: int  # Of the opening fence, as an editor shows it.
    code: str
    fragment: bool

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def module(self) -> str | None:
        """The dotted name of the module this sample is, if its first line names one."""
        first = self.code.splitlines()[0] if self.code else ""
        found = MODULE_COMMENT.match(first)
        return found.group(1).replace("/", ".") if found else None

    @property
    def is_settings(self) -> bool:
        """Imports and upper-case assignments only: a piece of a settings module."""
        statements = ast.parse(self.code).body
        return all(
            isinstance(node, ast.Import | ast.ImportFrom)
            or (
                isinstance(node, ast.Assign)
                and all(isinstance(t, ast.Name) and t.id.isupper() for t in node.targets)
            )
            for node in statements
        )


def read_samples() -> list[Sample]:
    samples = []
    for page in sorted(DOCS.glob("*.md")):
        lines = page.read_text(encoding="utf-8").splitlines()
        previous = ""
        index = 0
        while index < len(lines):
            text = lines[index].strip()
            if text.startswith("```"):
                end = index + 1
                while not lines[end].strip().startswith("```"):
                    end += 1
                if text.removeprefix("```").split(" ")[0] == "python":
                    code = "\n".join(lines[index + 1 : end])
                    fragment = previous == FRAGMENT
                    samples.append(Sample(page.name, index + 1, code, fragment))
                index = end
            if text:
                previous = text
            index += 1
    return samples


SAMPLES = read_samples()
RUNNABLE = [sample for sample in SAMPLES if not sample.fragment]


class Service:
    """A service of the reader's (a bank, a gateway, statsd): each call is counted."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> str:
            self.calls.append(name)
            return f"{name}-{len(self.calls)}"

        return call


def _reader_names() -> dict[str, Any]:
    """What the docs take as the reader's own code (models, serializers, services), never a
    name of this package, Django or a library: a sample must import those itself."""
    from testproject.payments.models import Payment
    from testproject.payments.services import Settlement
    from testproject.payments.views import PaymentSerializer
    from tests.views import ClassView

    return {
        "Payment": Payment,
        "PaymentSerializer": PaymentSerializer,
        "Settlement": Settlement,
        "Invoice": dict,
        "SearchView": ClassView,
        "payment": Payment.objects.get(pk=42),
        "gateway": Service(),
        "bank": Service(),
        "statsd": Service(),
    }


@pytest.fixture
def scratch(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A scratch project: the reader's package `myproject`, gone after the test, and the
    admin site and the package's signals as they were (samples register and connect)."""
    registered = admin.site._registry
    admin.site._registry = dict(registered)
    # A LOGGING sample, applied as a setting, reconfigures logging on Django 6: put it back.
    loggers = _logging_state()
    connected = {signal: list(signal.receivers) for signal in _package_signals()}
    finalizers = _celery_finalizers()
    package = types.ModuleType("myproject")
    package.__path__ = []
    monkeypatch.setitem(sys.modules, "myproject", package)
    # The deployment's secrets, which samples read from the environment.
    from cryptography.fernet import Fernet

    monkeypatch.setenv("IDEMPOTENCY_ENCRYPTION_KEY", Fernet.generate_key().decode())
    from testproject.payments.models import Payment

    Payment.objects.create(pk=42, amount=1000)  # The payment the samples settle.
    yield
    for name in [name for name in sys.modules if name.startswith(("myproject.", SCRATCH))]:
        del sys.modules[name]
    # Settings name the scratch modules by path: forget what was imported from these.
    _imported.cache_clear()
    _store_for.cache_clear()
    admin.site._registry = registered
    _restore_logging(loggers)
    for signal, receivers in connected.items():
        signal.receivers = receivers
        signal.sender_receivers_cache.clear()
    _forget_celery_tasks(finalizers)


LoggerState = tuple[logging.Logger, int, bool, bool, list[logging.Handler]]


def _logging_state() -> list[LoggerState]:
    every = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    return [
        (logger, logger.level, logger.propagate, logger.disabled, list(logger.handlers))
        for logger in every
        if isinstance(logger, logging.Logger)
    ]


def _restore_logging(state: list[LoggerState]) -> None:
    for logger, level, propagate, disabled, handlers in state:
        logger.setLevel(level)
        logger.propagate, logger.disabled, logger.handlers = propagate, disabled, handlers


def _celery_finalizers() -> set[Any] | None:
    """The shared tasks declared before the test (None where Celery is not installed)."""
    try:
        from celery import _state
    except ImportError:
        return None
    return set(_state._on_app_finalizers)


def _forget_celery_tasks(finalizers: set[Any] | None) -> None:
    """Forget the tasks the samples declared. Celery keeps the first callable declared under a
    name: the next test's run of the page would call this test's task, with its module's names."""
    if finalizers is None:
        return
    from celery import _state

    _state._on_app_finalizers.intersection_update(finalizers)
    for app in _state._get_active_apps():
        for name in [name for name in app.tasks if name.startswith(("myproject.", SCRATCH))]:
            app.tasks.unregister(name)


def _package_signals() -> list[Signal]:
    return [value for value in vars(signals).values() if isinstance(value, Signal)]


def run_page(sample: Sample) -> dict[str, Any]:
    """Run a page's samples from the top down to `sample`, as a reader follows the page: modules
    of the reader's project first (settings name them by path), then the rest in order."""
    on_page = [s for s in RUNNABLE if s.page == sample.page and s.line <= sample.line]
    for module_sample in [s for s in RUNNABLE if s.page == sample.page and s.module]:
        name = module_sample.module
        assert name is not None
        module = types.ModuleType(name)
        module.__dict__.update(_reader_names())
        sys.modules[name] = module
        setattr(sys.modules["myproject"], name.rpartition(".")[2], module)
        exec(compile(module_sample.code, f"{module_sample.id}", "exec"), module.__dict__)
    page = types.ModuleType(f"{SCRATCH}.{sample.page.removesuffix('.md')}")
    sys.modules[page.__name__] = page
    page.__dict__.update(_reader_names())
    for earlier in on_page:
        if earlier.module:
            continue
        exec(compile(earlier.code, earlier.id, "exec"), page.__dict__)
        if earlier is sample and sample.is_settings:
            check_settings(sample, page.__dict__)
    if sample.module:
        return sys.modules[sample.module].__dict__
    return page.__dict__


def check_settings(sample: Sample, namespace: dict[str, Any]) -> None:
    """The settings the sample assigns, set as written, pass the package's checks."""
    assigned = {
        target.id
        for node in ast.parse(sample.code).body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    names = {name: namespace[name] for name in assigned}
    with override_settings(**names):
        messages = [
            message
            for message in checks.run_checks(include_deployment_checks=False)
            if (message.id or "").startswith("django_idempotency.")
            and message.level >= checks.WARNING
        ]
    assert messages == [], f"{sample.id}: {messages}"


@pytest.mark.parametrize("sample", RUNNABLE, ids=[sample.id for sample in RUNNABLE])
def test_sample_runs(sample: Sample, scratch: None) -> None:
    run_page(sample)


def test_every_block_is_run_or_declared_a_fragment() -> None:
    # A Python block under another fence name would escape the harness.
    other_names = re.compile(r"^\s*```\s*(py|pycon|python3|py3)\b", re.MULTILINE)
    escaping = [page.name for page in DOCS.glob("*.md") if other_names.search(page.read_text())]
    assert escaping == [], "use ```python for Python code"
    assert len(RUNNABLE) >= 40, "the harness lost the docs' samples: is docs/ still there?"
    fragments = [sample for sample in SAMPLES if sample.fragment]
    for sample in fragments:  # A fragment must be one: it does not compile, or it elides code.
        try:
            compile(sample.code, sample.id, "exec")
        except SyntaxError:
            continue
        assert "..." in sample.code, f"{sample.id} compiles and has no `...`: run it"


def test_a_misspelt_setting_in_a_sample_fails_its_test(scratch: None) -> None:
    sample = Sample("settings.md", 1, "IDEMPOTENCY_REQUIERD = True", fragment=False)
    with pytest.raises(AssertionError, match="W005"):
        check_settings(sample, {"IDEMPOTENCY_REQUIERD": True})


def _run_sample_defining(page: str, name: str) -> dict[str, Any]:
    defines = re.compile(rf"^(def|class) {name}\b", re.MULTILINE)
    (sample,) = [s for s in RUNNABLE if s.page == page and defines.search(s.code)]
    return run_page(sample)


def _post(client: Client, path: str, data: dict[str, Any], key: str) -> Any:
    return client.post(path, data, "application/json", headers={"Idempotency-Key": key})


def test_webhooks_receiver_answers_once_and_replays(scratch: None) -> None:
    """docs/webhooks.md: the receiver verifies a delivery, answers it, and replays a redelivery."""
    from django.conf import settings

    receiver = _run_sample_defining("webhooks.md", "provider_webhook")["provider_webhook"]
    body = json.dumps({"type": "payment.succeeded"})
    now = datetime.now(tz=UTC)
    signature = Webhook(settings.PAYMENTS_WEBHOOK_SECRET).sign("msg_1", now, body)
    headers = {
        "webhook-id": "msg_1",
        "webhook-timestamp": str(int(now.timestamp())),
        "webhook-signature": signature,
    }

    def deliver() -> Any:
        request = RequestFactory().post("/", body, "application/json", headers=headers)
        return receiver(request)

    first, again = deliver(), deliver()

    assert (first.status_code, json.loads(first.content)) == (
        200,
        {"received": "payment.succeeded"},
    )
    assert again.content == first.content
    assert again["Idempotent-Replayed"] == "true"


def test_without_query_fingerprint_lets_the_query_string_change(
    scratch: None, client: Client
) -> None:
    """docs/settings.md: with the fingerprint that leaves the query out, a retry whose query
    string differs is the same request (a replay, not 422)."""
    page = _run_sample_defining("settings.md", "without_query")
    path = f"{page['__name__']}.without_query"
    with override_settings(IDEMPOTENCY_FINGERPRINT=path):
        first = _post(client, "/function/charges/?page=1", {"amount": 5}, "k-query")
        again = _post(client, "/function/charges/?page=2", {"amount": 5}, "k-query")
        other = _post(client, "/function/charges/?page=2", {"amount": 6}, "k-query")

    assert first.status_code == 201
    assert again.status_code == 201
    assert again["Idempotent-Replayed"] == "true"
    assert other.status_code == 422  # The body is still in the fingerprint.


def test_the_default_fingerprint_still_tells_query_strings_apart(client: Client) -> None:
    first = _post(client, "/function/charges/?page=1", {"amount": 5}, "k-default")
    again = _post(client, "/function/charges/?page=2", {"amount": 5}, "k-default")

    assert (first.status_code, again.status_code) == (201, 422)


def test_audited_store_logs_a_reused_key(
    scratch: None, client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/stores.md: the audited store logs the key reused for a different request."""
    _run_sample_defining("stores.md", "AuditedStore")
    with (
        override_settings(IDEMPOTENCY_STORE="myproject.stores.AuditedStore"),
        caplog.at_level(logging.WARNING, logger="myproject.stores"),
    ):
        first = _post(client, "/function/charges/", {"amount": 5}, "k-audit")
        reused = _post(client, "/function/charges/", {"amount": 6}, "k-audit")

    assert (first.status_code, reused.status_code) == (201, 422)
    assert [r.getMessage() for r in caplog.records if r.name == "myproject.stores"] == [
        "key reused: namespace=default owner="
    ]


def test_functions_sample_calls_the_bank_once(scratch: None) -> None:
    """docs/functions.md: the second call returns an equal Settlement without the bank."""
    page = _run_sample_defining("functions.md", "settle_payment")

    assert page["bank"].calls == ["transfer"]  # The sample's own two calls ran.
    assert page["settle_payment"](42) == page["Settlement"](42, "transfer-1")
    assert page["bank"].calls == ["transfer"]


DATABASE_NAME = re.compile(r"\b(PostgreSQL|MariaDB|MySQL|SQLite)\b")
# Words of a statement about which databases are supported (not about one database's behaviour).
SUPPORT_WORD = re.compile(r"\b(support\w*|neither|nor|production|refused)\b", re.IGNORECASE)
DATABASES_PAGE = "databases.md"


def test_only_the_databases_page_names_the_supported_databases() -> None:
    """A sentence naming two databases and whether they are supported belongs on one page;
    the others link to it, so a new database is never listed on some pages and not others."""
    statements = []
    for page in sorted(DOCS.glob("*.md")):
        if page.name in (DATABASES_PAGE, "changelog.md"):  # The changelog is history.
            continue
        for paragraph in re.split(r"\n\s*\n", page.read_text(encoding="utf-8")):
            for sentence in re.split(r"(?<=[.:;])\s+", " ".join(paragraph.split())):
                named = set(DATABASE_NAME.findall(sentence))
                if len(named) >= 2 and SUPPORT_WORD.search(sentence):
                    statements.append(f"{page.name}: {sentence}")
    assert statements == [], "link to docs/databases.md instead:\n" + "\n".join(statements)
