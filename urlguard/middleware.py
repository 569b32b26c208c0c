"""The middleware's public import paths. Host sites put `RedirectGuardMiddleware` first
in MIDDLEWARE (DESIGN.md, fixed; its implementation is the hot path's,
urlguard.hotpath.middleware) and, behind a reverse proxy, `TrustedProxyMiddleware`
before it (urlguard.runtime.trustedproxy)."""

from urlguard.hotpath.middleware import RedirectGuardMiddleware
from urlguard.runtime.trustedproxy import TrustedProxyMiddleware

__all__ = ["RedirectGuardMiddleware", "TrustedProxyMiddleware"]
