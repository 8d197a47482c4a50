"""The views whose responses are credentials, exempt from the project-wide guard by default."""

from __future__ import annotations

# By dotted path: a view function, or a class-based view (its subclasses are credential views
# too). Their responses are tokens and sessions, which a stored response would keep at rest.
CREDENTIAL_VIEWS = [
    "django.contrib.admin.sites.AdminSite.login",
    "django.contrib.auth.views.LoginView",
    "django.contrib.auth.views.PasswordChangeView",
    "django.contrib.auth.views.PasswordResetConfirmView",
    "rest_framework.authtoken.views.ObtainAuthToken",
    "rest_framework.authtoken.views.obtain_auth_token",
    "rest_framework_simplejwt.views.TokenViewBase",
    "rest_framework_simplejwt.views.TokenObtainPairView",
    "rest_framework_simplejwt.views.TokenRefreshView",
    "rest_framework_simplejwt.views.TokenObtainSlidingView",
    "rest_framework_simplejwt.views.TokenRefreshSlidingView",
    "rest_framework_simplejwt.views.token_obtain_pair",
    "rest_framework_simplejwt.views.token_refresh",
    "rest_framework_simplejwt.views.token_obtain_sliding",
    "rest_framework_simplejwt.views.token_refresh_sliding",
]
