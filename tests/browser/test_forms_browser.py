"""The shop's HTML checkout in Chromium: one payment however a person sends its form again."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.signals import request_finished, request_started
from playwright.sync_api import expect

from django_idempotency import signals
from testproject.payments.models import Payment
from tests.browser.conftest import CHROMIUM, CHROMIUM_ARGS

# The shop is the same page on every database; what differs is the store holding its keys
# while two requests race (SQLite's single writer, PostgreSQL's row locks): run on both.
pytestmark = [
    pytest.mark.browser,
    pytest.mark.django_db(transaction=True),
    pytest.mark.sqlite,
    pytest.mark.postgresql,
    pytest.mark.urls("testproject.urls"),
]

CHECKOUT = "/shop/checkout/"
KEY = "input[name=idempotency_key]"
PAY = "button[type=submit]"
RECEIPT = re.compile(r"/shop/receipts/\d+/$")
REUSED = "Idempotency key reused for a different request"


class Server:
    """What the live server (a thread of this process) saw, in order: each request, as
    "POST /shop/checkout/", and each of the guard's outcomes, as "claimed"."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.first_post = threading.Event()
        self._running = 0
        self._changed = threading.Condition()

    @property
    def posts(self) -> list[str]:
        return [event for event in self.events if event.startswith("POST ")]

    @property
    def outcomes(self) -> list[str]:
        return [event for event in self.events if " " not in event]

    def started(self, sender: Any, environ: dict[str, Any], **kwargs: Any) -> None:
        with self._changed:
            self._running += 1
        if environ["PATH_INFO"] != "/favicon.ico":
            self.events.append(f"{environ['REQUEST_METHOD']} {environ['PATH_INFO']}")
        if environ["REQUEST_METHOD"] == "POST":
            self.first_post.set()

    def finished(self, sender: Any, **kwargs: Any) -> None:
        with self._changed:
            self._running -= 1
            self._changed.notify_all()

    def outcome(self, name: str) -> Any:
        return lambda sender, **kwargs: self.events.append(name)

    def idle(self) -> bool:
        """Wait until every request that reached the server was answered (False: 10 s on)."""
        with self._changed:
            return self._changed.wait_for(lambda: self._running == 0, timeout=10)


@pytest.fixture
def server() -> Iterator[Server]:
    seen = Server()
    receivers = {name: seen.outcome(name) for name in signals.BY_OUTCOME}
    request_started.connect(seen.started)
    request_finished.connect(seen.finished)
    for name, receiver in receivers.items():
        signals.BY_OUTCOME[name].connect(receiver)
    yield seen
    request_started.disconnect(seen.started)
    request_finished.disconnect(seen.finished)
    for name, receiver in receivers.items():
        signals.BY_OUTCOME[name].disconnect(receiver)


@pytest.fixture
def history_page(page: Any) -> Iterator[Any]:
    """A page in a Chromium that keeps the page a person leaves in its back/forward cache, as
    browsers do: going back shows the very form that was sent, its key and what was typed.

    Playwright turns that cache off in the browsers it launches (the `page` fixture's): there,
    going back fetches the checkout again, a new form with a new key (the POST to the same URL
    dropped the copy in the HTTP cache), whose payment would rightly be a second one. This
    browser, launched by the same Playwright, keeps the cache on.
    """
    browser = page.context.browser.browser_type.launch(
        executable_path=CHROMIUM,
        headless=True,
        args=CHROMIUM_ARGS,
        ignore_default_args=["--disable-back-forward-cache"],
    )
    try:
        context = browser.new_context(locale="en-US")
        context.set_default_timeout(15_000)
        yield context.new_page()
    finally:
        browser.close()


def watch_posts(page: Any) -> list[str]:
    """The paths the page POSTs to, from now on: what the browser sent, whatever it showed."""
    sent: list[str] = []

    def on_request(request: Any) -> None:
        if request.method == "POST":
            sent.append(re.sub(r"^https?://[^/]+", "", request.url))

    page.on("request", on_request)
    return sent


def open_checkout(page: Any, live_server: Any) -> str:
    """Open the checkout, as a person following a link does; the key of the form shown."""
    page.goto(f"{live_server.url}{CHECKOUT}")
    return str(page.input_value(KEY))


def fill(page: Any, amount: str) -> None:
    page.fill("#id_amount", amount)
    page.select_option("#id_currency", "EUR")
    page.fill("#id_description", "Blue teapot")


def pay(page: Any) -> str:
    """Click "Pay" and wait for the receipt the checkout redirects to; its URL."""
    page.click(PAY)
    page.wait_for_url(RECEIPT)
    return str(page.url)


def back_to_the_form_sent(page: Any, key: str) -> None:
    # A page restored from the back/forward cache fires no load event to wait for.
    page.go_back(wait_until="commit")
    expect(page).to_have_url(re.compile(f"{CHECKOUT}$"))
    # The checkout never serves a key twice: the same key is the same form.
    expect(page.locator(KEY), "Going back showed a new form, not the one sent.").to_have_value(key)


def the_payment() -> Payment:
    """The one payment the shop took (fails if it took none, or several)."""
    (payment,) = Payment.objects.all()
    return payment


def receipt_of(live_server: Any, payment: Payment) -> str:
    return f"{live_server.url}/shop/receipts/{payment.pk}/"


def paid_once(live_server: Any, receipt: str) -> str:
    """The one payment's receipt's GET, as the server saw it, after checking that `receipt`
    (where the browser was sent) is that payment's."""
    payment = the_payment()
    assert receipt == receipt_of(live_server, payment)
    return f"GET /shop/receipts/{payment.pk}/"


def paid_then_back(page: Any, live_server: Any) -> tuple[list[str], str]:
    """Pay 1250 through the checkout, then go back to the form sent: the paths the page
    posted to (growing as it posts again), and the receipt it was sent to."""
    posts = watch_posts(page)
    sent_key = open_checkout(page, live_server)
    fill(page, "1250")
    receipt = pay(page)
    back_to_the_form_sent(page, sent_key)
    return posts, receipt


# What the server saw of a form shown and paid with: its page, its POST, the guard's outcomes.
PAID = [f"GET {CHECKOUT}", f"POST {CHECKOUT}", "claimed", "completed"]


def test_double_click_on_pay_sends_two_posts_and_pays_once(
    live_server: Any, page: Any, server: Server, settings: Any
) -> None:
    # The provider takes a second to pay: the second click arrives while the first pays.
    settings.SHOP_PAYMENT_SECONDS = 1.0
    posts = watch_posts(page)
    open_checkout(page, live_server)
    fill(page, "1250")
    button = page.locator(PAY).bounding_box()
    x, y = button["x"] + button["width"] / 2, button["y"] + button["height"] / 2

    # Two clicks of the mouse. Not page.dblclick: Chromium folds two submits that come before
    # the first has left into one POST. Nor page.click: Playwright would wait for the first
    # submit's page before clicking again. The second click waits until the first POST is at
    # the server, so that both reach it (Chromium drops the first when the second is sent).
    page.mouse.click(x, y)
    assert server.first_post.wait(timeout=10), "The first click's POST never reached the server."
    page.mouse.click(x, y)

    # Polled: the first submit's navigation, which the second replaced, ends in net::ERR_ABORTED
    # and page.wait_for_url would fail on it.
    expect(page).to_have_url(RECEIPT)
    assert posts == [CHECKOUT, CHECKOUT]
    # The browser follows whichever answer it kept; the POST it dropped may be answered after.
    assert server.idle(), "A request to the server was never answered."
    assert server.posts == [f"POST {CHECKOUT}"] * 2
    # Both came before the payment's answer was stored: one paid, the other waited for it and
    # was given the same redirect.
    last_post = max(i for i, event in enumerate(server.events) if event == f"POST {CHECKOUT}")
    assert last_post < server.events.index("completed"), server.events
    assert server.outcomes == ["claimed", "completed", "replayed"]
    payment = the_payment()
    assert (payment.amount, payment.currency, payment.description) == (1250, "EUR", "Blue teapot")
    assert page.url == receipt_of(live_server, payment)
    assert page.locator("#payment").inner_text() == f"Payment {payment.pk}: 1250 EUR (Blue teapot)"
    assert page.locator("#payments").inner_text() == "Payments taken: 1"


def test_reloading_the_receipt_after_paying_does_not_pay_again(
    live_server: Any, page: Any, server: Server
) -> None:
    posts = watch_posts(page)
    open_checkout(page, live_server)
    fill(page, "1250")
    receipt = pay(page)
    assert page.locator(".message").inner_text() == "Payment of 1250 EUR received."

    # Post/Redirect/Get: the page shown is the receipt's GET, which is what a reload sends.
    page.reload()

    assert page.url == receipt
    assert page.locator("#payments").inner_text() == "Payments taken: 1"
    assert posts == [CHECKOUT]
    receipt_path = paid_once(live_server, receipt)
    assert server.events == [*PAID, receipt_path, receipt_path]


def test_the_same_form_sent_again_from_history_is_replayed_the_same_receipt(
    live_server: Any, history_page: Any, server: Server
) -> None:
    page = history_page
    posts, receipt = paid_then_back(page, live_server)
    assert page.input_value("#id_amount") == "1250"  # What was typed is there too.
    replayed = pay(page)

    assert replayed == receipt
    assert page.locator("#payments").inner_text() == "Payments taken: 1"
    assert posts == [CHECKOUT, CHECKOUT]
    # Going back fetched nothing; the form sent again was answered from its stored answer.
    receipt_path = paid_once(live_server, receipt)
    assert server.events == [*PAID, receipt_path, f"POST {CHECKOUT}", "replayed", receipt_path]


def test_an_invalid_form_comes_back_with_its_key_and_the_corrected_form_pays_once(
    live_server: Any, page: Any, server: Server
) -> None:
    posts = watch_posts(page)
    sent_key = open_checkout(page, live_server)
    # Chromium does not send -5 at all (the field's min="0"): an amount larger than the
    # database holds is what gets past the browser to the form's own validation.
    fill(page, "-5")
    assert page.eval_on_selector("#id_amount", "input => input.validity.rangeUnderflow")
    fill(page, "99999999999999999999")
    page.click(PAY)

    expect(page.locator(".errorlist")).to_contain_text("Ensure this value is less than or equal")
    assert page.url == f"{live_server.url}{CHECKOUT}"
    assert page.input_value(KEY) == sent_key
    assert not Payment.objects.exists()

    # The key was given back rather than spent on the errors: the corrected form runs with it.
    fill(page, "1250")
    receipt = pay(page)

    assert page.locator("#payments").inner_text() == "Payments taken: 1"
    paid_once(live_server, receipt)
    assert the_payment().amount == 1250
    assert posts == [CHECKOUT, CHECKOUT]
    assert server.outcomes == ["claimed", "released", "claimed", "completed"]


def test_the_same_form_sent_again_with_other_data_shows_a_422_page_and_pays_once(
    live_server: Any, history_page: Any, server: Server
) -> None:
    page = history_page
    posts, _ = paid_then_back(page, live_server)

    fill(page, "9900")  # The person changes the amount on the form already sent.
    with page.expect_response(lambda response: response.request.method == "POST") as sent:
        page.click(PAY)

    answer = sent.value
    # A browser's Accept (HTML above JSON) gets a page, not the problem's JSON.
    assert (answer.request.header_value("accept") or "").startswith("text/html,")
    assert answer.status == 422
    assert answer.headers["content-type"] == "text/html; charset=utf-8"
    expect(page).to_have_title(REUSED)
    expect(page.locator("h1")).to_have_text(REUSED)
    assert page.locator("main p").first.inner_text() == (
        "This form was already sent with other data. Reload its page for a fresh form, then"
        " send it again."
    )
    assert posts == [CHECKOUT, CHECKOUT]
    assert server.outcomes == ["claimed", "completed", "mismatch"]
    assert the_payment().amount == 1250
