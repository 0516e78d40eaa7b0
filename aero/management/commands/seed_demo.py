from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand

from aero.roles import ADMIN, APPROVER, AUDITOR, OPERATOR, ensure_role_groups

DEMO_USERS = [
    ("admin", ADMIN, "admin-demo-pass"),
    ("operator", OPERATOR, "operator-demo-pass"),
    ("approver", APPROVER, "approver-demo-pass"),
    ("auditor", AUDITOR, "auditor-demo-pass"),
]


class Command(BaseCommand):
    help = "Create the role groups and the demo users (admin, operator, approver, auditor)."

    def handle(self, *args: Any, **options: Any) -> None:
        ensure_role_groups()
        users = get_user_model().objects
        self.stdout.write("Demo users (username / password / role):")
        for username, role, password in DEMO_USERS:
            user = users.filter(username=username).first()
            if user is None:
                user = users.create_user(username=username, password=password)
                if role == ADMIN:
                    user.is_staff = user.is_superuser = True
                    user.save(update_fields=["is_staff", "is_superuser"])
                user.groups.add(Group.objects.get(name=role))
                shown = password
            else:
                shown = password if user.check_password(password) else "(changed since seeding)"
            self.stdout.write(f"  {username:<9} {shown:<24} {role}")
