"""People and roles: hashed passwords, sign-in, and what each role may do, through core and through the pages."""

from __future__ import annotations

import pytest
from sqlmodel import Session, select

from core.domain.library import ProposedOp
from core.errors import PermissionDenied, SignInLocked
from core.grpo.training import RunSettings, create_run
from core.jobs.run_control import pause_run
from core.records.library.versions import edit_library, set_label
from core.records.people.passwords import check_password, hash_password
from core.records.people.roles import sign_in_required
from core.records.people.sign_in import authenticate
from core.records.people.users import add_user, update_user
from core.records.review.decisions import decide_operation, decide_step
from core.records.tasks.demos import DEMO_TASK
from core.records.tasks.lookup import ensure_library, get_task
from storage.db import session_scope
from storage.tables import AuditEvent, LibraryLabel, Operation, User
from tests.ui_support import run_app, seeded_run


@pytest.fixture
def people(engine, demo_task):
    """An admin, a reviewer and a labeller: sign-in is on from here."""
    for name, role in (("ada", "admin"), ("rex", "reviewer"), ("lab", "labeler")):
        add_user(engine, name, role, f"{name}-password")
    return engine


def pending(engine, run_id: int) -> list[Operation]:
    with Session(engine) as session:
        return list(session.exec(select(Operation).where(Operation.run_id == run_id, Operation.status == "pending")))


def test_passwords_are_stored_as_salted_hashes(engine):
    stored = hash_password("correct horse")
    assert stored.startswith("scrypt$") and "correct horse" not in stored
    assert stored != hash_password("correct horse")  # salted
    assert check_password("correct horse", stored) and not check_password("wrong horse", stored)
    assert not check_password("x", "not-a-hash")
    add_user(engine, "ann", "labeler", "secret-pass")
    with Session(engine) as session:
        user = session.exec(select(User)).one()
        events = session.exec(select(AuditEvent)).all()
    assert check_password("secret-pass", user.password_hash)
    assert all("secret-pass" not in str(e.after) and "hash" not in str(e.after) for e in events)
    assert authenticate(engine, "ann", "secret-pass").name == "ann"
    assert authenticate(engine, "ann", "wrong-pass") is None and authenticate(engine, "nobody", "x") is None


def test_sign_in_turns_on_with_the_first_user_and_names_are_checked(engine):
    with Session(engine) as session:
        assert not sign_in_required(session)
    for name, role, password, message in (("cli", "admin", "long-enough", "reserved"),
                                          ("a b", "admin", "long-enough", "user name"),
                                          ("ann", "boss", "long-enough", "unknown role"),
                                          ("ann", "admin", "short", "at least 8")):
        with pytest.raises(ValueError, match=message):
            add_user(engine, name, role, password)
    add_user(engine, "ann", "admin", "long-enough")
    with Session(engine) as session:
        assert sign_in_required(session)
    with pytest.raises(ValueError, match="exists already"):
        add_user(engine, "ann", "admin", "long-enough")


def test_a_labeller_cannot_approve_an_operation_through_core(people):
    run_id = seeded_run(people, "manual")
    op = pending(people, run_id)[0]
    with pytest.raises(PermissionDenied, match="lab is a labeler; deciding operations needs the reviewer role"):
        decide_operation(people, op.id, "approved", "lab")
    with pytest.raises(PermissionDenied):
        decide_step(people, op.step_id, "approved", "lab")
    assert [o.id for o in pending(people, run_id)] == [op.id]
    decide_operation(people, op.id, "approved", "rex")
    assert pending(people, run_id) == []


def test_roles_gate_library_edits_runs_production_and_users(people):
    with session_scope(people) as session:
        ensure_library(session, get_task(session, DEMO_TASK))
    with pytest.raises(PermissionDenied, match="editing libraries needs the reviewer role"):
        edit_library(people, DEMO_TASK, [ProposedOp("ADD", [], "Check the units of every quantity.", "")], "lab")
    version = edit_library(people, DEMO_TASK, [ProposedOp("ADD", [], "Check the units of every quantity.", "")], "rex")
    with pytest.raises(PermissionDenied, match="moving the production label needs the admin role"):
        set_label(people, DEMO_TASK, str(version.number), "production", "rex")
    set_label(people, DEMO_TASK, str(version.number), "candidate", "rex")
    set_label(people, DEMO_TASK, str(version.number), "production", "ada")
    with Session(people) as session:
        assert {label.name for label in session.exec(select(LibraryLabel))} == {"candidate", "production"}
    with pytest.raises(PermissionDenied, match="starting a run needs the reviewer role"):
        create_run(people, DEMO_TASK, RunSettings(limit=1), created_by="lab")
    run_id = create_run(people, DEMO_TASK, RunSettings(limit=1), created_by="rex")
    with pytest.raises(PermissionDenied):
        pause_run(people, run_id, "lab")
    with pytest.raises(PermissionDenied, match="adding users needs the admin role"):
        add_user(people, "eve", "admin", "long-enough", actor="rex")
    with pytest.raises(PermissionDenied, match="not a signed-in user"):
        decide_step(people, 1, "approved", "someone-else")
    update_user(people, "lab", "ada", active=False)
    with pytest.raises(PermissionDenied, match="not a signed-in user"):
        edit_library_as(people, "lab")


def edit_library_as(engine, actor: str) -> None:
    edit_library(engine, DEMO_TASK, [ProposedOp("ADD", [], "Re-read the question.", "")], actor)


def sign_in(at, name: str, password: str):
    at.text_input(key="sign_in_name").input(name)
    at.text_input(key="sign_in_password").input(password)
    at.button[0].click()
    return at.run()


def test_the_app_asks_for_sign_in_once_users_exist(app_engine):
    add_user(app_engine, "lab", "labeler", "lab-password")
    at = run_app()
    assert [t.value for t in at.title] == ["Sign in"]
    assert not at.sidebar.selectbox  # nothing of the studio before sign-in
    at = sign_in(at, "lab", "wrong-password")
    assert [e.value for e in at.error] == ["Wrong user name or password."]
    at = sign_in(at, "lab", "lab-password")
    assert not at.exception
    assert "Overview" in [t.value for t in at.title]
    assert "lab (labeler)" in [c.value for c in at.sidebar.code]
    with Session(app_engine) as session:
        actions = [e.action for e in session.exec(select(AuditEvent).order_by(AuditEvent.id))]
    assert actions[-2:] == ["user.sign_in_failed", "user.sign_in"]


def test_a_labeller_sees_no_decision_buttons_on_review_and_a_reviewer_does(app_engine):
    add_user(app_engine, "lab", "labeler", "lab-password")
    add_user(app_engine, "rex", "reviewer", "rex-password")
    seeded_run(app_engine, "manual")
    at = sign_in(run_app(), "lab", "lab-password")
    at.switch_page("pages/review.py").run()
    keys = [b.key for b in at.button]
    assert not any(k and (k.startswith("review_approve") or k.startswith("review_reject")) for k in keys)
    assert any("deciding operations needs the reviewer role" in i.value.lower() for i in at.info)

    at = sign_in(run_app(), "rex", "rex-password")
    at.switch_page("pages/review.py").run()
    assert "review_approve_all" in [b.key for b in at.button]


def test_without_users_the_single_local_user_is_shown_and_may_do_everything(app_engine):
    at = run_app()
    assert "No sign-in: single local user with every permission" in [c.value for c in at.sidebar.caption]
    at.switch_page("pages/evaluate.py").run()
    assert "eval_submit" in [b.key for b in at.button]


def test_the_first_user_from_a_page_is_an_admin_and_the_last_admin_stays(engine):
    with pytest.raises(ValueError, match="first user turns sign-in on, so it must be an admin"):
        add_user(engine, "lab", "labeler", "long-enough", actor="local")
    add_user(engine, "ada", "admin", "long-enough", actor="local")
    for change in ({"role": "reviewer"}, {"active": False}):
        with pytest.raises(ValueError, match="ada is the last active admin"):
            update_user(engine, "ada", "ada", **change)
    add_user(engine, "bea", "admin", "long-enough", actor="ada")
    update_user(engine, "ada", "bea", role="reviewer")
    with Session(engine) as session:
        assert {u.name: u.role for u in session.exec(select(User))} == {"ada": "reviewer", "bea": "admin"}


def test_repeated_failed_sign_ins_make_the_name_wait_a_while(engine, monkeypatch):
    from datetime import timedelta

    from core.records.people import sign_in

    add_user(engine, "ann", "admin", "right-password")
    assert authenticate(engine, "ann", "right-password").name == "ann"
    for _ in range(sign_in.MAX_FAILURES):
        assert authenticate(engine, "ann", "wrong-password") is None
    with pytest.raises(SignInLocked, match="too many failed sign-ins for this user name; try again in 30 s"):
        authenticate(engine, "ann", "right-password")  # even the right password waits
    assert authenticate(engine, "bob", "anything") is None  # other names do not wait
    monkeypatch.setattr(sign_in, "FIRST_WAIT", timedelta(seconds=0))  # as if the 30 seconds had passed
    assert authenticate(engine, "ann", "right-password").name == "ann"
