"""The hot path: every redirect's destination canonicalized exactly as the browser will go
(canonical), its roll-up expressions probed in the filter and a hit confirmed in the spam
table (guard, with the clean cache of confirmed false positives), the middleware that
checks every redirect, the warning page with its signed "continue anyway" step
(warning, continuation) and the hit log it records, the link shim for pages, the rule
levels the warning words a block by (rollup), and the 503 while the database is away
(unavailable)."""
