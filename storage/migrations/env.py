"""Alembic environment: runs on the connection handed over by storage.db.migrate, or on a URL.

The URL is `config.attributes["url"]`, else `alembic -x url=...`, else alembic.ini's sqlalchemy.url.
The first two never pass through the config file's %-interpolation, so a URL-escaped password
(`p%40ss%25w%2Frd%3A1`) reaches the driver as written."""

from alembic import context
from sqlalchemy import create_engine, pool
from sqlmodel import SQLModel

from storage import tables  # noqa: F401

config = context.config
target_metadata = SQLModel.metadata


def _run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def _url() -> str:
    return (config.attributes.get("url") or context.get_x_argument(as_dictionary=True).get("url")
            or config.get_main_option("sqlalchemy.url"))


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    engine = create_engine(_url(), poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            _run(conn)
    finally:
        engine.dispose()
