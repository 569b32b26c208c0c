"""Mistake reports: the warning page's "Report a mistake" opens a short form (an
optional e-mail address and comment, no account), and what is sent lands in the
admin's queue beside the rule that blocked. The form's link carries a signed token
naming the destination and the rule, so a report is always about a real warning;
reports are CSRF-protected and limited per visitor."""

from __future__ import annotations

import time
from urllib.parse import urlencode

from django import forms
from django.core import signing
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from urlguard.clicks import visitor_id
from urlguard.conf import conf
from urlguard.models import MistakeReport, SpamRule
from urlguard.reportmail import report_arrived

__all__ = ["REPORT_SALT", "report_form_url", "report_token", "report_view"]

REPORT_SALT = "urlguard.report"
# A warning page may be read and reported on days later.
TOKEN_MAX_AGE = 7 * 24 * 3600
RATE_WINDOW = 3600


def report_token(destination: str, rule: SpamRule | None) -> str:
    return signing.TimestampSigner(salt=REPORT_SALT).sign_object(
        {
            "u": destination,
            "r": rule.pk if rule is not None else None,
            "e": rule.expression if rule is not None else "",
        },
        compress=True,
    )


def report_form_url(destination: str, rule: SpamRule | None) -> str:
    return reverse("urlguard:report") + "?" + urlencode({"token": report_token(destination, rule)})


class MistakeReportForm(forms.Form):
    email = forms.EmailField(
        label="Your e-mail address (optional)",
        required=False,
        help_text="Only if you would like an answer.",
    )
    comment = forms.CharField(
        label="What is this link? (optional)",
        required=False,
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 4, "cols": 60}),
    )


def _limited(visitor: str) -> bool:
    """True once this visitor has sent REPORT_RATE_LIMIT reports this hour."""
    key = f"urlguard.report.{visitor}.{int(time.time() // RATE_WINDOW)}"
    cache.add(key, 0, RATE_WINDOW)
    try:
        sent = cache.incr(key)
    except ValueError:  # expired between add and incr
        cache.set(key, 1, RATE_WINDOW)
        sent = 1
    return sent > int(conf.REPORT_RATE_LIMIT)


@require_http_methods(["GET", "POST"])
def report_view(request: HttpRequest) -> HttpResponse:
    token = request.GET.get("token") or request.POST.get("token", "")
    try:
        data = signing.TimestampSigner(salt=REPORT_SALT).unsign_object(token, max_age=TOKEN_MAX_AGE)
        destination = str(data["u"])
    except (signing.BadSignature, KeyError, TypeError):
        return render(
            request,
            "urlguard/report.html",
            {
                "problem": "This report link is not valid or has expired. Open the original link "
                "again and use “Report a mistake” on the warning page."
            },
            status=400,
        )
    context = {"destination": destination, "expression": data.get("e", ""), "token": token}
    if request.method == "POST":
        form = MistakeReportForm(request.POST)
        if form.is_valid():
            visitor = visitor_id(request)
            if _limited(visitor):
                context["problem"] = (
                    "You have sent several reports already; please try again in an hour."
                )
                return render(
                    request, "urlguard/report.html", {**context, "form": form}, status=429
                )
            rule = SpamRule.objects.filter(pk=data.get("r")).first() if data.get("r") else None
            # One open report per visitor and destination: a second click adds nothing.
            report, created = MistakeReport.objects.get_or_create(
                destination=destination[:4000],
                visitor=visitor,
                status=MistakeReport.Status.OPEN,
                defaults={
                    "rule": rule,
                    "expression": str(data.get("e", ""))[:2000],
                    "email": form.cleaned_data["email"],
                    "comment": form.cleaned_data["comment"],
                },
            )
            if created:
                report_arrived(report, request)
            return render(request, "urlguard/report.html", {**context, "sent": True})
    else:
        form = MistakeReportForm()
    response = render(request, "urlguard/report.html", {**context, "form": form})
    # Not "no-referrer" like the warning page: browsers then send "Origin: null" with
    # the form, which CSRF protection refuses. The page links nowhere off-site.
    response["Referrer-Policy"] = "same-origin"
    response["Cache-Control"] = "no-store"
    return response
