"""The guard's errors as DRF exceptions, for projects that shape errors in EXCEPTION_HANDLER."""

from __future__ import annotations

from django_idempotency.contrib import missing

try:
    from rest_framework.exceptions import APIException
except ModuleNotFoundError as exc:
    raise missing(exc, "drf") from exc

from django_idempotency.http.problems import ProblemResponse, documentation_url, problem_type


class IdempotencyProblem(APIException):
    """Raised in a DRF view instead of answering problem+json (IDEMPOTENCY_ERROR_FORMAT = "drf").

    DRF's exception handler sees the status, ``detail`` and code (the problem's slug, e.g.
    ``"key-reused"``) as for any `APIException`, and turns ``wait`` into ``Retry-After``.
    ``problem_type``, ``title`` and ``documentation`` (the page of IDEMPOTENCY_DOCS_URL
    documenting it, or None) are there for a handler that wants them.
    """

    status_code = 400
    default_detail = "The idempotency key cannot be used for this request."
    default_code = "idempotency-error"

    def __init__(self, problem: ProblemResponse) -> None:
        super().__init__(detail=problem.detail, code=problem.kind.slug)
        self.status_code = problem.kind.status
        self.wait = problem.retry_after
        self.problem_type = problem_type(problem.kind)
        self.title = problem.kind.title
        self.documentation = documentation_url(problem.kind)
