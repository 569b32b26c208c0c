"""Slug allocation: shortest free slug first, the filter rebuilt from the table, the
unique constraint as the authority, custom slugs and destinations validated."""

import pytest
from django.db import transaction

from urlguard.models import ShortLink
from urlguard.shortlinks import slugs
from urlguard.shortlinks.slugs import ALPHABET, SlugError, allocate_slug, create_short_link

pytestmark = pytest.mark.django_db

DEST = "https://example.com/page"


@pytest.fixture(autouse=True)
def fresh_process():
    slugs.reset()
    yield
    slugs.reset()


def test_slugs_are_the_shortest_free_ones():
    made = [create_short_link(f"{DEST}/{i}").slug for i in range(len(ALPHABET) + 3)]
    assert sorted(made[: len(ALPHABET)]) == sorted(ALPHABET), "all 1-character slugs first"
    assert all(len(s) == 2 for s in made[len(ALPHABET) :])
    assert len(set(made)) == len(made)
    assert all(set(s) <= set(ALPHABET) for s in made)


def test_allocate_slug_finds_the_one_free_short_slug():
    for ch in ALPHABET[1:]:
        ShortLink.objects.create(slug=ch, destination=DEST)
    assert allocate_slug() == ALPHABET[0]
    assert create_short_link(DEST).slug == ALPHABET[0]
    assert len(allocate_slug()) == 2


def test_filter_is_rebuilt_from_the_table_on_first_use(django_assert_max_num_queries):
    for ch in ALPHABET[:-1]:
        ShortLink.objects.create(slug=ch, destination=DEST)  # made before this "process" started
    # Rebuild (count + rows) and one INSERT in a savepoint: the filter says which
    # slugs are taken, so no candidate needs a lookup.
    with django_assert_max_num_queries(6):
        link = create_short_link(DEST)
    assert link.slug == ALPHABET[-1]


def test_a_slug_taken_by_another_process_is_retried(django_assert_max_num_queries):
    create_short_link(DEST)  # builds this process's filter
    # Another process takes every other 1-character slug behind our back.
    taken_now = set(ShortLink.objects.values_list("slug", flat=True))
    others = [ch for ch in ALPHABET if ch not in taken_now]
    for ch in others[:-1]:
        ShortLink.objects.create(slug=ch, destination=DEST)
    link = create_short_link(DEST)
    assert link.slug == others[-1], "IntegrityError on each taken slug, then the free one"
    assert ShortLink.objects.filter(slug=link.slug).count() == 1


def test_integrity_errors_leave_an_outer_transaction_usable():
    ShortLink.objects.create(slug="taken", destination=DEST)
    with transaction.atomic():
        with pytest.raises(SlugError, match="already taken"):
            create_short_link(DEST, slug="taken")
        assert create_short_link(DEST, slug="mine").slug == "mine"
    assert ShortLink.objects.filter(slug="mine").exists()


def test_custom_slug_is_used_and_then_taken():
    link = create_short_link(DEST, slug="My-Link_2")
    assert link.slug == "My-Link_2" and link.destination == DEST
    with pytest.raises(SlugError, match="already taken"):
        create_short_link("https://other.example/", slug="My-Link_2")


@pytest.mark.parametrize(
    ("slug", "match"),
    [
        ("", "1 to 64"),
        ("a b", "1 to 64"),
        ("a/b", "1 to 64"),
        ("ü", "1 to 64"),
        ("x" * 65, "1 to 64"),
        ("admin", "reserved"),
        ("API", "reserved"),
        ("continue", "reserved"),
    ],
)
def test_bad_custom_slugs(slug, match):
    with pytest.raises(SlugError, match=match):
        create_short_link(DEST, slug=slug)
    assert not ShortLink.objects.exists()


@pytest.mark.parametrize(
    ("destination", "match"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("javascript:alert(1)", "not a usable"),
        ("ftp://files.example/x", "not a usable"),
        ("https://", "not a usable"),
        ("https://example.com/" + "a" * 4000, "limit is 4000"),
    ],
)
def test_bad_destinations(destination, match):
    with pytest.raises(ValueError, match=match):
        create_short_link(destination)
    assert not ShortLink.objects.exists()


def test_destination_is_stored_as_given_but_stripped():
    link = create_short_link("  https://Example.COM/a/../b?x=1  ")
    assert link.destination == "https://Example.COM/a/../b?x=1"


def test_generated_slugs_never_collide_with_reserved_paths(monkeypatch):
    monkeypatch.setattr(slugs, "RESERVED", frozenset(ALPHABET[:5]))
    made = {create_short_link(DEST).slug for _ in range(10)}
    assert not made & set(ALPHABET[:5])


def test_a_filter_gone_stale_is_rebuilt_instead_of_giving_up():
    create_short_link(DEST)  # builds this process's filter while the table is nearly empty
    # Other worker processes then fill almost every 1- and 2-character slug: this
    # process's filter believes them free, so nearly every candidate would collide.
    taken = set(ShortLink.objects.values_list("slug", flat=True))
    short = [a for a in ALPHABET] + [a + b for b in ALPHABET for a in ALPHABET]
    free = [s for s in short if s not in taken and s not in slugs.RESERVED][-3:]
    ShortLink.objects.bulk_create(
        ShortLink(slug=s, destination=DEST) for s in short if s not in taken and s not in free
    )
    made = {create_short_link(f"{DEST}/{i}").slug for i in range(3)}
    assert made == set(free), "the shortest free slugs, found after one rebuild"


def test_allocate_slug_rebuilds_a_stale_filter_instead_of_probing_every_slug(
    django_assert_max_num_queries,
):
    allocate_slug()  # builds this process's filter while the table is empty
    short = [a for a in ALPHABET] + [a + b for b in ALPHABET for a in ALPHABET]
    free = [s for s in short if s not in slugs.RESERVED][-1]
    ShortLink.objects.bulk_create(ShortLink(slug=s, destination=DEST) for s in short if s != free)
    # One lookup that collides, the rebuild (count + rows), a query for the
    # filter's maybe-used 1-character slugs, the lookup that finds the free one.
    with django_assert_max_num_queries(8):
        assert allocate_slug() == free
