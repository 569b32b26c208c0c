"""Every Celery task of the app, for the site's Celery app to find: autodiscovery
imports `<app>.tasks`, and the app's tasks live with the work they do. Each task keeps
the name it is registered and routed by (urlguard.celery), wherever its module lives."""

from urlguard.feeds import tasks as feed_tasks
from urlguard.hotpath import hitlog
from urlguard.jobs import deletes, imports, rescans, reverts
from urlguard.nodesync import tasks as sync_tasks
from urlguard.reports import mail as report_tasks

__all__ = [
    "deletes",
    "feed_tasks",
    "hitlog",
    "imports",
    "report_tasks",
    "rescans",
    "reverts",
    "sync_tasks",
]
