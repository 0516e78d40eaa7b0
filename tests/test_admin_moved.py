"""Bookmarked admin pages of the models the airport pack took over from the core (the
restrictions from diagnosis, the topology and flights from scenarios_admin) still open:
the old address redirects to the same page under the model's new app label. Staff only,
as the admin is."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.urls import reverse

from packs.airport.models import Flight, Topology
from tests.admin_helpers import admin_client, staff_with
from tests.web_helpers import login


@pytest.fixture
def admin_user(builtin: None) -> User:
    return User.objects.create_superuser("root", password="pw-for-tests")


@pytest.mark.django_db
def test_an_old_list_page_opens_the_new_one_with_its_filters(admin_user: User) -> None:
    client = admin_client(admin_user)
    response = client.get("/admin/diagnosis/restriction/?kind__exact=taxiway")
    assert response.status_code == 301
    assert response["Location"] == "/admin/airport/restriction/?kind__exact=taxiway"
    page = client.get(response["Location"])
    assert page.status_code == 200 and b"restriction" in page.content.lower()


@pytest.mark.django_db
def test_an_old_change_page_opens_the_same_object(admin_user: User) -> None:
    client = admin_client(admin_user)
    topology = Topology.objects.get(is_active=True)
    flight = Flight.objects.filter(topology=topology).first()
    assert flight is not None
    for old, new in (
        (
            f"/admin/scenarios_admin/topology/{topology.pk}/change/",
            reverse("admin:airport_topology_change", args=[topology.pk]),
        ),
        (
            f"/admin/scenarios_admin/flight/{flight.pk}/",
            reverse("admin:airport_flight_change", args=[flight.pk]),
        ),
        (
            f"/admin/scenarios_admin/flight/{flight.pk}/history/",
            reverse("admin:airport_flight_history", args=[flight.pk]),
        ),
    ):
        response = client.get(old)
        assert (response.status_code, response["Location"]) == (301, new), old
    page = client.get(f"/admin/scenarios_admin/topology/{topology.pk}/change/", follow=True)
    assert page.status_code == 200
    assert topology.icao in page.content.decode()


@pytest.mark.django_db
def test_the_old_pages_are_staff_only(builtin: None, alice: User) -> None:
    """Anonymous visitors and signed-in users who are not staff get the admin's login
    page, never the new address."""
    for client in (login(None), login(alice)):
        response = client.get("/admin/diagnosis/restriction/")
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("admin:login"))
    # Staff without the model's permission are redirected, then refused by the admin.
    staff = admin_client(staff_with("clerk"))
    response = staff.get("/admin/diagnosis/restriction/", follow=True)
    assert response.redirect_chain == [("/admin/airport/restriction/", 301)]
    assert response.status_code == 403


@pytest.mark.django_db
def test_a_page_that_never_was_still_answers_404(admin_user: User) -> None:
    client = admin_client(admin_user)
    assert client.get("/admin/scenarios_admin/riskrule/").status_code == 404
