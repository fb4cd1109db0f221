"""The Notifications page (AppTest): an administrator adds a webhook and sees its secret once, tests it against a
real receiver, reads the delivery log and replays a failed delivery; a person without the admin role sees none
of it."""

from __future__ import annotations

import pytest
from sqlmodel import Session, select
from standardwebhooks import Webhook

from core.records.notifications import webhooks
from core.records.people.users import add_user
from core.settings import get_settings
from storage.db import session_scope
from storage.tables import WebhookDelivery
from tests.test_webhooks import Receiver
from tests.ui_support import click, markdown_texts, run_app
from ui.common import AUTH_KEY, REVIEWER_KEY

PAGE = "pages/notifications.py"


@pytest.fixture
def receiver(app_engine, monkeypatch):
    monkeypatch.setenv("TFGRPO_WEBHOOK_ALLOWLIST", "127.0.0.1")
    monkeypatch.setenv("TFGRPO_WEBHOOK_MAX_ATTEMPTS", "1")
    get_settings.cache_clear()
    found = Receiver()
    yield found
    found.close()
    get_settings.cache_clear()


def test_an_admin_adds_tests_reads_the_log_and_replays(app_engine, receiver):
    at = run_app(page=PAGE)
    at.text_input(key="notifications_add_name").input("team-chat")
    at.text_input(key="notifications_add_url").input(receiver.url)
    click(at, "FormSubmitter:notifications_add_form-Add webhook")
    [said] = [s.value for s in at.success]
    secret = said.split("`")[1]
    assert secret.startswith("whsec_") and "shown this once" in said
    click(at, "notifications_test_team-chat")
    assert Webhook(secret).verify(receiver.got[0][1], receiver.got[0][0])["type"] == "webhook.test"
    assert any("Test: delivered (HTTP 204, attempt 1)." in s.value for s in at.success)
    assert all(secret not in text for text in markdown_texts(at))  # shown once, never again
    [log] = [df.value for df in at.dataframe]
    assert list(log["status"]) == ["delivered"] and list(log["code"]) == [204]

    receiver.mode = "error"
    with session_scope(app_engine) as session:
        webhooks.raise_event(session, "run.failed", "Run 7 failed", {"run": 7})
    webhooks.deliver_due(app_engine, "test")
    at.run()
    [log] = [df.value for df in at.dataframe]
    assert list(log["status"])[:1] == ["failed"] and "HTTP 500; gave up after 1 attempts" in log["what happened"][0]
    [notice] = [w.value for w in at.warning if "given up" in w.value]  # a test's failure raised none; this does
    assert "1 webhook delivery was given up: the newest, run.failed to team-chat" in notice
    receiver.mode = "ok"
    assert at.selectbox(key="notifications_replay").value == int(log["id"][0])  # the failed one is offered first
    click(at, "notifications_replay_button")
    webhooks.deliver_due(app_engine, "test")
    at.run()
    [log] = [df.value for df in at.dataframe]
    assert list(log["status"]) == ["delivered", "failed", "delivered"]
    assert receiver.verified(secret)[-1]["text"] == "Run 7 failed"
    assert not [w.value for w in at.warning if "given up" in w.value]  # replayed: its notice has done its work


def test_a_person_without_the_admin_role_sees_no_webhook(app_engine, receiver):
    add_user(app_engine, "ada", "admin", "password1")
    add_user(app_engine, "rev", "reviewer", "password1")
    webhooks.add_endpoint(app_engine, "team-chat", receiver.url, "ada")
    at = run_app(page=PAGE, session_state={REVIEWER_KEY: "rev", AUTH_KEY: "rev"})
    assert any("needs the admin role" in i.value for i in at.info)
    assert not at.dataframe and not [b for b in at.button if b.key and b.key.startswith("notifications_")]
    with Session(app_engine) as session:
        assert session.exec(select(WebhookDelivery)).all() == []


def test_the_link_of_a_step_awaiting_review_opens_that_run_and_step(app_engine, receiver):
    import urllib.parse

    from streamlit.testing.v1 import AppTest

    from tests.ui_support import APP, seeded_run

    secret = webhooks.add_endpoint(app_engine, "team-chat", receiver.url, "cli")[1]
    older = seeded_run(app_engine, "manual", settings={"gate": "off"})
    run_id = seeded_run(app_engine, "manual", settings={"gate": "off"})
    webhooks.deliver_due(app_engine, "test")
    links = [p["data"]["link"] for p in receiver.verified(secret) if p["data"].get("run") == older]
    link = urllib.parse.urlsplit(links[0])
    assert link.path == "/review" and run_id != older
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    at.switch_page(f"pages/{link.path.strip('/')}.py")
    for name, value in urllib.parse.parse_qsl(link.query):
        at.query_params[name] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    step = dict(urllib.parse.parse_qsl(link.query))["step"]
    assert (at.selectbox(key="review_run").value, at.selectbox(key="review_step").value) == (older, int(step))
