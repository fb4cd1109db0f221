"""The production loop on the command line: API keys, labelling rules, traces per day, an A/B split,
harvest and an update from production, each with a clear message on bad input."""

from __future__ import annotations

import pytest
from sqlmodel import Session, select

from core.records.keys.api_keys import check_key
from core.records.library.versions import import_library, set_label
from core.records.production.traces import TraceIn, ingest_traces
from core.records.tasks.demos import DEMO_TASK
from storage import queries
from storage.db import get_engine
from storage.tables import Run, Trace
from tests.test_cli import db, run  # noqa: F401  (the fixture)


@pytest.fixture
def traced(db):  # noqa: F811
    engine = get_engine(db)
    version = import_library(engine, DEMO_TASK, "- Re-read the question.", "a.md", actor="system")
    set_label(engine, DEMO_TASK, str(version.number), "production", "system")
    ingest_traces(engine, [TraceIn(id=str(i), task=DEMO_TASK, version_id=version.id, input=f"production question {i}",
                                   score=score) for i, score in enumerate([0.0, 0.2, 0.9, 1.0])])
    return db, engine, version


def test_apikey_create_list_revoke(db, capsys):  # noqa: F811
    code, out, err = run(capsys, "--db", db, "apikey", "create", "--name", "bot", "--role", "ingest", "--any-task")
    secret = out.split(": ", 1)[1].strip()
    assert code == 0 and "only time the key is shown" in err
    engine = get_engine(db)
    assert check_key(engine, secret, "ingest", "posting traces").name == "bot"
    code, out, _ = run(capsys, "--db", db, "apikey", "list")
    assert "bot" in out and "ingest" in out and secret not in out
    assert run(capsys, "--db", db, "apikey", "revoke", "1")[0] == 0
    assert "no" not in run(capsys, "--db", db, "apikey", "list")[1].splitlines()[1].split()[-1]
    code, _, err = run(capsys, "--db", db, "apikey", "create", "--name", "", "--role", "read")
    assert code == 2 and "needs a name" in err


def test_traces_rules_ab_harvest_and_an_update_from_production(traced, capsys):
    url, engine, version = traced
    code, out, _ = run(capsys, "--db", url, "traces", "--task", DEMO_TASK)
    assert code == 0 and f"#{version.number} " in out and "(id " not in out and "0.525 [" in out
    assert "lowest scored:" in out and "production question 0" in out

    assert run(capsys, "--db", url, "production-rules", "--task", DEMO_TASK, "--below", "0.5")[0] == 0
    code, _, err = run(capsys, "--db", url, "production-rules", "--task", DEMO_TASK, "--share", "3")
    assert code == 2 and "from 0 to 1" in err

    candidate = import_library(engine, DEMO_TASK, "- Check units.", "b.md", actor="system")
    set_label(engine, DEMO_TASK, str(candidate.number), "candidate", "system")
    code, out, _ = run(capsys, "--db", url, "ab", "--task", DEMO_TASK, "candidate", "--share", "0.1")
    assert code == 0 and "10% of users get 'candidate'" in out
    with Session(engine) as session:
        library = queries.library_by_name(session, queries.task_by_name(session, DEMO_TASK).id, "default")
    assert (library.ab_label, library.ab_share) == ("candidate", 0.1)
    assert run(capsys, "--db", url, "ab", "--task", DEMO_TASK, "--off")[0] == 0

    code, out, _ = run(capsys, "--db", url, "harvest", "--task", DEMO_TASK, "--max-score", "0.5")
    assert code == 0 and out.startswith("added 2 train samples")
    code, _, err = run(capsys, "--db", url, "harvest", "--task", DEMO_TASK, "--since", "last week")
    assert code == 2 and "not a date" in err

    code, out, _ = run(capsys, "--db", url, "train", "--task", DEMO_TASK, "--from-production", "--queue")
    assert code == 0
    with Session(engine) as session:
        queued = session.exec(select(Run)).one()
    assert queued.start_version_id == version.id and queued.settings["old_share"] == 0.3


def test_a_bound_key_from_the_cli_and_held_spans_landing_with_traces_map_service(traced, capsys):
    from core.domain.otlp_spans import decode_spans
    from core.records.production.otlp import ingest_spans
    from tests.otlp_support import chat_span, sdk_request

    url, engine, _ = traced
    code, out, _ = run(capsys, "--db", url, "apikey", "create", "--name", "shop", "--role", "ingest", "--task", DEMO_TASK)
    assert code == 0 and f"writes to task {DEMO_TASK}" in out
    assert f"{DEMO_TASK}" in run(capsys, "--db", url, "apikey", "list")[1].splitlines()[1]
    code, _, err = run(capsys, "--db", url, "apikey", "create", "--name", "loose", "--role", "ingest")
    assert code == 2 and "--any-task" in err
    ingest_spans(engine, decode_spans(sdk_request(lambda tracer: chat_span(tracer, "held question"),
                                                  resource={"service.name": "shop-agent"})))
    code, out, _ = run(capsys, "--db", url, "traces", "held")
    assert code == 0 and "shop-agent" in out
    code, out, _ = run(capsys, "--db", url, "traces", "map-service", "--service", "shop-agent", "--task", DEMO_TASK)
    assert code == 0 and "1 held span(s) landed" in out
    with Session(engine) as session:
        landed = session.exec(select(Trace).where(Trace.input == "held question")).one()
    assert landed.meta["otlp"]["service"] == "shop-agent"
    assert "no OpenTelemetry span is held" in run(capsys, "--db", url, "traces", "held")[1]
