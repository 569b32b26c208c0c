"""The library must stay importable without Django."""

import subprocess
import sys


def test_filterengine_does_not_import_django():
    code = "import sys, filterengine; assert 'django' not in sys.modules, 'django imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
