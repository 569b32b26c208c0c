"""The bulk loader: each chunk of rows reaches PostgreSQL's COPY sorted by expression,
so the new rules' ids, added_at and change-log seq follow that order."""

from __future__ import annotations

from tests.support.services import live
from urlguard.models import ChangeEvent, ChangeSet, Source, SpamRule, expression_key
from urlguard.writepath import bulkload, changes

ORDER = (5, 3, 9, 1, 7, 2, 8)


def rows() -> list[tuple[str, str, int]]:
    return [(f"h{i}.example/", "spam", expression_key(f"h{i}.example/")) for i in ORDER]


def test_the_reader_hands_out_each_chunk_sorted_by_expression_in_blocks(monkeypatch):
    monkeypatch.setattr(bulkload, "_COPY_BLOCK", 2)
    given = rows()
    reader = bulkload._Reader(iter(given), 3)
    chunks = []
    try:
        for chunk in reader:
            chunks.append((chunk.first, chunk.count, chunk.blocks))
            reader.copied()
    finally:
        reader.close()
    first, second, third = sorted(given[:3]), sorted(given[3:6]), given[6:]
    assert chunks == [
        (0, 3, [first[:2], first[2:]]),
        (3, 3, [second[:2], second[2:]]),
        (6, 1, [third]),
    ]


@live
def test_the_rules_of_a_chunk_are_written_in_expression_order(
    nudges,
    monkeypatch,
):
    copied: list[list[str]] = []
    copy_chunk = bulkload._copy_chunk

    def spy(cursor, stage, chunk):
        copied.append([row[0] for block in chunk.blocks for row in block])
        copy_chunk(cursor, stage, chunk)

    monkeypatch.setattr(bulkload, "_copy_chunk", spy)
    feed = Source.objects.create(name="sorted", kind=Source.Kind.FEED, url="file:///dev/null")
    head = ChangeEvent.objects.head()
    with changes.change_set(kind=ChangeSet.Kind.REFRESH, source=feed) as cs:
        changes.add_listed(iter(rows()), source=feed, change_set=cs, chunk_size=3)
    expressions = [e for e, _, _ in rows()]
    assert copied == [sorted(expressions[:3]), sorted(expressions[3:6]), expressions[6:]]
    in_order = [e for chunk in copied for e in chunk]
    by_id = SpamRule.objects.filter(listings__source=feed).order_by("id")
    assert list(by_id.values_list("expression", flat=True)) == in_order
    assert list(by_id.values_list("added_at", flat=True)) == sorted(
        by_id.values_list("added_at", flat=True)
    )
    logged = ChangeEvent.objects.filter(seq__gt=head).order_by("seq")
    assert list(logged.values_list("expression", flat=True)) == in_order
