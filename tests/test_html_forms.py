"""HTML forms carrying their key in a hidden field: the tag, the mixin, a person's flows."""

from __future__ import annotations

import re
import threading
import uuid
from typing import Any

import pytest
from django import forms
from django.db import connection
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template import Context, Template
from django.test import Client, override_settings
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from ulid import ULID

from django_idempotency import idempotent
from django_idempotency.forms import IdempotentFormMixin
from tests.factories import UserFactory
from tests.models import Charge
from tests.utils import CSRF_TOKEN, logged_in_browser

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls("tests.test_html_forms")]

BROWSER = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,*/*;q=0.8"
FIELD = re.compile(r'<input type="hidden" name="idempotency_key" value="([^"]+)"')


class ChargeForm(IdempotentFormMixin, forms.Form):
    amount = forms.IntegerField(min_value=1)


class PlainChargeForm(forms.Form):
    amount = forms.IntegerField(min_value=1)


# A form rendered by the tag given the form, and one by the bare tag answering errors with 422.
WITH_FORM = Template(
    "{% load idempotency %}<form method=post>{% idempotency_key_field form %}{{ form }}</form>"
)
BARE = Template(
    "{% load idempotency %}<form method=post>{% idempotency_key_field %}{{ form }}</form>"
)


def charge_view(form_class: type[forms.Form], template: Template | None, invalid: int) -> Any:
    """A view paying through `form_class`: 303 to the charge once valid, else the form again."""

    @csrf_exempt
    @idempotent(required=True)
    def view(request: HttpRequest) -> HttpResponse:
        form = form_class(request.POST if request.method == "POST" else None)
        if request.method == "POST" and form.is_valid():
            charge = Charge.objects.create(amount=form.cleaned_data["amount"])
            return HttpResponseRedirect(f"/charges/{charge.pk}/", status=303)
        if template is None:
            return HttpResponse(f"<form method=post>{form}</form>", status=invalid)
        page = template.render(Context({"form": form}))
        return HttpResponse(page, status=invalid if form.is_bound else 200)

    return view


@csrf_exempt
@idempotent(required=True, mode="atomic")
def audited_view(request: HttpRequest) -> HttpResponse:
    """Notes each attempt (a charge of 1) before it checks the form: a write of the answer's."""
    Charge.objects.create(amount=1)
    form = ChargeForm(request.POST)
    if form.is_valid():
        Charge.objects.create(amount=form.cleaned_data["amount"])
        return HttpResponseRedirect("/done/", status=303)
    return HttpResponse(f"<form method=post>{form}</form>")


class CouponForm(IdempotentFormMixin, forms.Form):
    coupon = forms.CharField(required=False, max_length=4)


@csrf_exempt
@idempotent(required=True)
def rebinding_view(request: HttpRequest) -> HttpResponse:
    """Fills in what the first form lacked, binds a new one, and pays with it."""
    form = ChargeForm(request.POST)
    if not form.is_valid():
        form = ChargeForm({**request.POST.dict(), "amount": 7})
    if form.is_valid():
        Charge.objects.create(amount=form.cleaned_data["amount"])
    return HttpResponse("paid", status=201)


@csrf_exempt
@idempotent(required=True)
def coupon_view(request: HttpRequest) -> HttpResponse:
    """Pays with the first form, then checks the coupon's, whose error it shows (a 200)."""
    payment, coupon = ChargeForm(request.POST), CouponForm(request.POST)
    if payment.is_valid():
        Charge.objects.create(amount=payment.cleaned_data["amount"])
    if not coupon.is_valid():
        return HttpResponse(f"paid; the coupon: {coupon.errors}")
    return HttpResponse("paid")


@csrf_exempt
@idempotent(required=True)
def prefixed_view(request: HttpRequest) -> HttpResponse:
    """A form with a prefix, and a formset of two: the key's field keeps its name."""
    form = ChargeForm(request.POST or None, prefix="pay")
    formset = forms.formset_factory(ChargeForm, extra=2)(request.POST or None)
    if request.method == "POST" and form.is_valid() and formset.is_valid():
        Charge.objects.create(amount=form.cleaned_data["amount"])
        return HttpResponseRedirect("/done/", status=303)
    return HttpResponse(f"<form method=post>{form}{formset}</form>")


urlpatterns = [
    path("audited/", audited_view),
    path("rebinding/", rebinding_view),
    path("coupon/", coupon_view),
    path("prefixed/", prefixed_view),
    path("mixin/", charge_view(ChargeForm, None, 200)),
    path("tag/", charge_view(PlainChargeForm, WITH_FORM, 200)),
    path("bare-tag/", charge_view(PlainChargeForm, BARE, 422)),
    path("bare-tag-200/", charge_view(PlainChargeForm, BARE, 200)),
]


def shown_key(response: HttpResponse) -> str:
    match = FIELD.search(response.content.decode())
    assert match is not None, response.content.decode()
    return match.group(1)


def send(client: Client, url: str, data: dict[str, Any], **extra: Any) -> HttpResponse:
    return client.post(url, data, HTTP_ACCEPT=BROWSER, **extra)  # type: ignore[no-any-return]


@pytest.mark.parametrize("url", ["/mixin/", "/tag/", "/bare-tag/"])
def test_each_form_shown_carries_a_fresh_ulid(url: str) -> None:
    client = Client()
    first, second = shown_key(client.get(url)), shown_key(client.get(url))

    assert first != second
    assert str(ULID.from_str(first)) == first


@pytest.mark.parametrize("url", ["/mixin/", "/tag/", "/bare-tag/"])
def test_a_form_sent_twice_runs_once_and_the_second_gets_the_same_redirect(url: str) -> None:
    client = Client()
    data = {"amount": 5, "idempotency_key": shown_key(client.get(url))}

    first, second = send(client, url, data), send(client, url, data)

    assert first.status_code == second.status_code == 303
    assert second["Location"] == first["Location"]
    assert second["Idempotent-Replayed"] == "true"
    assert Charge.objects.count() == 1


@pytest.mark.parametrize("url", ["/mixin/", "/tag/"])
def test_an_invalid_form_is_shown_again_with_its_key_and_the_corrected_one_runs_once(
    url: str,
) -> None:
    client = Client()
    key = shown_key(client.get(url))

    invalid = send(client, url, {"amount": -5, "idempotency_key": key})
    again = send(client, url, {"amount": -5, "idempotency_key": key})
    corrected = send(client, url, {"amount": 5, "idempotency_key": key})
    resent = send(client, url, {"amount": 5, "idempotency_key": key})

    assert invalid.status_code == again.status_code == 200
    assert shown_key(invalid) == shown_key(again) == key  # The same form, the same key.
    assert "Idempotent-Replayed" not in again  # Given back: the form was checked again.
    assert corrected.status_code == resent.status_code == 303
    assert resent["Location"] == corrected["Location"]
    assert list(Charge.objects.values_list("amount", flat=True)) == [5]


def test_an_invalid_forms_answer_keeps_what_the_view_wrote_as_django_keeps_a_200s() -> None:
    client = Client()

    invalid = send(client, "/audited/", {"amount": -5, "idempotency_key": "audited"})
    corrected = send(client, "/audited/", {"amount": 5, "idempotency_key": "audited"})

    assert (invalid.status_code, corrected.status_code) == (200, 303)
    # The key was given back, the invalid answer's note kept: atomic mode rolled back nothing.
    assert sorted(Charge.objects.values_list("amount", flat=True)) == [1, 1, 5]


def test_a_bare_tag_form_answered_422_gives_its_key_back_for_the_corrected_form() -> None:
    client = Client()
    key = shown_key(client.get("/bare-tag/"))

    invalid = send(client, "/bare-tag/", {"amount": -5, "idempotency_key": key})
    corrected = send(client, "/bare-tag/", {"amount": 5, "idempotency_key": key})

    assert invalid.status_code == 422 and shown_key(invalid) != key  # A fresh form.
    assert corrected.status_code == 303
    assert Charge.objects.count() == 1


def test_a_bare_tag_form_answered_200_keeps_its_answer_and_other_data_gets_a_page() -> None:
    # What docs/forms.md warns of: the re-rendered form's 200 was stored under the key.
    client = Client()
    key = shown_key(client.get("/bare-tag-200/"))

    send(client, "/bare-tag-200/", {"amount": -5, "idempotency_key": key})
    corrected = send(client, "/bare-tag-200/", {"amount": 5, "idempotency_key": key})

    assert corrected.status_code == 422
    assert corrected["Content-Type"].startswith("text/html")
    assert "This form was already sent with other data" in corrected.content.decode()
    assert Charge.objects.count() == 0


@pytest.mark.parametrize(
    ("accept", "html"),
    [
        (BROWSER, True),
        ("text/html", True),
        ("*/*", False),
        (None, False),
        ("application/json", False),
        ("application/json, text/html;q=0.5", False),
    ],
)
def test_other_data_under_a_forms_key_is_a_page_for_browsers_and_problem_json_for_clients(
    accept: str | None, html: bool
) -> None:
    client = Client()
    key = shown_key(client.get("/mixin/"))
    send(client, "/mixin/", {"amount": 5, "idempotency_key": key})
    headers = {} if accept is None else {"HTTP_ACCEPT": accept}

    reused = client.post("/mixin/", {"amount": 6, "idempotency_key": key}, **headers)

    assert reused.status_code == 422
    body = reused.content.decode()
    if html:
        assert reused["Content-Type"] == "text/html; charset=utf-8"
        assert "<h1>Idempotency key reused for a different request</h1>" in body
        assert "This form was already sent with other data." in body
    else:
        assert reused["Content-Type"] == "application/problem+json"
        assert reused.json()["type"].endswith("key-reused")
    assert Charge.objects.count() == 1


def test_a_form_without_the_field_on_a_guarded_view_is_a_page_naming_the_tag() -> None:
    answer = send(Client(), "/mixin/", {"amount": 5})

    assert answer.status_code == 400
    assert answer["Content-Type"].startswith("text/html")
    assert "render {% idempotency_key_field %} inside the &lt;form&gt;" in answer.content.decode()
    assert Charge.objects.count() == 0


def test_a_key_that_is_not_one_is_a_400_page() -> None:
    answer = send(Client(), "/mixin/", {"amount": 5, "idempotency_key": "a" * 256})

    assert answer.status_code == 400
    assert "Idempotency key invalid" in answer.content.decode()
    assert Charge.objects.count() == 0


def test_the_header_wins_over_the_field_which_the_fingerprint_leaves_out() -> None:
    client = Client()
    header = {"HTTP_IDEMPOTENCY_KEY": "from-the-header"}

    first = send(client, "/mixin/", {"amount": 5, "idempotency_key": "field-one"}, **header)
    second = send(client, "/mixin/", {"amount": 5, "idempotency_key": "field-two"}, **header)
    by_field = send(client, "/mixin/", {"amount": 5, "idempotency_key": "field-one"})

    assert second["Idempotent-Replayed"] == "true"
    assert second["Location"] == first["Location"]
    assert by_field.status_code == 303 and "Idempotent-Replayed" not in by_field
    assert Charge.objects.count() == 2


def test_a_multipart_form_carries_its_key_too() -> None:
    client = Client()
    data = {"amount": "5", "idempotency_key": shown_key(client.get("/mixin/"))}

    client.post("/mixin/", data)  # The test client sends multipart by default.
    second = client.post("/mixin/", data)

    assert second["Idempotent-Replayed"] == "true"
    assert Charge.objects.count() == 1


def test_a_forms_key_is_scoped_to_its_user_as_a_header_key_is() -> None:
    alice, bob = logged_in_browser(), logged_in_browser()
    data = {"amount": 5, "idempotency_key": "shared-key", "csrfmiddlewaretoken": CSRF_TOKEN}

    first = send(alice, "/mixin/", data)
    other = send(bob, "/mixin/", data)

    assert "Idempotent-Replayed" not in other
    assert other["Location"] != first["Location"]
    assert Charge.objects.count() == 2


@override_settings(IDEMPOTENCY_FORM_FIELD=None)
def test_with_form_field_none_forms_carry_no_key() -> None:
    answer = client_post_json_errors("/mixin/", {"amount": 5, "idempotency_key": "k-1"})

    assert answer.status_code == 400
    assert "requires an Idempotency-Key header" in answer.json()["detail"]


def client_post_json_errors(url: str, data: dict[str, Any]) -> HttpResponse:
    return Client().post(url, data, HTTP_ACCEPT="application/json")  # type: ignore[no-any-return]


@override_settings(IDEMPOTENCY_FORM_FIELD="token")
def test_the_field_name_is_the_setting() -> None:
    client = Client()
    page = client.get("/mixin/").content.decode()
    [key] = re.findall(r'name="token" value="([^"]+)"', page)

    first = send(client, "/mixin/", {"amount": 5, "token": key})
    second = send(client, "/mixin/", {"amount": 5, "token": key})

    assert second["Idempotent-Replayed"] == "true" and first.status_code == 303
    assert Charge.objects.count() == 1


def test_a_user_of_a_django_template_gets_the_tag_from_the_app() -> None:
    page = Template("{% load idempotency %}{% idempotency_key_field %}").render(Context())

    assert FIELD.match(page) and page.endswith('">')


# A double click: the second submit reaches another thread while the first still runs.
@pytest.mark.postgresql
@pytest.mark.mariadb
def test_a_double_click_waits_for_the_first_submit_and_gets_its_redirect() -> None:
    started, release = threading.Event(), threading.Event()
    answers: list[HttpResponse] = []
    user = UserFactory()

    def slow_charge(sender: Any, instance: Charge, **kwargs: Any) -> None:
        started.set()
        release.wait(10)

    from django.db.models.signals import pre_save

    pre_save.connect(slow_charge, sender=Charge)
    data = {"amount": 5, "idempotency_key": "double-click"}

    def click() -> None:
        client = Client()
        client.force_login(user)
        try:
            answers.append(send(client, "/mixin/", data))
        finally:
            connection.close()  # This thread's: the test database is dropped at the end.

    try:
        first = threading.Thread(target=click)
        first.start()
        assert started.wait(10)
        pre_save.disconnect(slow_charge, sender=Charge)
        second = threading.Thread(target=click)
        second.start()
        release.set()
        first.join(10)
        second.join(10)
    finally:
        pre_save.disconnect(slow_charge, sender=Charge)
        release.set()

    # Not 409: it waited for the first, and got its redirect.
    assert [a.status_code for a in answers] == [303, 303]
    assert answers[0]["Location"] == answers[1]["Location"]
    assert Charge.objects.count() == 1


@override_settings(IDEMPOTENCY_KEY_FORMAT="uuid")
@pytest.mark.parametrize("url", ["/mixin/", "/bare-tag/"])
def test_where_keys_must_be_uuids_forms_carry_uuids(url: str) -> None:
    client = Client()
    key = shown_key(client.get(url))

    answer = send(client, url, {"amount": 5, "idempotency_key": key})

    assert str(uuid.UUID(key)) == key
    assert answer.status_code == 303


@pytest.mark.parametrize("url", ["/rebinding/", "/coupon/"])
def test_an_invalid_form_beside_a_valid_one_that_did_the_work_keeps_the_answer(url: str) -> None:
    # An invalid form says nothing happened only when no valid form was sent with the key: the
    # view may have paid with another one.
    client = Client()
    data = {"amount": "", "coupon": "too-long", "idempotency_key": f"k-{url}"}
    if url == "/coupon/":
        data["amount"] = "5"

    first, resent = send(client, url, data), send(client, url, data)

    assert resent["Idempotent-Replayed"] == "true"
    assert resent.content == first.content
    assert Charge.objects.count() == 1


def test_a_prefixed_form_and_a_formsets_forms_carry_the_key_under_its_own_name() -> None:
    client = Client()
    page = client.get("/prefixed/").content.decode()
    keys = FIELD.findall(page)
    assert len(keys) == 3 and "pay-idempotency_key" not in page  # One field name for all.
    data = {
        "pay-amount": 5,
        "form-TOTAL_FORMS": 2,
        "form-INITIAL_FORMS": 0,
        "form-0-amount": 1,
        "form-1-amount": 1,
        "idempotency_key": keys[-1],
    }

    first, resent = send(client, "/prefixed/", data), send(client, "/prefixed/", data)

    assert (first.status_code, resent["Idempotent-Replayed"]) == (303, "true")
    assert Charge.objects.count() == 1
