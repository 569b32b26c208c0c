"""The public surface: every name the package docstring and the README's "The public
surface" table promise a host site exists where they say, and the two lists agree."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

import urlguard

ROOT = Path(__file__).resolve().parent.parent
NAME = re.compile(r"`([^`]+)`")
CHECK_ID = re.compile(r"""["'](urlguard\.[A-Z]\d{3})["']""")


def docstring_names() -> list[str]:
    doc = urlguard.__doc__ or ""
    return [m.group(1) for line in doc.splitlines() if (m := re.match(r"- `([^`]+)`$", line))]


def readme_names() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## The public surface\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [NAME.match(row[2:]).group(1) for row in rows]  # type: ignore[union-attr]


def resolve(dotted: str) -> object:
    """The module `dotted` names, or the attribute its last part names in its parent."""
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError as exc:
        if exc.name != dotted:
            raise
    module, _, attribute = dotted.rpartition(".")
    return getattr(importlib.import_module(module), attribute)


def python_names() -> list[str]:
    return [n for n in docstring_names() if n.startswith("urlguard.") and "*" not in n]


def test_the_docstring_and_the_readme_list_the_same_names():
    assert docstring_names(), "the package docstring lists no public names"
    assert docstring_names() == readme_names()


@pytest.mark.parametrize("dotted", python_names())
def test_each_public_name_is_importable(dotted):
    assert resolve(dotted) is not None


def test_the_public_template_filters_are_in_the_urlguard_library():
    from urlguard.templatetags.urlguard import register

    prefix = "urlguard.templatetags.urlguard."
    listed = {n.removeprefix(prefix) for n in docstring_names() if n.startswith(prefix)}
    assert listed and listed <= set(register.filters) | set(register.tags)


def test_the_optional_apps_are_django_apps():
    from django.apps import AppConfig

    for app in ("urlguard.shortlinks", "urlguard.contrib.comments"):
        assert app in docstring_names()
        configs = vars(importlib.import_module(f"{app}.apps")).values()
        assert any(
            isinstance(c, type) and issubclass(c, AppConfig) and getattr(c, "name", "") == app
            for c in configs
        )


def test_the_settings_namespace_is_the_one_read():
    from urlguard.conf import conf

    assert "settings.URLGUARD" in docstring_names()
    with override_settings(URLGUARD="not a dict"), pytest.raises(ImproperlyConfigured):
        conf.DATA_DIR  # noqa: B018


def test_every_system_check_id_is_in_a_listed_family():
    ids = {
        found
        for path in (ROOT / "urlguard").rglob("*.py")
        for found in CHECK_ID.findall(path.read_text())
    }
    families = {n.removesuffix("*") for n in docstring_names() if n.endswith("*")}
    assert ids
    assert {i for i in ids if not any(i.startswith(f) for f in families)} == set()
    assert {f for f in families if not any(i.startswith(f) for i in ids)} == set()
