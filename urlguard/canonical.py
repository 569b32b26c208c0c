"""The canonicalizer's public import path, which outside checks call (DESIGN.md, fixed):
`canonicalize(url)` and `expressions(url)`. The implementation is the hot path's,
urlguard.hotpath.canonical."""

from urlguard.hotpath.canonical import canonicalize, expressions

__all__ = ["canonicalize", "expressions"]
