"""The hot path: every redirect's destination canonicalized exactly as the browser will go, its
roll-up expressions probed in the filter, a hit confirmed in the spam table, and the warning page
(with its signed "continue anyway" step) shown in place of a blocked redirect."""
