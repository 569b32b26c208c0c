"""Admin forms: adding a rule from a pasted URL (pick a roll-up level), editing a
rule's category and note, uploading an import file, and checking one URL."""

from __future__ import annotations

import codecs
import re
from collections.abc import Iterator

from django import forms
from django.core.exceptions import ValidationError

from urlguard.hotpath.canonical import canonicalize
from urlguard.models import Category, ShortLink, SpamRule
from urlguard.shortlinks.slugs import validate_destination, validate_slug
from urlguard.writepath.impact import Impact, impact_of_adding
from urlguard.writepath.rules import RuleError, rule_candidates
from urlguard.writepath.safety import Confirmation, confirmations, default_candidate

# An upload bigger than this is almost certainly not a rule list; refusing it early
# keeps one request from holding hundreds of megabytes in memory.
MAX_IMPORT_BYTES = 64 * 1024 * 1024

# A reason quotes the pasted text (or its host), which may be kilobytes long: such a
# run is cut to its ends in the message, so the reason and the advice around it stay.
LONG_RUN = re.compile(r"\S{80,}")


def _shorten(message: str) -> str:
    return LONG_RUN.sub(lambda m: f"{m[0][:40]}…{m[0][-20:]}", message)


def candidate_choices(text: str) -> list[tuple[str, str]]:
    """(expression, label) radio choices for a pasted URL; [] when it is not usable."""
    try:
        candidates = rule_candidates(text)
    except (RuleError, ValueError):
        return []
    return [(c.expression, f"{c.expression} — {c.description}") for c in candidates]


def proposed_expression(text: str) -> str | None:
    """The level the form proposes for pasted `text`
    (urlguard.writepath.safety.default_candidate)."""
    try:
        candidate = default_candidate(text, rule_candidates(text))
    except (RuleError, ValueError):
        return None
    return candidate.expression if candidate is not None else None


class SpamRuleAddForm(forms.Form):
    """Step one: paste anything (URL, host, expression). Step two: pick the roll-up
    level to block. Both steps post the same form; "Preview" never saves."""

    url = forms.CharField(
        label="URL, host or expression",
        max_length=4000,
        strip=True,
        error_messages={"required": "Paste the spam URL, a host or an expression to block."},
        widget=forms.TextInput(attrs={"size": 80, "autofocus": True, "autocomplete": "off"}),
        help_text="Paste it as you found it: https://www.Example.com/path?x=1, a bare host, "
        "or an expression such as example.com/path/.",
    )
    expression = forms.ChoiceField(
        label="What to block",
        required=False,
        widget=forms.RadioSelect,
        choices=[],
    )
    category = forms.ChoiceField(choices=Category.choices, initial=Category.SPAM)
    note = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2, "cols": 80}),
        help_text="Why this is spam, where it was reported (shown in the change log).",
    )
    confirm = forms.BooleanField(
        label="Yes, block it anyway",
        required=False,
        help_text="Needed when the rule blocks a popular site, a link shortener, a hosting "
        "platform, this service itself, or many short links at once (the reasons are shown).",
    )
    # "Narrow" from a mistake report: the rule the new one replaces (removed on save).
    replace = forms.ModelChoiceField(
        queryset=SpamRule.objects.all(), required=False, widget=forms.HiddenInput
    )
    report = forms.CharField(required=False, widget=forms.HiddenInput)
    samples = forms.CharField(
        label="Also test these URLs",
        required=False,
        widget=forms.Textarea(attrs={"rows": 3, "cols": 80}),
        help_text="Optional, one URL per line: the preview says whether the rule blocks each.",
    )

    def __init__(self, *args, preview: bool = False, request_host: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.request_host = request_host
        self.impact: Impact | None = None
        self.confirmations: list[Confirmation] = []
        # A preview round trip validates the pasted text but does not yet insist on a
        # chosen level: it is how the no-JavaScript user gets to see the choices.
        self.preview = preview
        # The radio choices depend on what was pasted, so they are built from the
        # submitted text before validation (ChoiceField checks against them).
        text = (self.data.get("url") or "") if self.is_bound else self.initial.get("url", "")
        self.fields["expression"].choices = candidate_choices(text) if text else []  # type: ignore[attr-defined]
        if text and not self.is_bound:
            self.initial.setdefault("expression", proposed_expression(text))

    def clean_url(self) -> str:
        text = self.cleaned_data["url"]
        try:
            rule_candidates(text)
        except (RuleError, ValueError) as exc:
            raise ValidationError(_shorten(str(exc)), code="invalid_rule") from exc
        return text

    def clean(self):
        data = super().clean()
        expression = data.get("expression")
        if "url" in data and not expression and not self.preview:
            self.add_error(
                "expression",
                ValidationError(
                    "Pick what to block: one of the expressions below.",
                    code="required",
                ),
            )
        elif expression:
            self.impact = impact_of_adding([expression])
            self.confirmations = confirmations(
                expression,
                request_host=self.request_host,
                blocked_links=self.impact.links if self.impact.exact else None,
            )
            if self.confirmations and not data.get("confirm") and not self.preview:
                self.add_error(
                    "confirm",
                    ValidationError(
                        "%(expression)s needs a confirmation: %(reasons)s. Tick “Yes, block "
                        "it anyway” if that is what you mean, or pick a narrower level.",
                        code="confirm",
                        params={
                            "expression": expression,
                            "reasons": "; ".join(c.reason for c in self.confirmations),
                        },
                    ),
                )
            existing = SpamRule.objects.filter(expression=expression).first()
            if existing is not None:
                self.add_error(
                    "expression",
                    ValidationError(
                        "%(expression)s is already blocked (rule added %(when)s, category "
                        "%(category)s).",
                        code="duplicate",
                        params={
                            "expression": expression,
                            "when": f"{existing.created:%Y-%m-%d %H:%M}",
                            "category": existing.get_category_display(),
                        },
                    ),
                )
        return data

    def sample_lines(self) -> list[str]:
        return ((self.data.get("samples") or "") if self.is_bound else "").splitlines()


class SpamRuleChangeForm(forms.ModelForm):
    """An existing rule: only its category and note change. A different expression
    is a different rule: remove this one and add the other, so the log says so."""

    class Meta:
        model = SpamRule
        fields = ["category", "note"]


def decoded(upload, *, chunk_size: int = 1 << 16) -> Iterator[str]:
    """An uploaded file as UTF-8 text pieces (a byte-order mark dropped), read a piece
    at a time. Raises UnicodeDecodeError with `start` counted from the file's start."""
    decoder = codecs.getincrementaldecoder("utf-8-sig")("strict")
    offset = 0
    upload.seek(0)
    for data in upload.chunks(chunk_size):
        try:
            yield decoder.decode(data)
        except UnicodeDecodeError as exc:
            raise UnicodeDecodeError(
                exc.encoding, exc.object, offset + exc.start, offset + exc.end, exc.reason
            ) from None
        offset += len(data)
    yield decoder.decode(b"", final=True)


class ImportForm(forms.Form):
    file = forms.FileField(
        label="Rule file",
        error_messages={"required": "Choose the rule file to upload."},
        help_text="One URL, host or expression per line; a hosts file (0.0.0.0 host); or CSV "
        "with the URL first and a category column. Lines starting with # are comments.",
    )
    default_category = forms.ChoiceField(
        choices=Category.choices,
        initial=Category.SPAM,
        help_text="Used for lines that do not name a category.",
    )

    def clean_file(self):
        """Read the upload once, a piece at a time (nothing kept): it must be UTF-8 text
        that is not empty. The import job stores it the same way (decoded)."""
        upload = self.cleaned_data["file"]
        if upload.size > MAX_IMPORT_BYTES:
            raise ValidationError(
                "The file is %(size)d MB; the limit is %(limit)d MB. Split it, or use the "
                "import_rules management command.",
                code="too_large",
                params={"size": upload.size // 2**20, "limit": MAX_IMPORT_BYTES // 2**20},
            )
        blank = True
        try:
            for text in decoded(upload):
                if "\x00" in text:
                    raise ValidationError(
                        "The file is binary, not a text list of rules.", code="binary"
                    )
                blank = blank and not text.strip()
        except UnicodeDecodeError as exc:
            raise ValidationError(
                "The file is not UTF-8 text (byte %(pos)d is invalid). Save it as UTF-8 and "
                "upload it again.",
                code="encoding",
                params={"pos": exc.start},
            ) from exc
        if blank:
            raise ValidationError("The file is empty.", code="empty")
        return upload


class CheckUrlForm(forms.Form):
    url = forms.CharField(
        label="URL",
        max_length=100_000,
        strip=True,
        error_messages={"required": "Paste the URL to check."},
        widget=forms.TextInput(attrs={"size": 100, "autofocus": True}),
    )

    def clean_url(self) -> str:
        text = self.cleaned_data["url"]
        try:
            canonicalize(text)
        except ValueError as exc:
            raise ValidationError(
                "%(url)s is not a URL that can be checked: %(reason)s",
                code="invalid_url",
                params={"url": _shorten(text), "reason": _shorten(str(exc))},
            ) from exc
        return text


class ShortLinkForm(forms.ModelForm):
    """Adding a link: a destination that canonicalizes, and a slug that is free (or
    blank: the shortest free one is allocated). Editing: the slug stays."""

    class Meta:
        model = ShortLink
        fields = ["slug", "destination", "disabled", "disabled_reason"]
        widgets = {"destination": forms.TextInput(attrs={"size": 100})}
        help_texts = {"slug": "Leave blank for the shortest free slug."}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "slug" in self.fields:
            self.fields["slug"].required = False

    def clean_destination(self) -> str:
        try:
            return validate_destination(self.cleaned_data["destination"])
        except ValueError as exc:
            raise ValidationError(str(exc), code="invalid_destination") from exc

    def clean_slug(self) -> str:
        slug = (self.cleaned_data.get("slug") or "").strip()
        if not slug:
            return ""
        try:
            validate_slug(slug)
        except ValueError as exc:
            raise ValidationError(str(exc), code="invalid_slug") from exc
        if ShortLink.objects.filter(slug=slug).exclude(pk=self.instance.pk).exists():
            raise ValidationError(
                "The slug %(slug)s is already taken.", code="taken", params={"slug": slug}
            )
        return slug
