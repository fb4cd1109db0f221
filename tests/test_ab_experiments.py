"""A/B experiments (core/records/production/ab_experiments.py, ab_verdict.py): a split starts an experiment with fixed arms;
only traces sent after its start, by the version their user's arm serves, count; a label move ends it and starts the
next; the guard stops a worse candidate's split (ab.stopped) and announces a better one (ab.decided), whose verdict a
promotion carries; `core ab --status --json` answers for users served through the API."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlmodel import Session, select

from api.app import create_app
from core.cli import main
from core.domain.sequential import ArmScores, verdict
from core.jobs.worker import guarding
from core.records.keys.api_keys import create_key
from core.records.library.versions import PRODUCTION, import_library, promote, set_label
from core.records.production.ab_experiments import BEFORE_START, CANDIDATE, NO_USER, served_arm
from core.records.production.ab_verdict import ab_status, experiment_scores, guard_experiments
from core.records.production.serving import served_library, set_ab_split
from core.records.production.traces import TraceIn, ingest_traces
from core.records.tasks.demos import DEMO_TASK
from storage import queries
from storage.db import make_engine
from storage.tables import AbExperiment, AuditEvent, Library, Trace
from tests.test_webhooks import endpoint, one_event, receiver  # noqa: F401  (the fixture)

SHARE = 0.5


@pytest.fixture
def split(engine, demo_task):
    """Production #1 and candidate #2, the split serving the candidate to half the users."""
    production = import_library(engine, DEMO_TASK, "- Re-read the question.", "a.md", actor="system")
    set_label(engine, DEMO_TASK, str(production.number), PRODUCTION, "system")
    candidate = import_library(engine, DEMO_TASK, "- Check the units.", "b.md", actor="system")
    set_label(engine, DEMO_TASK, str(candidate.number), "candidate", "system")
    set_ab_split(engine, DEMO_TASK, "default", "candidate", SHARE, "cli")
    return production, candidate


def library_of(engine) -> Library:
    with Session(engine) as session:
        return queries.library_by_name(session, queries.task_by_name(session, DEMO_TASK).id, "default")


def users(engine, arm: str, count: int, prefix: str = "u") -> list[str]:
    """User ids the split serves `arm` (the serving hash, as the API computes it)."""
    library = library_of(engine)
    found = [f"{prefix}{i}" for i in range(1000) if served_arm(library.id, SHARE, f"{prefix}{i}") == arm]
    return found[:count]


def post(engine, rows: list[dict]) -> None:
    ingest_traces(engine, [TraceIn(task=DEMO_TASK, input=f"question {row['id']}", **row) for row in rows])


def status(engine, **kwargs):
    with Session(engine) as session:
        return ab_status(session, DEMO_TASK, "default", **kwargs)


def open_experiments(engine) -> list[AbExperiment]:
    with Session(engine) as session:
        return list(session.exec(select(AbExperiment).where(AbExperiment.ended_at.is_(None))))


def test_an_experiment_counts_only_traces_sent_after_its_start_by_the_version_their_users_arm_serves(engine, split):
    production, candidate = split
    [experiment] = open_experiments(engine)
    assert (experiment.production_version_id, experiment.candidate_version_id) == (production.id, candidate.id)
    ours, theirs = users(engine, PRODUCTION, 12), users(engine, CANDIDATE, 12)
    earlier = datetime.now(UTC) - timedelta(days=1)
    post(engine, [{"id": f"p{i}", "user_id": user, "version_id": production.id, "score": 0.25}
                  for i, user in enumerate(ours)]
         + [{"id": f"c{i}", "user_id": user, "version_id": candidate.id, "score": 0.75}
            for i, user in enumerate(theirs)]
         + [{"id": "old", "user_id": theirs[0], "version_id": candidate.id, "score": 0.0, "created_at": earlier},
            {"id": "claims-candidate", "user_id": ours[0], "version_id": candidate.id, "score": 1.0},
            {"id": "claims-production", "user_id": theirs[1], "label": PRODUCTION, "score": 0.0},
            {"id": "no-user", "version_id": candidate.id, "score": 1.0}])
    found = status(engine)
    assert found.experiment == experiment.id and found.running
    assert {arm["arm"]: (arm["version"], arm["users"], arm["scored traces"], arm["mean per user"])
            for arm in found.arms} == {PRODUCTION: (f"#{production.number}", 12, 12, 0.25),
                                       CANDIDATE: (f"#{candidate.number}", 12, 12, 0.75)}
    assert found.excluded == {BEFORE_START: 1, NO_USER: 1,
                              "names another version than the production arm serves its user": 1,
                              "names another version than the candidate arm serves its user": 1}
    assert found.verdict.difference == pytest.approx(0.5) and found.verdict.decided
    with Session(engine) as session:  # flagged, not refused: every trace is stored
        assert len(session.exec(select(Trace)).all()) == 28


def test_a_label_move_ends_the_experiment_and_the_next_ignores_the_version_its_arm_no_longer_serves(engine, split):
    production, candidate = split
    theirs = users(engine, CANDIDATE, 12)
    post(engine, [{"id": f"c{i}", "user_id": user, "version_id": candidate.id, "score": 1.0}
                  for i, user in enumerate(theirs)])
    [first] = open_experiments(engine)
    newer = import_library(engine, DEMO_TASK, "- Check the units twice.", "c.md", actor="system")
    set_label(engine, DEMO_TASK, str(newer.number), "candidate", "ada")
    with Session(engine) as session:
        ended = session.get(AbExperiment, first.id)
        actions = [e.action for e in session.exec(select(AuditEvent).where(
            AuditEvent.object_type == "abexperiment").order_by(AuditEvent.id))]
    assert ended.ended_at is not None
    assert ended.end_reason == f"candidate moved from #{candidate.number} to #{newer.number} by ada"
    assert actions == ["ab.start", "ab.end", "ab.start"]
    [second] = open_experiments(engine)
    assert second.candidate_version_id == newer.id and second.production_version_id == production.id
    # a user of the candidate arm still on the cached #2: stored, not counted in the new experiment
    post(engine, [{"id": "stale", "user_id": theirs[0], "version_id": candidate.id, "score": 0.0},
                  {"id": "fresh", "user_id": theirs[1], "version_id": newer.id, "score": 0.5}])
    now = status(engine)
    assert now.experiment == second.id
    assert {arm["arm"]: arm["scored traces"] for arm in now.arms} == {PRODUCTION: 0, CANDIDATE: 1}
    assert now.excluded == {"names another version than the candidate arm serves its user": 1}
    before = status(engine, experiment_id=first.id)  # the ended one keeps its traces
    assert {arm["arm"]: arm["scored traces"] for arm in before.arms}[CANDIDATE] == 12 and not before.running
    # moving a label onto the version its arm already serves changes nothing
    set_label(engine, DEMO_TASK, str(newer.number), "candidate", "ada")
    assert [e.id for e in open_experiments(engine)] == [second.id]
    set_ab_split(engine, DEMO_TASK, "default", None, 0.0, "cli")
    assert open_experiments(engine) == []
    assert status(engine).end_reason == "the split was turned off by cli"


def test_the_guard_stops_a_worse_candidates_split_and_says_so(engine, split, receiver):  # noqa: F811
    production, candidate = split
    secret = endpoint(engine, receiver, events=["ab.stopped"])
    ours, theirs = users(engine, PRODUCTION, 40), users(engine, CANDIDATE, 40)
    post(engine, [{"id": f"p{i}", "user_id": user, "version_id": production.id, "thumbs": "up"}
                  for i, user in enumerate(ours)]
         + [{"id": f"c{i}", "user_id": user, "version_id": candidate.id, "thumbs": "down" if i % 5 else "up"}
            for i, user in enumerate(theirs)])
    assert status(engine).verdict.worse
    done = guard_experiments(engine)
    assert len(done) == 1 and "stopped" in done[0]
    assert guard_experiments(engine) == []  # once
    library = library_of(engine)
    assert (library.ab_label, library.ab_share) == (None, None)
    with Session(engine) as session:
        assert served_library(session, DEMO_TASK, user_id=theirs[0]).version_id == production.id
        actions = {e.action for e in session.exec(select(AuditEvent).where(AuditEvent.actor == "A/B guard"))}
    assert actions == {"ab.stopped", "library.ab_split"}
    ended = status(engine)
    assert not ended.running and ended.end_reason.startswith("stopped by the guard")
    payload = one_event(engine, receiver, secret, "ab.stopped")
    data = payload["data"]
    assert data["decided"] is True and data["high"] < 0 and data["candidate_version"] == f"#{candidate.number}"
    assert data["link"].endswith("/production?task=arithmetic+word+problems&library=default")


def test_a_better_candidate_is_announced_once_and_promoting_it_carries_the_verdict(engine, split):
    production, candidate = split
    ours, theirs = users(engine, PRODUCTION, 40), users(engine, CANDIDATE, 40)
    post(engine, [{"id": f"p{i}", "user_id": user, "version_id": production.id, "thumbs": "down" if i % 5 else "up"}
                  for i, user in enumerate(ours)]
         + [{"id": f"c{i}", "user_id": user, "version_id": candidate.id, "thumbs": "up"}
            for i, user in enumerate(theirs)])
    assert len(guard_experiments(engine)) == 1 and guard_experiments(engine) == []
    [experiment] = open_experiments(engine)
    assert experiment.decided["decided"] is True and experiment.decided["low"] > 0
    assert library_of(engine).ab_label == "candidate"  # a better candidate is not stopped
    promote(engine, candidate.id, "cli", reason="the A/B experiment decided")
    with Session(engine) as session:
        move = session.exec(select(AuditEvent).where(AuditEvent.action == "label.move")
                            .order_by(AuditEvent.id.desc())).first()
        ended = session.get(AbExperiment, experiment.id)
    assert move.after["ab"]["experiment"] == experiment.id and move.after["ab"]["promoted_candidate"] is True
    assert move.after["ab"]["verdict"]["low"] == experiment.decided["low"] == ended.final["low"]
    assert move.after["ab"]["decided_by_guard"]["decided"] is True
    assert ended.end_reason.startswith(f"production moved from #{production.number} to #{candidate.number}")
    # both labels now point at the candidate: the split stays on, but no experiment compares #N with #N (issue 62)
    assert open_experiments(engine) == [] and library_of(engine).ab_label == "candidate"
    assert status(engine).experiment == experiment.id and not status(engine).running  # the page shows the ended one


def test_a_decision_made_once_is_still_shown_after_later_data_would_have_unmade_it(engine, split, capsys,
                                                                                   database_url):
    """Issue 60: the verdict was recomputed at every read, so a declaration the webhook had announced could vanish
    from the page. The guard stores the first decision with its figures and time; the page, `ab --status` and the
    webhook read that record, and the interval now is shown beside it."""
    production, candidate = split
    ours, theirs = users(engine, PRODUCTION, 300), users(engine, CANDIDATE, 300)
    post(engine, [{"id": f"p{i}", "user_id": user, "version_id": production.id, "thumbs": "down" if i % 5 else "up"}
                  for i, user in enumerate(ours[:40])]
         + [{"id": f"c{i}", "user_id": user, "version_id": candidate.id, "thumbs": "up"}
            for i, user in enumerate(theirs[:40])])
    assert len(guard_experiments(engine)) == 1
    decided = status(engine)
    # 260 more users an arm, the candidate now the worse one: read alone, this moment shows no better candidate
    post(engine, [{"id": f"p{i}", "user_id": user, "version_id": production.id, "thumbs": "up"}
                  for i, user in enumerate(ours[40:], start=40)]
         + [{"id": f"c{i}", "user_id": user, "version_id": candidate.id, "thumbs": "down" if i % 3 else "up"}
            for i, user in enumerate(theirs[40:], start=40)])
    with Session(engine) as session:
        experiment = open_experiments(engine)[0]
        scores = experiment_scores(session, experiment).by_user
    assert not verdict(ArmScores.of_users(scores[PRODUCTION]), ArmScores.of_users(scores[CANDIDATE])).better
    later = status(engine)
    assert later.verdict == decided.verdict and later.verdict.better and later.decided_at is not None
    assert later.live is not None and later.live.difference < decided.verdict.difference
    assert "when it was decided" in later.words and "Promote it" in later.words
    assert guard_experiments(engine) == []  # nothing announced or stopped again
    code = main(["--db", database_url, "ab", "--task", DEMO_TASK, "--status", "--json"])
    figures = json.loads(capsys.readouterr().out)
    assert code == 0 and figures["decided"] is True and figures["low"] == round(decided.verdict.low, 4)
    assert figures["decided_at"] and figures["now"]["difference"] == round(later.live.difference, 4)


def test_ab_status_json_for_users_served_through_the_api(engine, split, capsys, database_url):
    """Users fetch `production` with `&user=ID`; each trace is posted with the version its user was served."""
    production, candidate = split
    read = create_key(engine, "agent-read", "read", "cli").secret
    ingest = create_key(engine, "agent-ingest", "ingest", "cli", any_task=True).secret
    app = create_app(engine)
    reader = TestClient(app, headers={"Authorization": f"Bearer {read}"})
    writer = TestClient(app, headers={"Authorization": f"Bearer {ingest}"})
    served = {f"user-{i}": reader.get(f"/v1/tasks/{DEMO_TASK}/libraries/default",
                                      params={"label": "production", "user": f"user-{i}"}).json() for i in range(60)}
    traces = [{"id": f"t{i}", "task": DEMO_TASK, "version_id": body["version_id"], "user_id": user,
               "input": f"question {i}", "thumbs": "up" if body["arm"] == "candidate" or i % 2 else "down"}
              for i, (user, body) in enumerate(served.items())]
    answered = writer.post("/v1/traces", json={"traces": traces})
    assert answered.status_code == 200 and answered.json() == {"stored": 60, "duplicates": 0,
                                                               "outside_experiment": []}
    ours = next(user for user, body in served.items() if body["arm"] == PRODUCTION)
    claims = writer.post("/v1/traces", json={"traces": [  # a trace naming the version the user's arm does not serve
        {"id": "claims", "task": DEMO_TASK, "version_id": candidate.id, "user_id": ours, "input": "q"}]})
    assert claims.json() == {"stored": 1, "duplicates": 0, "outside_experiment": [
        {"id": "claims", "reason": "names another version than the production arm serves its user"}]}
    code = main(["--db", database_url, "ab", "--task", DEMO_TASK, "--status", "--json"])
    figures = json.loads(capsys.readouterr().out)
    assert code == 0
    arms = {arm["arm"]: arm for arm in figures["arms"]}
    counts = {arm: sum(1 for body in served.values() if (body["arm"] or PRODUCTION) == arm)
              for arm in (PRODUCTION, CANDIDATE)}
    assert {arm: (row["users"], row["scored traces"]) for arm, row in arms.items()} == {
        arm: (count, count) for arm, count in counts.items()}  # one trace per user here
    assert figures["unit"] == "user" and "more_users_needed" in figures
    assert figures["excluded"] == {"names another version than the production arm serves its user": 1}
    assert arms[CANDIDATE]["version"] == f"#{candidate.number}" and arms[CANDIDATE]["mean per user"] == 1.0
    assert figures["difference"] == pytest.approx(1.0 - arms[PRODUCTION]["mean per user"], abs=1e-3)
    assert figures["low"] < figures["difference"] < figures["high"]
    assert figures["decided"] is (figures["low"] > 0 or figures["high"] < 0)
    code = main(["--db", database_url, "ab", "--task", DEMO_TASK, "--status"])
    out = capsys.readouterr().out
    assert code == 0 and f"#{candidate.number}" in out and "anytime-valid" in out and "decided:" in out
    assert "users" in out and "traces" in out and "each user counted once" in out


NEUTRAL = (0.25, 0.75)  # each ordinary user's two scored traces: a mean of 0.5, in both arms alike


def neutral_traces(users_of_arm: list[str], version_id: int, prefix: str) -> list[dict]:
    return [{"id": f"{prefix}{i}-{k}", "user_id": user, "version_id": version_id, "score": score}
            for i, user in enumerate(users_of_arm) for k, score in enumerate(NEUTRAL)]


def test_one_heavy_user_with_many_good_traces_does_not_decide_the_experiment(engine, split):
    """The split randomises users, so a user is one observation: 200 traces scored 1.0 from one candidate user, among
    15 users an arm who otherwise score alike, are one user of mean 1.0, not 200 independent wins (counted per trace,
    as before, the candidate was "decided better" at about +0.4)."""
    production, candidate = split
    ours, theirs = users(engine, PRODUCTION, 15), users(engine, CANDIDATE, 15)
    heavy = theirs[0]
    post(engine, neutral_traces(ours, production.id, "p") + neutral_traces(theirs[1:], candidate.id, "c")
         + [{"id": f"heavy{i}", "user_id": heavy, "version_id": candidate.id, "score": 1.0} for i in range(200)])
    found = status(engine)
    arms = {arm["arm"]: arm for arm in found.arms}
    assert {arm: (row["users"], row["scored traces"]) for arm, row in arms.items()} == {
        PRODUCTION: (15, 30), CANDIDATE: (15, 228)}
    assert arms[CANDIDATE]["mean per user"] == pytest.approx((14 * 0.5 + 1.0) / 15, abs=1e-4)
    assert found.verdict.difference == pytest.approx(0.5 / 15, abs=1e-4)
    assert found.verdict.low < 0 < found.verdict.high and not found.verdict.decided
    assert "15 and 15 users, from 228 and 30 scored traces" in found.words
    assert guard_experiments(engine) == []
    [experiment] = open_experiments(engine)
    assert experiment.decided is None


def test_the_same_per_user_data_decides_when_many_users_show_the_effect(engine, split, receiver):  # noqa: F811
    """Every candidate user behaving like the heavy user above (all traces 1.0) is an effect across users: decided
    better, announced once, and the webhook names users beside traces."""
    production, candidate = split
    secret = endpoint(engine, receiver, events=["ab.decided"])
    ours, theirs = users(engine, PRODUCTION, 15), users(engine, CANDIDATE, 15)
    post(engine, neutral_traces(ours, production.id, "p")
         + [{"id": f"c{i}-{k}", "user_id": user, "version_id": candidate.id, "score": 1.0}
            for i, user in enumerate(theirs) for k in range(4)])
    found = status(engine)
    assert found.verdict.better and found.verdict.difference == pytest.approx(0.5)
    assert len(guard_experiments(engine)) == 1 and guard_experiments(engine) == []
    data = one_event(engine, receiver, secret, "ab.decided")["data"]
    assert data["users"] == {PRODUCTION: 15, CANDIDATE: 15} and data["scored"] == {PRODUCTION: 30, CANDIDATE: 60}
    assert data["decided"] is True and data["low"] > 0


def test_no_verdict_before_each_arm_has_ten_users_however_many_traces_they_send(engine, split):
    production, candidate = split
    ours, theirs = users(engine, PRODUCTION, 9), users(engine, CANDIDATE, 9)
    post(engine, [{"id": f"p{i}-{k}", "user_id": user, "version_id": production.id, "score": 0.0}
                  for i, user in enumerate(ours) for k in range(10)]
         + [{"id": f"c{i}-{k}", "user_id": user, "version_id": candidate.id, "score": 1.0}
            for i, user in enumerate(theirs) for k in range(10)])
    found = status(engine)
    assert found.verdict.low is None and not found.verdict.decided
    assert "not enough users yet (9 and 9 users, from 90 and 90 scored traces" in found.words


def test_the_worker_runs_the_guard_beside_its_jobs(engine, split):
    """core.jobs.worker.guarding: the worker's background pass is what stops a worse split without anyone looking."""
    production, candidate = split
    ours, theirs = users(engine, PRODUCTION, 40), users(engine, CANDIDATE, 40)
    post(engine, [{"id": f"p{i}", "user_id": user, "version_id": production.id, "thumbs": "up"}
                  for i, user in enumerate(ours)]
         + [{"id": f"c{i}", "user_id": user, "version_id": candidate.id, "thumbs": "down"}
            for i, user in enumerate(theirs)])
    with guarding(engine, every=0.05):
        deadline = time.monotonic() + 30
        while open_experiments(engine) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert open_experiments(engine) == [] and library_of(engine).ab_label is None


def test_a_split_already_on_becomes_an_experiment_that_starts_at_the_migration(tmp_path):
    """Migration 0019: traces from before it were counted under whatever the labels pointed at, so the split's first
    experiment starts at the upgrade, with the versions the labels point at then."""
    from tests.test_migrations import upgrade_to

    engine = make_engine(f"sqlite:///{tmp_path / 'before.db'}", migrate=False)
    upgrade_to(engine, "0018")
    now = "2026-11-01 00:00:00"
    with engine.begin() as connection:
        for sql in (
            "INSERT INTO task (id, name, description, instructions, answer_format, reward_method, reward_settings, "
            f"policy_model, learner_model, judge_model, agent_mode, created_at) VALUES (1, 't', '', '', '', 'exact', "
            f"'{{}}', 'm', 'm', 'm', 'direct', '{now}')",
            f"INSERT INTO library (id, task_id, name, created_at, ab_label, ab_share) VALUES (1, 1, 'default', '{now}', "
            "'candidate', 0.2), (2, 1, 'other', '" + now + "', 'gone', 0.5)",
            *(f"INSERT INTO libraryversion (id, library_id, number, experiences, source, note, created_by, created_at) "
              f"VALUES ({n}, 1, {n}, '[]', 'import', '', 'x', '{now}')" for n in (1, 2)),
            f"INSERT INTO librarylabel (library_id, name, version_id, moved_by, moved_at) VALUES "
            f"(1, 'production', 1, 'x', '{now}'), (1, 'candidate', 2, 'x', '{now}'), (2, 'production', 1, 'x', '{now}')"):
            connection.execute(text(sql))
    upgrade_to(engine, "0019")
    with Session(engine) as session:
        [experiment] = session.exec(select(AbExperiment)).all()  # library 2's split names a label it lacks
    assert (experiment.library_id, experiment.candidate_label, experiment.share) == (1, "candidate", 0.2)
    assert (experiment.production_version_id, experiment.candidate_version_id) == (1, 2)
    assert experiment.ended_at is None and experiment.started_by == "migration 0019"


def test_moving_production_during_an_experiment_says_so_before_confirm(engine, split):
    """Issue 62: moving production on the Library page while an experiment ran said nothing of it."""
    from core.records.production.ab_verdict import running_experiment_note

    production, candidate = split
    other = import_library(engine, DEMO_TASK, "- Something else.", "c.md", actor="system")
    with Session(engine) as session:
        to_candidate = running_experiment_note(session, DEMO_TASK, "default", candidate.id)
        elsewhere = running_experiment_note(session, DEMO_TASK, "default", other.id)
    assert to_candidate.startswith("A/B experiment 1 is running") and "audit record" in to_candidate
    assert "ends it before its candidate is promoted or stopped" in elsewhere
    set_ab_split(engine, DEMO_TASK, "default", None, 0.0, "cli")
    with Session(engine) as session:
        assert running_experiment_note(session, DEMO_TASK, "default", candidate.id) is None
