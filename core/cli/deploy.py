"""The deploy commands: `migrate` brings a database's schema to the code's newest revision, as its own step.

A team that runs several processes (the app, the API, workers on more machines) sets TFGRPO_MIGRATE_ON_START=0
so that no process migrates on its own, and runs `python -m core migrate` once per release before starting them.
`migrate` also encrypts webhook signing secrets stored in plain text by an older release (core.secrets.seal).
"""

from __future__ import annotations

import argparse

from sqlalchemy.engine import Engine

from core.settings import database_pool, get_settings
from storage.db import describe_url, make_engine, migrate, schema_revisions


def cmd_migrate(args: argparse.Namespace) -> int:
    """Upgrade to the newest revision (Alembic's `upgrade head`); a database already there is left as it is.
    With --check nothing changes: the exit code is 1 when the database is behind."""
    url = args.db or get_settings().database_url
    engine = make_engine(url, migrate=False, **database_pool())
    try:
        before, newest = schema_revisions(engine)
        where = describe_url(url)
        if before == newest:
            print(f"{where}: schema at revision {newest}, the newest; nothing to do")
            if not args.check:
                seal_secrets(engine)
            return 0
        if args.check:
            print(f"{where}: schema at revision {before or 'none (empty)'}, behind the newest {newest}; "
                  "run `python -m core migrate`")
            return 1
        migrate(engine)
        after, _ = schema_revisions(engine)
        print(f"{where}: schema migrated from revision {before or 'none (empty)'} to {after}")
        seal_secrets(engine)
        return 0
    finally:
        engine.dispose()


def seal_secrets(engine: Engine) -> None:
    """Encrypt the webhook secrets stored before they were, and say what still stands in signing's way (no key)."""
    from core.records.notifications.webhooks import seal_stored_secrets, secrets_problem

    sealed = seal_stored_secrets(engine)
    if sealed:
        print(f"encrypted {sealed} stored webhook signing secret(s)")
    problem = secrets_problem(engine)
    if problem:
        print(problem)
