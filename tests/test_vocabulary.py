"""One home per concept: settings read once and honoured, auto approvals audited, errors mapped to exit codes,
and no status spelled as a bare string outside storage/statuses.py."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from sqlmodel import Session, select

from core import cli
from core.errors import (
    AlreadyDecided,
    Conflict,
    InvalidInput,
    ModelCallError,
    NotFound,
    PermissionDenied,
    exit_code,
)
from core.grpo.training import create_run, execute_run
from core.records.runs.settings import RunSettings
from core.records.tasks.demos import DEMO_TASK
from core.settings import get_settings
from storage.db import url_with_password
from storage.statuses import GroupStatus, JobStatus, LabelStatus, OperationStatus, StepStatus, WorkerStatus
from storage.tables import AuditEvent, Operation, Run
from tests.conftest import mixed_rollouts

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def concurrency_7(monkeypatch):
    monkeypatch.setenv("TFGRPO_CONCURRENCY", "7")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def test_concurrency_variable_sets_a_runs_default(engine, demo_task, concurrency_7):
    run_id = create_run(engine, DEMO_TASK, RunSettings(epochs=1, limit=2))
    with Session(engine) as session:
        assert session.get(Run, run_id).settings["concurrency"] == 7


def test_concurrency_variable_reaches_the_cli_and_the_gateway_of_the_run(engine, demo_task, concurrency_7, tmp_path,
                                                                         monkeypatch, scripted):
    url = url_with_password(engine)
    assert cli.main(["--db", url, "train", "--task", DEMO_TASK, "--limit", "2", "--epochs", "1", "--queue"]) == 0
    with Session(engine) as session:
        run = session.exec(select(Run)).one()
    assert run.settings["concurrency"] == 7
    seen = {}
    import core.grpo.training as training

    real = training.Gateway

    def spy(engine, **kwargs):
        seen.update(kwargs)
        _model, gateway = scripted(engine)
        return gateway

    monkeypatch.setattr(training, "Gateway", spy)
    execute_run(engine, run.id)
    assert seen["concurrency"] == 7
    assert real is not spy


def test_an_explicit_concurrency_beats_the_variable(engine, demo_task, concurrency_7):
    assert RunSettings(concurrency=2).concurrency == 2


def test_bad_run_settings_name_the_field():
    with pytest.raises(InvalidInput, match="group size"):
        RunSettings.build(group_size=0)
    with pytest.raises(InvalidInput, match="review mode"):
        RunSettings.build(review_mode="sometimes")


def test_every_auto_approved_operation_is_an_audit_event(engine, demo_task, scripted):
    _model, gateway = scripted(engine, rollout=mixed_rollouts())
    run_id = create_run(engine, DEMO_TASK, RunSettings(epochs=1, batch_size=2, group_size=2, limit=2, seed=0))
    run = execute_run(engine, run_id, gateway=gateway)
    assert run.status == JobStatus.COMPLETED, run.error
    with Session(engine) as session:
        ops = session.exec(select(Operation).where(Operation.run_id == run_id)).all()
        events = session.exec(select(AuditEvent).where(AuditEvent.action == "operation.approve")).all()
    assert ops and all(op.status == OperationStatus.APPLIED for op in ops)
    assert sorted(e.object_id for e in events) == sorted(op.id for op in ops)
    assert {e.actor for e in events} == {"auto"}


@pytest.mark.parametrize(("error", "code"), [
    (NotFound("no task"), 2), (InvalidInput("bad"), 2), (Conflict("busy"), 2), (AlreadyDecided("taken"), 2),
    (PermissionDenied("no"), 2), (ModelCallError("down"), 1), (ValueError("x"), 2), (RuntimeError("x"), 1),
])
def test_exit_codes_come_from_the_error_class(error, code):
    assert exit_code(error) == code


def test_cli_reports_a_missing_task_in_one_line(engine, capsys):
    assert cli.main(["--db", url_with_password(engine), "dataset", "show", "--task", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no task named 'nope'") and err.count("\n") == 1


STATUS_WORDS = {str(s) for enum in (JobStatus, StepStatus, OperationStatus, GroupStatus, LabelStatus, WorkerStatus)
                for s in enum}


def _status_literals(path: Path) -> list[str]:
    """Bare status strings where a status is read or written: `x.status == "..."`, `status="..."`,
    `x.status in ("...",)`, `x.status = "..."`, `label_status`, and the same for `.get("...")` on counters."""
    found = []
    tree = ast.parse(path.read_text())

    def literal(node) -> list[str]:
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in STATUS_WORDS:
            return [node.value]
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return [v for elt in node.elts for v in literal(elt)]
        return []

    def is_status(node) -> bool:
        name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
        return name in ("status", "label_status", "shown", "health")

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and (is_status(node.left) or any(is_status(c) for c in node.comparators)):
            for side in (node.left, *node.comparators):
                found += [f"{path.relative_to(ROOT)}:{node.lineno}: {v}" for v in literal(side)]
        elif isinstance(node, ast.keyword) and node.arg in ("status", "label_status"):
            found += [f"{path.relative_to(ROOT)}:{node.value.lineno}: {v}" for v in literal(node.value)]
        elif isinstance(node, ast.Assign) and any(is_status(t) for t in node.targets):
            found += [f"{path.relative_to(ROOT)}:{node.lineno}: {v}" for v in literal(node.value)]
    return found


def test_no_status_is_spelled_outside_its_home():
    files = [p for d in ("core", "storage", "pages") for p in (ROOT / d).rglob("*.py") if "migrations" not in p.parts]
    files.append(ROOT / "streamlit_app.py")
    found = [hit for path in files for hit in _status_literals(path)]
    assert found == [], "use storage.statuses instead of bare strings:\n" + "\n".join(found)
