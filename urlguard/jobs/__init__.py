"""Long operator work run off the request: a job is a database row a thread (no broker) or a
Celery task runs, records its progress and owner in, and finishes when run again after a crash."""
