"""The middleware's public import path, which host sites put first in MIDDLEWARE
(DESIGN.md, fixed): `urlguard.middleware.RedirectGuardMiddleware`. The implementation
is the hot path's, urlguard.hotpath.middleware."""

from urlguard.hotpath.middleware import RedirectGuardMiddleware

__all__ = ["RedirectGuardMiddleware"]
