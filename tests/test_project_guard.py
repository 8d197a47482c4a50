"""The project-wide guard: IDEMPOTENCY_GUARD_ALL_VIEWS for DRF, the middleware for Django views."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.test.client import AsyncClient
from django.urls import path
from django.utils.decorators import method_decorator
from django.views import View
from rest_framework import generics, viewsets
from rest_framework.decorators import api_view
from rest_framework.permissions import IsAuthenticated
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter
from rest_framework.views import APIView

from django_idempotency import idempotency_exempt, idempotent, signals
from django_idempotency.contrib.rest_framework import IdempotencyMixin
from django_idempotency.exceptions import DeliveryRejected
from django_idempotency.models import IdempotencyRecord
from tests.factories import UserFactory
from tests.models import Charge
from tests.utils import assert_problem, post
from tests.views import _django_response, _drf_response, charge

MIDDLEWARE = "django_idempotency.middleware.IdempotencyMiddleware"


# DRF views written without any idempotency in mind.


class PlainAPIView(APIView):
    def post(self, request: Request) -> Response:
        return _drf_response(*charge(request))

    put = delete = post

    def get(self, request: Request) -> Response:
        return Response({"count": Charge.objects.count()})


class PlainViewSet(viewsets.ViewSet):
    def create(self, request: Request) -> Response:
        return _drf_response(*charge(request))


class ExemptAPIView(PlainAPIView):
    idempotency_exempt = True


class PartlyExemptAPIView(PlainAPIView):
    @idempotency_exempt
    def put(self, request: Request) -> Response:
        return _drf_response(*charge(request))


class OwnOptionsAPIView(PlainAPIView):
    idempotency_namespace = "own"
    idempotency_required = False
    idempotent_methods = ("POST",)


class VerifiedAPIView(PlainAPIView):
    @staticmethod
    def idempotency_verify(request: Any) -> None:
        if request.headers.get("X-Signature") != "good":
            raise DeliveryRejected("The signature does not match the body.")


class PrivateAPIView(PlainAPIView):
    permission_classes = [IsAuthenticated]


@api_view(["POST"])
@idempotent(namespace="decorated")
def decorated_api_view(request: Request) -> Response:
    return _drf_response(*charge(request))


class MixinViewSet(IdempotencyMixin, viewsets.ViewSet):
    def create(self, request: Request) -> Response:
        return _drf_response(*charge(request))


class DecoratedAPIView(APIView):
    @idempotent(namespace="decorated")
    def post(self, request: Request) -> Response:
        return _drf_response(*charge(request))


@api_view(["POST"])
@idempotency_exempt
def exempt_below_api_view(request: Request) -> Response:
    return _drf_response(*charge(request))


@idempotency_exempt
@api_view(["POST"])
def exempt_above_api_view(request: Request) -> Response:
    return _drf_response(*charge(request))


# Views guarded by a decorator inside another guard: the decorator declares options of its own.

PER_ACTION_TTL = timedelta(minutes=7)


class DecoratedCreateView(generics.CreateAPIView):
    """DRF's generic post() calls create(), which carries the per-action options."""

    @idempotent(namespace="per-action", ttl=PER_ACTION_TTL)
    def create(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return _drf_response(*charge(request))


class MixinDecoratedCreateView(IdempotencyMixin, DecoratedCreateView):
    pass


class MixinDecoratedUpdateView(IdempotencyMixin, generics.UpdateAPIView):
    """PATCH: DRF's patch() calls partial_update(), which calls update()."""

    @idempotent(namespace="per-action", ttl=PER_ACTION_TTL)
    def update(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return _drf_response(*charge(request))


class MixinOwnPostView(IdempotencyMixin, DecoratedCreateView):
    """A post() of the project's own, which may do anything before it calls create()."""

    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return self.create(request, *args, **kwargs)  # type: ignore[no-any-return]


class DispatchDecoratedView(View):
    @method_decorator(idempotent(namespace="per-action", ttl=PER_ACTION_TTL))
    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        return super().dispatch(request, *args, **kwargs)  # type: ignore[no-any-return]

    def post(self, request: HttpRequest) -> HttpResponse:
        return _django_response(*charge(request))


class HelperDecoratedView(View):
    """A class-based view whose handler calls a decorated method of its own."""

    idempotency_namespace = "class-view"

    def post(self, request: HttpRequest) -> HttpResponse:
        return self.charge_once(request)

    @idempotent(namespace="per-action")
    def charge_once(self, request: HttpRequest) -> HttpResponse:
        return _django_response(*charge(request))


def hides_attributes(view: Any) -> Any:
    """A project's decorator written without functools.wraps: what the view carries is hidden."""

    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        return view(request, *args, **kwargs)

    return wrapper


# Plain Django views, for the middleware.


def plain_function(request: HttpRequest) -> HttpResponse:
    return _django_response(*charge(request))


@idempotency_exempt
def exempt_function(request: HttpRequest) -> HttpResponse:
    return _django_response(*charge(request))


@idempotent(namespace="decorated")
def decorated_function(request: HttpRequest) -> HttpResponse:
    return _django_response(*charge(request))


hidden_decorated_function = hides_attributes(decorated_function)


class PaymentRequired(Exception):
    pass


def needs_payment(request: HttpRequest) -> HttpResponse:
    Charge.objects.create(reference="unpaid", amount=1)
    raise PaymentRequired


class PaymentRequiredMiddleware:
    """A project's exception middleware: a view's PaymentRequired is answered 402."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> Any:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> Any:
        if isinstance(exception, PaymentRequired):
            return HttpResponse("pay first", status=402)
        return None


async def needs_payment_async(request: HttpRequest) -> HttpResponse:
    raise PaymentRequired


def counts_requests(get_response: Any) -> Any:
    """A function middleware whose closure also holds its own state, which is not a step."""
    served: list[str] = []

    def middleware(request: HttpRequest) -> Any:
        served.append(request.path)
        return get_response(request)

    return middleware


def passes_through(get_response: Any) -> Any:
    """A function middleware: nothing names its next step but a closure."""

    def middleware(request: HttpRequest) -> Any:
        return get_response(request)

    return middleware


class HidesItsNextStep:
    """A middleware keeping its next step under a name of its own, where nothing can find it."""

    def __init__(self, get_response: Any) -> None:
        self._next = get_response

    def __call__(self, request: HttpRequest) -> Any:
        return self._next(request)


async def async_function(request: HttpRequest) -> HttpResponse:
    from asgiref.sync import sync_to_async

    return _django_response(*await sync_to_async(charge)(request))


class PlainClassView(View):
    idempotency_namespace = "class-view"

    def post(self, request: HttpRequest) -> HttpResponse:
        return _django_response(*charge(request))


router = SimpleRouter()
router.register("drf/viewset", PlainViewSet, basename="plain")
router.register("drf/mixin", MixinViewSet, basename="mixin")

urlpatterns = [
    path("drf/plain/", PlainAPIView.as_view()),
    path("drf/exempt/", ExemptAPIView.as_view()),
    path("drf/partly-exempt/", PartlyExemptAPIView.as_view()),
    path("drf/own-options/", OwnOptionsAPIView.as_view()),
    path("drf/verified/", VerifiedAPIView.as_view()),
    path("drf/decorated/", DecoratedAPIView.as_view()),
    path("drf/decorated-api-view/", decorated_api_view),
    path("drf/private/", PrivateAPIView.as_view()),
    path("drf/route-exempt/", idempotency_exempt(PlainAPIView.as_view())),
    path("drf/exempt-below/", exempt_below_api_view),
    path("drf/exempt-above/", exempt_above_api_view),
    path("django/plain/", plain_function),
    path("django/exempt/", exempt_function),
    path("django/decorated/", decorated_function),
    path("django/async/", async_function),
    path("django/class/", PlainClassView.as_view()),
    path("django/dispatch-decorated/", DispatchDecoratedView.as_view()),
    path("django/helper-decorated/", HelperDecoratedView.as_view()),
    path("django/hidden-decorated/", hidden_decorated_function),
    path("django/needs-payment/", needs_payment),
    path("django/async/needs-payment/", needs_payment_async),
    path("drf/decorated-create/", DecoratedCreateView.as_view()),
    path("drf/mixin-decorated-create/", MixinDecoratedCreateView.as_view()),
    path("drf/mixin-decorated-update/", MixinDecoratedUpdateView.as_view()),
    path("drf/mixin-own-post/", MixinOwnPostView.as_view()),
    *router.urls,
]

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db]


@pytest.fixture
def guard_all_views() -> Iterator[None]:
    with override_settings(IDEMPOTENCY_GUARD_ALL_VIEWS=True):
        yield


@pytest.fixture
def middleware() -> Iterator[None]:
    with override_settings(MIDDLEWARE=[*settings.MIDDLEWARE, MIDDLEWARE]):
        yield


@pytest.fixture
def claims() -> Iterator[list[str]]:
    """The namespace of every claim made during the test."""
    seen: list[str] = []

    def receiver(sender: Any, namespace: str, **kwargs: Any) -> None:
        seen.append(namespace)

    signals.claimed.connect(receiver)
    yield seen
    signals.claimed.disconnect(receiver)


def send(client: Client, url: str, method: str = "post", key: str = "key-1") -> Any:
    return getattr(client, method)(
        url, {"amount": 10}, content_type="application/json", headers={"Idempotency-Key": key}
    )


def runs_once(client: Client, url: str, method: str = "post") -> bool:
    """Whether a retry with the same key was replayed rather than run again."""
    before = Charge.objects.count()
    first, retry = send(client, url, method), send(client, url, method)
    assert first.status_code == 201, first.content
    return retry.get("Idempotent-Replayed") == "true" and Charge.objects.count() == before + 1


@pytest.mark.usefixtures("guard_all_views")
@pytest.mark.parametrize(
    ("url", "method"),
    [
        ("/drf/plain/", "post"),
        ("/drf/plain/", "put"),
        ("/drf/plain/", "delete"),
        ("/drf/viewset/", "post"),
    ],
)
def test_the_setting_guards_every_unsafe_method_of_every_drf_view(
    client: Client, url: str, method: str
) -> None:
    assert runs_once(client, url, method)


def test_without_the_setting_drf_views_are_not_guarded(client: Client) -> None:
    assert not runs_once(client, "/drf/plain/")
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.usefixtures("guard_all_views")
@pytest.mark.parametrize(
    ("url", "method"),
    [
        ("/drf/exempt/", "post"),
        ("/drf/partly-exempt/", "put"),
        ("/drf/route-exempt/", "post"),
        ("/drf/exempt-below/", "post"),
        ("/drf/exempt-above/", "post"),
        ("/drf/own-options/", "put"),
    ],
)
def test_an_exempt_view_or_method_is_not_guarded(client: Client, url: str, method: str) -> None:
    assert not runs_once(client, url, method)
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.usefixtures("guard_all_views")
def test_an_exempt_method_leaves_the_views_other_methods_guarded(client: Client) -> None:
    assert runs_once(client, "/drf/partly-exempt/", "post")


@pytest.mark.usefixtures("guard_all_views")
def test_a_views_own_options_win_over_the_project_defaults(client: Client) -> None:
    with override_settings(IDEMPOTENCY_REQUIRED=True):
        assert runs_once(client, "/drf/own-options/")
        assert post(client, "/drf/own-options/", key=None).status_code == 201
        assert_problem(post(client, "/drf/plain/", key=None), 400, "missing-key")

    assert IdempotencyRecord.objects.get().namespace == "own"


@pytest.mark.usefixtures("guard_all_views")
def test_a_views_static_verify_method_is_called_with_the_request_alone(client: Client) -> None:
    rejected = post(client, "/drf/verified/", key="signed", **{"X-Signature": "forged"})
    assert_problem(rejected, 400, "delivery-rejected")
    accepted = post(client, "/drf/verified/", key="signed", **{"X-Signature": "good"})
    assert accepted.status_code == 201, accepted.content
    assert Charge.objects.count() == 1


@pytest.mark.usefixtures("guard_all_views", "middleware")
@pytest.mark.parametrize(
    ("url", "namespace"),
    [
        ("/drf/mixin/", "default"),
        ("/drf/decorated/", "decorated"),
        ("/drf/decorated-api-view/", "decorated"),
        ("/django/decorated/", "decorated"),
    ],
)
def test_a_view_guarded_by_the_mixin_or_decorator_is_guarded_once(
    client: Client, claims: list[str], url: str, namespace: str
) -> None:
    assert runs_once(client, url)

    assert claims == [namespace]


@pytest.mark.usefixtures("guard_all_views")
def test_a_replay_still_comes_after_drfs_permission_checks(client: Client) -> None:
    client.force_login(UserFactory())
    assert runs_once(client, "/drf/private/")

    client.logout()
    assert send(client, "/drf/private/").status_code == 403


@pytest.mark.usefixtures("middleware")
def test_the_middleware_guards_plain_django_views(client: Client) -> None:
    assert runs_once(client, "/django/plain/")


@pytest.mark.usefixtures("middleware")
def test_the_middleware_takes_a_class_views_options(client: Client) -> None:
    assert runs_once(client, "/django/class/")

    assert IdempotencyRecord.objects.get().namespace == "class-view"


@pytest.mark.usefixtures("middleware")
def test_the_middleware_leaves_exempt_views_and_drf_views_alone(client: Client) -> None:
    assert not runs_once(client, "/django/exempt/")
    assert not runs_once(client, "/drf/plain/")  # DRF views: IDEMPOTENCY_GUARD_ALL_VIEWS.
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.usefixtures("middleware")
def test_the_middleware_answers_problems(client: Client) -> None:
    send(client, "/django/plain/")
    reused = client.post(
        "/django/plain/",
        {"amount": 20},
        content_type="application/json",
        headers={"Idempotency-Key": "key-1"},
    )

    assert_problem(reused, 422, "key-reused")


@pytest.mark.usefixtures("middleware")
@pytest.mark.django_db(transaction=True)
def test_the_middleware_guards_async_views() -> None:
    client = AsyncClient()
    headers = {"Idempotency-Key": "async-1"}

    def send_async() -> Any:
        return async_to_sync(client.post)(
            "/django/async/", {"amount": 10}, "application/json", headers=headers
        )

    first, retry = send_async(), send_async()

    assert first.status_code == 201
    assert retry["Idempotent-Replayed"] == "true"
    assert Charge.objects.count() == 1


@pytest.mark.usefixtures("middleware")
@pytest.mark.django_db(transaction=True)
def test_served_by_wsgi_the_middleware_guards_async_views(client: Client) -> None:
    first = send(client, "/django/async/", key="wsgi-async-1")
    retry = send(client, "/django/async/", key="wsgi-async-1")

    assert first.status_code == 201
    assert retry["Idempotent-Replayed"] == "true"
    assert retry.content == first.content
    assert Charge.objects.count() == 1


@pytest.mark.usefixtures("middleware")
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("url", "runs"), [("/django/plain/", 1), ("/django/exempt/", 2)])
def test_served_by_asgi_the_middleware_guards_sync_views_but_not_exempt_ones(
    url: str, runs: int
) -> None:
    client = AsyncClient()
    headers = {"Idempotency-Key": "asgi-sync-1"}

    def send_async() -> Any:
        return async_to_sync(client.post)(url, {"amount": 10}, "application/json", headers=headers)

    first, retry = send_async(), send_async()

    assert first.status_code == retry.status_code == 201
    assert (retry.get("Idempotent-Replayed") == "true") is (runs == 1)
    assert Charge.objects.count() == runs


# One request, guarded once: every combination of decorator, mixin, project-wide guard and
# middleware. (url, method, the guards turned on, the namespace of the one claim.)
COMBINATIONS = [
    # The decorator on the action DRF's generic handler calls: the most specific, it wins.
    pytest.param(
        "/drf/mixin-decorated-create/", "post", ["mixin"], "per-action", id="decorator+mixin"
    ),
    pytest.param(
        "/drf/mixin-decorated-update/",
        "patch",
        ["mixin"],
        "per-action",
        id="decorator+mixin-patch",
    ),
    pytest.param(
        "/drf/decorated-create/",
        "post",
        ["guard_all_views"],
        "per-action",
        id="decorator+project-wide",
    ),
    pytest.param(
        "/drf/mixin-decorated-create/",
        "post",
        ["mixin", "guard_all_views", "middleware"],
        "per-action",
        id="decorator+mixin+project-wide+middleware",
    ),
    pytest.param(
        "/django/decorated/", "post", ["middleware"], "decorated", id="middleware+decorator"
    ),
    pytest.param(
        "/django/dispatch-decorated/",
        "post",
        ["middleware"],
        "per-action",
        id="middleware+decorator-on-dispatch",
    ),
    pytest.param("/drf/mixin/", "post", ["mixin", "middleware"], "default", id="middleware+mixin"),
    pytest.param(
        "/drf/plain/",
        "post",
        ["guard_all_views", "middleware"],
        "default",
        id="middleware+project-wide",
    ),
    # A decorator the outer guard cannot see (called by the project's own code): the outer one
    # holds the key, and the decorator passes the request through.
    pytest.param("/drf/mixin-own-post/", "post", ["mixin"], "default", id="mixin+unseen-decorator"),
    pytest.param(
        "/drf/mixin-own-post/",
        "post",
        ["mixin", "guard_all_views", "middleware"],
        "default",
        id="all+unseen-decorator",
    ),
    pytest.param(
        "/django/helper-decorated/",
        "post",
        ["middleware"],
        "class-view",
        id="middleware+unseen-decorated-method",
    ),
    pytest.param(
        "/django/hidden-decorated/",
        "post",
        ["middleware"],
        "default",
        id="middleware+decorator-hidden-by-a-wrapper",
    ),
]


@pytest.mark.parametrize(("url", "method", "guards", "namespace"), COMBINATIONS)
def test_one_request_is_guarded_once_whatever_guards_it_meets(
    request: pytest.FixtureRequest,
    client: Client,
    claims: list[str],
    url: str,
    method: str,
    guards: list[str],
    namespace: str,
) -> None:
    for name in guards:
        if name != "mixin":  # The mixin is among the view's bases.
            request.getfixturevalue(name)

    assert runs_once(client, url, method)  # 201 once, then the replay; one charge.

    assert claims == [namespace]
    record = IdempotencyRecord.objects.get()
    assert record.namespace == namespace
    if namespace == "per-action":  # The decorator's own options, all of them.
        assert record.expires_at - record.created_at == PER_ACTION_TTL


EXCEPTION_MIDDLEWARE = f"{__name__}.PaymentRequiredMiddleware"
FUNCTION_MIDDLEWARE = f"{__name__}.passes_through"
STATEFUL_MIDDLEWARE = f"{__name__}.counts_requests"
# Where the project's exception middleware stands, against IdempotencyMiddleware.
ORDERS = {
    "before": [EXCEPTION_MIDDLEWARE, MIDDLEWARE],
    "after": [MIDDLEWARE, EXCEPTION_MIDDLEWARE],
    "after, behind a function middleware": [MIDDLEWARE, FUNCTION_MIDDLEWARE, EXCEPTION_MIDDLEWARE],
    "after, behind a function middleware with state": [
        MIDDLEWARE,
        STATEFUL_MIDDLEWARE,
        EXCEPTION_MIDDLEWARE,
    ],
}


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("key", ["unpaid-1", None])
def test_a_views_exception_reaches_the_projects_exception_middleware(
    order: str, key: str | None
) -> None:
    client = Client()
    with override_settings(MIDDLEWARE=[*settings.MIDDLEWARE, *ORDERS[order]]):
        first = post(client, "/django/needs-payment/", key=key)
        retry = post(client, "/django/needs-payment/", key=key)

    assert first.status_code == retry.status_code == 402
    assert first.content == b"pay first"
    # The view raised: its key was released, so the retry ran the view again.
    assert "Idempotent-Replayed" not in retry
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("order", ORDERS)
def test_served_by_asgi_a_views_exception_reaches_the_projects_exception_middleware(
    order: str,
) -> None:
    client = AsyncClient()
    with override_settings(MIDDLEWARE=[*settings.MIDDLEWARE, *ORDERS[order]]):
        first = async_to_sync(client.post)(
            "/django/needs-payment/",
            {"amount": 10},
            "application/json",
            headers={"Idempotency-Key": "unpaid-async"},
        )

    assert first.status_code == 402
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("order", ORDERS)
def test_an_async_views_exception_reaches_the_projects_exception_middleware(order: str) -> None:
    client = Client()
    with override_settings(MIDDLEWARE=[*settings.MIDDLEWARE, *ORDERS[order]]):
        first = post(client, "/django/async/needs-payment/", key="unpaid-async-view")
        retry = post(client, "/django/async/needs-payment/", key="unpaid-async-view")

    assert first.status_code == retry.status_code == 402
    assert "Idempotent-Replayed" not in retry  # Released: the retry ran the view again.
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.usefixtures("middleware")
@pytest.mark.django_db(transaction=True)
def test_served_by_asgi_an_exception_no_middleware_answers_is_still_raised() -> None:
    with pytest.raises(PaymentRequired):
        async_to_sync(AsyncClient().post)(
            "/django/needs-payment/",
            {"amount": 10},
            "application/json",
            headers={"Idempotency-Key": "unpaid-asgi"},
        )

    assert not IdempotencyRecord.objects.exists()


@pytest.mark.usefixtures("middleware")
def test_an_exception_no_middleware_answers_is_still_raised(client: Client) -> None:
    with pytest.raises(PaymentRequired):
        post(client, "/django/needs-payment/", key="unpaid-2")

    assert not IdempotencyRecord.objects.exists()


def test_when_the_handler_cannot_be_found_the_middleware_says_where_to_list_it(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    hidden = [MIDDLEWARE, f"{__name__}.HidesItsNextStep", EXCEPTION_MIDDLEWARE]
    with (
        override_settings(MIDDLEWARE=[*settings.MIDDLEWARE, *hidden]),
        caplog.at_level("WARNING", logger="django_idempotency"),
        pytest.raises(PaymentRequired),  # As before: nothing answers the view's exception.
    ):
        post(client, "/django/needs-payment/", key="unpaid-3")

    assert "List it last in MIDDLEWARE." in caplog.text
    assert not IdempotencyRecord.objects.exists()
