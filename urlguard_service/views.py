"""The service's own pages: the demo home page listing the short links."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from urlguard_service.management.commands.seed_demo import demo_links, embedded_demo_database


def home(request: HttpRequest) -> HttpResponse:
    # The demo's own links only: a shortener's links are its users' business.
    context = {"links": list(demo_links()), "demo": embedded_demo_database()}
    return render(request, "urlguard_service/home.html", context)
