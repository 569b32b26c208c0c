"""The comments site's URLs: the service's, and the comments app's."""

from django.urls import include, path

from urlguard_service.urls import urlpatterns as service

urlpatterns = [path("comments/", include("django_comments.urls")), *service]
