"""urlguard: a reusable Django app that checks every redirect a site makes against
a spam list (the middleware, the warning page, the admin, the management commands).
The standalone service built on it is urlguard_service."""
