"""HTML forms: the key a form carries in a hidden field, and HTML answers for browsers."""

from __future__ import annotations

from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.template import TemplateDoesNotExist
from django.template.loader import render_to_string
from django.utils.html import format_html

from django_idempotency.conf import conf
from django_idempotency.http.problems import PROBLEM_CONTENT_TYPE, ProblemResponse

# What a browser's form posts: the only bodies a page without JavaScript can send.
FORM_TYPES = frozenset({"application/x-www-form-urlencoded", "multipart/form-data"})
# The answer's types in the order an Accept header that ranks them alike (*/*, or none) picks:
# problem+json first, so that only a client that asks for HTML above JSON gets it (a browser).
_ANSWER_TYPES = [PROBLEM_CONTENT_TYPE, "application/json", "text/html"]
TEMPLATE = "django_idempotency/problem.html"
TAG = "{% idempotency_key_field %}"


def is_form_post(http_request: HttpRequest) -> bool:
    """A POST of form data: what an HTML form sends."""
    return http_request.method == "POST" and http_request.content_type in FORM_TYPES


def form_key(http_request: HttpRequest) -> str | None:
    """The key a form sent in its IDEMPOTENCY_FORM_FIELD field (its last value); None when it
    sent none or is not a form. Parsing the body may raise what `problems.body_problem`
    answers."""
    field = conf.FORM_FIELD
    if field is None or not is_form_post(http_request):
        return None
    return http_request.POST.get(field)


def prefers_html(http_request: HttpRequest) -> bool:
    """Whether the client ranks HTML above JSON: a browser, not an API client (whose `*/*` or
    missing Accept header gets problem+json)."""
    return http_request.get_preferred_type(_ANSWER_TYPES) == "text/html"


class ProblemPage(ProblemResponse):
    """The guard's problem as a page for a person: its status, title, detail and headers.

    Still a `ProblemResponse`, of the same kind: DRF's and Ninja's error formats reshape it as
    they reshape problem+json (IDEMPOTENCY_ERROR_FORMAT).
    """

    def __init__(self, problem: ProblemResponse, http_request: HttpRequest) -> None:
        super().__init__(problem.kind, problem.detail, problem.retry_after)
        context = {
            "status": problem.status_code,
            "title": problem.kind.title,
            "detail": problem.detail,
            "type": problem.kind.slug,
        }
        try:
            # The project's django_idempotency/problem.html if it has one, else the package's.
            page = render_to_string(TEMPLATE, context, request=http_request)
        except TemplateDoesNotExist:  # A project with no template engine (an API alone).
            page = format_html(
                "<!doctype html><title>{title}</title><h1>{title}</h1><p>{detail}</p>", **context
            )
        self.content = page.encode()
        self["Content-Type"] = "text/html; charset=utf-8"


def for_client(response: HttpResponseBase, http_request: HttpRequest) -> HttpResponseBase:
    """The guard's own problem as HTML for a client that prefers it; anything else as it is."""
    if type(response) is ProblemResponse and prefers_html(http_request):
        return ProblemPage(response, http_request)
    return response
