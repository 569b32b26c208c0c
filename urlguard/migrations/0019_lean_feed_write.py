"""What a feed's first load writes per entry (a rule, a listing, a change-log row)
carries only the indexes and checks a query or a guarantee needs:

- SpamRule.expression loses the `varchar_pattern_ops` index Django adds beside a
  unique CharField on PostgreSQL: no query reads it by LIKE prefix.
- SpamRule.added_by and ChangeEvent.actor lose their indexes: only a user's deletion
  reads them (it then scans the table).
- RuleSource loses the (source, key) index (no query looks a listing up by its key;
  a source's listings are read through the unique (source, rule) pair) and the index
  on source alone (the same pair covers it).
- RuleSource.rule, RuleSource.source and ChangeEvent.change_set are no database
  constraints (PostgreSQL checked each once per row): the code keeps them (see the
  models) and writepath.changes.dangling_references counts any that dangle.
"""

from django.conf import settings
from django.db import migrations, models


def _like_indexes(schema_editor):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'urlguard_spamrule' "
            "AND indexdef LIKE '%%varchar_pattern_ops%%'"
        )
        return [row[0] for row in cursor.fetchall()]


def drop_expression_like_index(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for name in _like_indexes(schema_editor):
        schema_editor.execute(f"DROP INDEX IF EXISTS {schema_editor.quote_name(name)}")


def make_expression_like_index(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql" or _like_indexes(schema_editor):
        return
    model = apps.get_model("urlguard", "SpamRule")
    statement = schema_editor._create_like_index_sql(model, model._meta.get_field("expression"))
    if statement is not None:
        schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [
        ("urlguard", "0018_allowlist_events"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.RunPython(drop_expression_like_index, make_expression_like_index),
        migrations.RemoveIndex(model_name="rulesource", name="urlguard_rulesource_key"),
        migrations.AlterField(
            model_name="changeevent",
            name="actor",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
        migrations.AlterField(
            model_name="changeevent",
            name="change_set",
            field=models.ForeignKey(
                blank=True,
                db_constraint=False,
                null=True,
                on_delete=models.deletion.SET_NULL,
                related_name="events",
                to="urlguard.changeset",
            ),
        ),
        migrations.AlterField(
            model_name="rulesource",
            name="rule",
            field=models.ForeignKey(
                db_constraint=False,
                on_delete=models.deletion.CASCADE,
                related_name="listings",
                to="urlguard.spamrule",
            ),
        ),
        migrations.AlterField(
            model_name="rulesource",
            name="source",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=models.deletion.CASCADE,
                related_name="listings",
                to="urlguard.source",
            ),
        ),
        migrations.AlterField(
            model_name="spamrule",
            name="added_by",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=models.deletion.SET_NULL,
                related_name="+",
                to=settings.AUTH_USER_MODEL,
            ),
        ),
    ]
