"""Every existing rule gets its provenance: the manual source its `source` label
names ("admin", "import:list.txt" -> "import", "demo", ...), so that a rule listed
before sources existed survives until a person removes it."""

import mmh3
from django.db import migrations
from django.utils import timezone

CHUNK = 5000


def _base(label):
    return (label or "admin").split(":", 1)[0].strip()[:100] or "admin"


def forwards(apps, schema_editor):
    Source = apps.get_model("urlguard", "Source")
    SpamRule = apps.get_model("urlguard", "SpamRule")
    RuleSource = apps.get_model("urlguard", "RuleSource")
    db = schema_editor.connection.alias
    sources = {}
    for name in ("admin", "import"):
        sources[name], _ = Source.objects.using(db).get_or_create(
            name=name, defaults={"kind": "manual"}
        )
    now = timezone.now()
    batch = []
    rows = SpamRule.objects.using(db).order_by("pk").values_list("pk", "expression", "source")
    for pk, expression, label in rows.iterator(chunk_size=CHUNK):
        name = _base(label)
        if name not in sources:
            sources[name], _ = Source.objects.using(db).get_or_create(
                name=name, defaults={"kind": "manual"}
            )
        key = mmh3.hash64(expression, signed=True)[0]
        batch.append(RuleSource(rule_id=pk, source=sources[name], key=key, created=now))
        if len(batch) >= CHUNK:
            RuleSource.objects.using(db).bulk_create(batch)
            batch = []
    RuleSource.objects.using(db).bulk_create(batch)


def backwards(apps, schema_editor):
    apps.get_model("urlguard", "RuleSource").objects.using(
        schema_editor.connection.alias
    ).all().delete()


class Migration(migrations.Migration):
    dependencies = [("urlguard", "0006_sources_changesets")]

    operations = [migrations.RunPython(forwards, backwards)]
