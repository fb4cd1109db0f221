"""Database engine and sessions: SQLite by default, any SQLAlchemy URL through DATABASE_URL.

SQLite is tuned for one worker writing while the UI reads (WAL, busy timeout, foreign keys), and
the schema is brought up to date with Alembic whenever an engine is opened, unless the process is told not to
(core.settings: TFGRPO_MIGRATE_ON_START=0, for a team that migrates as a deploy step with `python -m core
migrate`): it then refuses a database behind the newest revision (SchemaBehind) instead of working on it. A database already at the newest
revision (alembic_version holds the one head of storage/migrations/versions) opens without importing Alembic,
which costs about 0.2 s at every start of the worker, the API, the app or a command. On a server database
(PostgreSQL through psycopg 3: `postgresql+psycopg://user:password@host:5432/name`, with `@ % / :` in
the password URL-escaped) each engine keeps a pool of connections (default 5), opens at most a few more
under load (default 10), and replaces a connection older than a limit (default 1800 s; 0 keeps them)
before a proxy or firewall drops it. The sizes are arguments: core.settings reads them from the
environment (TFGRPO_DB_POOL_SIZE, TFGRPO_DB_MAX_OVERFLOW, TFGRPO_DB_POOL_RECYCLE_S) and passes them in.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from sqlalchemy import event, inspect
from sqlalchemy.engine import Engine
from sqlmodel import Session, create_engine

from storage import tables  # noqa: F401  (registers the tables on SQLModel.metadata)

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"

DEFAULT_POOL_SIZE = 5
DEFAULT_MAX_OVERFLOW = 10
DEFAULT_POOL_RECYCLE_S = 1800


class SchemaBehind(RuntimeError):
    """The database's schema is older than the code's newest migration and this process may not migrate it."""


def _whole_number(name: str, value: object, minimum: int) -> int:
    """`value` as an int of at least `minimum`; a ValueError naming the argument otherwise."""
    try:
        number = int(value)
        if isinstance(value, float) and number != value:
            raise ValueError
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a whole number of at least {minimum}, not {value!r}") from None
    if number < minimum:
        raise ValueError(f"{name} must be a whole number of at least {minimum}, not {number}")
    return number


def pool_settings(pool_size: int = DEFAULT_POOL_SIZE, max_overflow: int = DEFAULT_MAX_OVERFLOW,
                  pool_recycle: int = DEFAULT_POOL_RECYCLE_S) -> dict[str, int]:
    """The connection pool of a server database: `pool_size` at least 1, `max_overflow` at least 0,
    `pool_recycle` seconds (0 for never); a bad value is a ValueError naming it."""
    recycle = _whole_number("pool_recycle", pool_recycle, 0)
    return {"pool_size": _whole_number("pool_size", pool_size, 1),
            "max_overflow": _whole_number("max_overflow", max_overflow, 0),
            "pool_recycle": recycle or -1}  # SQLAlchemy's "never" is -1


def url_with_password(engine: Engine) -> str:
    """The engine's URL as a string a child process or a new engine can connect with.

    `str(engine.url)` masks the password as `***`; this keeps it, still URL-escaped."""
    return engine.url.render_as_string(hide_password=False)


def describe_url(url: str) -> str:
    """The driver and host of a database URL (a SQLite file by its name), for pages and logs.

    User, password, query and paths stay out: pages are seen by every signed-in person, and an
    unparsable URL is described without echoing it."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError, TypeError):
        return "an unreadable DATABASE_URL"
    if parsed.get_backend_name() == "sqlite":
        return f"{parsed.drivername} file {Path(parsed.database).name}" if parsed.database else f"{parsed.drivername} in memory"
    host = parsed.host or "localhost"
    return f"{parsed.drivername} on {host}" + (f":{parsed.port}" if parsed.port else "")


def scrub_url(text: str, url: str) -> str:
    """`text` (an error message) with the URL and its password replaced, so a page can show it."""
    from sqlalchemy.engine import make_url

    secrets = [url]
    try:
        parsed = make_url(url)
        secrets += [parsed.render_as_string(hide_password=False), parsed.password or "", parsed.username or ""]
    except Exception:  # noqa: BLE001  (an unparsable URL has no parts to look for)
        pass
    for secret in sorted({s for s in secrets if s and len(s) >= 3}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _sqlite_pragmas(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def make_engine(url: str, *, migrate: bool = True, require_current: bool = False, pool_size: int = DEFAULT_POOL_SIZE,
                max_overflow: int = DEFAULT_MAX_OVERFLOW, pool_recycle: int = DEFAULT_POOL_RECYCLE_S) -> Engine:
    """A new engine on `url`; the schema is migrated before it is returned unless `migrate` is False
    (for a database known to be at the newest revision, such as the tests' copies of a migrated file, or a process
    told not to migrate on start). A database whose alembic_version already holds the newest revision is not
    handed to Alembic at all. With `require_current` (and `migrate` False) a database behind the newest revision
    is refused with SchemaBehind, which says to run `python -m core migrate`.

    A server database gets a pool of `pool_size` connections plus `max_overflow`, each replaced after
    `pool_recycle` seconds (see pool_settings); SQLite ignores all three."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
    else:
        engine = create_engine(url, pool_pre_ping=True, **pool_settings(pool_size, max_overflow, pool_recycle))
    if migrate and not at_newest_revision(engine):
        _migrate(engine)
    elif not migrate and require_current and not at_newest_revision(engine):
        have, want = schema_revisions(engine)
        if have != want:
            engine.dispose()
            raise SchemaBehind(f"the database {describe_url(url)} is at schema revision {have or 'none (empty)'} and "
                               f"this code needs {want}; run `python -m core migrate` (migration on start is off)")
    return engine


# `revision = '0015'` and `down_revision = '0014'` (or None) in a migration file, with or without a type annotation
_REVISION_LINE = re.compile(r"""^(down_revision|revision)\s*(?::[^=]*)?=\s*(None|'[^']*'|"[^"]*")\s*$""", re.MULTILINE)


@lru_cache(maxsize=1)
def head_revision() -> str | None:
    """The newest revision of storage/migrations, read from the files' `revision` and `down_revision` lines
    without Alembic; None when they do not form one line of history (a merge, a branch, a line not understood),
    and then make_engine leaves the question to Alembic."""
    revisions, parents = set(), set()
    for path in (MIGRATIONS_DIR / "versions").glob("*.py"):
        found = dict(_REVISION_LINE.findall(path.read_text(encoding="utf-8")))
        if "revision" not in found or "down_revision" not in found:
            return None
        revisions.add(found["revision"].strip("'\""))
        if found["down_revision"] != "None":
            parents.add(found["down_revision"].strip("'\""))
    heads = revisions - parents
    return heads.pop() if len(heads) == 1 and parents <= revisions else None


def at_newest_revision(engine: Engine) -> bool:
    """Whether this database's alembic_version holds exactly the newest revision, so there is nothing to migrate."""
    head = head_revision()
    if head is None:
        return False
    with engine.connect() as connection:
        if not inspect(connection).has_table("alembic_version"):
            return False
        return list(connection.exec_driver_sql("SELECT version_num FROM alembic_version").scalars()) == [head]


def database_revision(engine: Engine) -> str | None:
    """The revision this database's alembic_version holds (None for a database never migrated)."""
    with engine.connect() as connection:
        if not inspect(connection).has_table("alembic_version"):
            return None
        found = list(connection.exec_driver_sql("SELECT version_num FROM alembic_version").scalars())
    return ",".join(sorted(found)) or None


def newest_revision() -> str:
    """The head of storage/migrations (read without Alembic when the files form one line, else by Alembic)."""
    head = head_revision()
    if head is not None:
        return head
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return ",".join(sorted(ScriptDirectory.from_config(cfg).get_heads()))


def schema_revisions(engine: Engine) -> tuple[str | None, str]:
    """This database's revision and the code's newest, for `python -m core migrate` and the readiness route."""
    return database_revision(engine), newest_revision()


def migrate(engine: Engine) -> None:
    """Apply every Alembic migration that this database has not seen yet."""
    from alembic import command
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as connection:
        cfg.attributes["connection"] = connection
        command.upgrade(cfg, "head")


_migrate = migrate  # make_engine's `migrate` flag hides the function's name inside it


@lru_cache(maxsize=8)
def get_engine(url: str, *, migrate: bool = True, pool_size: int = DEFAULT_POOL_SIZE,
               max_overflow: int = DEFAULT_MAX_OVERFLOW, pool_recycle: int = DEFAULT_POOL_RECYCLE_S) -> Engine:
    """One engine per URL (and pool) per process; migrated when opened unless `migrate` is False, which refuses
    a database behind the newest revision instead (SchemaBehind)."""
    return make_engine(url, migrate=migrate, require_current=not migrate, pool_size=pool_size,
                       max_overflow=max_overflow, pool_recycle=pool_recycle)


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """A short transaction: committed on success, rolled back on error."""
    with Session(engine, expire_on_commit=False) as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
