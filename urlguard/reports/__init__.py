"""Mistake reports: the warning page's "Report a mistake" form and the mail that tells a person
reports arrived. The admin's report queue (urlguard.admin.reportqueue) works them."""
