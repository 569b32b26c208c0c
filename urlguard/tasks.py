"""Every Celery task of the app, for the site's Celery app to find: autodiscovery
imports `<app>.tasks`, and the app's tasks live with the work they do. Each task keeps
the name it is registered and routed by (urlguard.celery), wherever its module lives."""

from urlguard.feeds import tasks as feed_tasks
from urlguard.jobs import runner as job_tasks
from urlguard.nodesync import tasks as sync_tasks
from urlguard.reports import mail as report_tasks

__all__ = ["feed_tasks", "job_tasks", "report_tasks", "sync_tasks"]
