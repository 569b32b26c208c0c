import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("urlguard", "0015_allowlist"),
    ]

    operations = [
        migrations.AlterField(
            model_name="adminjob",
            name="kind",
            field=models.CharField(
                choices=[
                    ("import", "Import"),
                    ("rescan", "Rescan"),
                    ("refresh", "Feed refresh"),
                    ("delete", "Bulk delete"),
                    ("revert", "Revert"),
                    ("test-fetch", "Test fetch"),
                ],
                max_length=16,
            ),
        ),
        migrations.AddField(
            model_name="mistakereport",
            name="change_set",
            field=models.ForeignKey(
                blank=True,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="reports",
                to="urlguard.changeset",
            ),
        ),
        migrations.AlterField(
            model_name="mistakereport",
            name="status",
            field=models.CharField(
                choices=[
                    ("open", "Open"),
                    ("removed", "Rule removed"),
                    ("narrowed", "Rule narrowed"),
                    ("allowlisted", "Host allowlisted"),
                    ("dismissed", "Dismissed"),
                ],
                default="open",
                max_length=16,
            ),
        ),
    ]
