"""The bank's routes, served under /bank/ by the demo's URLconf."""

from __future__ import annotations

from django.urls import path

from testproject.bank import views

app_name = "bank"
urlpatterns = [path("transfers/", views.create_transfer, name="transfer-create")]
