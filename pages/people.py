"""People: how people sign in, who the users are and what each role may do.

With no active user the studio serves one local user with every permission; the first user added
switches sign-in on. Admins add users (with a password, or by email for the team's OpenID Connect provider) and
change their role, activity and password here, and make API keys, each for a person if they like; every change
goes through `core.records.people.users` (and `core.records.people.roles`), which checks the role again and writes the audit event. Password hashes are
never read into the page beyond the query, and never shown.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st
from sqlmodel import Session

from core.domain.roles import NO_ROLE, PERSON_ROLES, ROLES
from core.records.keys.api_keys import API_ROLES, create_key, key_writes_to, list_keys, revoke_key
from core.records.people.roles import sign_in_required
from core.records.people.users import add_user, update_user
from storage import queries
from ui.common import (
    DATETIME,
    Flash,
    Outcome,
    allowed,
    context,
    engine,
    plain,
    role_note,
    run_action,
    run_page,
)
from ui.display import table

FLASH = Flash("people_flash")
MISMATCH = Outcome(False, "The two passwords differ; nothing was saved.")
ADD_NAME, ADD_ROLE, ADD_PASSWORD, ADD_REPEAT = "people_add_name", "people_add_role", "people_add_pw", "people_add_pw2"
USER_KEY = "people_user"
FIRST_USER_COMMAND = "python -m core user add NAME --role admin"
SIGN_IN_OFF = ("Sign-in is off: everyone using this studio is the single local user with every permission. "
               f"Add a user (here or with `{FIRST_USER_COMMAND}`) to require sign-in.")
PROVIDER_EMAIL, PROVIDER_ROLE = "people_provider_email", "people_provider_role"
NO_PERSON = "(nobody: a key of its own)"
ROLES_TEXT = """
- **none**: may sign in and do nothing else (a new person from an allowed domain, until an admin gives a role).
- **labeler**: labels rollouts in the labeling queue.
- **reviewer**: everything a labeler does, and also decides operations, edits libraries, starts runs and
  evaluations.
- **admin**: everything a reviewer does, and also manages tasks, users and the `production` label.
"""


def role_key(user_id: int) -> str:
    return f"people_role_{user_id}"


def password_keys(user_id: int) -> tuple[str, str]:
    return f"people_pw_{user_id}", f"people_pw2_{user_id}"


# --- actions (button callbacks) ---------------------------------------------------------------


def add() -> None:
    name = str(st.session_state.get(ADD_NAME) or "").strip()
    role = st.session_state.get(ADD_ROLE)
    password, repeat = st.session_state.get(ADD_PASSWORD) or "", st.session_state.get(ADD_REPEAT) or ""
    st.session_state[ADD_PASSWORD] = st.session_state[ADD_REPEAT] = ""
    if password != repeat:
        FLASH.set("add", MISMATCH)
        return
    if run_action(FLASH, "add", add_user, engine(), name, role, password, actor=context().reviewer,
                  success=f"User {plain(name)} added as {role}.") is not None:
        st.session_state[ADD_NAME] = ""


def add_provider_person() -> None:
    email = str(st.session_state.get(PROVIDER_EMAIL) or "").strip()
    role = st.session_state.get(PROVIDER_ROLE)
    if run_action(FLASH, "provider", add_user, engine(), email, role, None, actor=context().reviewer,
                  success=f"{plain(email)} added as {role}; they sign in through the provider.") is not None:
        st.session_state[PROVIDER_EMAIL] = ""


def change_role(name: str, user_id: int) -> None:
    role = st.session_state.get(role_key(user_id))
    run_action(FLASH, "user", update_user, engine(), name, context().reviewer, role=role,
               success=f"{plain(name)} is now a {role}.")


def set_active(name: str, active: bool) -> None:
    run_action(FLASH, "user", update_user, engine(), name, context().reviewer, active=active,
               success=f"{plain(name)} {'activated' if active else 'deactivated'}.")


def set_password(name: str, user_id: int) -> None:
    first, second = password_keys(user_id)
    password, repeat = st.session_state.get(first) or "", st.session_state.get(second) or ""
    st.session_state[first] = st.session_state[second] = ""
    if password != repeat:
        FLASH.set("user", MISMATCH)
        return
    run_action(FLASH, "user", update_user, engine(), name, context().reviewer, password=password,
               success=f"New password set for {plain(name)}.")


# --- display ----------------------------------------------------------------------------------


def add_form(sign_in_on: bool) -> None:
    st.subheader("Add a user", anchor=False)
    FLASH.show("add")
    if not sign_in_on:
        st.warning("Adding the first user turns sign-in on: right after, everyone, you included, must sign in, "
                   "and only an admin can manage users. Make the first user an admin whose password you know. "
                   "(The command line can still add or change users if no admin can sign in.)")
    with st.form("people_add_form"):
        st.text_input("User name", key=ADD_NAME)
        st.selectbox("Role", ROLES, index=ROLES.index("admin" if not sign_in_on else "labeler"), key=ADD_ROLE)
        st.text_input("Password (at least 8 characters)", type="password", key=ADD_PASSWORD)
        st.text_input("Password again", type="password", key=ADD_REPEAT)
        st.form_submit_button("Add user", type="primary", on_click=add)


def provider_form(sign_in_on: bool) -> None:
    """A person of the team's OpenID Connect provider, added by the email the provider verifies (no password)."""
    st.subheader("Add a person of the sign-in provider", anchor=False)
    st.caption("They sign in with the provider's button on the sign-in page; the studio knows them by this email "
               "(the provider must say it verified it) and keeps their role here.")
    FLASH.show("provider")
    with st.form("people_provider_form"):
        st.text_input("Email", key=PROVIDER_EMAIL)
        st.selectbox("Role", PERSON_ROLES, index=PERSON_ROLES.index("admin" if not sign_in_on else "labeler"),
                     key=PROVIDER_ROLE)
        st.form_submit_button("Add person", on_click=add_provider_person)


def manage_user(users: list) -> None:
    st.subheader("Change a user", anchor=False)
    FLASH.show("user")
    by_name = {user.name: user for user in users}
    names = list(by_name)
    if st.session_state.get(USER_KEY) not in names:
        st.session_state.pop(USER_KEY, None)
    name = st.selectbox("User", names, key=USER_KEY)
    user = by_name[name]
    if name == context().reviewer:
        st.warning("This is you: a lower role or deactivation takes effect at once and may lock you out of this "
                   "page.")
    role_col, active_col = st.columns(2)
    with role_col:
        st.selectbox("Role", PERSON_ROLES, index=PERSON_ROLES.index(user.role) if user.role in PERSON_ROLES else 0,
                     key=role_key(user.id))
        st.button("Change role", key=f"people_change_role_{user.id}", on_click=change_role, args=(name, user.id))
    with active_col:
        st.caption("Active" if user.active else "Deactivated")
        if user.active:
            st.button("Deactivate", key=f"people_deactivate_{user.id}", on_click=set_active, args=(name, False))
        else:
            st.button("Activate", key=f"people_activate_{user.id}", on_click=set_active, args=(name, True))
    first, second = password_keys(user.id)
    st.text_input("New password (at least 8 characters)", type="password", key=first)
    st.text_input("New password again", type="password", key=second)
    st.button("Set password", key=f"people_set_password_{user.id}", on_click=set_password, args=(name, user.id))


ANY_TASK = "(any task: an admin's choice)"
NEW_KEY = "people_new_api_key"  # the key just created, shown once and then dropped from the session


def make_key() -> None:
    name, role = st.session_state.get("people_key_name", ""), st.session_state.get("people_key_role", "read")
    person = st.session_state.get("people_key_person")
    where = st.session_state.get("people_key_task") if role == "ingest" else None
    library = (st.session_state.get("people_key_library") or "").strip() or None
    made = run_action(FLASH, "keys", create_key, engine(), name, role, context().reviewer,
                      person=None if person in (None, NO_PERSON) else person,
                      task=None if where in (None, ANY_TASK) else where,
                      library=library if where not in (None, ANY_TASK) else None, any_task=where == ANY_TASK)
    if made is not None:
        st.session_state[NEW_KEY] = made.secret
        st.session_state["people_key_name"] = ""


def drop_key(key_id: int) -> None:
    run_action(FLASH, "keys", revoke_key, engine(), key_id, context().reviewer, success=f"API key {key_id} revoked.")


def api_keys_section() -> None:
    """Keys for live agents (core/records/keys/api_keys.py): a new key is shown once; the table never shows one."""
    st.header("API keys", anchor=False)
    st.caption("Live agents send one to the HTTP API (`Authorization: Bearer <key>`). "
               + " ".join(f"A {role} key may {what}." for role, what in API_ROLES.items()))
    secret = st.session_state.pop(NEW_KEY, None)
    if secret:
        st.success("Copy the new key now: it is shown this once and stored only as a hash.")
        st.code(secret, language=None)
    with Session(engine()) as session:
        keys = list_keys(session)
        tasks = {task.id: task.name for task in queries.list_tasks(session)}
        session.expunge_all()
    if keys:
        table([{"id": k.id, "name": k.name, "role": k.role, "for": k.person or "",
                "writes to": key_writes_to(k, tasks), "starts with": k.prefix,
                "created by": k.created_by,
                "created at": k.created_at, "last used": k.last_used_at, "revoked at": k.revoked_at} for k in keys],
              column_config={"created at": DATETIME, "last used": DATETIME, "revoked at": DATETIME},
              key="people_keys_table")
    else:
        st.caption("No API keys yet.")
    FLASH.show("keys")
    if not allowed("admin"):
        role_note("admin", "creating and revoking API keys")
        return
    with Session(engine()) as session:
        people = [u.name for u in queries.list_users(session) if u.active and u.role != NO_ROLE]
    left, middle, person_col, right = st.columns([3, 2, 3, 1], vertical_alignment="bottom")
    left.text_input("Key name (which agent uses it)", key="people_key_name", max_chars=100)
    middle.selectbox("Role", list(API_ROLES), key="people_key_role")
    person_col.selectbox("For person", [NO_PERSON, *people], key="people_key_person",
                         help="A key for a person carries at most their role, checked at every request: a read key "
                              "needs a labeler, an ingest key a reviewer.")
    task_col, library_col = st.columns([3, 2])
    task_col.selectbox("An ingest key writes to task", [*tasks.values(), ANY_TASK], key="people_key_task", index=None,
                       placeholder="choose (ingest keys)",
                       help="Every trace and span the key sends is stored in this task, whatever it names; one naming "
                            "another task is refused. Any task: what each trace or span names decides, so a leaked "
                            "key can write anywhere. A read key writes nothing.")
    library_col.text_input("Library (optional)", key="people_key_library", placeholder="any of that task's")
    right.button("Create key", key="people_key_create", type="primary", on_click=make_key)
    live = [k for k in keys if k.revoked_at is None]
    if live:
        chosen = st.selectbox("Key to revoke", [k.id for k in live], key="people_key_revoke_id",
                              format_func=lambda i: next(f"{k.name} ({k.role}, {k.prefix}…)" for k in live if k.id == i))
        st.button("Revoke key", key="people_key_revoke", on_click=drop_key, args=(chosen,))


def page() -> None:
    st.title("People")
    with Session(engine()) as session:
        sign_in_on = sign_in_required(session)
        users = queries.list_users(session)
        rows = [{"name": u.name, "role": u.role, "active": u.active,
                 "signs in": "provider" if u.email and not u.password_hash else "password" if not u.email else "both",
                 "created by": u.created_by, "created at": u.created_at} for u in users]
        session.expunge_all()
    if sign_in_on:
        active = sum(1 for row in rows if row["active"])
        st.caption(f"Sign-in is on: {active} active {'user' if active == 1 else 'users'}.")
    elif users:
        st.info("Sign-in is off because no user is active: everyone using this studio is the single local user "
                "with every permission. Activate a user or add one to require sign-in.")
    else:
        st.info(SIGN_IN_OFF)
        st.code(FIRST_USER_COMMAND, language=None)

    st.header("Users", anchor=False)
    if rows:
        st.dataframe(pd.DataFrame(rows), hide_index=True, column_config={"created at": DATETIME},
                     key="people_users_table")
    else:
        st.caption("No users yet.")

    if allowed("admin"):
        add_form(sign_in_on)
        provider_form(sign_in_on)
        if users:
            manage_user(users)
    else:
        role_note("admin", "managing users")

    api_keys_section()

    st.header("Roles", anchor=False)
    st.markdown(ROLES_TEXT)


run_page(page)
