from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from aero import audit_views, i18n, views
from aero.admin_moved import moved_admin_urls
from aero.packs import installed_packs

urlpatterns = [
    # The approval queue first: its pages are the most requested, and each include tried
    # before it costs an exception and a list of its patterns (resolving 51 -> 15 us).
    path("approvals/", include("approvals.urls")),
    path("", views.home, name="home"),
    path("healthz", views.healthz, name="healthz"),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("language/", i18n.set_language, name="set-language"),
    path("audit/", audit_views.audit_log, name="audit"),
    path("audit/export.csv", audit_views.audit_csv, name="audit-csv"),
    # A pack's models the core held keep their old admin addresses, as redirects.
    *moved_admin_urls(),
    path("admin/", admin.site.urls),
    path("", include("diagnosis.urls")),
    # The packs' own pages (the apps are loaded before any URLconf is).
    *[path("", include(pack.urls)) for pack in installed_packs() if pack.urls],
    # The IT diagnosis pack's form (named by string: the kernel imports no app or pack).
    path("", include("packs.diagnosis.urls")),
    path("", include("replay.urls")),
    path("api/v1/", include("api.v1_urls")),
    path("api/tokens/", include("api.urls")),
    path("ingest/", include("ingest.urls")),
    path("", include("api.metrics_urls")),
]

# A refused dependency (database, Redis) answers 503 naming it; anything else the 500 page.
handler500 = "aero.errors.handler500"
