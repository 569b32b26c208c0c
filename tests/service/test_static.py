"""Static files are served without DEBUG (gunicorn in production), by WhiteNoise."""

import pytest


@pytest.mark.parametrize(
    "path", ["/static/urlguard/admin/urlguard.css", "/static/admin/css/base.css"]
)
def test_static_files_are_served_with_debug_off(settings, client, path):
    settings.DEBUG = False
    response = client.get(path)
    assert response.status_code == 200
    assert b"".join(response.streaming_content)
