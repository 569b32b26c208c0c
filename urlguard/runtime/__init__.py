"""Process-wide plumbing every layer uses: metrics, batched statistics, rate-limited logging
and rate limits with the client address they count by, visitor ids, which addresses are
public, who owns a long write (host, pid, start time), and the SQL that differs between
PostgreSQL and SQLite (database)."""
