"""Settings for awaken-site, read from the environment.

The defaults are the embedded ones (SQLite under ``var/``, no Redis, an in-process
broker); production points ``DATABASE_URL`` at PostgreSQL and ``REDIS_URL`` (or
``CELERY_BROKER_URL``) at a real broker. A bad value fails loudly at start-up.
"""

import hashlib
import importlib.util
import os
import re
import secrets
import warnings
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


def envnumber(name: str, default: str, kind=int, minimum=None, maximum=None):
    raw = os.getenv(name, default)
    try:
        value = kind(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be a number, not {raw!r}") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, not {value}")
    if maximum is not None and value > maximum:
        raise ImproperlyConfigured(f"{name} must be at most {maximum}, not {value}")
    return value


def envrenamed(name: str, old: str) -> None:
    """Setting ``old`` was renamed ``name``: the old name is still read (for one release),
    with a DeprecationWarning, when the new one is not set."""
    if old in os.environ:
        warnings.warn(f"{old} is deprecated: set {name} instead.", DeprecationWarning,
                      stacklevel=2)
        os.environ.setdefault(name, os.environ[old])


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
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "axes",
    "runs",
]
# The development harness (benchmarks, the processes the tests start) is a folder of the
# repository, not part of the installed package: present in a checkout, absent in a wheel.
if importlib.util.find_spec("harness") is not None:
    INSTALLED_APPS.append("harness")

MIDDLEWARE = [
    # A request is a span when traces are on (OTEL_* settings, runs/telemetry.py).
    "runs.telemetry.Middleware",
    "django.middleware.security.SecurityMiddleware",
    "awaken_site.csp.ContentSecurityPolicy",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, as django-axes asks: it turns a refused login into the lockout page.
    "axes.middleware.AxesMiddleware",
    # An exhausted database pool is 503 busy, not 500 (its process_exception runs first).
    "awaken_site.busy.PoolExhaustedIsBusy",
    # A page's template renders with no database connection held (after the view's reads).
    "awaken_site.rendering.ReleaseBeforeRender",
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


def _private_var_dir() -> Path:
    """``var/``, readable by this user alone, and its SQLite file with its ``-wal`` and
    ``-shm`` companions (SQLite gives those the database file's mode) 0600: the file holds
    live session keys. Made so before SQLite first opens the file. A directory named by
    AWAKEN_VAR_DIR that exists already keeps its mode (it may be shared, such as /tmp)."""
    if not VAR_DIR.exists() or VAR_DIR == BASE_DIR / "var":
        VAR_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
        VAR_DIR.chmod(0o700)
    database = VAR_DIR / "awaken.sqlite3"
    database.touch(mode=0o600, exist_ok=True)
    for path in (database, VAR_DIR / "awaken.sqlite3-wal", VAR_DIR / "awaken.sqlite3-shm"):
        if path.exists():
            path.chmod(0o600)
    return database


def _database() -> dict:
    url = os.getenv("DATABASE_URL", "")
    if not url:
        url = f"sqlite:///{_private_var_dir()}"
    config = dj_database_url.parse(url)
    given = config.get("OPTIONS", {})  # the URL's query
    if config["ENGINE"] == "django.db.backends.sqlite3":
        if DB_POOLER:
            raise ImproperlyConfigured("DB_POOLER names a PostgreSQL pooler; DATABASE_URL "
                                       "names no PostgreSQL database")
        config["OPTIONS"] = {
            # BEGIN IMMEDIATE: a transaction that locks a run and then writes it never
            # fails half-way with "database is locked" (runs.domain.core.locked_run).
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    elif config["ENGINE"] == "django.db.backends.postgresql":
        # A connection pool, not persistent connections: under ASGI every request runs in a
        # thread of its own, and a per-thread connection would be a new one per request.
        config["CONN_MAX_AGE"] = 0
        pooled = DB_POOLER == "transaction"
        config["OPTIONS"] = {
            "pool": {
                "min_size": envnumber("DB_POOL_MIN", "2", minimum=0),
                "max_size": envnumber("DB_POOL_MAX", "20", minimum=1),
                # How long a request waits for a free connection before it fails.
                "timeout": envnumber("DB_POOL_TIMEOUT", "5", kind=float, minimum=0.1),
            },
            # Parameters bound by the server, and a statement prepared the fifth time a
            # connection runs it (Django leaves preparing off unless asked): the few
            # statements of the transitions are parsed and planned once per connection.
            # Behind a transaction pooler a statement prepared on one server session would
            # be looked for on another, and the pooler refuses a session's own settings
            # (``options``): neither is asked for there.
            "server_side_binding": True,
            "prepare_threshold": None if pooled else 5,
            # A process frozen inside a transaction (stopped, swapped out, stuck in a
            # debugger) would hold its row locks until its connection died, and the
            # sweeper would wait on them for ever: the server ends such a session instead.
            # No transaction here waits on anything but the database. Behind a pooler the
            # server's own setting does it (the database check ``awaken.W001`` says so).
            **({} if pooled else {
                "options": "-c idle_in_transaction_session_timeout="
                           f"{round(DB_IDLE_IN_TRANSACTION_SECONDS * 1000)}"}),
            # A server or network that goes silent is given up on, not waited for: a new
            # connection waits 10 s at most; the kernel probes one idle for 10 s every 5 s
            # and drops it after 3 unanswered probes, or once data it sent has gone 30 s
            # unacknowledged. The query then fails with an error, the pool opens another.
            # (A silent server is not a slow one: a long query is never cut short.)
            "connect_timeout": 10,
            "keepalives": 1,
            "keepalives_idle": 10,
            "keepalives_interval": 5,
            "keepalives_count": 3,
            "tcp_user_timeout": 30_000,
        }
        # A server-side cursor (``QuerySet.iterator()``) outlives its transaction, which a
        # transaction pooler does not keep on one server session.
        config["DISABLE_SERVER_SIDE_CURSORS"] = pooled
    else:
        raise ImproperlyConfigured(f"DATABASE_URL must be sqlite:// or postgres://, not {url!r}")
    config["OPTIONS"] = _url_options_on_top(config["OPTIONS"], given)
    return config


def _pooler() -> str:
    """``DB_POOLER``: empty when the site's pools talk to PostgreSQL itself, ``transaction``
    when a pooler in transaction mode (PgBouncer's ``pool_mode = transaction``) stands
    between them."""
    pooler = os.getenv("DB_POOLER", "").strip().lower()
    if pooler not in ("", "transaction"):
        raise ImproperlyConfigured(f"DB_POOLER must be empty or transaction, not {pooler!r}")
    return pooler


def _url_options_on_top(ours: dict, given: dict) -> dict:
    """Our connection options with those of the URL's query over them: what the URL names
    (``sslmode``, ``sslrootcert``, ``application_name``, ``connect_timeout``, ...) is the
    deployment's choice. Server settings (PostgreSQL's ``options``) are joined, ours first,
    so that the URL's ``-c`` of a setting we also give wins."""
    options = " ".join(filter(None, (ours.get("options"), given.get("options"))))
    return {**ours, **given, **({"options": options} if options else {})}


DB_POOLER = _pooler()
DB_IDLE_IN_TRANSACTION_SECONDS = envnumber("DB_IDLE_IN_TRANSACTION_SECONDS", "10", kind=float,
                                           minimum=0.1)
DATABASES = {"default": _database()}

# --- Shares of the web process (awaken_site/request_share.py) -------------------------------

# Requests one web process serves at once (fewer than its pool's connections: its sockets and
# change stream take theirs too), how many of them may be reads (the rest stay free for
# controls), and how many reads one client may have at once. A request with no room waits
# this many seconds on the event loop, then is answered 503 busy with Retry-After.
_POOL_MAX = DATABASES["default"].get("OPTIONS", {}).get("pool", {}).get("max_size", 20)
AWAKEN_REQUEST_SLOTS = envnumber("AWAKEN_REQUEST_SLOTS", str(max(2, _POOL_MAX - 4)), minimum=1)
AWAKEN_READ_SLOTS = envnumber("AWAKEN_READ_SLOTS", str(max(1, AWAKEN_REQUEST_SLOTS * 3 // 4)),
                              minimum=1)
AWAKEN_CLIENT_SLOTS = envnumber("AWAKEN_CLIENT_SLOTS", str(max(1, AWAKEN_REQUEST_SLOTS // 4)),
                                minimum=1)
AWAKEN_BUSY_WAIT = envnumber("AWAKEN_BUSY_WAIT", "1", kind=float, minimum=0)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
# django-axes first: a locked-out login is refused before any password is hashed.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
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
    "staticfiles": {"BACKEND": "awaken_site.storage.StaticStorage"},
}

# Behind TLS (production): cookies over HTTPS only, redirect plain HTTP, HSTS.
SESSION_COOKIE_SECURE = envbool("SECURE_COOKIES", "0")
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_SSL_REDIRECT = envbool("SECURE_SSL_REDIRECT", "0")
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^metrics$"]  # probes speak plain HTTP
SECURE_HSTS_SECONDS = envnumber("SECURE_HSTS_SECONDS", "0", minimum=0)
# Subdomains only when asked: they may be served by others, some without TLS.
SECURE_HSTS_INCLUDE_SUBDOMAINS = envbool("SECURE_HSTS_INCLUDE_SUBDOMAINS", "0")
SECURE_HSTS_PRELOAD = envbool("SECURE_HSTS_PRELOAD", "0")
if envbool("BEHIND_TLS_PROXY", "0"):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# The browser pages run no inline script and load nothing from other origins. Styles come
# from files too (style attributes set from JavaScript are allowed; inline ones are not).
# Every answer carries this policy (awaken_site.csp).
SECURE_CSP = {
    "default-src": ["'self'"],
    "script-src": ["'self'"],
    "style-src": ["'self'"],
    "img-src": ["'self'", "data:"],
    "font-src": ["'self'"],
    "connect-src": ["'self'"],
    "object-src": ["'none'"],
    "base-uri": ["'none'"],
    "form-action": ["'self'"],
    "frame-ancestors": ["'none'"],
}

# --- Throttling of logins and API keys --------------------------------------------------

# After this many failed logins (for one username from one address) or checks of unknown
# keys (from one address), each less than the lockout period after the one before, further
# tries of that pair or address are refused with 429 until the lockout period has passed
# since the last failure. The lock falls on what failed: a right key is never refused, and
# a username locked from one address still logs in from another.
AWAKEN_AUTH_FAILURES = envnumber("AWAKEN_AUTH_FAILURES", "10", minimum=1)
AWAKEN_AUTH_LOCKOUT_SECONDS = envnumber("AWAKEN_AUTH_LOCKOUT_SECONDS", "900", kind=float,
                                        minimum=1)
# Logins: django-axes, its counts in the database (so they hold across web processes).
AXES_FAILURE_LIMIT = "runs.pages.logins.failure_limit"
AXES_COOLOFF_TIME = "runs.pages.logins.lockout_period"
AXES_LOCKOUT_CALLABLE = "runs.pages.logins.locked_out"
# The (username, address) pair: failures from one address never lock the username elsewhere.
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
# A refused try is not counted: it neither extends the lockout nor writes anything.
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_DISABLE_ACCESS_LOG = True
AXES_VERBOSE = False
# The address is the connection's (REMOTE_ADDR), never a header the client chose.
AXES_IPWARE_META_PRECEDENCE_ORDER = ["REMOTE_ADDR"]

# --- REST API -------------------------------------------------------------------------

REST_FRAMEWORK = {
    # Token first: its WWW-Authenticate header makes anonymous calls 401, not 403.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "runs.api.authentication.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["runs.api.permissions.IsViewer"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["runs.api.parsers.JSONParser"],
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
    "PREPROCESSING_HOOKS": ["runs.api.schema.review_links_documented"],
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "runs.api.schema.refuse_unknown_fields"],
    # Choice sets that share a field name with the run's get names of their own.
    "ENUM_NAME_OVERRIDES": {
        "RunStateEnum": "runs.models.RunState",
        "EndCauseEnum": "runs.models.EndCause",
        "ReviewLinkStateEnum": "runs.api.review.LINK_STATES",
        "BulkJobStateEnum": "runs.models.BulkState",
    },
}

# --- Run control ----------------------------------------------------------------------

AWAKEN_LEASE_SECONDS = envnumber("AWAKEN_LEASE_SECONDS", "15", kind=float, minimum=0.5)
AWAKEN_MAX_CRASH_RETRIES = envnumber("AWAKEN_MAX_CRASH_RETRIES", "3", minimum=0)
# The most runs one bulk job may select.
AWAKEN_BULK_MAX_RUNS = envnumber("AWAKEN_BULK_MAX_RUNS", "10000", minimum=1)
# How long a review link lasts unless its maker says otherwise (60 s to 7 days).
AWAKEN_REVIEW_LINK_SECONDS = envnumber("AWAKEN_REVIEW_LINK_SECONDS", "86400", minimum=60)

# --- Limits on input ------------------------------------------------------------------

# A request body over this is answered 413 before it is read (awaken_site/body_limit.py);
# Django's own check, which DRF's JSON parser goes through, uses the same figure.
AWAKEN_MAX_BODY_BYTES = envnumber("AWAKEN_MAX_BODY_BYTES", str(1024 * 1024), minimum=1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = AWAKEN_MAX_BODY_BYTES
# A run's input (and a resume's), as compact UTF-8 JSON.
AWAKEN_MAX_INPUT_BYTES = envnumber("AWAKEN_MAX_INPUT_BYTES", str(256 * 1024), minimum=2)
# A run in a list page whose input and output, as stored, together take more than this is
# listed without them and with "truncated": true; /api/runs/{id}/ has it whole.
AWAKEN_LIST_PAYLOAD_BYTES = envnumber("AWAKEN_LIST_PAYLOAD_BYTES", str(16 * 1024), minimum=0)

# --- Channels and Celery --------------------------------------------------------------

REDIS_URL = os.getenv("REDIS_URL", "")


def channel_prefix(database: dict) -> str:
    """The channel layer's prefix: ``AWAKEN_CHANNEL_PREFIX``, else one derived from the
    database's name. Redis pub/sub ignores database numbers, so deployments that share a
    Redis server are kept apart only by the names of their channels."""
    prefix = os.getenv("AWAKEN_CHANNEL_PREFIX", "")
    if not prefix:
        name = str(database["NAME"])
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-.")
        if len(slug) > 40:  # a long SQLite path: its end, and a digest of the whole
            slug = f"{slug[-31:]}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
        prefix = f"awaken.{slug}."
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,60}", prefix):
        raise ImproperlyConfigured("AWAKEN_CHANNEL_PREFIX must be 1 to 60 letters, digits, "
                                   f"'_', '.' or '-', not {prefix!r}")
    return prefix


AWAKEN_CHANNEL_PREFIX = channel_prefix(DATABASES["default"])


def redis_channel_layer(url: str, prefix: str) -> dict:
    """The channel layer on the Redis server at ``url``, its names prefixed with ``prefix``."""
    return {
        # Redis pub/sub: a group message reaches each process once and fans out there,
        # with no per-channel capacity to overflow. Every process must use this same
        # layer: the core and pub/sub layers do not talk to each other.
        "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
        # redis-py 8 reads with a 5 s socket timeout by default (django/channels_redis#422);
        # this layer reads in 0.1 s slices, so the explicit value only bounds a dead link.
        "CONFIG": {"hosts": [{"address": url, "socket_timeout": 15, "socket_connect_timeout": 2}],
                   "prefix": prefix},
    }


if REDIS_URL:
    CHANNEL_LAYERS = {"default": redis_channel_layer(REDIS_URL, AWAKEN_CHANNEL_PREFIX)}
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# --- Sockets --------------------------------------------------------------------------

# A run whose representation is larger is pushed without its input, output and ticket
# prompt, marked "truncated" (API.md): this bounds the channel layer's messages too. A
# snapshot is cut to fit 512 KiB, under daphne's 1 MiB limit for a websocket message.
AWAKEN_PUSH_RUN_BYTES = envnumber("AWAKEN_PUSH_RUN_BYTES", "65536", minimum=1024)
if AWAKEN_PUSH_RUN_BYTES > 262144:
    raise ImproperlyConfigured("AWAKEN_PUSH_RUN_BYTES must be at most 262144")
# What a socket may hold for a client that does not read before it is closed: its queue,
# besides the connection's own write buffer (64 KiB) and one message.
AWAKEN_SOCKET_BUFFER_BYTES = envnumber("AWAKEN_SOCKET_BUFFER_BYTES", "1048576", minimum=524288)
# How often each web process re-checks the sessions, tokens and users of its open sockets.
AWAKEN_SOCKET_RECHECK_SECONDS = envnumber("AWAKEN_SOCKET_RECHECK_SECONDS", "2", kind=float,
                                          minimum=0.05)
# How often an idle event stream (server-sent events) sends a comment, to keep proxies open.
AWAKEN_SSE_KEEPALIVE_SECONDS = envnumber("AWAKEN_SSE_KEEPALIVE_SECONDS", "15", kind=float,
                                         minimum=0.05)


def _networks(name: str, items: list[str]) -> list:
    """Addresses or CIDR ranges (the list of setting ``name``), as networks."""
    import ipaddress

    try:
        return [ipaddress.ip_network(item, strict=False) for item in items]
    except ValueError as error:
        raise ImproperlyConfigured(f"{name} must list addresses or CIDR ranges: {error}") \
            from None


# Who may read /metrics without an API key: anyone (AWAKEN_METRICS_PUBLIC), else these
# client addresses (REMOTE_ADDR: behind a proxy, daphne's --proxy-headers makes it the
# client's), by default this host only.
AWAKEN_METRICS_PUBLIC = envbool("AWAKEN_METRICS_PUBLIC", "0")
AWAKEN_METRICS_ALLOWED_ADDRESSES = _networks("AWAKEN_METRICS_ALLOWED_ADDRESSES", envlist(
    "AWAKEN_METRICS_ALLOWED_ADDRESSES", "127.0.0.1/32,::1/128"))
# Webhooks: the only hosts ever called (a name, or .example.com for it and its subdomains),
# how long one attempt may take, and for how long a delivery is retried.
AWAKEN_WEBHOOK_ALLOWED_HOSTS = [host.strip() for host in os.getenv(
    "AWAKEN_WEBHOOK_ALLOWED_HOSTS", "").split(",") if host.strip()]
AWAKEN_WEBHOOK_TIMEOUT = envnumber("AWAKEN_WEBHOOK_TIMEOUT", "10", kind=float, minimum=0.1)
AWAKEN_WEBHOOK_RETRY_SECONDS = envnumber("AWAKEN_WEBHOOK_RETRY_SECONDS", "10800", kind=float,
                                         minimum=3600)

# The in-memory broker names a host, which it ignores: without one kombu warns "No hostname
# was supplied" at every start.
CELERY_BROKER_URL = os.getenv("CELERY_BROKER_URL") or REDIS_URL or "memory://localhost/"
CELERY_BROKER_TRANSPORT_OPTIONS = (
    # The memory transport polls once a second by default; control replies would wait for it.
    {"polling_interval": 0.005} if CELERY_BROKER_URL.startswith("memory")
    # No call to Redis waits without a deadline (redis-py waits for ever by default). No
    # acknowledgement emulation: a message is taken off its queue when it is delivered. A
    # run whose message is lost with its worker stays queued and the sweeper sends it again,
    # so the broker need not keep unacknowledged messages (kombu 5.7 restoring them through
    # a connection that a Redis restart closed made the worker exit).
    else {"socket_timeout": 5, "socket_connect_timeout": 2, "ack_emulation": False}
    if CELERY_BROKER_URL.startswith(("redis", "rediss")) else {}
)
# A connection or producer from Celery's pool is waited for at most this long, and a new
# broker connection is given up on after this long.
CELERY_BROKER_POOL_ACQUIRE_TIMEOUT = 2.0
CELERY_BROKER_CONNECTION_TIMEOUT = 2.0
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = False  # durability is the database's: see the transport options
CELERY_WORKER_PREFETCH_MULTIPLIER = 4
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # Control characters escaped, review tokens redacted (awaken_site.logs).
    "formatters": {"plain": {"()": "awaken_site.logs.SafeFormatter",
                             "format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": os.getenv("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.channels.server": {"level": "WARNING"},
        # Axes logs each failed login at WARNING, and its bookkeeping at INFO.
        "axes": {"level": "WARNING"},
        # Their INFO and DEBUG lines name the provider's address: kept out of the logs.
        "httpx": {"level": "WARNING"},
        "httpcore": {"level": "WARNING"},
    },
}

# Live attempts one worker process holds at most (children started in-process included),
# and its database threads.
AWAKEN_WORKER_CAPACITY = envnumber("AWAKEN_WORKER_CAPACITY", "2000", minimum=1)
# Child runs one run may have, whoever creates them (its agent, or the API's parent_id).
AWAKEN_MAX_CHILDREN = envnumber("AWAKEN_MAX_CHILDREN", "100", minimum=0)
AWAKEN_DB_THREADS = envnumber("AWAKEN_DB_THREADS", "8", minimum=1)
# Runs queued together (a batch, a sweep) go to the workers this many to a message, and
# a worker claims a message's runs in one transaction. Measured on 2 cores with batches of
# 50: 8 to a message, 251 lifecycles/s; 16, 278; 25, 293; 50, 305.
AWAKEN_DISPATCH_CHUNK = envnumber("AWAKEN_DISPATCH_CHUNK", "50", minimum=1)
# A process sends its queued runs at most once per this many seconds: the runs queued
# within it of the last send go together in the next, one message and one claim for the
# requests of a burst (runs.workers.dispatch.Dispatches). Measured on 2 cores one run per
# request, 8 callers: 0.01 against 0, 0.88 and 0.90 of the system's CPU a lifecycle; the
# workers' CPU against the web's, 0.80-0.84 at 0.01, 0.75-0.76 at 0.025, 0.67-0.71 at
# 0.05 and 0.66-0.68 at 0.1 (docs/performance.md); a run of a steady stream started about
# 20 ms later at the median at 0.05 than at 0.01. A broker thread sleeps out the linger,
# so it is kept short (1 s at most).
AWAKEN_DISPATCH_LINGER = envnumber("AWAKEN_DISPATCH_LINGER", "0.05", kind=float, minimum=0,
                                   maximum=1)
# A web process sends its changes to the channel layer at most once per this many
# seconds: the changes committed within it of the last send (a burst of creates) go
# together in the next, one message for them all; a change after a quiet spell goes at
# once (runs.changes.stream). The workers send theirs as they come: a waiting cancel's
# answer follows a worker's end.
AWAKEN_PUBLISH_LINGER = envnumber("AWAKEN_PUBLISH_LINGER", "0.01", kind=float, minimum=0,
                                  maximum=1)
# How long a live command waits for the owning worker's answer.
AWAKEN_DELIVERY_TIMEOUT = envnumber("AWAKEN_DELIVERY_TIMEOUT", "1.0", kind=float, minimum=0.05)
# The broker threads (runs.workers.broker): the threads of each process that talk to the
# broker for the others (dispatches, live commands, health probes), and how many calls may
# wait for them. Their first names, AWAKEN_COURIER_THREADS and AWAKEN_COURIER_BACKLOG, are
# still read, with a DeprecationWarning, until the next release.
envrenamed("AWAKEN_BROKER_THREADS", "AWAKEN_COURIER_THREADS")
envrenamed("AWAKEN_BROKER_BACKLOG", "AWAKEN_COURIER_BACKLOG")
AWAKEN_BROKER_THREADS = envnumber("AWAKEN_BROKER_THREADS", "4", minimum=1)
AWAKEN_BROKER_BACKLOG = envnumber("AWAKEN_BROKER_BACKLOG", "500", minimum=0)
# How long a health probe waits for the broker and for the workers' ping answers.
AWAKEN_BROKER_TIMEOUT = envnumber("AWAKEN_BROKER_TIMEOUT", "0.5", kind=float, minimum=0.05)

# --- Agents and the model provider ------------------------------------------------------

# Modules imported at start-up for the agents they register, besides the built-in demo
# agents and those of installed packages' ``awaken.agents`` entry points.
AWAKEN_AGENTS = envlist("AWAKEN_AGENTS", "")
# The shipped demo agents (demo.hang, demo.parent...) are registered only when this is set:
# `make run`, the harness and the tests set it; production processes leave it out.
AWAKEN_DEMO_AGENTS = envbool("AWAKEN_DEMO_AGENTS", "0")


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
# Prices of models the price table (genai-prices) does not know, or that one pays otherwise:
# JSON, model name to {"input": …, "output": …} in US dollars per million tokens.
AWAKEN_MODEL_PRICES = os.getenv("AWAKEN_MODEL_PRICES", "")
# A provider still failing after the retries: "fail" the run, or "pause" it (ticket reason
# provider) to be resumed once the provider is back.
AWAKEN_ON_PROVIDER_ERROR = os.getenv("AWAKEN_ON_PROVIDER_ERROR", "fail").strip().lower()
if AWAKEN_ON_PROVIDER_ERROR not in ("fail", "pause"):
    raise ImproperlyConfigured("AWAKEN_ON_PROVIDER_ERROR must be fail or pause, not "
                               f"{AWAKEN_ON_PROVIDER_ERROR!r}")
# A model reply (its bytes as sent, stream framing included) is read this far at most: past
# it the connection is closed and the call fails. A run's output encoded larger than
# AWAKEN_MAX_OUTPUT_BYTES ends the run failed, with an error saying so.
AWAKEN_MAX_REPLY_BYTES = envnumber("AWAKEN_MAX_REPLY_BYTES", str(1024 * 1024), minimum=1024)
AWAKEN_MAX_OUTPUT_BYTES = envnumber("AWAKEN_MAX_OUTPUT_BYTES", str(1024 * 1024), minimum=1024)
# Pushes of streamed model output to a run's page per second (0: none).
AWAKEN_LIVE_OUTPUT_PER_SECOND = envnumber("AWAKEN_LIVE_OUTPUT_PER_SECOND", "10", kind=float,
                                          minimum=0)

CELERY_TASK_DEFAULT_QUEUE = os.getenv("AWAKEN_QUEUE", "awaken")
# Beat sweeps itself, on a thread of its own (runs.workers.sweeper), so the sweep never waits
# on a worker; the one task it sends is the webhooks' delivery round. It keeps its schedule in
# memory, and needs no writable directory (the default scheduler's file under var/ made it
# fail on a bare checkout).
CELERY_BEAT_SCHEDULE = {
    "webhooks": {"task": "runs.webhooks", "schedule": 2.0},
}
CELERY_BEAT_SCHEDULER = "celery.beat:Scheduler"
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 2, "interval_start": 0.1,
                                    "interval_step": 0.2, "interval_max": 0.5}
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
