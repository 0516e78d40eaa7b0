"""The admin pages of models a pack took over from the core keep answering at their old
addresses (bookmarks, links in notes): the list, add and each object's change, history
and delete pages redirect to the same page under the model's new app label. The pack
says what moved (DomainPack.moved_admin); staff only, as the admin is."""

from __future__ import annotations

from django.contrib import admin
from django.http import HttpRequest, HttpResponsePermanentRedirect
from django.urls import URLPattern, path, reverse

from aero.packs import moved_admin

# The model admin's own pages: (path after the model's, the URL name's suffix, this
# redirect's own name's suffix).
_PAGES = (
    ("", "changelist", "changelist"),
    ("add/", "add", "add"),
    ("<path:object_id>/change/", "change", "change"),
    ("<path:object_id>/history/", "history", "history"),
    ("<path:object_id>/delete/", "delete", "delete"),
    ("<path:object_id>/", "change", "short"),  # the admin's short form of the change page
)


def moved(
    request: HttpRequest, target: str, page: str, object_id: str = ""
) -> HttpResponsePermanentRedirect:
    """The same page of the model, now `target` ("app_label.model"), query kept."""
    url = reverse(f"admin:{target.replace('.', '_')}_{page}", args=[object_id] if object_id else [])
    query = request.META.get("QUERY_STRING", "")
    return HttpResponsePermanentRedirect(f"{url}?{query}" if query else url)


def moved_admin_urls() -> list[URLPattern]:
    """The old addresses of every installed pack's moved models, before the admin's own
    (whose catch-all answers 404 for a model it no longer has)."""
    view = admin.site.admin_view(moved)
    return [
        path(
            f"admin/{old.replace('.', '/')}/{suffix}",
            view,
            {"target": new, "page": page},
            name=f"admin_moved_{old.replace('.', '_')}_{own}",
        )
        for old, new in moved_admin().items()
        for suffix, page, own in _PAGES
    ]
