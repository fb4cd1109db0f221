"""The people commands: the labeling queue of a task and the users who may sign in."""

from __future__ import annotations

import argparse
import getpass
import sys

from sqlmodel import Session

from core.cli.base import UsageError, engine_of
from core.records.people.users import add_user, update_user
from core.records.review import labeling
from core.records.tasks.lookup import get_task
from core.settings import secret
from storage import queries


def cmd_queue(args: argparse.Namespace) -> int:
    """What waits in the labeling queue of a task, and the agreement between its labellers."""
    with Session(engine_of(args)) as session:
        task = get_task(session, args.task)
        counts = labeling.progress(session, task)
        found = labeling.agreement(session, task)
    print(f"{task.name}: {counts.needed} waiting, {counts.done} done, {counts.disputed} disputed")
    if found.fleiss is not None:
        print(f"Fleiss' kappa {found.fleiss:.2f} over {found.items} rollouts with {found.raters_per_item} labels each")
    for (a, b), (kappa, n) in sorted(found.cohen.items()):
        print(f"Cohen's kappa {a} / {b}: {'-' if kappa is None else f'{kappa:.2f}'} over {n} rollouts")
    for row in found.disagreements:
        labels = ", ".join(f"{who} {value}" for who, value in row["labels"].items())
        print(f"disputed: rollout {row['rollout']} ({labels})")
    return 0


def _password(args: argparse.Namespace) -> str:
    """From the named environment variable, else one line of piped stdin, else typed twice (not echoed)."""
    if args.password_env:
        password = secret(args.password_env)
        if not password:
            raise UsageError(f"environment variable {args.password_env} is not set or empty")
        return password
    if not sys.stdin.isatty():
        password = sys.stdin.readline().rstrip("\r\n")
        if not password:
            raise UsageError("no password: pipe one line to stdin or use --password-env VAR")
        return password
    password = getpass.getpass("password: ")
    if getpass.getpass("again: ") != password:
        raise UsageError("the two passwords differ")
    return password


def cmd_user_add(args: argparse.Namespace) -> int:
    if args.provider and args.password_env:
        raise UsageError("user add: --provider adds a person without a password; leave out --password-env")
    password = None if args.provider else _password(args)
    user = add_user(engine_of(args), args.name, args.role, password, actor="cli")
    how = "signs in through the OpenID Connect provider as this email" if args.provider else "signs in with a password"
    print(f"added user {user.name} ({user.role}, {how}); sign-in is now required")
    return 0


def cmd_user_list(args: argparse.Namespace) -> int:
    with Session(engine_of(args)) as session:
        users = queries.list_users(session)
    print(f"{'name':<32}{'role':<10}{'active':<8}sign-in")
    for user in users:
        how = "provider" if user.email and not user.password_hash else "password" if not user.email else "both"
        print(f"{user.name:<32}{user.role:<10}{'yes' if user.active else 'no':<8}{how}")
    return 0


def cmd_user_set(args: argparse.Namespace) -> int:
    password = _password(args) if args.password_env else None
    if args.role is None and args.active is None and password is None:
        raise UsageError("user set: nothing to change; give --role, --active or --password-env")
    active = None if args.active is None else args.active == "yes"
    user = update_user(engine_of(args), args.name, "cli", role=args.role, active=active, password=password)
    changed = ", ".join(part for part, given in (("role", args.role), ("active", args.active),
                                                   ("password", password)) if given is not None)
    print(f"updated user {user.name}: {changed} (role {user.role}, active {'yes' if user.active else 'no'})")
    return 0
