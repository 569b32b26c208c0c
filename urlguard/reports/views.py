"""Mistake reports: the warning page's "Report a mistake" opens a short form (an
optional e-mail address and comment, no account), and what is sent lands in the
admin's queue beside the rule that blocked. The form's link carries a signed token
naming the destination, the rule and the warned visitor (REPORT_TOKEN_MAX_AGE), so a
report is always about a real warning shown to whoever sends it. Reports are
CSRF-protected and limited per visitor (REPORT_RATE_LIMIT) and per client address,
IPv6 per /64, whatever its User-Agent (REPORT_ADDRESS_RATE_LIMIT); a destination
keeps at most REPORT_MAX_OPEN_PER_DESTINATION open reports, so a flood cannot bury
the queue."""

from __future__ import annotations

import time

from django import forms
from django.core import signing
from django.core.cache import cache
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_http_methods

from urlguard.conf import conf
from urlguard.hotpath.warning import REPORT_SALT
from urlguard.models import MistakeReport, SpamRule
from urlguard.reports.mail import report_arrived
from urlguard.runtime.clientaddress import client_network
from urlguard.runtime.visitors import visitor_id

__all__ = ["report_view"]

RATE_WINDOW = 3600


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


def _count(who: str) -> int:
    """Reports `who` has sent this hour, this one included."""
    key = f"urlguard.report.{who}.{int(time.time() // RATE_WINDOW)}"
    cache.add(key, 0, RATE_WINDOW)
    try:
        return int(cache.incr(key))
    except ValueError:  # expired between add and incr
        cache.set(key, 1, RATE_WINDOW)
        return 1


def _limited(request: HttpRequest, visitor: str) -> bool:
    """True once this visitor has sent REPORT_RATE_LIMIT reports this hour, or its
    address (network) REPORT_ADDRESS_RATE_LIMIT: a new User-Agent is a new visitor."""
    by_visitor = _count(f"v.{visitor}") > conf.REPORT_RATE_LIMIT
    by_address = _count(f"a.{client_network(request)}") > conf.REPORT_ADDRESS_RATE_LIMIT
    return by_visitor or by_address


@require_http_methods(["GET", "POST"])
def report_view(request: HttpRequest) -> HttpResponse:
    token = request.GET.get("token") or request.POST.get("token", "")
    visitor = visitor_id(request)
    try:
        data = signing.TimestampSigner(salt=REPORT_SALT).unsign_object(
            token, max_age=conf.REPORT_TOKEN_MAX_AGE
        )
        destination = str(data["u"])
        # Made for the browser that was warned: a link passed around (or scripted
        # from one warning) sends nothing.
        if data.get("v") != visitor:
            raise signing.BadSignature("made for another visitor")
    except (signing.BadSignature, KeyError, TypeError):
        return render(
            request,
            "urlguard/report.html",
            {
                "problem": "This report link is not valid, has expired or was made for another "
                "browser. Open the original link again and use “Report a mistake” on the "
                "warning page."
            },
            status=400,
        )
    context = {"destination": destination, "expression": data.get("e", ""), "token": token}
    if request.method == "POST":
        form = MistakeReportForm(request.POST)
        if form.is_valid():
            if _limited(request, visitor):
                context["problem"] = (
                    "You have sent several reports already; please try again in an hour."
                )
                return render(
                    request, "urlguard/report.html", {**context, "form": form}, status=429
                )
            open_reports = MistakeReport.objects.filter(
                destination=destination[:4000], status=MistakeReport.Status.OPEN
            )
            if open_reports.count() >= conf.REPORT_MAX_OPEN_PER_DESTINATION:
                # Enough people said so already: thank this one, store nothing.
                return render(request, "urlguard/report.html", {**context, "sent": True})
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
