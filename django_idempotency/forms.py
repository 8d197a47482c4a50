"""The idempotency key in a Django form: a hidden field, and a mixin that adds it."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from django import forms
from django.core.exceptions import ImproperlyConfigured

from django_idempotency.attempts import current_attempt
from django_idempotency.conf import conf
from django_idempotency.core.keys import InvalidKey, new_key, parse_key

if TYPE_CHECKING:
    _Form = forms.BaseForm
else:
    _Form = object


class IdempotencyKeyField(forms.CharField):
    """A hidden field holding a fresh key (`fresh_key`) each time its unbound form is rendered; a
    bound form renders the key it was sent with. The guard reads it, not the form: it is not
    required here, and a form without it is answered by the guard."""

    widget = forms.HiddenInput

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("initial", fresh_key)  # Called once per form: a key per form shown.
        kwargs.setdefault("required", False)
        super().__init__(**kwargs)


class IdempotentFormMixin(_Form):
    """Gives a `Form` or `ModelForm` the key field (named IDEMPOTENCY_FORM_FIELD).

    A bound form that is invalid tells the guard that its request changed nothing: the key is
    given back rather than its answer stored, and the form shown again with its errors keeps
    that key, for the corrected form to run with once.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields[field_name()] = IdempotencyKeyField()

    def add_prefix(self, field_name: str) -> str:
        # The key's field keeps its own name under a prefix (a formset's forms, two forms on a
        # page): the guard reads it by that name.
        if field_name == conf.FORM_FIELD:
            return field_name
        return super().add_prefix(field_name)

    def full_clean(self) -> None:
        super().full_clean()
        judged(self)


def fresh_key() -> str:
    """A new key for a form: a ULID, or a UUID where IDEMPOTENCY_KEY_FORMAT demands one."""
    return str(uuid.uuid4()) if conf.KEY_FORMAT == "uuid" else new_key()


def field_name() -> str:
    """IDEMPOTENCY_FORM_FIELD, which a form needs to carry the key."""
    name = conf.FORM_FIELD
    if name is None:
        raise ImproperlyConfigured(
            "IDEMPOTENCY_FORM_FIELD is None, so the guard reads no key from forms: set it to"
            ' the field name to use (the default is "idempotency_key").'
        )
    return name


def submitted_key(form: forms.BaseForm) -> str | None:
    """The key a bound form was sent with, if it is a valid one."""
    if not form.is_bound:
        return None
    raw = form.data.get(field_name())
    if not isinstance(raw, str):
        return None
    try:
        return parse_key(raw, conf.KEY_FORMAT)
    except InvalidKey:
        return None


def judged(form: forms.BaseForm) -> None:
    """Tell the guard holding this form's key what its validation found. An invalid form says
    that nothing happened, unless a valid form sent with the key says otherwise in the same
    request (a view that binds a corrected form, or takes the payment before it checks a
    coupon's form): the request may then have done its work, and its answer is stored."""
    attempt = current_attempt()
    key = submitted_key(form)
    if attempt is None or attempt.scope is None or key != attempt.scope.key:
        return
    if form.errors:
        attempt.invalid_forms += 1
    else:
        attempt.valid_forms += 1
