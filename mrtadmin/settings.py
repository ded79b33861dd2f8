"""Settings for the Merritt queue console, all taken from the environment.

Every variable has a local default so that a fresh checkout runs on one machine with its own
ZooKeeper, storage, inventory and mail under ``MRT_VAR_DIR``. Secrets may come from a file named
by ``<NAME>_FILE`` so that they never have to sit in the process environment.
"""

import ipaddress
import logging
import math
import os
import re
import socket
import zoneinfo
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

from mrtadmin import local
from queues.core import deployment, retries
from queues.core.outside_text import url_shown
from queues.core.words import digits, range_words, within, yes_or_no

BASE_DIR = Path(__file__).resolve().parent.parent


def refuse(name: str, expected: str, value: str) -> NoReturn:
    """Stop start-up: the one wording of every bad setting, its value escaped (``repr``)."""
    raise ImproperlyConfigured(f"environment variable {name} must be {expected}, got {value!r}")


def env(name: str, default: str = "") -> str:
    """Read ``name`` from the environment, or from the file named by ``name_FILE``."""
    file_name = os.environ.get(f"{name}_FILE")
    if file_name:
        try:
            return Path(file_name).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            refuse(f"{name}_FILE", f"a readable file ({reason})", file_name)
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    """A yes/no variable; anything but the usual words is an error naming the variable. Set
    and empty it is ``default``, as unset: compose's ``${VAR:-}`` and systemd's
    ``Environment=VAR=`` leave a variable so, meaning none was given (read as "no", an empty
    MRT_KEEP_LOCKS turned a default-on setting off in silence)."""
    value = env(name).strip().lower()
    if not value:
        return default
    answer = yes_or_no(value)
    if answer is None:
        refuse(name, "one of 1/0, true/false, yes/no, on/off", value)
    return answer


def env_int(name: str, default: int, *, low: int | None = None, high: int | None = None) -> int:
    """A whole number from ``low`` to ``high``; anything else is an error naming the variable
    and the range (a download cap of 0 would stall downloading, a port of 70000 fail late)."""
    value = env(name, str(default)).strip()
    try:
        number = int(value)
    except ValueError:
        number = None
    if number is None or not within(number, low, high):
        refuse(name, range_words("a whole number", low, high), value)
    return number


def env_float(
    name: str,
    default: float,
    *,
    low: float | None = None,
    high: float | None = None,
    above: bool = False,
) -> float:
    """A number from ``low`` (more than ``low`` with ``above``) to ``high``; anything else,
    nan and inf included, is an error naming the variable and the range (a step history kept
    -1 days would be pruned whole at the first sweep)."""
    value = env(name, str(default)).strip()
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not within(number, low, high, above=above):
        refuse(name, range_words("a number", low, high, above=above), value)
    return number


# Ranges the numeric settings below share: a port, a size in bytes, a day in seconds, a week.
PORT = {"low": 1, "high": 65_535}
DAY, WEEK = 86_400.0, 7 * 86_400.0


def env_seconds(name: str, default: float, most: float) -> float:
    """A time in seconds above 0 and at most ``most``: a timeout or an interval of 0 would
    spin or fail at once."""
    return env_float(name, default, low=0, high=most, above=True)


def _port_of(parts: Any) -> int | None:
    """The port of a ``urlsplit`` result; -1 for one that is not a number from 1 to 65,535."""
    try:
        port = parts.port
    except ValueError:
        return -1
    return -1 if port == 0 else port


def env_url(
    name: str,
    default: str = "",
    *,
    schemes: tuple[str, ...] = ("http", "https"),
    secret_path: bool = False,
) -> str:
    """A URL of one of ``schemes`` naming a host (its port, if any, from 1 to 65,535), or empty
    (the setting's documented default): "storage:8080" or "http//x" would otherwise be taken and
    fail at the first request a step makes, an hour later. A value refused is shown with its
    password hidden, and with ``secret_path`` (a Slack webhook's path is its credential) only up
    to its host."""
    value = env(name, default).strip()
    if not value:
        return value
    try:
        parts = urlsplit(value)
        port = _port_of(parts)
    except ValueError:  # "http://[::1": an address urlsplit cannot read
        parts, port = urlsplit(""), -1
    if (
        parts.scheme.lower() not in schemes
        or not parts.hostname
        or port == -1
        or not value.isprintable()
        or " " in value
    ):
        kinds = " or ".join(f"{scheme}://" for scheme in schemes)
        shown = url_shown(value)
        if secret_path:
            scheme, slashes, rest = shown.partition("//") if "//" in shown else ("", "", shown)
            # The authority ends at the first "/", "?" or "#": a credential may follow any.
            host = re.split(r"[/?#]", rest, maxsplit=1)[0]
            shown = f"{scheme}{slashes}{host}{'/…' if host != rest else ''}"
        refuse(name, f"a URL such as {schemes[0]}://host:port/path ({kinds}), or empty", shown)
    return value


def env_networks(name: str, *, separators: str = ",") -> list[str]:
    """Addresses or networks (``10.1.0.0/16``), separated by any of ``separators``."""
    value = env(name)
    entries = [e.strip() for e in re.split(f"[{re.escape(separators)}]", value) if e.strip()]
    for entry in entries:
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            refuse(name, "IP addresses or networks such as 10.1.0.0/16, comma-separated", value)
    return entries


# Everything written locally (ZooKeeper data, working folders, storage, mail, SQLite) lives here.
# Importing the settings creates nothing: mrtadmin/local.py says when the folder and the
# generated secret key are made (manage.py before any command, else the key's first use).
MRT_VAR_DIR = Path(env("MRT_VAR_DIR", str(BASE_DIR / "var"))).resolve()

# DJANGO_SECRET_KEY, else a random key kept in MRT_VAR_DIR/secret_key so sessions survive a
# restart and every process of one installation signs alike.
SECRET_KEY = env("DJANGO_SECRET_KEY") or local.lazy_secret_key(MRT_VAR_DIR / "secret_key")
DEBUG = env_bool("DJANGO_DEBUG", False)
# The error report (the debug page, error mails) hides every setting that may hold a secret.
DEFAULT_EXCEPTION_REPORTER_FILTER = "queues.web.security.SecretSettingsFilter"
_allowed_hosts = env("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]")
ALLOWED_HOSTS = [h.strip() for h in _allowed_hosts.split(",") if h.strip()]
if not ALLOWED_HOSTS:
    # Django would answer every request 400 (DisallowedHost), health checks included.
    refuse("DJANGO_ALLOWED_HOSTS", "the host names the console answers to", _allowed_hosts)
CSRF_TRUSTED_ORIGINS = [
    o.strip() for o in env("DJANGO_CSRF_TRUSTED_ORIGINS").split(",") if o.strip()
]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_htmx",
    "template_partials",
    "channels",
    "axes",
    "queues",
]

MIDDLEWARE = [
    # Outermost: the pages a request's work freed go back to the system (glibc keeps them).
    "queues.web.memory.GiveBackMemoryMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # A database outage met anywhere in a view (the session, a token, the roles) is a 503
    # with the outage banner; outermost of the middleware with a process_exception.
    "queues.views.outage.DatabaseOutageMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "queues.web.security.ContentSecurityPolicyMiddleware",
    # Last, as django-axes asks: turns a locked-out login into its "locked out" page.
    "axes.middleware.AxesMiddleware",
]

# Password logins: django-axes counts failures per user name and per client address and locks
# either out after MRT_LOGIN_FAILURE_LIMIT of them for MRT_LOGIN_COOLOFF_MINUTES (SSO and API
# tokens go on working; `manage.py axes_reset` lifts lockouts at once). Behind a proxy that
# every browser comes through, MRT_LOGIN_LOCKOUT_BY=username keeps one person's typos from
# locking out everybody's password logins.
AUTHENTICATION_BACKENDS = [
    "queues.operator.auth.LoginAttemptsBackend",
    "django.contrib.auth.backends.ModelBackend",
]
MRT_LOGIN_FAILURE_LIMIT = env_int("MRT_LOGIN_FAILURE_LIMIT", 5, low=1, high=1000)
MRT_LOGIN_COOLOFF_MINUTES = env_int("MRT_LOGIN_COOLOFF_MINUTES", 15, low=1, high=10_080)
AXES_FAILURE_LIMIT = MRT_LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(minutes=MRT_LOGIN_COOLOFF_MINUTES)
_lockout_by = env("MRT_LOGIN_LOCKOUT_BY", "username,ip_address")
MRT_LOGIN_LOCKOUT_BY = [p.strip() for p in _lockout_by.split(",") if p.strip()]
if not MRT_LOGIN_LOCKOUT_BY or set(MRT_LOGIN_LOCKOUT_BY) - {"username", "ip_address"}:
    refuse("MRT_LOGIN_LOCKOUT_BY", "username, ip_address or username,ip_address", _lockout_by)
AXES_LOCKOUT_PARAMETERS = MRT_LOGIN_LOCKOUT_BY
if "ip_address" not in MRT_LOGIN_LOCKOUT_BY:
    # axes warns that a lockout without the address can be dodged by changing cookies or the
    # User-Agent; a lockout by user name uses neither, so the warning does not apply.
    SILENCED_SYSTEM_CHECKS = ["axes.W006"]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "queues.operator.auth.lockout_response"

# Single sign-on: Merritt's load balancer authenticates and passes the user name in a header.
# Only enable this behind a proxy that strips the header from client requests, with daphne
# reachable from the proxy only; MRT_SSO_PROXIES (addresses or networks, comma-separated)
# makes the console itself ignore the header from any other address.
# A header's name: letters, digits and "-" (a space or ":" names no header a proxy can send).
HEADER_NAME = re.compile(r"[A-Za-z0-9-]+")
MRT_SSO_HEADER = env("MRT_SSO_HEADER").strip()
if MRT_SSO_HEADER and not HEADER_NAME.fullmatch(MRT_SSO_HEADER):
    refuse("MRT_SSO_HEADER", "a header name (letters, digits and -), or empty", MRT_SSO_HEADER)
MRT_SSO_PROXIES = env_networks("MRT_SSO_PROXIES")
if MRT_SSO_HEADER:
    MIDDLEWARE.insert(
        MIDDLEWARE.index("django.contrib.auth.middleware.AuthenticationMiddleware") + 1,
        "queues.operator.auth.TrustedHeaderMiddleware",
    )
    AUTHENTICATION_BACKENDS.insert(1, "queues.operator.auth.TrustedHeaderBackend")

ROOT_URLCONF = "mrtadmin.urls"
ASGI_APPLICATION = "mrtadmin.asgi.application"

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
                "queues.views.outage.banner",
                "queues.views.environment.environment",
                "queues.views.common.loading_banner",
            ],
        },
    },
]

DATABASES: dict[str, Any] = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": Path(env("MRT_DATABASE_PATH", str(MRT_VAR_DIR / "console.sqlite3"))),
        # Several daemon processes record into the local inventory at once. IMMEDIATE takes the
        # write lock when a transaction starts, so a writer waits out the busy timeout instead
        # of failing on a read-to-write upgrade; WAL lets pages read while daemons write.
        "OPTIONS": {
            "timeout": 30,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
    }
}
# DATABASE_URL (postgres://user:password@host:port/name, for production; may come from
# DATABASE_URL_FILE) replaces the SQLite file: the audit log, tokens, bulk runs, the local
# inventory and the archive of finished jobs then live in PostgreSQL (driver: psycopg 3).
DATABASE_URL = env("DATABASE_URL").strip()
if DATABASE_URL:
    import dj_database_url

    # Shown by its scheme only: the rest of the URL holds the password.
    _shown = DATABASE_URL.partition(":")[0] + ":..."
    _expected = (
        "a postgres:// URL such as postgres://user:password@host:port/name (empty: the SQLite file)"
    )
    try:
        DATABASES["default"] = dj_database_url.parse(DATABASE_URL, conn_health_checks=True)
    except ValueError as exc:
        refuse("DATABASE_URL", f"{_expected}: {exc}", _shown)
    if DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        refuse("DATABASE_URL", _expected, _shown)
    # A server that does not answer (a partition, a host down) fails a connection attempt
    # in seconds, as a refused one does, instead of holding a daemon thread or a page for the
    # operating system's TCP timeout; "?connect_timeout=" in the URL overrides it.
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault("connect_timeout", 5)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "overview"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"


def _server_zone() -> str:
    """The machine's own time zone name (Debian's /etc/timezone, or the zone /etc/localtime
    links to); UTC when it names none."""
    try:
        name = Path("/etc/timezone").read_text(encoding="utf-8").strip()
    except OSError:
        name = ""
    if not name:
        link = os.path.realpath("/etc/localtime")
        name = link.split("/zoneinfo/", 1)[1] if "/zoneinfo/" in link else ""
    return name or "UTC"


# One clock: every time the console shows, mails and writes into CSV is in this zone.
TIME_ZONE = env("TZ") or _server_zone()
try:
    zoneinfo.ZoneInfo(TIME_ZONE)
except (zoneinfo.ZoneInfoNotFoundError, ValueError):
    # Django would stop every process on it too, with a traceback.
    refuse("TZ", "a time zone name such as America/Los_Angeles or UTC", TIME_ZONE)
USE_I18N = False
USE_TZ = True

# Absolute, and put under the URL prefix of each request by the storage (mrtadmin/prefix.py).
STATIC_URL = "/static/"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "mrtadmin.prefix.PrefixedStaticFilesStorage"},
}
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = Path(env("DJANGO_STATIC_ROOT", str(BASE_DIR / "staticfiles")))
# Without collectstatic (development, tests) WhiteNoise serves straight from STATICFILES_DIRS.
WHITENOISE_USE_FINDERS = True

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # htmx reads the token from the page, not the cookie
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"

# TLS. DJANGO_SECURE=1 when browsers reach the console over HTTPS (usually through a proxy):
# Secure session and CSRF cookies, and HSTS on HTTPS answers. Behind a TLS proxy, name the
# header it sets (DJANGO_SECURE_PROXY_SSL_HEADER=X-Forwarded-Proto, value "https") so Django
# knows which requests came over TLS; only when the proxy always sets or strips that header.
DJANGO_SECURE = env_bool("DJANGO_SECURE", False)
SESSION_COOKIE_SECURE = env_bool("DJANGO_SECURE_COOKIES", DJANGO_SECURE)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
SECURE_HSTS_SECONDS = env_int(
    "DJANGO_HSTS_SECONDS", 31_536_000 if DJANGO_SECURE else 0, low=0, high=10 * 31_536_000
)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_HSTS_INCLUDE_SUBDOMAINS", False)
# Off by default: the proxy usually redirects, and health checks come over plain HTTP.
SECURE_SSL_REDIRECT = env_bool("DJANGO_SSL_REDIRECT", False)
# Under a URL prefix (daphne's --root-path) Django matches these against the path with it.
SECURE_REDIRECT_EXEMPT = [r"(^|/)healthz$", r"(^|/)metrics$"]
_ssl_header = env("DJANGO_SECURE_PROXY_SSL_HEADER").strip()
if _ssl_header and not HEADER_NAME.fullmatch(_ssl_header):
    refuse(
        "DJANGO_SECURE_PROXY_SSL_HEADER",
        "a header name such as X-Forwarded-Proto, or empty",
        _ssl_header,
    )
if _ssl_header:
    SECURE_PROXY_SSL_HEADER = ("HTTP_" + _ssl_header.upper().replace("-", "_"), "https")

# Channels: the in-memory layer serves one web process; with REDIS_URL, channels-redis carries
# the messages of several daphne workers. Each worker watches ZooKeeper itself (queues/live/hub.py).
REDIS_URL = env_url("REDIS_URL", schemes=("redis", "rediss"))
if REDIS_URL:
    from redis.asyncio.retry import Retry
    from redis.backoff import NoBackoff

    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # The layer waits up to 5 s for each message; redis-py 8 gives up reading a socket
            # after 5 s by default and the layer then closes every idle page's websocket. A
            # longer read timeout (unless the URL sets its own) keeps idle pages subscribed.
            # After a Redis restart each connection pooled before it fails the first command
            # sent on it, and redis-py's pools retry nothing by default: one retry, which
            # connects afresh, lets a socket's join, a worker's group send and its wait for
            # messages go through at once instead of failing once per pooled connection.
            "CONFIG": {
                "hosts": [
                    {"address": REDIS_URL, "socket_timeout": 30, "retry": Retry(NoBackoff(), 1)}
                ]
            },
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
# The live console folds a topic's ZooKeeper events arriving within this window into one message.
LIVE_COALESCE_SECONDS = env_float("LIVE_COALESCE_SECONDS", 0.25, low=0, high=60)

# ZooKeeper: the ensemble, or "local" for the project's own server on loopback (bin/run-console
# sets that); empty uses the local server only while one runs, never starts it.
ZK_HOSTS = env("ZK_HOSTS").strip()


def _ensemble_ok(hosts: str) -> bool:
    """``host:port,host:port[/chroot]`` (a port from 1 to 65,535, ``[v6]`` in brackets)."""
    servers, slash, chroot = hosts.partition("/")
    if slash and (chroot.endswith("/") or "//" in chroot or not chroot.isprintable()):
        return False
    for server in servers.split(","):
        parts = urlsplit(f"//{server.strip()}")
        if not parts.hostname or _port_of(parts) == -1 or parts.path or not server.isprintable():
            return False
    return True


if ZK_HOSTS not in ("", "local") and not _ensemble_ok(ZK_HOSTS):
    refuse(
        "ZK_HOSTS",
        "the ensemble as host:port,host:port[/chroot], or local, or empty",
        ZK_HOSTS,
    )
ZK_LOCAL_PORT = env_int("ZK_LOCAL_PORT", 2191, **PORT)
ZK_TIMEOUT = env_seconds("ZK_TIMEOUT", 10.0, 3600)
ZK_LOCK_STALE_SECONDS = env_int("ZK_LOCK_STALE_SECONDS", 6 * 3600, low=1, high=int(30 * DAY))

# Outside services. Empty URL means the local default that works on one machine.
MRT_PROFILES_DIR = Path(env("MRT_PROFILES_DIR", str(BASE_DIR / "profiles")))
MRT_WORK_DIR = Path(env("MRT_WORK_DIR", str(MRT_VAR_DIR / "work")))
MRT_STORAGE_URL = env_url("MRT_STORAGE_URL")
# A node number, as a profile's StorageNode is (queues/steps/profiles.py).
MRT_STORAGE_NODE = env("MRT_STORAGE_NODE", "9501").strip()
if digits(MRT_STORAGE_NODE) is None:
    refuse("MRT_STORAGE_NODE", "a storage node number such as 9501", MRT_STORAGE_NODE)
MRT_STORAGE_ROOT = Path(env("MRT_STORAGE_ROOT", str(MRT_VAR_DIR / "storage")))
MRT_INVENTORY_URL = env_url("MRT_INVENTORY_URL")
MRT_EZID_URL = env_url("MRT_EZID_URL")
MRT_EZID_USER = env("MRT_EZID_USER")
MRT_EZID_PASSWORD = env("MRT_EZID_PASSWORD")
# EZID's _target for a minted ARK: {this}/m/{ARK URL-encoded twice}, as Merritt's ingest sets it.
MRT_EZID_TARGET_URL = env_url("MRT_EZID_TARGET_URL", "https://merritt.cdlib.org")
MRT_DOWNLOADS_DIR = Path(env("MRT_DOWNLOADS_DIR", str(MRT_VAR_DIR / "downloads")))
# The URL prefix bin/run-console serves under (daphne's --root-path), checked as it checks it:
# "/" and segments of letters, digits and . _ ~ - (none "." or ".."), no "/" last; empty: none.
MRT_ROOT_PATH = env("MRT_ROOT_PATH")
if MRT_ROOT_PATH and not re.fullmatch(r"(/(?!\.\.?(?:/|$))[A-Za-z0-9._~-]+)+", MRT_ROOT_PATH):
    raise ImproperlyConfigured(
        'environment variable MRT_ROOT_PATH must be a URL prefix such as /queue (a "/" first, '
        "none last, letters, digits and . _ ~ - between), or empty for none, "
        f"got {MRT_ROOT_PATH!r}"
    )
# The console's address as users reach it (links in mail); by default where bin/run-console
# serves it (MRT_BIND, MRT_PORT, MRT_ROOT_PATH), so a console moved to another port does not
# mail dead links.
_bind = env("MRT_BIND", "127.0.0.1")
# Bound to every address: the machine's name is the one a browser can use.
_host = socket.gethostname() if _bind in ("0.0.0.0", "::", "[::]") else _bind  # noqa: S104
MRT_CONSOLE_URL = env_url("MRT_CONSOLE_URL") or (
    f"http://{_host}:{env_int('MRT_PORT', 8000, **PORT)}{MRT_ROOT_PATH}"
)
# Folders a depositor's file:// URLs may read from (":"-separated). Empty: none, file://
# payloads are refused (the daemons' own working folders and local storage stay readable).
MRT_FILE_ROOTS = [Path(p) for p in env("MRT_FILE_ROOTS").split(":") if p.strip()]
# Where remote storage can fetch a job's working folder over HTTP (needed with MRT_STORAGE_URL).
MRT_WORK_URL = env_url("MRT_WORK_URL")
# Base URL of assembled access archives; default: the console's /downloads/.
MRT_DOWNLOADS_URL = env_url("MRT_DOWNLOADS_URL")
MRT_HTTP_TIMEOUT = env_seconds("MRT_HTTP_TIMEOUT", 30.0, DAY)
# Right after a start, how long a page or API read waits for what the read index's background
# fill is reading before it answers 503 saying what is still loading (and tries again).
MRT_LOADING_WAIT = env_float("MRT_LOADING_WAIT", 0.8, low=0, high=60)
# One deadline for a whole exchange with inventory or EZID, and with storage (whose add reads
# every file of the version it makes).
MRT_SERVICE_DEADLINE = env_seconds("MRT_SERVICE_DEADLINE", 300.0, WEEK)
MRT_STORAGE_ADD_DEADLINE = env_seconds("MRT_STORAGE_ADD_DEADLINE", 6 * 3600.0, WEEK)
# Retry policies of the services outside, over queues/core/retries.py's defaults
# (docs/configuration.md): MRT_RETRY_STORAGE="attempts=12 first=30s most=30m within=12h"; checked
# when a daemon starts. A storage node's breaker (queues/daemons/breakers.py): this many outages in
# a row within this many seconds hold the node until it answers again.
MRT_BREAKER_FAILURES = env_int("MRT_BREAKER_FAILURES", 5, low=1, high=10_000)
MRT_BREAKER_WINDOW = env_seconds("MRT_BREAKER_WINDOW", 60.0, DAY)
MRT_RETRY = {name: env(f"MRT_RETRY_{name.upper()}") for name in retries.SERVICES}
for _name, _text in MRT_RETRY.items():
    try:
        retries.parse_policy(_text, retries.DEFAULT_POLICIES[_name])
    except ValueError as _exc:
        refuse(
            f"MRT_RETRY_{_name.upper()}",
            f"a retry policy such as 'attempts=12 first=30s most=30m within=12h' ({_exc})",
            _text,
        )
# A bulk action over more items than this runs in the background with a progress page.
MRT_BULK_INLINE_MAX = env_int("MRT_BULK_INLINE_MAX", 200, low=0, high=100_000)
MRT_DOWNLOAD_RETRIES = env_int("MRT_DOWNLOAD_RETRIES", 3, low=0, high=100)
MRT_DOWNLOAD_THREADS = env_int("MRT_DOWNLOAD_THREADS", 4, low=1, high=256)
MRT_PROVISION_HIGH_WATER = env_float("MRT_PROVISION_HIGH_WATER", 0.70, low=0, high=1, above=True)
MRT_LARGE_JOB_BYTES = env_int("MRT_LARGE_JOB_BYTES", 10 * 1024**3, low=0)
# "standalone" (every step ours) or "beside-merritt" (Merritt's storage and inventory services
# claim Storing and Recording jobs, and storage the access requests, themselves). Checked here,
# with the two below, so daphne starts on none it would act on wrongly (what a resume may do).
_deployment = env("MRT_DEPLOYMENT", deployment.STANDALONE).strip()
MRT_DEPLOYMENT = _deployment.lower().replace("_", "-") or deployment.STANDALONE
if MRT_DEPLOYMENT not in deployment.MODES:
    refuse("MRT_DEPLOYMENT", " or ".join(deployment.MODES), _deployment)
# The environment every page names (production, stage, development, ...): anything but
# production is shown in a band no one can miss, so a test console is never taken for the real one.
MRT_ENVIRONMENT = env("MRT_ENVIRONMENT", "development").strip().lower()
if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,29}", MRT_ENVIRONMENT):
    refuse(
        "MRT_ENVIRONMENT",
        "a short name such as production, stage or development (letters, digits, '-')",
        MRT_ENVIRONMENT,
    )
# The daemons this console serves, comma-separated, or "all"; empty: the mode's default.
MRT_OWN_STEPS = env("MRT_OWN_STEPS").strip()
if {n.strip() for n in MRT_OWN_STEPS.split(",") if n.strip()} - set(deployment.NAMES):
    refuse(
        "MRT_OWN_STEPS",
        f"daemon names, comma-separated ({', '.join(deployment.STEPS)}), or all, or empty",
        MRT_OWN_STEPS,
    )
# Who takes new batches through ingest: "merritt" (submissions made through the console go to
# Merritt's ingest service, MRT_INGEST_URL) or "console" (this console's daemons); empty: merritt
# beside Merritt, console standalone (queues/services/deployment.py, docs/merritt-ownership.md).
_intake = env("MRT_BATCH_INTAKE").strip()
MRT_BATCH_INTAKE = _intake.lower()
if MRT_BATCH_INTAKE and MRT_BATCH_INTAKE not in deployment.INTAKES:
    refuse("MRT_BATCH_INTAKE", f"{' or '.join(deployment.INTAKES)}, or empty", _intake)
if MRT_BATCH_INTAKE == deployment.MERRITT_INTAKE and MRT_DEPLOYMENT != deployment.BESIDE_MERRITT:
    # A standalone console has no Merritt ingest service to send batches to.
    refuse(
        "MRT_BATCH_INTAKE",
        f"{deployment.CONSOLE_INTAKE} or empty with MRT_DEPLOYMENT={MRT_DEPLOYMENT} "
        f"({deployment.MERRITT_INTAKE} needs MRT_DEPLOYMENT={deployment.BESIDE_MERRITT})",
        _intake,
    )
# Merritt's ingest service (http://host:port/<context>, without /poster/submit).
MRT_INGEST_URL = env_url("MRT_INGEST_URL")
# Seconds one submission sent to Merritt's ingest may take in all (reading a batch manifest by
# URL, the upload, ingest's answer): past it the door answers that ingest is away.
MRT_INGEST_DEADLINE = env_seconds("MRT_INGEST_DEADLINE", 120.0, DAY)
# Where Merritt's access assembly requests (<token>/status) can be read; empty: not at all.
MRT_ACCESS_REQUESTS_URL = env("MRT_ACCESS_REQUESTS_URL")
# The largest file /poster/submit|update accepts.
MRT_POSTER_MAX_BYTES = env_int("MRT_POSTER_MAX_BYTES", 1024**3, low=1)
# The largest request body, refused (413) from its headers before it is read
# (mrtadmin/bodylimit.py): from a signed-in user, and from anyone else; /poster/ takes
# MRT_POSTER_MAX_BYTES from a depositor with an API token.
MRT_MAX_REQUEST_BYTES = env_int("MRT_MAX_REQUEST_BYTES", 10 * 1024**2, low=1)
MRT_MAX_ANONYMOUS_REQUEST_BYTES = env_int("MRT_MAX_ANONYMOUS_REQUEST_BYTES", 2 * 1024**2, low=1)
# One deadline for the whole of a request (its line, headers and body), past which the client
# is answered 408 and the connection closed (mrtadmin/bodylimit.py); a depositor's upload to
# /poster/ (an API token of a user who may submit) has MRT_POSTER_UPLOAD_SECONDS instead.
MRT_REQUEST_SECONDS = env_seconds("MRT_REQUEST_SECONDS", 60.0, DAY)
MRT_POSTER_UPLOAD_SECONDS = env_seconds("MRT_POSTER_UPLOAD_SECONDS", 3600.0, WEEK)
# Retention (queues/operator/archive.py): batches finished, with all their jobs, at least this many
# days ago are archived into the database and removed from ZooKeeper, a sweep every so many seconds.
MRT_RETENTION_DAYS = env_float("MRT_RETENTION_DAYS", 30.0, low=0, high=36_500)
MRT_RETENTION_SWEEP_SECONDS = env_seconds("MRT_RETENTION_SWEEP_SECONDS", 3600.0, WEEK)
# The operator's cockpit: step history kept this many days; "stuck" is past FACTOR x a step's
# p95 (never under MIN), or past STUCK_SECONDS while a step's history is thin; consumer processes
# rewrite their registration this often, with this version (empty: git describe).
MRT_STEP_HISTORY_DAYS = env_float("MRT_STEP_HISTORY_DAYS", 30.0, low=0, high=36_500, above=True)
# The search's text index in the database (queues/console/jobtext.py) follows the queue this many
# seconds after a watch said a job state folder changed (a search reads what is new itself).
MRT_SEARCH_FEED_SECONDS = env_seconds("MRT_SEARCH_FEED_SECONDS", 10.0, DAY)
MRT_STUCK_SECONDS = env_seconds("MRT_STUCK_SECONDS", 3600.0, 30 * DAY)
MRT_STUCK_FACTOR = env_float("MRT_STUCK_FACTOR", 3.0, low=1, high=1000)
MRT_STUCK_MIN_SECONDS = env_float("MRT_STUCK_MIN_SECONDS", 300.0, low=0, high=30 * DAY)
MRT_CONSUMER_PUBLISH_SECONDS = env_seconds("MRT_CONSUMER_PUBLISH_SECONDS", 5.0, 3600)
MRT_VERSION = env("MRT_VERSION")
# The fetch policy for every request made for a depositor (queues/steps/netpolicy.py):
# addresses that may be fetched although they are loopback/private (comma-separated networks).
MRT_FETCH_ALLOW = ",".join(env_networks("MRT_FETCH_ALLOW", separators=",;"))
MRT_FETCH_MAX_REDIRECTS = env_int("MRT_FETCH_MAX_REDIRECTS", 5, low=0, high=100)
# One file: a wall-clock limit (all attempts), and a minimum rate over every window.
MRT_DOWNLOAD_DEADLINE = env_seconds("MRT_DOWNLOAD_DEADLINE", 6 * 3600.0, WEEK)
MRT_DOWNLOAD_MIN_RATE = env_int("MRT_DOWNLOAD_MIN_RATE", 1024, low=0)
MRT_DOWNLOAD_RATE_WINDOW = env_seconds("MRT_DOWNLOAD_RATE_WINDOW", 60.0, DAY)
# What a web request reads from a depositor's server while its client waits (a batch manifest
# given by URL, with MRT_BATCH_INTAKE=merritt): one deadline for the whole exchange.
MRT_IN_REQUEST_FETCH_SECONDS = env_seconds("MRT_IN_REQUEST_FETCH_SECONDS", 20.0, 3600)
# One object: bytes downloaded and unpacked, and how far a container may expand.
MRT_MAX_OBJECT_BYTES = env_int("MRT_MAX_OBJECT_BYTES", 200 * 1024**3, low=1)
MRT_MAX_COMPRESSION_RATIO = env_float("MRT_MAX_COMPRESSION_RATIO", 100.0, low=1)
# What provisioning counts for a file whose size the server would not tell.
MRT_UNKNOWN_SIZE_BYTES = env_int("MRT_UNKNOWN_SIZE_BYTES", 1024**3, low=0)
# Jobs downloading at once in one process, and at most this many from one depositor host.
MRT_DOWNLOAD_JOBS = env_int("MRT_DOWNLOAD_JOBS", 4, low=1, high=256)
# The batched job loop (queues/daemons/pipeline.py), the default of the steps that are short
# next to a ZooKeeper round trip (BATCHED_STEPS in queues/daemons/runner.py): jobs claimed per
# lock multi and moved per move multi, and whether a process keeps a job's lock from one of its
# steps to the next. 1 and off is the one-job loop for every step.
MRT_CLAIM_BATCH = env_int("MRT_CLAIM_BATCH", 32, low=1, high=1000)
MRT_KEEP_LOCKS = env_bool("MRT_KEEP_LOCKS", True)
# Whether downloading, processing, storing and recording (LONG_STEPS) run in the batched loop,
# their steps in as many threads as the copies a process runs of them (``--threads``; downloading:
# MRT_DOWNLOAD_JOBS), or one job at a time.
MRT_BATCH_LONG_STEPS = env_bool("MRT_BATCH_LONG_STEPS", True)
# Whether a process's batched loops share one thread (one per copy of the steps, ``--threads``)
# or run a thread each; a step that blocks (a slow HEAD) holds up the loops of its thread.
MRT_SHARED_LOOPS = env_bool("MRT_SHARED_LOOPS", True)
MRT_DOWNLOADS_PER_HOST = env_int("MRT_DOWNLOADS_PER_HOST", 2, low=1, high=1000)
# For benchmarks only (bench/daemons.py --shipped): every job step's work is "move on to the next
# state", so what runconsumer as shipped measures is its loops and ZooKeeper. Never in production:
# jobs would complete without their objects being stored.
MRT_NOOP_STEPS = env_bool("MRT_NOOP_STEPS", False)

# Mail: SMTP when EMAIL_HOST is set, else files under MRT_VAR_DIR/mail the console can show.
# The Date header in the console's zone, as the body's times (Django's default is -0000).
EMAIL_USE_LOCALTIME = True
EMAIL_HOST = env("EMAIL_HOST")
if EMAIL_HOST:
    EMAIL_BACKEND = "queues.steps.smtp.EmailBackend"  # Django's, one deadline a send
    EMAIL_PORT = env_int("EMAIL_PORT", 25, **PORT)
    EMAIL_HOST_USER = env("EMAIL_HOST_USER")
    EMAIL_HOST_PASSWORD = env("EMAIL_HOST_PASSWORD")
    EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)  # STARTTLS
    EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)  # TLS from the first byte (SMTPS, 465)
    # Each answer of the mail server; a whole send has MAIL_EXCHANGES times it (notify.send).
    EMAIL_TIMEOUT = env_seconds("EMAIL_TIMEOUT", 60.0, 3600.0)
    if EMAIL_USE_TLS and EMAIL_USE_SSL:
        # Django's backend would refuse it at every send instead.
        raise ImproperlyConfigured(
            "EMAIL_USE_TLS (STARTTLS) and EMAIL_USE_SSL (SMTPS): set one or the other, not both"
        )
else:
    EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
    EMAIL_FILE_PATH = MRT_VAR_DIR / "mail"
DEFAULT_FROM_EMAIL = env("DEFAULT_FROM_EMAIL", "merritt-queue@localhost")
# Sender of summary e-mails; empty: DEFAULT_FROM_EMAIL.
MRT_MAIL_FROM = env("MRT_MAIL_FROM")
# Alerts (queues/daemons/alerts.py): where they go (comma-separated addresses; a webhook URL,
# posted Slack's {"text": ...} or, with "json", the alert's fields), how often the rules are
# evaluated, and the hour (local time, 0-23) of the daily digest (negative: none).
MRT_ALERT_EMAIL = env("MRT_ALERT_EMAIL")
MRT_ALERT_WEBHOOK_URL = env_url("MRT_ALERT_WEBHOOK_URL", secret_path=True)
MRT_ALERT_WEBHOOK_FORMAT = env("MRT_ALERT_WEBHOOK_FORMAT", "slack").strip().lower()
if MRT_ALERT_WEBHOOK_FORMAT not in ("slack", "json"):
    refuse("MRT_ALERT_WEBHOOK_FORMAT", "slack or json", MRT_ALERT_WEBHOOK_FORMAT)
MRT_ALERT_EVERY = env_seconds("MRT_ALERT_EVERY", 30.0, DAY)
MRT_ALERT_DIGEST_HOUR = env_int("MRT_ALERT_DIGEST_HOUR", 7, low=-1, high=23)
# Seconds a storage node an operator held (with a reason, and no maintenance window) stays held
# before the node-held alert pages: the operator meant it; a forgotten hold is worth a page.
# A breaker's hold, or one with no reason or no name, pages at the rule's own threshold.
MRT_ALERT_HAND_HOLD_AFTER = env_seconds("MRT_ALERT_HAND_HOLD_AFTER", 3600.0, 30 * DAY)

LOG_LEVEL = env("LOG_LEVEL", "INFO").strip().upper()
if not isinstance(logging.getLevelNamesMapping().get(LOG_LEVEL), int):
    raise ImproperlyConfigured(
        f"environment variable LOG_LEVEL must be DEBUG, INFO, WARNING, ERROR or CRITICAL, "
        f"got {LOG_LEVEL!r}"
    )
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # Every record's text from outside (reason phrases, names) with its control characters
    # escaped: queues/core/outside_text.py.
    "formatters": {
        "plain": {
            "class": "queues.core.outside_text.LogFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s %(message)s",
        }
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {
        "kazoo": {"level": "WARNING"},
        "daphne": {"level": "WARNING"},
        "axes": {"level": "WARNING"},
    },
}
