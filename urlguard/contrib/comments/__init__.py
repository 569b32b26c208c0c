"""urlguard.contrib.comments: for a site on django-contrib-comments. Added to
INSTALLED_APPS (after "django_comments"), a new comment that links to a listed URL
(in its text or as the commenter's website), or a published one edited to, is saved
held for moderation (is_public=False), with the reason shown in the comments admin
and in its own list; a clean comment is published as before."""
