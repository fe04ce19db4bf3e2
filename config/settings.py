"""Settings: everything here, differences come from the environment (12-factor).

Every variable read below is documented in the README's configuration table.
"""

from __future__ import annotations

import ipaddress
from datetime import timedelta
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()
DEBUG = env.bool("DJANGO_DEBUG", default=False)
SECRET_KEY = env.str("DJANGO_SECRET_KEY")
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])

# Comma-separated Fernet keys: the first encrypts, all decrypt (rotation). See apps.core.crypto.
SECRETS_ENCRYPTION_KEYS = env.list("SECRETS_ENCRYPTION_KEY", default=[])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "drf_spectacular",
    "django_htmx",
    "channels",
    "apps.core",
    "apps.accounts",
    "apps.llm",
    "apps.sandbox",
    "apps.memory",
    "apps.tools",
    "apps.agents",
    "apps.identities",
    "apps.folders",
    "apps.streams",
    "apps.observability",
    "apps.api",
    "apps.ade",
    "django_ace",  # ships the Ace editor (static files) used by the ADE's tool editor
    "axes",  # failed sign-ins and lockouts (see Throttling below)
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Daphne serves no static files; WhiteNoise serves the admin's and the ADE's from STATIC_ROOT.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "axes.middleware.AxesMiddleware",  # last, as django-axes requires: turns a lockout into its response
]
# Under ASGI the chain and the views run synchronously in one thread hop: apps.core.asgi.

ROOT_URLCONF = "config.urls"
# The Letta SDK's paths are exact about trailing slashes; never redirect (a 301 turns POST into GET).
APPEND_SLASH = False

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
                "apps.ade.context_processors.ade",
            ]
        },
    }
]

WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

DATABASES = {"default": env.db_url("DATABASE_URL")}
# Persistent connections: a new PostgreSQL connection per request is what made Letta slow.
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", default=300)
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# A session whose peer is gone (a worker cut off by a partition, a lost machine) must end within this many
# seconds on both sides, so its per-conversation advisory lock (apps.agents.locks) is released for another
# worker, instead of after the kernel's TCP defaults (hours). Client side: libpq's keepalives and
# tcp_user_timeout; server side: the same settings for this session (`-c` options). TCP connections only
# (the embedded PostgreSQL's Unix socket needs none). 0: leave both to the system.
DATABASE_TCP_TIMEOUT = env.int("DATABASE_TCP_TIMEOUT", default=30)
if DATABASE_TCP_TIMEOUT > 0:
    _idle, _interval = max(1, DATABASE_TCP_TIMEOUT // 3), max(1, DATABASE_TCP_TIMEOUT // 6)
    _database_options = DATABASES["default"].setdefault("OPTIONS", {})
    _database_options.update(
        keepalives=1,
        keepalives_idle=_idle,
        keepalives_interval=_interval,
        keepalives_count=4,
        tcp_user_timeout=DATABASE_TCP_TIMEOUT * 1000,
    )
    _database_options["options"] = " ".join(
        filter(
            None,
            [
                _database_options.get("options", ""),
                f"-c tcp_keepalives_idle={_idle} -c tcp_keepalives_interval={_interval}",
                f"-c tcp_keepalives_count=4 -c tcp_user_timeout={DATABASE_TCP_TIMEOUT * 1000}",
            ],
        )
    )
# A connection pool (psycopg_pool) of at most this many connections instead: for the web process, where
# under ASGI requests run in as many threads as are served at once (apps/core/asgi.py keeps up to 64 idle),
# each with its own persistent connection, so a burst would open one a request and keep dozens
# (`make run` sets it for daphne from WEB_DATABASE_POOL_MAX_SIZE). 0: no pool.
DATABASE_POOL_MAX_SIZE = env.int("DATABASE_POOL_MAX_SIZE", default=0)
if DATABASE_POOL_MAX_SIZE > 0:
    DATABASES["default"]["CONN_MAX_AGE"] = 0  # connections go back to the pool at the end of a request
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": min(2, DATABASE_POOL_MAX_SIZE),
        "max_size": DATABASE_POOL_MAX_SIZE,
        "timeout": env.float("DATABASE_POOL_TIMEOUT", default=30.0),
    }

# Server-side parameter binding with prepared statements (psycopg; Django's default is client-side
# binding, where PostgreSQL parses and plans every statement afresh). A worker repeats the same ~20
# statements every turn: prepared, PostgreSQL's CPU per memory turn fell by about a third (bench/cpu_turn.py).
# `make run` and the bench turn it on for the Celery workers only (the worker's code is what the tests
# run with it: DATABASE_SERVER_SIDE_BINDING=true pytest tests/agents).
# Without it, the few hand-written statements every request runs are still bound on the server and
# prepared (apps.core.db.prepared_cursor); Django's client-side cursors never prepare. 0: nothing is
# prepared (Django's default, for a pooler that cannot keep a session's prepared statements).
DATABASE_SERVER_SIDE_BINDING = env.bool("DATABASE_SERVER_SIDE_BINDING", default=False)
DATABASE_PREPARE_THRESHOLD = env.int("DATABASE_PREPARE_THRESHOLD", default=2)
DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = DATABASE_PREPARE_THRESHOLD or None
if DATABASE_SERVER_SIDE_BINDING:
    DATABASES["default"]["OPTIONS"]["server_side_binding"] = True

REDIS_URL = env.str("REDIS_URL")
# Django's cache, where the API's throttles count: Redis, so that every web process shares the counts.
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": "cache",
    }
}

AUTH_USER_MODEL = "accounts.User"
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
# django-axes' backend first: it refuses a locked-out sign-in before the password is checked.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
LOGIN_URL = "ade:login"
LOGIN_REDIRECT_URL = "ade:home"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = env.path("STATIC_ROOT", default=BASE_DIR / "var" / "static")
STATICFILES_DIRS = [BASE_DIR / "static"]
# Serve static files straight from the apps (no collectstatic): tests and development servers.
WHITENOISE_USE_FINDERS = env.bool("WHITENOISE_USE_FINDERS", default=DEBUG)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
FORMS_URLFIELD_ASSUME_HTTPS = True  # Django 6 behaviour now, and no deprecation noise

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "apps.api.authentication.ApiKeyAuthentication",
        "apps.api.authentication.OrgSessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["apps.api.renderers.OrjsonRenderer"],
    "DEFAULT_PARSER_CLASSES": ["apps.api.parsers.BoundedJSONParser"],  # JSON_MAX_DEPTH
    "EXCEPTION_HANDLER": "apps.api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
    # Per API key and per organisation (rates: API_RATE_PER_KEY, API_RATE_PER_ORG under Throttling).
    "DEFAULT_THROTTLE_CLASSES": [
        "apps.api.throttles.ApiKeyRateThrottle",
        "apps.api.throttles.OrganizationRateThrottle",
    ],
    # A client's address is the connection's (daphne's --proxy-headers sets it behind a proxy): an
    # X-Forwarded-For header a client sends itself never moves it out of its throttles.
    "NUM_PROXIES": 0,
}
# Single-user local mode (off by default): /v1 requests without a key or a session act as the bootstrap
# admin (DJANGO_SUPERUSER_USERNAME) in their first organisation, when they come from this machine
# (apps/api/authentication.py anonymous_local). Django cannot see the address daphne binds (`make run`
# passes HOST to it), so every request's own address must be loopback, and these settings refuse to load
# (no process starts) when the mode is on with a HOST that is not a loopback address.
ALLOW_ANONYMOUS_LOCAL = env.bool("ALLOW_ANONYMOUS_LOCAL", default=False)
ANONYMOUS_LOCAL_USERNAME = env.str("DJANGO_SUPERUSER_USERNAME", default="admin")
if ALLOW_ANONYMOUS_LOCAL:
    _host = env.str("HOST", default="127.0.0.1").strip("[]")
    try:
        _loopback = _host == "localhost" or ipaddress.ip_address(_host).is_loopback
    except ValueError:
        _loopback = False
    if not _loopback:
        raise ImproperlyConfigured(
            f"ALLOW_ANONYMOUS_LOCAL=true lets anyone who reaches the server act as its owner: it needs a "
            f"loopback HOST (127.0.0.1, ::1, localhost), not {_host!r}"
        )

SPECTACULAR_SETTINGS = {
    "TITLE": "Letta-compatible agent server",
    "DESCRIPTION": "Stateful agents with self-editing memory; a Letta v1 compatible REST API.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    "SERVE_AUTHENTICATION": [],
}

CHANNEL_LAYERS = {
    "default": {"BACKEND": "channels_redis.core.RedisChannelLayer", "CONFIG": {"hosts": [REDIS_URL]}}
}

# Celery: see README "Workers" for why these values (crash safety, fairness).
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default=REDIS_URL)
CELERY_RESULT_BACKEND = None
# kombu's Redis transport with one Redis client per channel instead of one per command (config/broker.py);
# other brokers (rediss://, sentinel://, amqp://...) get kombu's own transport for their scheme.
CELERY_BROKER_TRANSPORT = "config.broker:Transport" if CELERY_BROKER_URL.startswith("redis://") else None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ALWAYS_EAGER = False
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT", default=3600)}
CELERY_TIMEZONE = "UTC"
# Celery's Django fixup closes the database connection before and after every task unless this is set;
# a new PostgreSQL connection per turn cost the worker ~3 ms and PostgreSQL a backend start. With it,
# the fixup closes only every 2 x N task signals; between tasks config/celery.py closes connections that
# are broken or older than CONN_MAX_AGE, as Django does between requests.
CELERY_DB_REUSE_MAX = 1000
# Where agent runs execute: "celery" (workers; the web process never calls an LLM) or "in_process"
# (the request that submits a run executes it before answering: for single-process setups and tests).
RUN_EXECUTOR = env.str("RUN_EXECUTOR", default="celery")
# Messages an executing process keeps in memory once loaded (stored messages never change), so a run
# fetches only those it has not seen; 0: fetch every in-context message on every run.
MESSAGE_CACHE_SIZE = env.int("MESSAGE_CACHE_SIZE", default=20_000)
# Graceful shutdown (SIGTERM), within an orchestrator's usual 30 s: a worker waits this long for its runs,
# then hands back those still going (apps.agents.worker_shutdown); the web process waits this long for
# its requests and streams, then closes what is left (config/serve.py).
WORKER_SHUTDOWN_TIMEOUT = env.float("WORKER_SHUTDOWN_TIMEOUT", default=25.0)
WEB_SHUTDOWN_TIMEOUT = env.float("WEB_SHUTDOWN_TIMEOUT", default=10.0)
# Lost tasks (apps.agents.recovery): a run's task marker lives RUN_TASK_MARKER_TTL seconds after each send
# or deferral (keep it well above a deferral's longest wait, 10 s); a queued run older than
# RUN_LOST_TASK_GRACE seconds whose marker is gone is enqueued again at the next recovery pass.
RUN_TASK_MARKER_TTL = env.int("RUN_TASK_MARKER_TTL", default=120)
RUN_LOST_TASK_GRACE = env.float("RUN_LOST_TASK_GRACE", default=60.0)
CELERY_BEAT_SCHEDULE = {
    "recover-runs": {
        "task": "agents.recover_runs",
        "schedule": env.float("RUN_RECOVERY_INTERVAL", default=15.0),
    },
    "recover-files": {  # folder files whose ingesting worker died end as error (apps.folders.recovery)
        "task": "folders.recover_files",
        "schedule": env.float("RUN_RECOVERY_INTERVAL", default=15.0),
    },
    "prune-llm-calls": {  # LLM call records past their organisation's retention (apps.llm.records)
        "task": "llm.prune_llm_calls",
        "schedule": env.float("LLM_RECORD_PRUNE_INTERVAL", default=3600.0),
    },
}

# LLM providers from the environment; organisation credentials (apps.llm.Provider) take precedence.
OPENAI_API_KEY = env.str("OPENAI_API_KEY", default="")
OPENAI_BASE_URL = env.str("OPENAI_BASE_URL", default="")
ANTHROPIC_API_KEY = env.str("ANTHROPIC_API_KEY", default="")
OLLAMA_BASE_URL = env.str("OLLAMA_BASE_URL", default="")
# Our one retry policy for provider calls (apps.llm.retry): 429/5xx/timeouts, exponential backoff.
LLM_MAX_ATTEMPTS = env.int("LLM_MAX_ATTEMPTS", default=4)
LLM_RETRY_BASE_DELAY = env.float("LLM_RETRY_BASE_DELAY", default=1.0)
LLM_RETRY_MAX_DELAY = env.float("LLM_RETRY_MAX_DELAY", default=20.0)
LLM_REQUEST_TIMEOUT = env.float("LLM_REQUEST_TIMEOUT", default=120.0)
LLM_CLIENT = env.str("LLM_CLIENT", default="direct")
if LLM_CLIENT not in {"direct", "litellm"}:
    raise ImproperlyConfigured(f"LLM_CLIENT must be 'direct' or 'litellm', not {LLM_CLIENT!r}")
LLM_EMBEDDING_BATCH_SIZE = env.int("LLM_EMBEDDING_BATCH_SIZE", default=100)
# LLM call records (apps.llm.records): days kept unless an organisation sets its own (LlmRecordPolicy),
# and the most of each request and response body kept (longer ones are cut, and the record says so).
LLM_RECORD_RETENTION_DAYS = env.int("LLM_RECORD_RETENTION_DAYS", default=30)
LLM_RECORD_MAX_BYTES = env.int("LLM_RECORD_MAX_BYTES", default=1024 * 1024)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {"LiteLLM": {"level": "WARNING"}, "httpx": {"level": "WARNING"}},
}

if not DEBUG:
    SESSION_COOKIE_HTTPONLY = True
    X_FRAME_OPTIONS = "DENY"

# Request bounds -----------------------------------------------------------------------------------
# What one request may make the server read, parse or run (issue 16). The largest legitimate request is
# an agent-file import: the file (AGENT_FILE_MAX_BYTES) and a few form fields, hence the body limit's
# default. Bodies past MAX_REQUEST_BODY_BYTES are refused with 413 before authentication and before
# anything is read or spooled (apps/core/asgi.py: a larger Content-Length at once, a chunked body when it
# crosses the limit).
AGENT_FILE_MAX_BYTES = env.int("AGENT_FILE_MAX_BYTES", default=32 * 1024 * 1024)
MAX_REQUEST_BODY_BYTES = env.int("MAX_REQUEST_BODY_BYTES", default=AGENT_FILE_MAX_BYTES + 1024 * 1024)
# A custom tool's source, wherever it enters (the API, agent files, the ADE): past it, a 400 naming it.
TOOL_SOURCE_MAX_BYTES = env.int("TOOL_SOURCE_MAX_BYTES", default=64 * 1024)
# Git memory (/v1/git/{agent_id}/state.git): one fetch or push request's body (after gunzip), the files
# (blocks) a pushed tree may hold, one file's size, and the commits one push may add.
GIT_MEMORY_MAX_PUSH_BYTES = env.int("GIT_MEMORY_MAX_PUSH_BYTES", default=8 * 1024 * 1024)
GIT_MEMORY_MAX_FILES = env.int("GIT_MEMORY_MAX_FILES", default=500)
GIT_MEMORY_MAX_FILE_BYTES = env.int("GIT_MEMORY_MAX_FILE_BYTES", default=1024 * 1024)
GIT_MEMORY_MAX_PUSH_COMMITS = env.int("GIT_MEMORY_MAX_PUSH_COMMITS", default=1000)
# A pushed pack: the bytes its objects may inflate to in all (deltas counted at their result size), and
# how many objects it may hold; one object may not inflate past GIT_MEMORY_MAX_FILE_BYTES. Checked from
# the object headers and while inflating, before anything is kept: past them, git's "unpack" error.
GIT_MEMORY_MAX_PUSH_INFLATED_BYTES = env.int("GIT_MEMORY_MAX_PUSH_INFLATED_BYTES", default=64 * 1024 * 1024)
GIT_MEMORY_MAX_PUSH_OBJECTS = env.int("GIT_MEMORY_MAX_PUSH_OBJECTS", default=20_000)
# Nesting of a JSON body or agent file (tool schemas and agent files nest 10-20 deep): past it, a 400.
JSON_MAX_DEPTH = env.int("JSON_MAX_DEPTH", default=64)
# The most steps (LLM calls) one run may take, the largest `max_steps` a request may ask for (Letta's
# default is 50); an organisation's own limit (Organization.max_steps_limit, in the admin) replaces it.
MAX_STEPS_LIMIT = env.int("MAX_STEPS_LIMIT", default=100)
# Folders (apps/folders): the largest file an upload may be (larger: 413, before it is read), what all of an
# organisation's files may add up to (0: no quota; past it: 413), and how long parsing one file may take (it
# runs in a child process with a memory limit, killed at the deadline; the file then reports why).
FOLDER_FILE_MAX_BYTES = env.int("FOLDER_FILE_MAX_BYTES", default=25 * 1024 * 1024)
FOLDER_STORAGE_QUOTA_BYTES = env.int("FOLDER_STORAGE_QUOTA_BYTES", default=1024 * 1024 * 1024)
FOLDER_PARSE_TIMEOUT = env.float("FOLDER_PARSE_TIMEOUT", default=60.0)
# A file still waiting for its ingestion task this long (the broker lost it) gets the task again.
FOLDER_REQUEUE_AFTER = env.float("FOLDER_REQUEUE_AFTER", default=300.0)
# HTML, PDF and DOCX are parsed in the local jail (apps/folders/isolation.py); where none can be made:
# "jail" fails those files with a reason, "process" parses them in a plain child process (weaker).
FOLDER_PARSE_ISOLATION = env.str("FOLDER_PARSE_ISOLATION", default="jail")
if FOLDER_PARSE_ISOLATION not in ("jail", "process"):
    raise ImproperlyConfigured(
        f"FOLDER_PARSE_ISOLATION must be 'jail' or 'process', not {FOLDER_PARSE_ISOLATION!r}"
    )
# End of Request bounds ----------------------------------------------------------------------------

# Throttling ---------------------------------------------------------------------------------------
# Sign-ins, the ADE's and the admin's (django-axes): the LOGIN_FAILURE_LIMIT-th failed attempt for one
# username from one address locks that pair out for LOGIN_LOCKOUT_MINUTES (429; the ADE's sign-in page
# says so); a successful sign-in resets the count. `manage.py axes_reset` lifts every lockout.
LOGIN_FAILURE_LIMIT = env.int("LOGIN_FAILURE_LIMIT", default=5)
LOGIN_LOCKOUT_MINUTES = env.int("LOGIN_LOCKOUT_MINUTES", default=15)
AXES_FAILURE_LIMIT = LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(minutes=LOGIN_LOCKOUT_MINUTES)
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "apps.ade.views.auth.lockout_response"
AXES_ENABLE_ADMIN = False  # its rows are not organisation-scoped: staff would see other tenants' sign-ins
AXES_DISABLE_ACCESS_LOG = True  # no row per successful sign-in
# Wrong API keys (apps/api/authentication.py): after API_KEY_FAILURE_LIMIT failures from one client address
# within a window of API_KEY_FAILURE_WINDOW seconds, that address is answered 429 with Retry-After until
# the window ends, whatever key it sends (a right guess looks the same).
API_KEY_FAILURE_LIMIT = env.int("API_KEY_FAILURE_LIMIT", default=10)
API_KEY_FAILURE_WINDOW = env.int("API_KEY_FAILURE_WINDOW", default=300)
# Request rates of /v1 per API key (an ADE session counts as its user's key) and per organisation, as
# "N/s", "N/min", "N/hour" or "N/day"; empty: unlimited. apps/api/throttles.py, counted in CACHES.
API_RATE_PER_KEY = env.str("API_RATE_PER_KEY", default="600/min")
API_RATE_PER_ORG = env.str("API_RATE_PER_ORG", default="3000/min")
# Streams one user holds open at once: SSE streams, blocking sends waiting for their run and the ADE's
# WebSocket relays (each holds a thread or a task and a Redis read). Past it: 429, or the WebSocket is
# closed with code 4429. 0: unlimited.
MAX_STREAMS_PER_USER = env.int("MAX_STREAMS_PER_USER", default=8)
# The longest a blocking send waits for its run (less when the client announces a shorter read timeout);
# then it answers 504 with what the run produced so far, and the run goes on.
BLOCKING_WAIT_SECONDS = env.float("BLOCKING_WAIT_SECONDS", default=600.0)
# Each web process follows all its streams with one reader (apps.streams.hub): entries a slow client may
# have queued before it is switched to re-reading its backlog from Redis, and the hub's Redis connections
# besides the reader's (catch-up reads, wake-ups, stream slots).
STREAM_HUB_QUEUE_EVENTS = env.int("STREAM_HUB_QUEUE_EVENTS", default=2000)
STREAM_HUB_CONNECTIONS = env.int("STREAM_HUB_CONNECTIONS", default=8)
# End of Throttling --------------------------------------------------------------------------------

# Run bounds ---------------------------------------------------------------------------------------
# Wall-clock limits (issue 16): LLM_REQUEST_TIMEOUT bounds each read only, and Celery enforces no time
# limit in a thread pool. One LLM call, its retries, their backoff and its whole (streamed) body included,
# ends after LLM_CALL_DEADLINE seconds (stop reason llm_api_error); a run stops after RUN_DEADLINE seconds
# (checked between steps, and no LLM call outlives it; stop reason error). apps/llm/retry.py, CallBounds.
LLM_CALL_DEADLINE = env.float("LLM_CALL_DEADLINE", default=300.0)
RUN_DEADLINE = env.float("RUN_DEADLINE", default=900.0)
# The longest an agent's send_message_to_agent_and_wait_for_reply (and each agent of
# send_message_to_agents_matching_tags) waits for the other agent's reply, within the sender's own
# RUN_DEADLINE; then the request is cancelled and the tool answers an error (apps/agents/agent_messaging.py).
AGENT_REPLY_TIMEOUT = env.float("AGENT_REPLY_TIMEOUT", default=60.0)
# End of Run bounds --------------------------------------------------------------------------------

# Sandbox ------------------------------------------------------------------------------------------
# Where custom tools run (apps.sandbox.selection): "auto" = Docker when an engine answers, else the
# local bubblewrap jail if the organisation allows it; "docker" = never local; "local" = never Docker.
SANDBOX_BACKEND = env.str("SANDBOX_BACKEND", default="auto")
# The image tools run on (a sandbox config's `image` overrides it): by default the one
# scripts/build_sandbox_image.sh builds from Debian's packages (no registry needed), which `make run`
# makes sure exists before it serves.
SANDBOX_BASE_IMAGE = env.str("SANDBOX_BASE_IMAGE", default="letta-sandbox-base:py3")
# The interpreter of the local jail (standard library only; bound read-only into the jail).
SANDBOX_LOCAL_PYTHON = env.str("SANDBOX_LOCAL_PYTHON", default="/usr/bin/python3")
# Hidden from every jail even where they sit under a folder it sees (with the checkout, BASE_DIR).
DATA_DIR = env.path("DATA_DIR", default=BASE_DIR / "var")
SANDBOX_PULL_IMAGES = env.bool("SANDBOX_PULL_IMAGES", default=True)
# Started, idle containers kept per container spec (each serves one call, then is removed), how long
# an idle one is kept, and the most kept in all by one process.
SANDBOX_POOL_SIZE = env.int("SANDBOX_POOL_SIZE", default=2)
SANDBOX_POOL_IDLE_SECONDS = env.float("SANDBOX_POOL_IDLE_SECONDS", default=600.0)
SANDBOX_POOL_MAX_IDLE = env.int("SANDBOX_POOL_MAX_IDLE", default=16)
# The Docker network of configs with network_enabled (others get network_mode "none"): by default one
# this server creates and filters (apps/sandbox/egress.py), so tools reach public addresses only.
SANDBOX_NETWORK = env.str("SANDBOX_NETWORK", default="letta-sandbox-egress")
# "iptables": before a network-enabled tool runs, the host's iptables must drop everything from that
# network's bridge to non-public addresses and to the host itself; the server installs the rules
# (root or CAP_NET_ADMIN in the Docker host's network namespace) and, when it cannot, does not run the
# tool. "external": SANDBOX_NETWORK is filtered by the operator; nothing is checked.
SANDBOX_EGRESS_FILTER = env.str("SANDBOX_EGRESS_FILTER", default="iptables")
# Private IPv4 CIDRs network-enabled tools may reach all the same (an internal API, a proxy), comma-separated.
SANDBOX_EGRESS_ALLOW_CIDRS = env.list("SANDBOX_EGRESS_ALLOW_CIDRS", default=[])
# The iptables program (same backend, nft or legacy, as the Docker engine's) and how long a verified
# filter is trusted before the next network-enabled call checks it again.
SANDBOX_EGRESS_IPTABLES = env.str("SANDBOX_EGRESS_IPTABLES", default="iptables")
SANDBOX_EGRESS_CHECK_TTL = env.float("SANDBOX_EGRESS_CHECK_TTL", default=30.0)
SANDBOX_TMPFS_MB = env.int("SANDBOX_TMPFS_MB", default=64)
SANDBOX_MAX_OUTPUT_BYTES = env.int("SANDBOX_MAX_OUTPUT_BYTES", default=8 * 1024 * 1024)
SANDBOX_DOCKER_PING_TTL = env.float("SANDBOX_DOCKER_PING_TTL", default=30.0)
# Pip requirements are installed once into a derived image. A wheelhouse folder of .whl files is
# offered to pip (--find-links); with SANDBOX_PIP_NO_INDEX the build uses only it, without network.
SANDBOX_WHEELHOUSE = env.str("SANDBOX_WHEELHOUSE", default="")
SANDBOX_PIP_NO_INDEX = env.bool("SANDBOX_PIP_NO_INDEX", default=False)
# The sandbox runner (apps/sandbox/runner_service.py, `manage.py sandbox_runner`): in production the one
# process that holds the Docker socket. With SANDBOX_RUNNER_URL set, this process never talks to an
# engine: the Docker backend asks the runner (health, cached SANDBOX_DOCKER_PING_TTL; one POST per
# call, waiting the tool's timeout plus SANDBOX_RUNNER_TIMEOUT_MARGIN). The token (a secret, at least 16
# characters) authenticates both sides; the runner refuses to start without one.
SANDBOX_RUNNER_URL = env.str("SANDBOX_RUNNER_URL", default="")
SANDBOX_RUNNER_TOKEN = env.str("SANDBOX_RUNNER_TOKEN", default="")
SANDBOX_RUNNER_TIMEOUT_MARGIN = env.float("SANDBOX_RUNNER_TIMEOUT_MARGIN", default=60.0)
# The runner's side: where it listens, the largest request body it reads, the maxima it clamps every
# call's limits to, and the images a call may name besides SANDBOX_BASE_IMAGE (comma-separated).
# SANDBOX_RUNNER_URL and SANDBOX_RUNNER_BIND may name a Unix socket instead of TCP (unix:///path/runner.sock,
# or unix:/path/runner.sock): the runner creates it with mode 0660 and, with SANDBOX_RUNNER_SOCKET_GID, that
# group (the clients' group; unset: the runner's own), and removes it at exit (a stale one at start).
SANDBOX_RUNNER_BIND = env.str("SANDBOX_RUNNER_BIND", default="0.0.0.0:8290")
SANDBOX_RUNNER_SOCKET_GID = env.int("SANDBOX_RUNNER_SOCKET_GID", default=None)
SANDBOX_RUNNER_MAX_BODY_BYTES = env.int("SANDBOX_RUNNER_MAX_BODY_BYTES", default=8 * 1024 * 1024)
SANDBOX_RUNNER_MAX_MEMORY_MB = env.int("SANDBOX_RUNNER_MAX_MEMORY_MB", default=1024)
SANDBOX_RUNNER_MAX_CPUS = env.float("SANDBOX_RUNNER_MAX_CPUS", default=2.0)
SANDBOX_RUNNER_MAX_PIDS = env.int("SANDBOX_RUNNER_MAX_PIDS", default=256)
SANDBOX_RUNNER_MAX_TIMEOUT = env.float("SANDBOX_RUNNER_MAX_TIMEOUT", default=300.0)
SANDBOX_RUNNER_ALLOWED_IMAGES = env.list("SANDBOX_RUNNER_ALLOWED_IMAGES", default=[])
# End of Sandbox -----------------------------------------------------------------------------------

# Outbound guard -------------------------------------------------------------------------------------------
# URLs a tenant chooses (its LLM providers, MCP servers over HTTP) reach public addresses only
# (apps/core/outbound.py). Comma-separated exceptions the operator opens on purpose: CIDRs (10.0.0.0/8),
# addresses with or without a port (127.0.0.1:11434, [::1]:11434) and host names with or without a port
# (gpu-box, ollama:11434; trusted whatever they resolve to). Cloud metadata addresses stay closed.
# Ollama on the same host for every organisation: OUTBOUND_ALLOW=127.0.0.1:11434 (base URL
# http://127.0.0.1:11434). The deployment's own OPENAI_BASE_URL / OLLAMA_BASE_URL need no entry.
OUTBOUND_ALLOW = env.list("OUTBOUND_ALLOW", default=[])

# MCP ----------------------------------------------------------------------------------------------------
MCP_LIST_TOOLS_TIMEOUT = env.float("MCP_LIST_TOOLS_TIMEOUT", default=30.0)
# Adding a server waits this long for its tool list; a slower one is finished by a worker (sync_status).
MCP_REGISTER_INLINE_SECONDS = env.float("MCP_REGISTER_INLINE_SECONDS", default=2.0)
MCP_CALL_TOOL_TIMEOUT = env.float("MCP_CALL_TOOL_TIMEOUT", default=60.0)
# The only commands a stdio MCP server may have (exact match, e.g. npx,uvx,/usr/bin/python3); empty: no
# stdio servers at all. A tenant chooses among them, never a command of its own, and every one runs in
# the local jail (apps/sandbox/jail.py: own uid, no network, read-only /usr). Remote servers: SSE or HTTP.
MCP_STDIO_COMMANDS = env.list("MCP_STDIO_COMMANDS", default=[])
# Host folders those commands need besides /usr (a node or venv install elsewhere), bound read-only
# into the jail; their bin/ folders come first on the jail's PATH. They must be world-readable: as
# root, a jail runs as an unprivileged host uid of its own.
MCP_STDIO_READ_PATHS = env.list("MCP_STDIO_READ_PATHS", default=[])

# Observability (apps/observability) ----------------------------------------------------------------------
# Traces: with an OTLP endpoint (the OpenTelemetry SDK also reads OTEL_EXPORTER_OTLP_* itself) every
# process exports its spans, with the Django, Celery, psycopg, redis and httpx instrumentations; without
# one nothing is installed globally. RUN_TRACES keeps each run's own spans (steps, LLM and tool calls,
# memory edits, persistence, queue wait) in Postgres for GET /v1/runs/{id}/trace and the ADE's run page.
OTEL_EXPORTER_OTLP_ENDPOINT = env.str("OTEL_EXPORTER_OTLP_ENDPOINT", default="")
OTEL_SERVICE_NAME = env.str("OTEL_SERVICE_NAME", default="letta-django")
RUN_TRACES = env.bool("RUN_TRACES", default=True)
RUN_TRACE_MAX_SPANS = env.int("RUN_TRACE_MAX_SPANS", default=1000)
# Metrics: /metrics answers 404 unless this is set, and then asks for `Authorization: Bearer <token>`;
# processes without it count nothing.
METRICS_TOKEN = env.str("METRICS_TOKEN", default="")
