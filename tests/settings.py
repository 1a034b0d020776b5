"""Test settings: the real ones, with a known key and a fast password hasher."""

import os
import uuid

os.environ.setdefault("SECRET_KEY", "tests-only-not-a-secret")
# A queue of this test session's own: worker processes started by the tests inherit it, and
# no message of an earlier session is ever picked up.
os.environ.setdefault("AWAKEN_QUEUE", f"awaken-test-{uuid.uuid4().hex[:10]}")

# The demo agents, which the tests run (and which the processes they start inherit).
os.environ.setdefault("AWAKEN_DEMO_AGENTS", "1")

from awaken_site.settings import *  # noqa: E402,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
STORAGES = {**STORAGES, "staticfiles": {  # noqa: F405
    "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}
# Static files come from the finders; no collectstatic before tests.
STATIC_ROOT = None
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = True
# The tests that commit here and read the pushes of a socket here expect each change as it
# commits, after the snapshot that came before it: this process sends them at once. The
# web processes the tests start keep the web's linger; tests/test_changes.py tests it.
AWAKEN_PUBLISH_LINGER = 0.0
