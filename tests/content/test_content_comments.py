"""urlguard.contrib.comments is tested on a site of its own (the comments apps
installed: tests/contrib_comments/settings.py) with the real django-contrib-comments
package, in a pytest of its own: one Django process has one set of installed apps."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_comments_site_passes_its_tests():
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--ds=tests.contrib_comments.settings",
            "tests/contrib_comments",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-2000:]
