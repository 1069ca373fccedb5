"""Django settings for Hydra. The environment is read once, here, through `webapp.config.load`."""

from __future__ import annotations

import os
from datetime import timedelta

from webapp.config import BASE_DIR, load

HYDRA = load(os.environ)

DEBUG = HYDRA.debug
SECRET_KEY = HYDRA.secret_key
ALLOWED_HOSTS = HYDRA.allowed_hosts
CSRF_TRUSTED_ORIGINS = HYDRA.csrf_trusted_origins

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    # Hydra's apps, each above those it imports (tests/test_boundaries.py holds the order).
    "webapp.accounts",
    "webapp.background",
    "webapp.ground",
    "webapp.datasets",
    "webapp.health",
    "webapp.catalog",
    "webapp.telemetry",
    "webapp.leaderboards",
    "webapp.notifications",
    "webapp.dashboards",
    "webapp.experiments",
    "webapp.api",
    "ninja",  # the API's docs page and its Swagger UI files, served from here (no CDN)
    "axes",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "webapp.accounts.middleware.CurrentTeamMiddleware",
    "axes.middleware.AxesMiddleware",
    "webapp.api.middleware.ApiConditionalGetMiddleware",
]

ROOT_URLCONF = "webapp.urls"
WSGI_APPLICATION = "webapp.wsgi.application"

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
                "webapp.accounts.context_processors.teams",
            ],
        },
    },
]

DATABASES = {"default": HYDRA.database}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # refuses a locked-out login before the password is checked
    "django.contrib.auth.backends.ModelBackend",
]
# Login throttling (the login page and the admin's; `webapp.accounts.login_throttle`): within AXES_COOLOFF_TIME,
# AXES_FAILURE_LIMIT wrong passwords for one username from one client address lock that username from that
# address, and LOGIN_FAILURES_PER_ADDRESS for any usernames lock that address for everyone. Guesses from
# elsewhere therefore never lock out the real user. A lab behind one NAT address keeps working: a colleague's
# typos lock only their own username, and the address's limit is far above a lab's typos. Behind the TLS proxy
# every connection comes from the proxy: it sets X-Forwarded-For and HYDRA_TRUSTED_PROXY_COUNT says how many
# proxies append to it, or else the whole site counts as one address. Administrators unlock early with
# `manage.py axes_reset_username <name>`, `axes_reset_ip <address>` or `axes_reset`, or in the admin's "Access
# attempts".
AXES_HANDLER = "webapp.accounts.login_throttle.PairAndAddressHandler"
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"], "ip_address"]  # the handler's order: pair, address
AXES_FAILURE_LIMIT = HYDRA.login_throttle.failures_per_user
LOGIN_FAILURES_PER_ADDRESS = HYDRA.login_throttle.failures_per_address
AXES_CLIENT_IP_CALLABLE = "webapp.accounts.login_throttle.client_address"
TRUSTED_PROXY_COUNT = HYDRA.login_throttle.trusted_proxy_count
AXES_COOLOFF_TIME = timedelta(minutes=15)
AXES_RESET_ON_SUCCESS = True  # the pair's failures only (the handler)
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"

# The API's lists come a page at a time: ?limit= (at most 100) and ?offset=.
NINJA_PAGINATION_PER_PAGE = 50
NINJA_PAGINATION_MAX_LIMIT = 100

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = HYDRA.data_dir / "staticfiles"
MEDIA_ROOT = HYDRA.data_dir / "media"
# In development static files come straight from static/ (a file's .gz beside it, such as Plotly's, goes to
# browsers that take gzip); production serves what `collectstatic` gathered into STATIC_ROOT: every file
# compressed and named by its content's hash, so that browsers cache it for good.
WHITENOISE_USE_FINDERS = DEBUG
WHITENOISE_AUTOREFRESH = DEBUG
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage" if DEBUG else
                    "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # the page's fetch() calls read the token from the cookie
SECURE_CONTENT_TYPE_NOSNIFF = True
X_FRAME_OPTIONS = "DENY"

# Production runs behind a TLS proxy that terminates HTTPS and sets X-Forwarded-Proto (docs/operations.md).
# The proxy must overwrite that header from clients, and gunicorn must be reachable only through the proxy.
if HYDRA.https:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    # The load balancer's up/down check may call the server directly over plain HTTP.
    SECURE_REDIRECT_EXEMPT = [r"^health$"]
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
SECURE_HSTS_SECONDS = HYDRA.hsts_seconds
SECURE_HSTS_INCLUDE_SUBDOMAINS = HYDRA.hsts_seconds > 0
SECURE_HSTS_PRELOAD = HYDRA.hsts_seconds > 0

DATA_UPLOAD_MAX_MEMORY_SIZE = 10 * 1024 * 1024
FILE_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024
FILE_UPLOAD_HANDLERS = [
    "webapp.datasets.uploads.UploadLimitHandler",  # HYDRA_MAX_UPLOAD_MB, held while the body streams in
    "django.core.files.uploadhandler.MemoryFileUploadHandler",
    "django.core.files.uploadhandler.TemporaryFileUploadHandler",
]

# E-mail (team notifications): the console backend in development (each message goes to the web worker's output,
# `make run`'s var/logs/web-worker.log), SMTP from the environment otherwise (`webapp.config.notify`). The web
# worker sends it, never a request.
EMAIL_BACKEND = HYDRA.notify.email.backend
EMAIL_HOST = HYDRA.notify.email.host
EMAIL_PORT = HYDRA.notify.email.port
EMAIL_HOST_USER = HYDRA.notify.email.user
EMAIL_HOST_PASSWORD = HYDRA.notify.email.password
EMAIL_USE_TLS = HYDRA.notify.email.use_tls
EMAIL_USE_SSL = HYDRA.notify.email.use_ssl
EMAIL_TIMEOUT = 10  # seconds: a mail server that never answers holds a web worker's slot no longer
DEFAULT_FROM_EMAIL = SERVER_EMAIL = HYDRA.notify.email.from_address

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": "INFO"},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
