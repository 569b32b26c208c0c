"""Tells a person that visitors reported mistakes: a mail to Django's MANAGERS when a
report arrives, at most one per REPORT_MAIL_INTERVAL (a burst of reports is one mail
carrying the open count), sent by a Celery task so the visitor's request never waits
on a mail server. The throttle lives in Django's cache: per process with the local
memory cache, shared by all with Redis (CACHE_URL)."""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.cache import cache
from django.core.mail import mail_managers
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse

from urlguard.celery import shared_task
from urlguard.conf import conf
from urlguard.models import MistakeReport

logger = logging.getLogger(__name__)

__all__ = ["MAIL_REPORTS_TASK", "mail_about_reports", "report_arrived"]

MAIL_REPORTS_TASK = "urlguard.mail_about_reports"
_THROTTLE_KEY = "urlguard.report.mail"


def report_arrived(report: MistakeReport, request: HttpRequest) -> bool:
    """Queue the mail about `report` unless one went out within the interval (or no
    manager or no interval is set); True if queued."""
    interval = conf.REPORT_MAIL_INTERVAL
    if not interval or not settings.MANAGERS:
        return False
    if not cache.add(_THROTTLE_KEY, report.pk, interval):
        return False
    try:
        queue = reverse("admin:urlguard_mistakereport_changelist") + "?status__exact=open"
        queue_url = request.build_absolute_uri(queue)
    except NoReverseMatch:  # a host site without the admin
        queue_url = "(the admin's mistake reports)"
    mail_about_reports.delay(report.pk, queue_url)
    return True


@shared_task(name=MAIL_REPORTS_TASK, ignore_result=True)
def mail_about_reports(report_id: int, queue_url: str) -> None:
    report = MistakeReport.objects.select_related("rule").filter(pk=report_id).first()
    if report is None:
        return
    waiting = MistakeReport.objects.filter(status=MistakeReport.Status.OPEN).count()
    subject = (
        f"{waiting:,} open mistake report{'' if waiting == 1 else 's'}: {report.destination[:80]}"
    )
    lines = [
        "A visitor says a link was blocked by mistake.",
        "",
        f"Destination: {report.destination}",
        f"Blocked by:  {report.expression or '(no rule recorded)'}",
    ]
    if report.comment:
        lines += ["", "Their comment:", report.comment]
    if report.email:
        lines += ["", f"They would like an answer at {report.email}."]
    lines += [
        "",
        f"Open reports waiting: {waiting:,}. The queue: {queue_url}",
        f"(At most one such mail every {conf.REPORT_MAIL_INTERVAL:,} seconds.)",
    ]
    try:
        mail_managers(subject, "\n".join(lines))
    except Exception:  # a mail server that is down must not fail anything else
        logger.warning(
            "could not mail the managers about mistake report #%s", report.pk, exc_info=True
        )
