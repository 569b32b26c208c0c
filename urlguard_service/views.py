"""The service's own pages: the demo home page listing the short links."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from urlguard.models import ShortLink


def home(request: HttpRequest) -> HttpResponse:
    links = ShortLink.objects.order_by("slug")[:50]
    return render(request, "urlguard/home.html", {"links": links})
