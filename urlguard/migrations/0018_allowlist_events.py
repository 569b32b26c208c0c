"""Allowlist changes become change-log rows (`allow`, `unallow`). The hosts in force at
the upgrade get one `allow` row each, labelled UPGRADE_SOURCE, so that from here on a
host's latest allowlist row says whether it is allowlisted; an RPZ IXFR across these
rows is answered with the whole zone (the secondary's copy of the exceptions predates
the log)."""

import time

from django.conf import settings
from django.db import migrations, models

UPGRADE_SOURCE = "allowlist:upgrade"


def log_the_allowlist_in_force(apps, schema_editor):
    AllowedHost = apps.get_model("urlguard", "AllowedHost")
    ChangeEvent = apps.get_model("urlguard", "ChangeEvent")
    in_force = AllowedHost.objects.filter(
        models.Q(source__isnull=True) | models.Q(source__enabled=True, source__is_allowlist=True)
    )
    hosts = sorted(set(in_force.values_list("host", flat=True)))
    now = int(time.time() * 1_000_000)
    ChangeEvent.objects.bulk_create(
        [
            ChangeEvent(action="allow", expression=host, added_at=now, source=UPGRADE_SOURCE)
            for host in hosts
        ],
        batch_size=5000,
    )


class Migration(migrations.Migration):
    dependencies = [
        ("urlguard", "0017_hit_events"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterField(
            model_name="changeevent",
            name="action",
            field=models.CharField(
                choices=[
                    ("add", "Add"),
                    ("remove", "Remove"),
                    ("allow", "Allowlist"),
                    ("unallow", "Off the allowlist"),
                ],
                max_length=8,
            ),
        ),
        migrations.AddIndex(
            model_name="changeevent",
            index=models.Index(
                condition=models.Q(("action__in", ["allow", "unallow"])),
                fields=["expression", "seq"],
                name="urlguard_changeevent_allowlist",
            ),
        ),
        migrations.RunPython(log_the_allowlist_in_force, migrations.RunPython.noop),
    ]
