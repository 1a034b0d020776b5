"""Test settings: the real ones, with a known key and a fast password hasher."""

import os

os.environ.setdefault("SECRET_KEY", "tests-only-not-a-secret")

from awaken_site.settings import *  # noqa: E402,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
STORAGES = {**STORAGES, "staticfiles": {  # noqa: F405
    "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}
# Static files come from the finders; no collectstatic before tests.
STATIC_ROOT = None
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = True
