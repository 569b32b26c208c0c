"""manage.py create_api_key NAME: make a key of the batch check API and print it
once (only its hash is stored)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from urlguard.models import APIKey
from urlguard.operations.apikeys import create_api_key


class Command(BaseCommand):
    help = "Create an API key for POST /api/check and print it (shown only this once)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="who uses the key, e.g. mail-gateway")

    def handle(self, *args: Any, name: str, **options: Any) -> None:
        name = name.strip()
        if not name:
            raise CommandError("the key needs a name")
        if APIKey.objects.filter(name=name).exists():
            raise CommandError(
                f"an API key named {name!r} exists already; revoke it in the admin "
                "(API keys) and choose another name"
            )
        row, key = create_api_key(name)
        self.stderr.write(
            f"API key {row.name!r} created. It is not stored: copy it now, it is shown only once."
        )
        self.stdout.write(key)
