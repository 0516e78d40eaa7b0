from __future__ import annotations

from django import template
from django.utils.safestring import SafeString

from approvals.cards import deadline_html
from approvals.models import Approval

register = template.Library()


@register.simple_tag
def deadline(approval: Approval) -> SafeString:
    """The deadline as the queue's cards show it (approvals.cards), on other pages."""
    return deadline_html(approval)
