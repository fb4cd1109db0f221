"""A labeller in a real browser labels with one key per rollout: three, after which the run goes on,
and ten pressed back to back, none lost and none counted twice.

The waiting run is made beforehand with scripted replies (so the test does not wait for the model to
write answers); from the labels on, everything is the live studio: Streamlit, the worker process and
Chromium. In the first test the labels differ, so the worker continues with the embedded model's
summaries; the second needs no worker.
"""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import expect
from sqlmodel import Session, select

from core.grpo.training import RunSettings, create_run, execute_run
from core.records.people.users import add_user
from core.records.review.labeling import ACCEPTED
from core.records.tasks.demos import DEMO_TASK
from storage.db import make_engine, session_scope
from storage.tables import RewardLabel, Rollout, Run, Task
from tests.browser_support import (
    browser_page,
    expect_focus_in,
    expect_stored,
    require_chromium,
    screenshot,
    studio,
    wait_for_app,
)
from tests.ui_support import scripted_gateway

pytestmark = pytest.mark.browser



def waiting_run(database_url: str, queries: int = 1) -> int:
    """A run of `queries` queries x G=3 on a human-labelled 1-5 scale, stopped at awaiting_labels."""
    engine = make_engine(database_url)
    with session_scope(engine) as session:
        task = session.exec(select(Task).where(Task.name == DEMO_TASK)).one()
        task.reward_method, task.reward_settings = "human", {"scale": "1-5"}
        session.add(task)
    add_user(engine, "lab", "labeler", "lab-password")
    settings = RunSettings(epochs=1, batch_size=queries, group_size=3, limit=queries)
    run_id = create_run(engine, DEMO_TASK, settings, created_by="cli")
    _model, gateway = scripted_gateway(engine)
    assert execute_run(engine, run_id, gateway=gateway).status == "awaiting_labels"
    return run_id


def status_of(database_url: str, run_id: int) -> str:
    with Session(make_engine(database_url)) as session:
        return session.get(Run, run_id).status


def test_a_labeller_signs_in_labels_three_rollouts_by_keyboard_and_the_run_continues(tmp_path):
    require_chromium()
    with studio(tmp_path) as app:
        run_id = waiting_run(app.database_url)  # before Playwright: its event loop would stop asyncio.run
        with browser_page() as page:
            label_and_watch(page, app, run_id)


def sign_in_and_open_labeling(page, app) -> None:
    page.goto(app.url)
    page.get_by_label("User name").fill("lab")
    page.get_by_role("textbox", name="Password").fill("lab-password")
    page.get_by_role("button", name="Sign in").click()
    wait_for_app(page)
    page.locator("[data-testid='stSidebarNav']").get_by_role("link", name="Labeling", exact=True).click()
    wait_for_app(page)


def shown_rollout(page) -> int:
    """The rollout on screen, from its caption `Rollout N · ...`: awaited until one shows, and taken from the
    same look at the page that found it."""
    return page.wait_for_function(
        """() => {
            const main = document.querySelector("[data-testid='stMain']");
            const found = main && main.innerText.match(/Rollout (\\d+) · /);
            return found ? Number(found[1]) : false;
        }""").json_value()


def ready(page, rollout_id: int) -> None:
    """Until the line under this rollout's score buttons shows (the buttons keep their place from rollout to
    rollout and are drawn for it just before): what a fast person waits for before pressing, no more."""
    page.locator("[data-testid='stMain']").get_by_text(f"Keys for rollout {rollout_id}:").first.wait_for(
        state="visible")


def next_shown(page, before: int) -> int | None:
    """Once the page has moved past `before`: the rollout now shown, or None when none is left (both from the
    look at the page that saw it move, not a second read)."""
    return page.wait_for_function(
        """before => {
            const main = document.querySelector("[data-testid='stMain']");
            if (!main) return false;
            if (main.innerText.includes('Nothing waiting for you')) return {shown: null};
            const found = main.innerText.match(/Rollout (\\d+) · /);
            return found && Number(found[1]) !== before ? {shown: Number(found[1])} : false;
        }""", arg=before).json_value()["shown"]


def label_and_watch(page, app, run_id: int) -> None:
    sign_in_and_open_labeling(page, app)
    page.get_by_text("You: 0 done; 3 left for you").first.wait_for()
    wait_for_app(page)
    screenshot(page, "labeling")

    page.locator("h1").first.click()  # focus out of any input: keys go to the page
    shown, current = [], shown_rollout(page)
    for key in ("4", "1", "5"):
        shown.append(current)
        ready(page, current)
        page.keyboard.press(key)
        current = next_shown(page, current)
    page.get_by_text("Nothing waiting for you").first.wait_for()
    assert current is None and len(set(shown)) == 3, shown  # each key moved on to the next rollout
    with Session(make_engine(app.database_url)) as session:
        labels = session.exec(select(RewardLabel).order_by(RewardLabel.id)).all()
    assert [(label.rollout_id, label.labeler, label.value) for label in labels] == [
        (shown[0], "lab", 0.75), (shown[1], "lab", 0.0), (shown[2], "lab", 1.0)]

    for _ in range(120):  # the worker claims the run once its batch is labelled
        if status_of(app.database_url, run_id) not in ("awaiting_labels", "queued"):
            break
        page.wait_for_timeout(500)
    assert status_of(app.database_url, run_id) in ("running", "completed")
    page.locator("[data-testid='stSidebarNav']").get_by_role("link", name="Train", exact=True).click()
    wait_for_app(page)
    page.get_by_text("Status:").first.wait_for()
    expect(page.get_by_text("awaiting_labels")).to_have_count(0)
    screenshot(page, "train-after-labels")


# ---- ten labels, keys only, back to back -------------------------------------------------------------------


SCORES = {"1": 0.0, "2": 0.25, "3": 0.5, "4": 0.75, "5": 1.0}
KEYS = ("5", "1", "4", "A", "2", "3", "5", "4", "1", "3")  # A: the rollout with the judge's suggestion
COMMENTED = 1  # the second label goes with a comment: typed, Tab out of the box, then the digit
COMMENT = "the total is wrong"


def suggest(database_url: str, rollout_id: int, value: float) -> None:
    """A judge's suggestion on one rollout (the human method asks no judge), so A has something to accept."""
    with session_scope(make_engine(database_url)) as session:
        row = session.get(Rollout, rollout_id)
        row.suggested_reward, row.suggested_detail = value, "judge 4/5: names the total"
        session.add(row)


def queued_ids(database_url: str) -> list[int]:
    with Session(make_engine(database_url)) as session:
        return list(session.exec(select(Rollout.id).where(Rollout.label_status == "needed").order_by(Rollout.id)))


def test_ten_labels_pressed_back_to_back_are_all_kept_once_on_the_right_rollout(tmp_path):
    require_chromium()
    with studio(tmp_path, worker=False) as app:
        waiting_run(app.database_url, queries=4)  # 4 queries x G=3 = 12 rollouts wait
        queued = queued_ids(app.database_url)
        assert len(queued) == 12
        suggest(app.database_url, queued[KEYS.index("A")], 0.75)
        with browser_page() as page:
            pressed, seconds = label_ten_by_keys(page, app)
    with Session(make_engine(app.database_url)) as session:
        labels = session.exec(select(RewardLabel).order_by(RewardLabel.id)).all()
    assert [(label.rollout_id, label.value) for label in labels] == pressed
    assert [label.comment for label in labels] == [COMMENT if i == COMMENTED else ACCEPTED if key == "A" else ""
                                                   for i, key in enumerate(KEYS)]
    assert len({label.rollout_id for label in labels}) == 10 and {label.labeler for label in labels} == {"lab"}
    assert [rollout_id for rollout_id, _ in pressed] == queued[:10]  # the queue's order, none skipped
    print(f"\nten labels by keys: {seconds / 10:.2f} s per label on average ({seconds:.1f} s in all)")


def label_ten_by_keys(page, app) -> tuple[list[tuple[int, float]], float]:
    """Press KEYS, one per rollout, each as soon as the next rollout's buttons show; (rollout, value) as
    pressed, and the seconds from the first key to the page after the tenth (less the screenshot's)."""
    sign_in_and_open_labeling(page, app)
    page.get_by_text("You: 0 done; 12 left for you").first.wait_for()
    wait_for_app(page)
    page.locator("h1").first.click()  # focus out of any input: keys go to the page
    pressed, current, paused = [], shown_rollout(page), 0.0
    started = time.monotonic()
    for index, key in enumerate(KEYS):
        ready(page, current)
        if index == COMMENTED:
            page.locator(f".st-key-label_comment_{current} input").type(COMMENT)
            page.keyboard.press("Tab")
        if key == "A":
            page.locator(".st-key-label_accept button").first.wait_for(state="visible")
            paused = time.monotonic()
            screenshot(page, "labeling_keys")  # the rubric's anchors, the judge's suggestion and its key
            paused = time.monotonic() - paused
        page.keyboard.press(key)
        pressed.append((current, 0.75 if key == "A" else SCORES[key]))
        current = next_shown(page, current)
    page.get_by_text("You: 10 done; 2 left for you").first.wait_for()
    return pressed, time.monotonic() - started - paused


# ---- disputes: each decision is made on its own rollout (issue 25) -----------------------------------------


def disputed_rollouts(database_url: str, count: int = 3, users: bool = True) -> list[int]:
    """`count` rollouts of a 1-5 human-labelled run that two labellers scored 5 and 1 (disputed), and a
    reviewer `rev` who settles them; the run waits for nothing but the reviewer. Without `users` the studio
    keeps no accounts, so it runs without sign-in."""
    from core.records.review.labeling import submit_label

    engine = make_engine(database_url)
    with session_scope(engine) as session:
        task = session.exec(select(Task).where(Task.name == DEMO_TASK)).one()
        task.reward_method, task.reward_settings = "human", {"scale": "1-5", "labels_per_rollout": 2}
        session.add(task)
    for name, role in (("alma", "labeler"), ("bert", "labeler"), ("rev", "reviewer")) if users else ():
        add_user(engine, name, role, f"{name}-password")
    run_id = create_run(engine, DEMO_TASK, RunSettings(epochs=1, batch_size=1, group_size=count, limit=1),
                        created_by="cli")
    _model, gateway = scripted_gateway(engine)
    assert execute_run(engine, run_id, gateway=gateway).status == "awaiting_labels"
    ids = queued_ids(database_url)
    for rollout_id in ids:
        submit_label(engine, rollout_id, 1.0, "alma")
        submit_label(engine, rollout_id, 0.0, "bert")
    with Session(engine) as session:
        assert [session.get(Rollout, i).label_status for i in ids] == ["disputed"] * count
    return ids


def decisions(database_url: str) -> list[tuple[int, float, str]]:
    with Session(make_engine(database_url)) as session:
        rows = session.exec(select(RewardLabel).where(RewardLabel.kind == "decision").order_by(RewardLabel.id)).all()
        return [(row.rollout_id, row.value, row.comment) for row in rows]


def agreement_tab(page):
    """The Agreement tab's panel (the one tab panel on screen once it is chosen)."""
    return page.locator("[data-testid='stMain'] [role='tabpanel']:visible")


def test_a_dispute_decided_leaves_nothing_behind_for_the_next_one(tmp_path):
    """After Decide, the next dispute opens empty: no score chosen, no reason typed, the picker on it; a press
    of Decide right away stores nothing (it stored the previous dispute's score and reason)."""
    require_chromium()
    with studio(tmp_path, worker=False) as app:
        first, second, third = disputed_rollouts(app.database_url)
        with browser_page() as page:
            page.goto(app.url)
            page.get_by_label("User name").fill("rev")
            page.get_by_role("textbox", name="Password").fill("rev-password")
            page.get_by_role("button", name="Sign in").click()
            wait_for_app(page)
            page.locator("[data-testid='stSidebarNav']").get_by_role("link", name="Labeling", exact=True).click()
            wait_for_app(page)
            page.get_by_role("tab", name="Agreement").click()
            wait_for_app(page)
            panel = agreement_tab(page)
            picker = panel.get_by_role("combobox", name="Rollout to decide")
            expect(picker).to_have_value(re.compile(rf"^Rollout {first} ·"))
            panel.locator("[data-testid='stRadio'] label").filter(has_text="4 ·").click()
            wait_for_app(page)
            reason = panel.get_by_label("Reason (optional)")
            reason.fill("partly right")
            reason.press("Tab")
            wait_for_app(page)
            panel.get_by_role("button", name="Decide").click()
            expect_stored(lambda: decisions(app.database_url), [(first, 0.75, "partly right")])

            page.wait_for_function(f"() => !document.querySelector(\"[data-testid='stMain']\").innerText"
                                   f".includes('Rollout {first} · reward now')")
            wait_for_app(page)
            screenshot(page, "labeling_next_dispute")
            expect(picker).to_have_value(re.compile(rf"^Rollout {second} ·"))
            expect(panel.locator("[data-testid='stRadio'] input:checked")).to_have_count(0)
            expect(panel.get_by_label("Reason (optional)")).to_have_value("")
            panel.get_by_role("button", name="Decide").click()
            wait_for_app(page)
            page.get_by_text("Choose the final score before deciding").first.wait_for()
            assert decisions(app.database_url) == [(first, 0.75, "partly right")]  # nothing for the second


# ---- focus after a text field (issue 25) ----------------------------------------------------------------------


def labels_written(database_url: str) -> list[tuple[int, float, str, str]]:
    with Session(make_engine(database_url)) as session:
        rows = session.exec(select(RewardLabel).order_by(RewardLabel.id)).all()
        return [(row.rollout_id, row.value, row.comment, row.kind) for row in rows]


def test_tab_out_of_a_comment_lands_on_no_score_and_enter_there_labels_nothing(tmp_path):
    """Tab out of the comment box put the focus on score 1, so Enter labelled 1; it must land on something
    harmless, from which the digit pressed next still labels with the comment."""
    require_chromium()
    with studio(tmp_path, worker=False) as app:
        waiting_run(app.database_url)
        with browser_page() as page:
            sign_in_and_open_labeling(page, app)
            page.get_by_text("You: 0 done; 3 left for you").first.wait_for()
            wait_for_app(page)
            current = shown_rollout(page)
            ready(page, current)
            comment = page.locator(f".st-key-label_comment_{current} input")
            comment.fill("names the total")
            comment.press("Tab")
            wait_for_app(page)
            expect_focus_in(page, f".st-key-label_comment_stop_{current}")
            page.keyboard.press("Enter")
            page.wait_for_timeout(1500)
            wait_for_app(page)
            assert labels_written(app.database_url) == []
            page.keyboard.press("4")
            assert next_shown(page, current) != current
            expect_stored(lambda: labels_written(app.database_url), [(current, 0.75, "names the total", "label")])


def test_tab_out_of_a_dispute_reason_lands_on_no_decide_and_enter_there_decides_nothing(tmp_path):
    require_chromium()
    with studio(tmp_path, worker=False) as app:
        first, *_ = disputed_rollouts(app.database_url, count=2)
        with browser_page() as page:
            page.goto(app.url)
            page.get_by_label("User name").fill("rev")
            page.get_by_role("textbox", name="Password").fill("rev-password")
            page.get_by_role("button", name="Sign in").click()
            wait_for_app(page)
            page.locator("[data-testid='stSidebarNav']").get_by_role("link", name="Labeling", exact=True).click()
            wait_for_app(page)
            page.get_by_role("tab", name="Agreement").click()
            wait_for_app(page)
            panel = agreement_tab(page)
            panel.locator("[data-testid='stRadio'] label").filter(has_text="4 ·").click()
            wait_for_app(page)
            reason = panel.get_by_label("Reason (optional)")
            reason.fill("partly right")
            reason.press("Tab")
            wait_for_app(page)
            expect_focus_in(page, f".st-key-label_decide_stop_{first}")
            page.keyboard.press("Enter")
            page.wait_for_timeout(1500)
            wait_for_app(page)
            assert decisions(app.database_url) == []
            panel.get_by_role("button", name="Decide").click()
            expect_stored(lambda: decisions(app.database_url), [(first, 0.75, "partly right")])
