"""The views the middleware and the project-wide guard leave alone: credential views by default,
and those IDEMPOTENCY_EXEMPT_VIEWS names."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from django_idempotency.conf import conf

# Views that browsers and login forms reach, whose answers are sessions and credentials rather
# than operations: a login form has no idempotency key to send, and a token must not be replayed.
# Named by dotted path, each a class or a function, and matched against the view, its class and
# every base class, so nothing here is imported and a project's subclass matches too.
CREDENTIAL_VIEWS: tuple[str, ...] = (
    # The admin site: every page, its login and logout included.
    "django.contrib.admin.sites.AdminSite",
    "django.contrib.admin.options.ModelAdmin",
    # Django's authentication views.
    "django.contrib.auth.views.LoginView",
    "django.contrib.auth.views.LogoutView",
    "django.contrib.auth.views.PasswordChangeView",
    "django.contrib.auth.views.PasswordChangeDoneView",
    "django.contrib.auth.views.PasswordResetView",
    "django.contrib.auth.views.PasswordResetDoneView",
    "django.contrib.auth.views.PasswordResetConfirmView",
    "django.contrib.auth.views.PasswordResetCompleteView",
    # DRF's token endpoint (`obtain_auth_token` is `ObtainAuthToken.as_view()`).
    "rest_framework.authtoken.views.ObtainAuthToken",
    # djangorestframework-simplejwt: TokenObtainPairView, TokenRefreshView, TokenVerifyView,
    # TokenBlacklistView and the sliding-token views are all TokenViewBase.
    "rest_framework_simplejwt.views.TokenViewBase",
    # django-rest-knox, dj-rest-auth, django-oauth-toolkit.
    "knox.views.LoginView",
    "knox.views.LogoutView",
    "knox.views.LogoutAllView",
    "dj_rest_auth.views.LoginView",
    "dj_rest_auth.views.LogoutView",
    "oauth2_provider.views.base.TokenView",
    "oauth2_provider.views.base.RevokeTokenView",
)


def dotted_names(*views: Any) -> frozenset[str]:
    """Every dotted path each view answers to: a function's, a class's and its bases', a view
    instance's class, a bound method's owner, and the admin site or model admin that built it."""
    names: set[str] = set()
    for view in views:
        if view is None:
            continue
        owners = [
            getattr(view, "view_class", None),  # as_view()
            getattr(view, "cls", None),  # DRF's as_view() and @api_view
            getattr(view, "admin_site", None),  # AdminSite.admin_view
            getattr(view, "model_admin", None),  # ModelAdmin.get_urls
            getattr(view, "__self__", None),  # A bound method: AdminSite.login
        ]
        if isinstance(view, type):
            owners.append(view)
        elif not callable(view) or not hasattr(view, "__qualname__"):
            owners.append(type(view))  # A view instance.
        else:
            names.add(f"{view.__module__}.{view.__qualname__}")
        for owner in owners:
            if owner is not None:
                names.update(_class_names(owner if isinstance(owner, type) else type(owner)))
    return frozenset(names)


@functools.cache
def _class_names(view_class: type) -> frozenset[str]:
    # By __name__ as well: @api_view names its class after the function, not its __qualname__.
    return frozenset(
        f"{base.__module__}.{name}"
        for base in view_class.__mro__
        for name in (base.__qualname__, base.__name__)
    )


def is_listed(views: Iterable[Any], paths: Iterable[str]) -> bool:
    """Whether any of `views` answers to one of these dotted paths."""
    return not dotted_names(*views).isdisjoint(paths)


def is_credential_view(*views: Any) -> bool:
    """A view of CREDENTIAL_VIEWS (its class, a base class, or the admin site)."""
    return is_listed(views, CREDENTIAL_VIEWS)


def exempt_by_default(*views: Any) -> bool:
    """Left alone by the middleware and the project-wide guard: a credential view, or one that
    IDEMPOTENCY_EXEMPT_VIEWS names. `@idempotent` and IdempotencyMixin still guard it."""
    return is_listed(views, (*CREDENTIAL_VIEWS, *conf.EXEMPT_VIEWS))
