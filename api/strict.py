"""Routers whose operations refuse query parameters they do not take."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any

from django.http import HttpRequest
from ninja import Router
from ninja.signature.details import ViewSignature
from ninja.signature.utils import get_typed_signature

from api.errors import ApiError


def strict_query(path: str, view: Callable[..., Any]) -> Callable[..., Any]:
    """`view`, refusing unknown query parameters (422) once authentication and validation
    have passed: a misspelt filter must not quietly return everything."""
    allowed: set[str] = set()
    for model in ViewSignature(path, view).models:
        if getattr(model, "__ninja_param_source__", None) != "query":
            continue
        flat = getattr(model, "__ninja_flatten_map__", None)
        if flat:
            allowed.update(flat)
        else:
            allowed.update(f.alias or name for name, f in model.model_fields.items())

    @wraps(view)
    def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        unknown = sorted(set(request.GET) - allowed)
        if unknown:
            known = ", ".join(sorted(allowed)) or "none"
            raise ApiError(
                422,
                "unknown_parameter",
                f"Unknown query parameter {', '.join(unknown)} (this operation takes: {known}).",
            )
        return view(request, *args, **kwargs)

    # the view's own signature, its annotations resolved in its own module
    checked.__signature__ = get_typed_signature(view)  # type: ignore[attr-defined]
    return checked


class StrictRouter(Router):
    def add_api_operation(
        self, path: str, methods: list[str], view_func: Callable[..., Any], **kwargs: Any
    ) -> None:
        super().add_api_operation(path, methods, strict_query(path, view_func), **kwargs)
