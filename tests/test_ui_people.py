"""The People page (AppTest): sign-in off is said plainly, admins add and change users through core.records.people.users,
a mismatched password writes nothing, non-admins only read, and no password hash is ever shown."""

from __future__ import annotations

import pytest
from sqlmodel import Session, select

from core.records.people.passwords import check_password
from core.records.people.users import add_user
from core.records.tasks.demos import DEMO_TASK
from storage.tables import ApiKey, AuditEvent, User
from tests.ui_support import markdown_texts, run_app
from ui.common import AUTH_KEY, REVIEWER_KEY

PAGE = "pages/people.py"
PASSWORD = "a-long-secret-1"
ADD_NAME, ADD_ROLE, ADD_PASSWORD, ADD_REPEAT = "people_add_name", "people_add_role", "people_add_pw", "people_add_pw2"
SIGN_IN_OFF = ("Sign-in is off: everyone using this studio is the single local user with every permission. "
               "Add a user (here or with `python -m core user add NAME --role admin`) to require sign-in.")
COLUMNS = ["name", "role", "active", "signs in", "created by", "created at"]


@pytest.fixture
def engine(app_engine):
    """The app's database with the demo task (shadows the conftest engine on purpose)."""
    return app_engine


def as_person(name: str) -> dict:
    """Session state for acting as `name`: signed in (sign-in on) and typed in the sidebar (sign-in off)."""
    return {REVIEWER_KEY: name, AUTH_KEY: name}


def open_people(**state):
    at = run_app(page=PAGE, session_state=state)
    assert [t.value for t in at.title] == ["People"]
    return at


def users(engine) -> dict[str, User]:
    with Session(engine) as session:
        rows = {u.name: u for u in session.exec(select(User))}
        session.expunge_all()
    return rows


def users_table(at):
    [frame] = [df.value for df in at.dataframe if "role" in df.value.columns]
    return frame


def fill_add_form(at, name: str, role: str, password: str, repeat: str):
    at.text_input(key=ADD_NAME).input(name)
    at.selectbox(key=ADD_ROLE).set_value(role)
    at.text_input(key=ADD_PASSWORD).input(password)
    at.text_input(key=ADD_REPEAT).input(repeat)
    [submit] = [b for b in at.button if b.label == "Add user"]
    submit.click().run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def click(at, key: str):
    at.button(key=key).click().run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_no_users_says_sign_in_is_off(engine):
    at = open_people(**as_person("local"))
    assert SIGN_IN_OFF in [i.value for i in at.info]
    assert "python -m core user add NAME --role admin" in [c.value for c in at.code]
    assert not [df for df in at.dataframe if "role" in df.value.columns]
    assert any("Adding the first user turns sign-in on" in w.value for w in at.warning)
    assert at.selectbox(key=ADD_ROLE).value == "admin"
    assert any("**admin**" in m for m in markdown_texts(at))


def test_first_admin_added_from_the_form_has_a_scrypt_hash(engine):
    at = open_people(**as_person("local"))
    fill_add_form(at, "ana", "admin", PASSWORD, PASSWORD)
    stored = users(engine)
    assert list(stored) == ["ana"]
    ana = stored["ana"]
    assert ana.role == "admin" and ana.active and ana.created_by == "local"
    assert ana.password_hash.startswith("scrypt$") and PASSWORD not in ana.password_hash
    assert check_password(PASSWORD, ana.password_hash)
    with Session(engine) as session:
        [event] = session.exec(select(AuditEvent).where(AuditEvent.action == "user.add")).all()
    assert event.actor == "local" and event.after == {"name": "ana", "role": "admin", "sign_in": "password"}


def test_admin_adds_a_labeler_and_the_table_shows_no_hash(engine):
    add_user(engine, "ana", "admin", PASSWORD, actor="cli")
    at = open_people(**as_person("ana"))
    assert any(c.value == "Sign-in is on: 1 active user." for c in at.caption)
    assert not any("Adding the first user" in w.value for w in at.warning)
    fill_add_form(at, "lee", "labeler", "lee-secret-22", "lee-secret-22")
    stored = users(engine)
    assert stored["lee"].role == "labeler" and stored["lee"].created_by == "ana"
    assert check_password("lee-secret-22", stored["lee"].password_hash)
    shown = users_table(at)
    assert list(shown.columns) == COLUMNS
    assert shown["name"].tolist() == ["ana", "lee"]
    assert "scrypt$" not in shown.to_csv() and "lee-secret-22" not in shown.to_csv()
    assert at.text_input(key=ADD_PASSWORD).value == "" and at.text_input(key=ADD_NAME).value == ""


def test_mismatched_passwords_write_nothing(engine):
    at = open_people(**as_person("local"))
    fill_add_form(at, "ana", "admin", PASSWORD, PASSWORD + "x")
    assert "The two passwords differ; nothing was saved." in [e.value for e in at.error]
    assert users(engine) == {}
    with Session(engine) as session:
        assert not session.exec(select(AuditEvent).where(AuditEvent.action == "user.add")).all()


def test_core_errors_show_and_write_nothing(engine):
    at = open_people(**as_person("local"))
    fill_add_form(at, "ana", "admin", "short", "short")
    assert "the password must be at least 8 characters" in [e.value for e in at.error]
    assert users(engine) == {}


def test_a_reviewer_sees_the_users_but_cannot_manage_them(engine):
    add_user(engine, "ana", "admin", PASSWORD, actor="cli")
    add_user(engine, "rev", "reviewer", PASSWORD, actor="cli")
    at = open_people(**as_person("rev"))
    assert users_table(at)["name"].tolist() == ["ana", "rev"]
    assert "Managing users needs the admin role, which you do not have. An admin can change roles on People." in [
        i.value for i in at.info]
    assert not [t for t in at.text_input if t.key == ADD_NAME]
    assert not [b for b in at.button if b.label in ("Add user", "Change role", "Deactivate", "Set password")]


def test_admin_changes_role_active_and_password(engine):
    add_user(engine, "ana", "admin", PASSWORD, actor="cli")
    add_user(engine, "rev", "reviewer", PASSWORD, actor="cli")
    at = open_people(**as_person("ana"))
    at.selectbox(key="people_user").set_value("rev").run()
    rev_id = users(engine)["rev"].id

    at.selectbox(key=f"people_role_{rev_id}").set_value("labeler")
    click(at, f"people_change_role_{rev_id}")
    assert users(engine)["rev"].role == "labeler"

    click(at, f"people_deactivate_{rev_id}")
    assert users(engine)["rev"].active is False
    assert users_table(at).set_index("name").loc["rev", "active"] == False  # noqa: E712  (numpy bool)
    click(at, f"people_activate_{rev_id}")
    assert users(engine)["rev"].active is True

    at.text_input(key=f"people_pw_{rev_id}").input("new-secret-33")
    at.text_input(key=f"people_pw2_{rev_id}").input("other-secret-33")
    click(at, f"people_set_password_{rev_id}")
    assert "The two passwords differ; nothing was saved." in [e.value for e in at.error]
    assert check_password(PASSWORD, users(engine)["rev"].password_hash)

    at.text_input(key=f"people_pw_{rev_id}").input("new-secret-33")
    at.text_input(key=f"people_pw2_{rev_id}").input("new-secret-33")
    click(at, f"people_set_password_{rev_id}")
    assert check_password("new-secret-33", users(engine)["rev"].password_hash)
    with Session(engine) as session:
        updates = session.exec(select(AuditEvent).where(AuditEvent.action == "user.update")).all()
    assert [e.actor for e in updates] == ["ana"] * 4
    assert updates[-1].after == {"role": "labeler", "active": True, "password": "changed"}


def test_an_admin_creates_an_api_key_sees_it_once_and_revokes_it(engine):
    from core.errors import Unauthorized
    from core.records.keys.api_keys import check_key
    from storage.tables import ApiKey

    at = open_people()
    at.text_input(key="people_key_name").input("support bot")
    at.selectbox(key="people_key_role").set_value("ingest")
    at.button(key="people_key_create").click()
    at.run()
    assert any("bound to a task" in e.value for e in at.error)  # an ingest key's task is chosen, never assumed
    at.selectbox(key="people_key_task").set_value(DEMO_TASK)
    at.button(key="people_key_create").click()
    at.run()
    [shown] = [c.value for c in at.code if c.value.startswith("tfg_")]
    assert check_key(engine, shown, "ingest", "posting traces").name == "support bot"
    [table] = [d.value for d in at.dataframe if "starts with" in d.value.columns]
    assert table[["name", "role", "writes to"]].values.tolist() == [["support bot", "ingest", DEMO_TASK]]
    assert shown not in table.to_string()  # the table shows a prefix, never the key
    with Session(engine) as session:
        assert session.exec(select(ApiKey)).one().key_hash != shown

    at.run()
    assert not [c.value for c in at.code if c.value.startswith("tfg_")]  # shown once
    at.button(key="people_key_revoke").click()
    at.run()
    with pytest.raises(Unauthorized):
        check_key(engine, shown, "read", "fetching a library")


def test_a_labeler_sees_keys_but_cannot_make_one(engine):
    add_user(engine, "boss", "admin", PASSWORD)
    add_user(engine, "lab", "labeler", PASSWORD, actor="boss")
    at = open_people(**as_person("lab"))
    assert not [b for b in at.button if b.key == "people_key_create"]


def test_admin_adds_a_person_of_the_provider_by_email_and_a_key_for_them_only_within_their_role(engine):
    add_user(engine, "ana", "admin", PASSWORD, actor="cli")
    at = open_people(**as_person("ana"))
    at.text_input(key="people_provider_email").input("Noa@Team.example")
    at.selectbox(key="people_provider_role").set_value("labeler")
    [submit] = [b for b in at.button if b.label == "Add person"]
    submit.click().run()
    assert not at.exception, [e.value for e in at.exception]
    noa = users(engine)["noa@team.example"]
    assert (noa.role, noa.email, noa.password_hash) == ("labeler", "noa@team.example", "")
    assert users_table(at).set_index("name").loc["noa@team.example", "signs in"] == "provider"

    at.text_input(key="people_key_name").input("noa's agent")
    at.selectbox(key="people_key_role").set_value("ingest")
    at.selectbox(key="people_key_task").set_value(DEMO_TASK)
    at.selectbox(key="people_key_person").set_value("noa@team.example")
    at.button(key="people_key_create").click().run()
    assert any("noa@team.example is a labeler; an ingest key needs a reviewer or above" in e.value for e in at.error)
    with Session(engine) as session:
        assert session.exec(select(ApiKey)).all() == []
    at.selectbox(key="people_key_role").set_value("read")
    at.button(key="people_key_create").click().run()
    with Session(engine) as session:
        [key] = session.exec(select(ApiKey)).all()
    assert (key.role, key.person) == ("read", "noa@team.example")
