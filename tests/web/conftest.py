"""Fixtures of the dashboard tests: the service tier's real databases and app (SQLite and PostgreSQL),
and Chromium for the browser tier."""

from tests.service.conftest import (  # noqa: F401  (fixtures shared with the service tier)
    client,
    database_url,
    postgres_service,
    postgres_url,
    settings,
)
from tests.web.browser import browser  # noqa: F401  (a module-scoped Chromium)
