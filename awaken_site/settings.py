"""Settings for awaken-site, read from the environment.

The defaults are the embedded ones (SQLite under ``var/``, no Redis, an in-process
broker); production points ``DATABASE_URL`` at PostgreSQL and ``REDIS_URL`` (or
``CELERY_BROKER_URL``) at a real broker. A bad value fails loudly at start-up.
"""

import importlib.util
import os
import secrets
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.getenv("AWAKEN_VAR_DIR", BASE_DIR / "var"))


def envbool(name: str, default: str = "0") -> bool:
    value = os.getenv(name, default).strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ImproperlyConfigured(f"{name} must be a boolean (1/0, true/false), not {value!r}")


def envnumber(name: str, default: str, kind=int, minimum=None):
    raw = os.getenv(name, default)
    try:
        value = kind(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, not {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, not {value}")
    return value


def envlist(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.getenv(name, default).split(",") if item.strip()]


DEBUG = envbool("DEBUG", "0")


def _secret_key() -> str:
    key = os.getenv("SECRET_KEY", "")
    if key:
        return key
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off.")
    # Development only: a random key kept under var/ so sessions survive restarts.
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    path = VAR_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = envlist("ALLOWED_HOSTS", "127.0.0.1,localhost")
CSRF_TRUSTED_ORIGINS = envlist("CSRF_TRUSTED_ORIGINS", "")

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "runs",
]
# The development harness (benchmarks, the processes the tests start) is a folder of the
# repository, not part of the installed package: present in a checkout, absent in a wheel.
if importlib.util.find_spec("harness") is not None:
    INSTALLED_APPS.append("harness")

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "awaken_site.urls"
ASGI_APPLICATION = "awaken_site.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


def _database() -> dict:
    url = os.getenv("DATABASE_URL", "")
    if not url:
        VAR_DIR.mkdir(parents=True, exist_ok=True)
        url = f"sqlite:///{VAR_DIR / 'awaken.sqlite3'}"
    config = dj_database_url.parse(url)
    if config["ENGINE"] == "django.db.backends.sqlite3":
        config["OPTIONS"] = {
            # BEGIN IMMEDIATE: a transaction that locks a run and then writes it never
            # fails half-way with "database is locked" (runs.services.core.locked_run).
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    elif config["ENGINE"] == "django.db.backends.postgresql":
        # A connection pool, not persistent connections: under ASGI every request runs in a
        # thread of its own, and a per-thread connection would be a new one per request.
        config["CONN_MAX_AGE"] = 0
        config["OPTIONS"] = {
            "pool": {
                "min_size": envnumber("DB_POOL_MIN", "2", minimum=0),
                "max_size": envnumber("DB_POOL_MAX", "20", minimum=1),
                "timeout": 10,
            },
            # Parameters bound by the server, and a statement prepared the fifth time a
            # connection runs it (Django leaves preparing off unless asked): the few
            # statements of the transitions are parsed and planned once per connection.
            "server_side_binding": True,
            "prepare_threshold": 5,
        }
    else:
        raise ImproperlyConfigured(f"DATABASE_URL must be sqlite:// or postgres://, not {url!r}")
    return config


DATABASES = {"default": _database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(os.getenv("STATIC_ROOT", VAR_DIR / "static"))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

# Behind TLS (production): cookies over HTTPS only, redirect plain HTTP, HSTS.
SESSION_COOKIE_SECURE = envbool("SECURE_COOKIES", "0")
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", "0")
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]  # probes speak plain HTTP
SECURE_HSTS_SECONDS = envnumber("SECURE_HSTS_SECONDS", "0", minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = SECURE_HSTS_SECONDS > 0
SECURE_HSTS_PRELOAD = envbool("SECURE_HSTS_PRELOAD", "0")
if envbool("BEHIND_TLS_PROXY", "0"):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# --- REST API -------------------------------------------------------------------------

REST_FRAMEWORK = {
    # Token first: its WWW-Authenticate header makes anonymous calls 401, not 403.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["runs.api.permissions.IsViewer"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "EXCEPTION_HANDLER": "runs.api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "awaken-site API",
    "DESCRIPTION": "Create, watch and control long-running agent runs.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["runs.api.permissions.IsViewer"],
    # The interactive docs are served from static files: no CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
}

# --- Run control ----------------------------------------------------------------------

AWAKEN_LEASE_SECONDS = envnumber("AWAKEN_LEASE_SECONDS", "15", kind=float, minimum=0.5)
AWAKEN_MAX_CRASH_RETRIES = envnumber("AWAKEN_MAX_CRASH_RETRIES", "3", minimum=0)

# --- Channels and Celery --------------------------------------------------------------

REDIS_URL = os.getenv("REDIS_URL", "")

if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            # Redis pub/sub: a group message reaches each process once and fans out there,
            # with no per-channel capacity to overflow. Every process must use this same
            # layer: the core and pub/sub layers do not talk to each other.
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            # redis-py 8 reads with a 5 s socket timeout by default (django/channels_redis#422);
            # this layer reads in 0.1 s slices, so the explicit value only bounds a dead link.
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 15}]},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

CELERY_BROKER_URL = os.getenv("CELERY_BROKER_URL") or REDIS_URL or "memory://"
CELERY_BROKER_TRANSPORT_OPTIONS = (
    # The memory transport polls once a second by default; control replies would wait for it.
    {"polling_interval": 0.005} if CELERY_BROKER_URL.startswith("memory") else {}
)
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 4
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.getenv("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.channels.server": {"level": "WARNING"},
        # Their INFO and DEBUG lines name the provider's address: kept out of the logs.
        "httpx": {"level": "WARNING"},
        "httpcore": {"level": "WARNING"},
    },
}

# Live attempts one worker process holds at most, and its database threads.
AWAKEN_WORKER_CAPACITY = envnumber("AWAKEN_WORKER_CAPACITY", "1000", minimum=1)
AWAKEN_DB_THREADS = envnumber("AWAKEN_DB_THREADS", "8", minimum=1)
# Runs queued together (a batch, a sweep) go to the workers this many to a message, and
# a worker claims a message's runs in one transaction. Measured on 2 cores with batches of
# 50: 8 to a message, 251 lifecycles/s; 16, 278; 25, 293; 50, 305.
AWAKEN_DISPATCH_CHUNK = envnumber("AWAKEN_DISPATCH_CHUNK", "50", minimum=1)
# How long a live command waits for the owning worker's answer.
AWAKEN_DELIVERY_TIMEOUT = envnumber("AWAKEN_DELIVERY_TIMEOUT", "1.0", kind=float, minimum=0.05)

# --- Agents and the model provider ------------------------------------------------------

# Modules imported at start-up for the agents they register, besides the built-in demo
# agents and those of installed packages' ``awaken.agents`` entry points.
AWAKEN_AGENTS = envlist("AWAKEN_AGENTS", "")


def _provider_url() -> str:
    url = (os.getenv("AWAKEN_PROVIDER_BASE_URL") or os.getenv("OPENAI_BASE_URL") or "").strip()
    if url and not url.startswith(("http://", "https://")):
        raise ImproperlyConfigured("AWAKEN_PROVIDER_BASE_URL must be an http:// or https:// "
                                   "URL (the part before /chat/completions).")
    return url


# An OpenAI-compatible chat completions API. With no base URL, `manage.py serve` (make run)
# starts the provider stub and points this at it.
AWAKEN_PROVIDER_BASE_URL = _provider_url()
AWAKEN_PROVIDER_API_KEY = os.getenv("AWAKEN_PROVIDER_API_KEY") or os.getenv("OPENAI_API_KEY", "")
AWAKEN_PROVIDER_MODEL = os.getenv("AWAKEN_PROVIDER_MODEL", "")
# Seconds one try of a model call may take, first byte to last chunk; tries after the first.
AWAKEN_PROVIDER_TIMEOUT = envnumber("AWAKEN_PROVIDER_TIMEOUT", "120", kind=float, minimum=0.1)
AWAKEN_PROVIDER_MAX_RETRIES = envnumber("AWAKEN_PROVIDER_MAX_RETRIES", "3", minimum=0)
# Pushes of streamed model output to a run's page per second (0: none).
AWAKEN_LIVE_OUTPUT_PER_SECOND = envnumber("AWAKEN_LIVE_OUTPUT_PER_SECOND", "10", kind=float,
                                          minimum=0)

CELERY_TASK_DEFAULT_QUEUE = os.getenv("AWAKEN_QUEUE", "awaken")
CELERY_BEAT_SCHEDULE = {
    "sweep": {"task": "runs.sweep", "schedule": max(1.0, AWAKEN_LEASE_SECONDS / 3)},
}
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 2, "interval_start": 0.1,
                                    "interval_step": 0.2, "interval_max": 0.5}
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
