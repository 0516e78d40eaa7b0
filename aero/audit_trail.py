"""Who changed what, as audit entries: every admin change (Django admin's LogEntry), the
provider switches and keys, users' roles and privileges, sign-in, sign-out and failed
sign-in. Decisions, publishing and exports are audited where they happen (do_* actions
and views); this module catches what people change through the admin, whatever page
they use.

Model signals know no request: `CurrentActorMiddleware` puts the signed-in user in a
context variable for the request, so an entry written by a signal names who did it (or
"system" for a shell or a command). Connected in AeroConfig.ready; the provider
switches by the app that holds the provider configs (`connect_provider`)."""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.contrib.auth.signals import user_logged_in, user_logged_out, user_login_failed
from django.db.models.signals import m2m_changed, post_save, pre_save
from django.http import HttpRequest, HttpResponse

from aero.models import audit
from aero.packs import admin_actions

# Holds the request, not request.user: the user is a lazy object, and asgiref inspects
# every context variable when it crosses into a thread (isinstance), which would load
# the user from the database inside the event loop and fail the request under daphne.
_actor: contextvars.ContextVar[Any] = contextvars.ContextVar("aero_actor", default=None)

# Admin changes, named for auditors by model (a pack names its own models' changes:
# DomainPack.admin_actions; the rest: admin.<app.model>.<verb>).
ADMIN_ACTIONS = {
    "scenarios_admin.scenario": ("scenario.created", "scenario.draft_saved", "scenario.deleted"),
    "scenarios_admin.providerconfig": (
        "provider.created",
        "provider.changed",
        "provider.deleted",
    ),
    "tools.mcpserver": ("mcp_server.created", "mcp_server.changed", "mcp_server.deleted"),
    "tools.skill": ("skill.created", "skill.changed", "skill.deleted"),
    "diagnosis_pack.metricssource": (
        "metrics_source.created",
        "metrics_source.changed",
        "metrics_source.deleted",
    ),
    "auth.user": ("user.created", "user.changed", "user.deleted"),
    "auth.group": ("role.created", "role.changed", "role.deleted"),
}
_VERBS = {ADDITION: 0, CHANGE: 1, DELETION: 2}
# Fields of a user whose change alters what the user may do.
PRIVILEGE_FIELDS = ("is_active", "is_staff", "is_superuser")


class CurrentActorMiddleware:
    """Makes the request's user the actor of audit entries written by model signals."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        # The request, not request.user: that is a lazy object, and asgiref inspects
        # context variables (isinstance) when it switches to async code (an async-capable
        # middleware after this one, such as django-axes'), which would evaluate it, a
        # database query, in the event loop: SynchronousOnlyOperation on every request.
        token = _actor.set(request)
        try:
            return self.get_response(request)
        finally:
            _actor.reset(token)


def current_actor() -> Any:
    user = getattr(_actor.get(), "user", None)
    return user if getattr(user, "is_authenticated", False) else None


def client_address(request: HttpRequest | None) -> str:
    # REMOTE_ADDR only: a forwarded header is the client's word (the proxy setting that
    # makes it trustworthy is the deployment's, see docs/security.md).
    return (request.META.get("REMOTE_ADDR", "") if request is not None else "")[:64]


# --- the admin ------------------------------------------------------------------------


def admin_logged(sender: Any, instance: LogEntry, created: bool, **kwargs: Any) -> None:
    if not created:
        return
    content_type = instance.content_type
    model = f"{content_type.app_label}.{content_type.model}" if content_type else "unknown"
    verb = _VERBS.get(instance.action_flag, 1)
    names = ADMIN_ACTIONS.get(model) or admin_actions().get(model)
    action = names[verb] if names else f"admin.{model}.{('added', 'changed', 'deleted')[verb]}"
    audit(
        action,
        object_type=model,
        object_id=str(instance.object_id or ""),
        actor=instance.user,
        detail={"object": instance.object_repr, "changes": instance.get_change_message()},
    )


# --- providers: switched on or off, key set or removed ----------------------------------


def connect_provider(model: type[Any]) -> None:
    """Audit the switches and keys of `model`'s provider configs."""
    pre_save.connect(provider_before, sender=model, dispatch_uid="aero.audit.prov0")
    post_save.connect(provider_after, sender=model, dispatch_uid="aero.audit.prov1")


def provider_before(sender: Any, instance: Any, **kwargs: Any) -> None:
    previous = sender.objects.filter(pk=instance.pk).first() if instance.pk else None
    instance._aero_before = (
        (previous.enabled, previous.api_key_encrypted) if previous is not None else (False, "")
    )


def provider_after(sender: Any, instance: Any, created: bool, **kwargs: Any) -> None:
    was_enabled, old_key = getattr(instance, "_aero_before", (False, ""))
    actor = current_actor()
    detail = {"name": instance.name, "base_url": instance.base_url}
    if instance.enabled != was_enabled and (instance.enabled or not created):
        action = "provider.enabled" if instance.enabled else "provider.disabled"
        audit(action, obj=instance, actor=actor, detail=detail)
    if instance.api_key_encrypted != old_key:
        # Never the key, nor its ciphertext: only that it changed.
        action = "provider.key_set" if instance.api_key_encrypted else "provider.key_cleared"
        audit(action, obj=instance, actor=actor, detail=detail)


# --- MCP servers: switched on or off, secret environment set or removed ------------------


def connect_secrets(model: type[Any]) -> None:
    """Audit the switch and the secret environment of `model`'s tool servers."""
    pre_save.connect(server_before, sender=model, dispatch_uid="aero.audit.mcp0")
    post_save.connect(server_after, sender=model, dispatch_uid="aero.audit.mcp1")


def server_before(sender: Any, instance: Any, **kwargs: Any) -> None:
    previous = sender.objects.filter(pk=instance.pk).first() if instance.pk else None
    instance._aero_before = (
        (previous.enabled, previous.secret_env_encrypted) if previous is not None else (False, {})
    )


def server_after(sender: Any, instance: Any, created: bool, **kwargs: Any) -> None:
    was_enabled, old_secrets = getattr(instance, "_aero_before", (False, {}))
    actor = current_actor()
    detail: dict[str, Any] = {"name": instance.name, "command": instance.command}
    if instance.enabled != was_enabled and (instance.enabled or not created):
        action = "mcp_server.enabled" if instance.enabled else "mcp_server.disabled"
        audit(action, obj=instance, actor=actor, detail=detail)
    new_secrets = instance.secret_env_encrypted
    if new_secrets != old_secrets:
        # The names whose value changed, never a value nor its ciphertext.
        changed = sorted(
            name
            for name in set(old_secrets) | set(new_secrets)
            if old_secrets.get(name) != new_secrets.get(name)
        )
        audit(
            "mcp_server.secrets_changed",
            obj=instance,
            actor=actor,
            detail={**detail, "names": changed, "now": sorted(new_secrets)},
        )


# --- users: roles and privileges --------------------------------------------------------


def user_before(sender: Any, instance: Any, **kwargs: Any) -> None:
    previous = sender.objects.filter(pk=instance.pk).first() if instance.pk else None
    instance._aero_before = (
        {f: getattr(previous, f) for f in PRIVILEGE_FIELDS} if previous is not None else None
    )


def user_after(sender: Any, instance: Any, created: bool, **kwargs: Any) -> None:
    before = getattr(instance, "_aero_before", None)
    now = {f: getattr(instance, f) for f in PRIVILEGE_FIELDS}
    changed = {f: [before[f], now[f]] for f in PRIVILEGE_FIELDS if before and before[f] != now[f]}
    if created and any(now[f] for f in ("is_staff", "is_superuser")):
        changed = {f: [False, True] for f in ("is_staff", "is_superuser") if now[f]}
    if changed:
        audit(
            "user.privileges_changed",
            obj=instance,
            actor=current_actor(),
            detail={"user": instance.get_username(), "changed": changed},
        )


def roles_changed(
    sender: Any, instance: Any, action: str, reverse: bool, pk_set: set[int] | None, **kwargs: Any
) -> None:
    """A user's groups (roles) changed, from either side of the relation."""
    if action not in ("post_add", "post_remove", "pre_clear", "post_clear"):
        return
    if action == "pre_clear":
        # The cleared rows are gone after the clear: remember them now.
        related = instance.user_set if reverse else instance.groups
        instance._aero_cleared = set(related.values_list("pk", flat=True))
        return
    if action == "post_clear":
        pk_set, verb = getattr(instance, "_aero_cleared", set()), "removed"
    else:
        verb = "added" if action == "post_add" else "removed"
    if not pk_set:
        return
    user_model = get_user_model()
    if reverse:  # group.user_set.add(...): one entry per user
        pairs = [(u, [instance.name]) for u in user_model.objects.filter(pk__in=pk_set)]
    else:
        names = sorted(Group.objects.filter(pk__in=pk_set).values_list("name", flat=True))
        pairs = [(instance, names)]
    for user, names in pairs:
        audit(
            "user.roles_changed",
            obj=user,
            actor=current_actor(),
            detail={"user": user.get_username(), verb: names},
        )


# --- signing in and out ------------------------------------------------------------------


def signed_in(sender: Any, request: HttpRequest, user: Any, **kwargs: Any) -> None:
    audit(
        "auth.signed_in",
        obj=user,
        actor=user,
        detail={"address": client_address(request)},
    )


def signed_out(sender: Any, request: HttpRequest, user: Any, **kwargs: Any) -> None:
    if user is None:
        return  # signing out without a session: nobody to name
    audit(
        "auth.signed_out",
        obj=user,
        actor=user,
        detail={"address": client_address(request)},
    )


def sign_in_failed(
    sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **kwargs: Any
) -> None:
    # The name typed is untrusted: it is the object, never the actor. Django has already
    # masked the password in `credentials`; nothing but the name is kept.
    username = str(credentials.get("username", ""))[:80]
    audit(
        "auth.sign_in_failed",
        object_type="auth.user",
        object_id=username,
        actor_label="anonymous",
        detail={"username": username, "address": client_address(request)},
    )


def connect() -> None:
    user_model = get_user_model()
    post_save.connect(admin_logged, sender=LogEntry, dispatch_uid="aero.audit.admin")
    pre_save.connect(user_before, sender=user_model, dispatch_uid="aero.audit.user0")
    post_save.connect(user_after, sender=user_model, dispatch_uid="aero.audit.user1")
    m2m_changed.connect(
        roles_changed, sender=user_model.groups.through, dispatch_uid="aero.audit.roles"
    )
    user_logged_in.connect(signed_in, dispatch_uid="aero.audit.in")
    user_logged_out.connect(signed_out, dispatch_uid="aero.audit.out")
    user_login_failed.connect(sign_in_failed, dispatch_uid="aero.audit.failed")
