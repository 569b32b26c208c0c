"""Process-wide plumbing every layer uses: metrics, batched statistics, rate-limited logging and
rate limits, the client address they count by, and who owns a long write (host, pid, start time)."""
