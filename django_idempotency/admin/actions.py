"""The admin actions: purge or release (confirmed first), resolve interrupted steps; say so."""

from __future__ import annotations

import base64
import functools
import logging
from collections.abc import Callable
from datetime import datetime
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.auth import get_permission_codename
from django.db import InterfaceError, OperationalError, router, transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from django_idempotency.conf import conf
from django_idempotency.core.outcomes import Scope
from django_idempotency.encryption import UnreadableResponse, unseal_step
from django_idempotency.exceptions import KeyInProgress
from django_idempotency.models import IdempotencyRecord, abandoned
from django_idempotency.purge import purge_expired_records
from django_idempotency.steps import STARTED, resolve_step
from django_idempotency.stores import StoreUnavailable, get_store
from django_idempotency.stores.database import records_alias

if TYPE_CHECKING:
    RecordAdminBase = admin.ModelAdmin[IdempotencyRecord]
else:
    RecordAdminBase = admin.ModelAdmin

logger = logging.getLogger("django_idempotency")


DELETE_BATCH_SIZE = 1000
CONFIRMATION_SAMPLE = 10
_UNREACHABLE = (StoreUnavailable, OperationalError, InterfaceError)

# What a confirmation page asks: the question, a sample of the keys concerned, how many.
Question = tuple[str, list[str], int]
_Action = Callable[["RecordActions", HttpRequest, QuerySet[IdempotencyRecord]], HttpResponse | None]
_View = TypeVar("_View", bound=Callable[..., HttpResponse])


def reports_a_lost_database(stopped: Callable[[], str]) -> Callable[[_Action], _Action]:
    """Turn a database lost during an action into an error message and a redirect back.

    An outage is not a bug: the user gets what happened and what to do, not a 500. `stopped`
    gives the message, with ``%(error)s`` for the database's own words.
    """

    def decorate(action: _Action) -> _Action:
        @functools.wraps(action)
        def run(
            self: RecordActions,
            request: HttpRequest,
            queryset: QuerySet[IdempotencyRecord],
        ) -> HttpResponse | None:
            try:
                return action(self, request, queryset)
            except _UNREACHABLE as exc:
                logger.warning("Admin action %s stopped: %s", action.__name__, exc)
                cause: BaseException = exc
                while isinstance(cause, StoreUnavailable) and cause.__cause__ is not None:
                    cause = cause.__cause__  # The database's own words, not our wrapping.
                error = " ".join(str(cause).split()).rstrip(".") or type(cause).__name__
                self.message_user(request, stopped() % {"error": error}, messages.ERROR)
                return None  # Django's admin then redirects back to the list, filters kept.

        return run

    return decorate


def _purge_stopped() -> str:
    return gettext(
        "The purge stopped: the database holding idempotency records cannot be reached "
        "(%(error)s). Try again when it is back; records already purged stay purged."
    )


def _release_stopped() -> str:
    return gettext(
        "The release stopped: the database holding idempotency records cannot be reached "
        "(%(error)s). Try again when it is back; records already released stay released."
    )


def _resolve_stopped() -> str:
    return gettext(
        "Resolving stopped: the database holding idempotency records cannot be reached "
        "(%(error)s). Try again when it is back; steps already resolved stay resolved."
    )


class _AndTheRecordsDatabase(set[str]):
    """The databases ATOMIC_REQUESTS leaves out of a view (Django's ``_non_atomic_requests``),
    the records' always among them, whichever it is when the request comes (IDEMPOTENCY_DATABASE,
    or the router's choice): a purge there commits each batch on its own, as documented, rather
    than hold every deleted row locked until the request's one commit."""

    def __contains__(self, alias: object) -> bool:
        records = (records_alias(), router.db_for_read(IdempotencyRecord))
        return super().__contains__(alias) or alias in records


def purges_outside_the_requests_transaction(view: _View) -> _View:
    """Leave the records' database out of ATOMIC_REQUESTS for the admin view whose actions
    purge, as Django's `transaction.non_atomic_requests` would for a database known in advance."""
    view._non_atomic_requests = _AndTheRecordsDatabase(  # type: ignore[attr-defined]
        getattr(view, "_non_atomic_requests", ())
    )
    return view


class RecordActions(RecordAdminBase):
    """The admin's actions: purge a selection, purge what expired, release abandoned claims."""

    @admin.action(permissions=["delete"], description=_("Purge selected idempotency records"))
    @reports_a_lost_database(_purge_stopped)
    def purge_selected(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyRecord]
    ) -> HttpResponse | None:
        def question(count: int) -> str:
            return ngettext(
                "Purge %(count)d idempotency record? Its key starts a new request the next "
                "time it is sent.",
                "Purge %(count)d idempotency records? Their keys start new requests the next "
                "time they are sent.",
                count,
            ) % {"count": count}

        def done(count: int) -> str:
            logger.info(
                "%s purged %d selected idempotency records in the admin", request.user, count
            )
            return ngettext(
                "Purged %(count)d idempotency record.",
                "Purged %(count)d idempotency records.",
                count,
            ) % {"count": count}

        return self._confirm_deletion(request, "purge_selected", queryset, question, done)

    @admin.action(permissions=["delete"], description=_("Purge all expired idempotency records"))
    @reports_a_lost_database(_purge_stopped)
    def purge_expired(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyRecord]
    ) -> HttpResponse | None:
        # The one purge, as the command and the task run it: its log line and metrics included.
        def ask() -> Question:
            preview = purge_expired_records(dry_run=True)
            # Whole sentences, one count each, so that every language can word them.
            question = " ".join(
                [
                    ngettext(
                        "%(count)d expired record will be purged.",
                        "%(count)d expired records will be purged.",
                        preview.expired,
                    )
                    % {"count": preview.expired},
                    # Only expired ones: a crashed attempt's record stays for its retry.
                    ngettext(
                        "%(count)d abandoned in-progress record (expired, its lease run out) "
                        "will be purged.",
                        "%(count)d abandoned in-progress records (expired, their leases run "
                        "out) will be purged.",
                        preview.abandoned,
                    )
                    % {"count": preview.abandoned},
                ]
            )
            return question, [], preview.total

        def act() -> str:
            report = purge_expired_records()
            logger.info("%s ran the purge in the admin", request.user)
            return " ".join(
                [
                    ngettext(
                        "Purged %(count)d expired record.",
                        "Purged %(count)d expired records.",
                        report.expired,
                    )
                    % {"count": report.expired},
                    ngettext(
                        "Purged %(count)d abandoned in-progress record.",
                        "Purged %(count)d abandoned in-progress records.",
                        report.abandoned,
                    )
                    % {"count": report.abandoned},
                ]
            )

        return self._confirm_then(request, "purge_expired", ask, act)

    @admin.action(permissions=["delete"], description=_("Release abandoned idempotency claims"))
    @reports_a_lost_database(_release_stopped)
    def release_abandoned(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyRecord]
    ) -> HttpResponse | None:
        def question(count: int) -> str:
            return ngettext(
                "Release %(count)d in-progress record whose lease ran out? Its key starts a "
                "new request the next time it is sent.",
                "Release %(count)d in-progress records whose leases ran out? Their keys start "
                "new requests the next time they are sent.",
                count,
            ) % {"count": count}

        def done(count: int) -> str:
            logger.info(
                "%s released %d abandoned idempotency claims in the admin", request.user, count
            )
            return ngettext(
                "Released %(count)d abandoned claim.",
                "Released %(count)d abandoned claims.",
                count,
            ) % {"count": count}

        claims = _abandoned_claims(get_store().now())  # By the store's clock, as claims are.
        return self._confirm_deletion(request, "release_abandoned", claims, question, done)

    # Resolving an interrupted step rewrites what the record keeps of its operation: the change
    # permission (Django's default one; the record's form stays read-only), the closest in
    # meaning. Not the delete permission: purging lets a key start afresh, it does not say
    # whether a side effect happened.
    def has_resolve_permission(self, request: HttpRequest) -> bool:
        opts = self.opts
        codename = get_permission_codename("change", opts)
        return request.user.has_perm(f"{opts.app_label}.{codename}")

    @admin.action(permissions=["resolve"], description=_("Step happened (resume after it)"))
    @reports_a_lost_database(_resolve_stopped)
    def step_happened(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyRecord]
    ) -> HttpResponse | None:
        self._resolve_selected(request, queryset, happened=True)
        return None

    @admin.action(permissions=["resolve"], description=_("Step did not happen (run it again)"))
    @reports_a_lost_database(_resolve_stopped)
    def step_did_not_happen(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyRecord]
    ) -> HttpResponse | None:
        self._resolve_selected(request, queryset, happened=False)
        return None

    def _resolve_selected(
        self, request: HttpRequest, queryset: QuerySet[IdempotencyRecord], *, happened: bool
    ) -> None:
        """Resolve the interrupted at-most-once steps of the selected records; skip (and count)
        those with none, and those a request still holds."""
        resolved = held = 0
        selected = queryset.count()
        # Only records in progress with steps can have an interrupted one: few, read at once.
        # resolve_step reads each again, locked, on the database it writes to.
        candidates = queryset.filter(status=IdempotencyRecord.Status.IN_PROGRESS)
        fields = ("status", "namespace", "owner", "key", "steps")
        for record in candidates.filter(steps__isnull=False).only(*fields).order_by():
            try:
                names = [n for n in interrupted_steps(record) if _resolve(record, n, happened)]
            except KeyInProgress:
                held += 1
                continue
            resolved += bool(names)
        logger.info(
            "%s marked the interrupted steps of %d idempotency records as %s in the admin",
            request.user,
            resolved,
            "happened" if happened else "not happened",
        )
        said = _resolved(resolved, held, selected - resolved - held, happened)
        self.message_user(request, said, messages.SUCCESS if resolved else messages.WARNING)

    def _confirm_deletion(
        self,
        request: HttpRequest,
        action: str,
        records: QuerySet[IdempotencyRecord],
        question: Callable[[int], str],
        done: Callable[[int], str],
    ) -> HttpResponse | None:
        """Ask first (`question` of how many, with a sample of the newest keys), then delete
        the records and forget their cached copies; `done` says (and logs) how many went."""

        def ask() -> Question:
            count = records.count()
            newest = records.order_by("-id").values_list("key", flat=True)
            return question(count), list(newest[:CONFIRMATION_SAMPLE]), count

        return self._confirm_then(request, action, ask, lambda: done(delete_and_forget(records)))

    def _confirm_then(
        self,
        request: HttpRequest,
        action: str,
        ask: Callable[[], Question],
        act: Callable[[], str],
    ) -> HttpResponse | None:
        """The first post shows the confirmation page (`ask`: the question, a sample of keys and
        how many); the confirmed one runs `act` and shows the message it returns."""
        if not request.POST.get("post"):
            question, sample, count = ask()
            return self._confirm(request, action, question, sample, count)
        self.message_user(request, act(), messages.SUCCESS)
        return None

    def _confirm(
        self, request: HttpRequest, action: str, question: str, sample: list[str], count: int
    ) -> TemplateResponse:
        """The intermediate page: what is about to go, and confirm or cancel."""
        opts = self.model._meta
        description = getattr(getattr(self, action), "short_description", action)
        context = {
            **self.admin_site.each_context(request),
            "title": gettext("Are you sure?"),
            "subtitle": description,
            "opts": opts,
            "action": action,
            "action_description": description,
            "question": question,
            "count": count,
            "sample": sample,
            "more": max(0, count - len(sample)) if sample else 0,
            "selected": request.POST.getlist(helpers.ACTION_CHECKBOX_NAME),
            "select_across": request.POST.get("select_across") == "1",
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "cancel_url": request.get_full_path(),
            "media": self.media,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "django_idempotency/admin/confirm_action.html", context)


def delete_and_forget(records: QuerySet[Any], batch_size: int | None = None) -> int:
    """Delete `records` in short batches and drop their cached copies; return how many went.

    Each batch re-applies the queryset's conditions in its DELETE, so a record that a new
    request took over in the meantime (its lease renewed, its expiry moved) is left alone.
    """
    batch_size = batch_size or DELETE_BATCH_SIZE
    deleted = 0
    records = _where_written(records.order_by())
    while True:
        with transaction.atomic(using=records.db):
            batch = list(records.values_list("pk", "namespace", "owner", "key")[:batch_size])
            if not batch:
                return deleted
            count, _ = records.filter(pk__in=[row[0] for row in batch]).delete()
            _forget_on_commit([Scope(*row[1:]) for row in batch], records.db)
        deleted += count
        if len(batch) < batch_size:
            return deleted


def _where_written(records: QuerySet[Any]) -> QuerySet[Any]:
    """`records` on the database the router writes them to, when it reads them elsewhere.

    The admin lists the records where the router reads them, maybe a replica; a batch read there
    would still hold the rows the previous batch deleted on the primary until the replica has
    applied that commit, and the loop would send the same deletes again until then.
    """
    model = records.model
    if records.db != router.db_for_read(model):
        return records  # A database the caller chose (`using()`), or no routing at all.
    return records.using(router.db_for_write(model))


def _forget_on_commit(scopes: list[Scope], using: str | None) -> None:
    # Not before the commit: a replay in between would find the record and cache it again.
    transaction.on_commit(partial(get_store().forget, scopes), using=using)


def _abandoned_claims(now: datetime) -> QuerySet[IdempotencyRecord]:
    """Abandoned records: in progress, their lease run out, the request holding them gone."""
    return IdempotencyRecord.objects.filter(abandoned(now))


def interrupted_steps(record: IdempotencyRecord) -> list[str]:
    """The names of the record's at-most-once steps that started and never finished."""
    if record.status != IdempotencyRecord.Status.IN_PROGRESS:
        return []  # Completed: its retries replay its response, nothing of it runs again.
    names = []
    for name, stored in (record.steps or {}).items():
        try:
            value = unseal_step(base64.b64decode(stored), conf.ENCRYPTION_KEYS)
        except (UnreadableResponse, ValueError):
            continue  # No key opens it, or not a step's value: nothing said about it here.
        if value == STARTED:
            names.append(name)
    return names


def _resolve(record: IdempotencyRecord, step: str, happened: bool) -> bool:
    """Resolve one step; False if it finished, or someone resolved it, since it was read."""
    try:
        resolve_step(
            record.key, namespace=record.namespace, owner=record.owner, step=step, happened=happened
        )
    except LookupError:
        return False
    return True


def _resolved(resolved: int, held: int, without: int, happened: bool) -> str:
    """What a resolving action says: whole sentences, one count each."""
    if not resolved and happened:
        said = gettext("Marked no step as happened.")
    elif not resolved:
        said = gettext("Marked no step as not happened.")
    elif happened:
        said = ngettext(
            "Marked the interrupted step of %(count)d record as happened: its retry resumes "
            "after it.",
            "Marked the interrupted steps of %(count)d records as happened: their retries resume "
            "after them.",
            resolved,
        ) % {"count": resolved}
    else:
        said = ngettext(
            "Marked the interrupted step of %(count)d record as not happened: its retry runs it "
            "again.",
            "Marked the interrupted steps of %(count)d records as not happened: their retries run "
            "them again.",
            resolved,
        ) % {"count": resolved}
    sentences = [said]
    if held:
        sentences.append(
            ngettext(
                "Skipped %(count)d record a request still holds: resolve it once its lease ends.",
                "Skipped %(count)d records requests still hold: resolve them once their leases "
                "end.",
                held,
            )
            % {"count": held}
        )
    if without:
        sentences.append(
            ngettext(
                "Skipped %(count)d record with no interrupted at-most-once step.",
                "Skipped %(count)d records with no interrupted at-most-once step.",
                without,
            )
            % {"count": without}
        )
    return " ".join(sentences)
