"""Mistake reports: the warning page's "Report a mistake" form, the mail that tells a
person reports arrived, and the queue's work on them (urlguard.reports.queue; the
admin's report queue, urlguard.admin.reportqueue, shows it)."""
