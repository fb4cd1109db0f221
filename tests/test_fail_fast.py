"""Fail fast where the failure is known (issue 41): an address where nothing answers (a refused connection, a host
name that does not resolve) is not retried, the gateway stops sending there, and an evaluation or a run on it ends
in seconds with that reason and Retry offered; the forms warn when a connection's last Test failed, and start
from the last model that answered. And no second job by accident: an evaluation or a run identical to one already
queued or running is refused with the one to follow, in core, so the pages, the CLI and the API all say it."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from sqlmodel import Session, col, select

from bench.stub_server import StubServer
from core.cli import main
from core.errors import DuplicateJob, ModelUnreachable
from core.grpo.evaluation import create_evaluation, execute_evaluation
from core.grpo.training import create_run, execute_run
from core.jobs.run_control import cancel_evaluation
from core.models.gateway import Gateway
from core.models.openai_http import REFUSED, UNRESOLVED
from core.records.library.versions import import_library
from core.records.models.connections import add_connection, failed_test_warning, try_connection
from core.records.runs.settings import RunSettings
from core.records.tasks.demos import DEMO_TASK
from core.records.tasks.lookup import get_task
from storage import queries
from storage.db import url_with_password
from storage.tables import Evaluation, LLMCall, ModelConnection, Run
from tests.ui_support import run_app, scripted_gateway


def closed_port() -> int:
    """A port nothing listens on: bound, then closed."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def ledger(engine) -> list[LLMCall]:
    with Session(engine) as session:
        return list(session.exec(select(LLMCall).order_by(col(LLMCall.id))))


def ask(gateway: Gateway, model: str, text: str = "What is 2 + 2?"):
    return gateway.complete(stage="rollout", model=model, messages=[{"role": "user", "content": text}], max_tokens=8)


def test_a_refused_connection_is_not_retried_and_the_gateway_stops_sending_there(engine):
    add_connection(engine, "down", "openai", base_url=f"http://127.0.0.1:{closed_port()}/v1", actor="cli")
    gateway = Gateway(engine, max_retries=5, backoff_s=2.0)  # a transient error would wait seconds per retry
    started = time.monotonic()
    with pytest.raises(ModelUnreachable, match=REFUSED):
        asyncio.run(ask(gateway, "down/m"))
    with pytest.raises(ModelUnreachable, match="was not sent"):
        asyncio.run(ask(gateway, "down/m", "Another question"))
    took = time.monotonic() - started
    (row,) = ledger(engine)  # one request, one row: the second call sent nothing
    assert row.attempts == 1 and row.error.startswith(REFUSED + ", not retried") and row.connection == "down"
    assert took < 2, took
    assert REFUSED in gateway.unreachable()


def test_a_host_name_that_does_not_resolve_is_not_retried(engine):
    add_connection(engine, "nowhere", "openai", base_url="http://no-such-host.invalid/v1", actor="cli")
    gateway = Gateway(engine, max_retries=5, backoff_s=2.0)
    with pytest.raises(ModelUnreachable, match=UNRESOLVED):
        asyncio.run(ask(gateway, "nowhere/m"))
    assert [row.attempts for row in ledger(engine)] == [1]


def test_a_refusal_through_litellm_is_read_through_its_wrapping(engine):
    """litellm calls a refused connection an InternalServerError or APIConnectionError (both transient): the
    socket's refusal under it decides."""
    add_connection(engine, "lite", "litellm", provider="hosted_vllm", base_url=f"http://127.0.0.1:{closed_port()}/v1",
                   actor="cli")
    gateway = Gateway(engine, max_retries=5, backoff_s=2.0)
    with pytest.raises(ModelUnreachable, match=REFUSED):
        asyncio.run(ask(gateway, "lite/m"))
    assert [row.attempts for row in ledger(engine)] == [1]


def refused_evaluation(engine, version: str = "empty", k: int = 4) -> tuple[Evaluation, float]:
    """An evaluation of the demo task's test split on a connection whose port is closed, and its seconds."""
    add_connection(engine, "down", "openai", base_url=f"http://127.0.0.1:{closed_port()}/v1", actor="cli")
    evaluation_id = create_evaluation(engine, DEMO_TASK, version, k=k, model="down/m", created_by="cli")
    started = time.monotonic()
    evaluation = execute_evaluation(engine, evaluation_id)  # the gateway's default retries and deadline
    return evaluation, time.monotonic() - started


def test_an_evaluation_on_a_closed_port_ends_incomplete_with_connection_refused_in_seconds(engine, demo_task):
    evaluation, took = refused_evaluation(engine)
    print(f"\nevaluation of {evaluation.progress['rollouts_total']} rollouts on a closed port ended "
          f"{evaluation.status} in {took:.2f} s")
    assert evaluation.status == "incomplete"
    assert evaluation.error.startswith("nothing answered at the model's address") and REFUSED in evaluation.error
    assert f"--retry {evaluation.id}" in evaluation.error
    assert evaluation.metrics["errors"] == evaluation.progress["rollouts_total"] >= 16
    assert took < 10, took
    rows = ledger(engine)  # requests only until the refusal was known: at most one per concurrency slot
    assert rows and len(rows) <= Gateway(engine).concurrency and all(row.attempts == 1 for row in rows)


def test_a_run_on_a_closed_port_fails_in_seconds_with_the_reason_first_and_resumes(engine, demo_task):
    add_connection(engine, "down", "openai", base_url=f"http://127.0.0.1:{closed_port()}/v1", actor="cli")
    run_id = create_run(engine, DEMO_TASK, RunSettings(epochs=1, batch_size=2, group_size=2, limit=2,
                                                       policy_model="down/m", learner_model="down/m"))
    started = time.monotonic()
    run = execute_run(engine, run_id)
    took = time.monotonic() - started
    assert run.status == "failed" and run.error.startswith("nothing answered at a model's address"), run.error
    assert REFUSED in run.error and "resume the run" in run.error
    assert took < 10, took


@pytest.fixture
def app(app_engine):
    return app_engine


def test_after_a_refused_evaluation_the_form_offers_the_last_model_that_answered_and_compare_skips_it(app):
    """The Evaluate page of a new session (a reload) pre-selects the model of the newest evaluation that answered,
    not the dead one, and Compare's default B is never an evaluation nothing answered."""
    older = import_library(app, DEMO_TASK, "- Re-read the question.", "lib.md").number
    newer = import_library(app, DEMO_TASK, "- Re-read the question.\n- Check the units.", "lib2.md").number
    answered = []
    for version in ("empty", str(older)):
        evaluation_id = create_evaluation(app, DEMO_TASK, version, k=1, limit=3, created_by="test")
        answered.append(execute_evaluation(app, evaluation_id, gateway=scripted_gateway(app)[1]))
    assert all(ev.status == "completed" for ev in answered)
    refused, _took = refused_evaluation(app, str(newer), k=1)  # the newest evaluation, of the newest version
    assert refused.status == "incomplete"
    with Session(app) as session:
        policy = get_task(session, DEMO_TASK).policy_model
        library = queries.library_by_name(session, get_task(session, DEMO_TASK).id, "default")
        task_id = get_task(session, DEMO_TASK).id

    at = run_app(page="pages/evaluate.py", session_state={"ctx_reviewer": "alice"})
    model_box = at.selectbox(key=f"eval_model_{task_id}_{library.id}")
    assert model_box.value == answered[-1].model == policy != "down/m"
    assert (at.selectbox(key="eval_compare_a").value, at.selectbox(key="eval_compare_b").value) == (
        answered[0].id, answered[1].id)
    assert refused.id not in at.selectbox(key="eval_compare_b").options
    warning = next(w.value for w in at.warning if f"Evaluation {refused.id} is incomplete" in w.value)
    assert "connection refused" in warning
    assert at.button(key=f"eval_retry_{refused.id}").label.startswith("Retry the failed rollouts")


def test_the_forms_warn_when_the_chosen_connections_last_test_failed(app):
    port = closed_port()
    add_connection(app, "down", "openai", base_url=f"http://127.0.0.1:{port}/v1", actor="cli")
    with Session(app) as session:
        assert failed_test_warning(session, "down/m") is None  # never tested: nothing to say
    assert not try_connection(app, "down", "m", timeout_s=5).ok
    with Session(app) as session:
        said = failed_test_warning(session, "down/m")
        assert failed_test_warning(session, "local/qwen2.5-coder-0.5b") is None
    assert said.startswith("The last Test of connection down (down/m, ") and REFUSED in said, said

    at = run_app(page="pages/evaluate.py", session_state={"ctx_reviewer": "alice", "eval_model": "down/m"})
    assert any(w.value.startswith("The last Test of connection down") for w in at.warning)
    at = run_app(page="pages/train.py", session_state={"ctx_reviewer": "alice"})
    assert not any(w.value.startswith("The last Test of connection down") for w in at.warning)
    at = run_app(page="pages/train.py", session_state={"ctx_reviewer": "alice", "train_policy_model": "down/m"})
    assert at.selectbox(key="train_policy_model").value == "down/m"
    assert any(w.value.startswith("The last Test of connection down") for w in at.warning)


def test_an_answer_through_the_connection_since_its_failed_test_ends_the_warning(engine):
    add_connection(engine, "flaky", "openai", base_url=f"http://127.0.0.1:{closed_port()}/v1", actor="cli")
    assert not try_connection(engine, "flaky", "stub", timeout_s=5).ok
    with StubServer() as stub:
        with Session(engine) as session:
            assert failed_test_warning(session, "flaky/stub") is not None
            connection = session.exec(select(ModelConnection)).one()
            connection.base_url = stub.url
            session.add(connection)
            session.commit()
        asyncio.run(ask(Gateway(engine), "flaky/stub"))
    with Session(engine) as session:
        assert failed_test_warning(session, "flaky/stub") is None


def test_an_identical_evaluation_already_queued_is_refused_with_the_one_to_follow(engine, demo_task):
    first = create_evaluation(engine, DEMO_TASK, "empty", k=2, limit=3)
    with pytest.raises(DuplicateJob, match=f"evaluation {first} .* already queued") as refused:
        create_evaluation(engine, DEMO_TASK, "empty", k=2, limit=3)
    assert (refused.value.kind, refused.value.existing_id) == ("evaluation", first)
    other_k = create_evaluation(engine, DEMO_TASK, "empty", k=3, limit=3)  # a different job is queued
    cancel_evaluation(engine, first, "cli")
    again = create_evaluation(engine, DEMO_TASK, "empty", k=2, limit=3)  # the first is over: queue it again
    with Session(engine) as session:
        assert [ev.id for ev in queries.evaluations(session)] == [again, other_k, first]


def test_the_cli_refuses_a_second_identical_evaluation_and_names_the_first(engine, demo_task, capsys):
    argv = ["--db", url_with_password(engine), "eval", "--task", DEMO_TASK, "--version", "empty", "--k", "2",
            "--limit", "3", "--queue"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert main(argv) == 2
    said = capsys.readouterr()
    with Session(engine) as session:
        (queued,) = queries.evaluations(session)
    assert f"evaluation {queued.id} queued" in first
    assert f"evaluation {queued.id}" in said.err + said.out and "nothing new was queued" in said.err + said.out


def test_an_identical_run_already_queued_is_refused_and_train_points_at_it(app):
    at = run_app(page="pages/train.py", session_state={"ctx_reviewer": "alice"})
    at.button(key="train_submit").click().run()
    assert not at.exception, [e.value for e in at.exception]
    with Session(app) as session:
        (run,) = session.exec(select(Run)).all()
    at.button(key="train_submit").click().run()  # a double click, or Start run again in the same settings
    assert not at.exception, [e.value for e in at.exception]
    with Session(app) as session:
        assert [r.id for r in session.exec(select(Run)).all()] == [run.id]
    assert any(f"run {run.id} with the same settings is already queued" in e.value.replace("\\", "")  # as shown
               for e in at.error), \
        [e.value for e in at.error]
    assert at.session_state["train_run"] == run.id  # Runs below shows the run already queued


def test_two_tabs_sending_the_same_evaluation_at_once_queue_it_once(engine, demo_task):
    """The task is held while a job is queued, so two requests at the same moment are queued one after the other
    and the second sees the first."""
    import threading

    start = threading.Barrier(4)
    outcomes: list[object] = []

    def send() -> None:
        start.wait()
        try:
            outcomes.append(create_evaluation(engine, DEMO_TASK, "empty", k=2, limit=3))
        except DuplicateJob as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=send) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    queued = [o for o in outcomes if isinstance(o, int)]
    assert len(queued) == 1 and all(o.existing_id == queued[0] for o in outcomes if isinstance(o, DuplicateJob))
    with Session(engine) as session:
        assert [ev.id for ev in queries.evaluations(session)] == queued
