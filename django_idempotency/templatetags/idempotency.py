"""`{% idempotency_key_field %}`: the hidden input that carries an HTML form's key."""

from __future__ import annotations

from django import forms, template
from django.utils.html import format_html
from django.utils.safestring import SafeString

from django_idempotency import forms as keyed_forms

register = template.Library()


@register.simple_tag
def idempotency_key_field(form: forms.BaseForm | None = None) -> SafeString:
    """A hidden input with a fresh key, for the form it is rendered in.

    Given the form (`{% idempotency_key_field form %}`): once bound, the key it was sent with,
    so that the form shown again keeps it; and when it is invalid, the guard gives that key
    back rather than store the answer (nothing happened), as `IdempotentFormMixin` does.
    """
    name = keyed_forms.field_name()
    key = None
    if form is not None:
        key = keyed_forms.submitted_key(form)
        if key is not None and form.errors:
            keyed_forms.judged(form)
    return format_html(
        '<input type="hidden" name="{}" value="{}">', name, key or keyed_forms.fresh_key()
    )
