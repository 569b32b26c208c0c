import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models


def hosts_to_the_allowlist(apps, schema_editor):
    """An enabled manual allowlist source becomes entries of the allowlist itself: each
    host keeps its note (or says where it came from) and its date; the source goes. A
    disabled one protected nothing, and is left as it was (moving its hosts would
    start protecting them)."""
    Source = apps.get_model("urlguard", "Source")
    AllowedHost = apps.get_model("urlguard", "AllowedHost")
    manual = Source.objects.filter(is_allowlist=True, enabled=True).filter(
        models.Q(kind="manual") | models.Q(url="")
    )
    for source in manual.order_by("pk"):
        for entry in AllowedHost.objects.filter(source=source).order_by("pk"):
            note = entry.note or f"from the allowlist {source.name!r}"[:200]
            kept = AllowedHost.objects.filter(source=None, host=entry.host).first()
            if kept is None:
                entry.source, entry.note = None, note
                entry.save(update_fields=["source", "note"])
            elif not kept.note and note:
                kept.note = note
                kept.save(update_fields=["note"])
        source.delete()


class Migration(migrations.Migration):
    dependencies = [
        ("urlguard", "0014_owners_heartbeats"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="allowedhost",
            options={
                "ordering": ["host"],
                "verbose_name": "allowlisted host",
                "verbose_name_plural": "allowlist",
            },
        ),
        migrations.AddField(
            model_name="allowedhost",
            name="added_by",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AlterField(
            model_name="allowedhost",
            name="source",
            field=models.ForeignKey(
                blank=True,
                help_text="The allowlist feed that lists it; empty for a host entered by a person.",
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="allowed_hosts",
                to="urlguard.source",
            ),
        ),
        migrations.AlterField(
            model_name="changeset",
            name="kind",
            field=models.CharField(
                choices=[
                    ("admin", "Admin edit"),
                    ("import", "Import"),
                    ("refresh", "Feed refresh"),
                    ("revert", "Revert"),
                    ("bulk-delete", "Bulk delete"),
                    ("allowlist", "Allowlist"),
                    ("other", "Other"),
                ],
                default="other",
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="feedrefresh",
            name="impact",
            field=models.JSONField(blank=True, default=dict),
        ),
        migrations.AddField(
            model_name="source",
            name="held_reason",
            field=models.CharField(blank=True, default="", max_length=500),
        ),
        migrations.RunPython(hosts_to_the_allowlist, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="allowedhost",
            constraint=models.UniqueConstraint(
                condition=models.Q(("source__isnull", True)),
                fields=("host",),
                name="urlguard_allowedhost_by_hand_unique",
            ),
        ),
        migrations.CreateModel(
            name="AllowlistRefusal",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("expression", models.CharField(max_length=2000)),
                (
                    "category",
                    models.CharField(
                        choices=[
                            ("phishing", "Phishing"),
                            ("malware", "Malware"),
                            ("spam", "Spam"),
                            ("unwanted", "Unwanted software"),
                            ("other", "Other"),
                        ],
                        default="spam",
                        max_length=16,
                    ),
                ),
                ("created", models.DateTimeField(auto_now_add=True)),
                (
                    "source",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="allowlist_refusals",
                        to="urlguard.source",
                    ),
                ),
            ],
            options={
                "constraints": [
                    models.UniqueConstraint(
                        fields=("source", "expression"), name="urlguard_allowlistrefusal_unique"
                    )
                ],
            },
        ),
    ]
