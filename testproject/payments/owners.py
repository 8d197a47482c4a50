"""Keys shared by the members of a tenant, who name it in an X-Tenant header."""

from __future__ import annotations

from typing import Any

from django_idempotency.http.owners import authenticated_user


def tenant_owner(request: Any) -> str:
    """The tenant in X-Tenant when the user is a member (group "tenant:<name>"), else the user.

    The header is the client's to choose, so it is trusted only for a member: anyone else who
    names the tenant keeps the per-user scope and never receives the tenant's stored responses.
    """
    tenant = request.headers.get("X-Tenant", "")
    user = getattr(request, "user", None)
    member = tenant and user is not None and user.is_authenticated
    if member and user.groups.filter(name=f"tenant:{tenant}").exists():
        return f"tenant:{tenant}"
    return authenticated_user(request)
