"""Production moves only through its guard (issue 25): by a core function or the command line, moving `production`
away from a version needs a paired comparison of the two versions or a written reason, the setting
promotion_requires_comparison makes the comparison mandatory, a candidate the comparison finds worse needs a reason,
and the audit event of the move holds the evidence and the reason. Other labels move freely."""

from __future__ import annotations

import pytest
from sqlmodel import Session, col, select

from core.cli import main
from core.errors import Conflict, InvalidInput
from core.grpo.evaluation import create_evaluation, execute_evaluation
from core.models.gateway import Gateway
from core.records.library.promotion import preview_promotion
from core.records.library.versions import PRODUCTION, _move_label, import_library, promote, set_label
from core.records.tasks.demo_data import demo_rows
from core.records.tasks.demos import DEMO_TASK
from core.settings import get_settings
from storage import queries
from storage.db import session_scope, url_with_password
from storage.tables import AuditEvent, LibraryVersion
from tests.conftest import ScriptedModel, default_replies

GOOD, GUESS = "Re-read the question.", "Guess the answer quickly."
REASON = "Hotfix: the old prompt leaks a customer's name; no time to evaluate."


@pytest.fixture
def versions(engine, demo_task) -> tuple[int, int]:
    """Version `GOOD` in production and a candidate `GUESS` beside it, neither evaluated."""
    current = import_library(engine, DEMO_TASK, f"- {GOOD}", "a.md", actor="system")
    set_label(engine, DEMO_TASK, str(current.number), PRODUCTION, "system")  # the first production needs nothing
    candidate = import_library(engine, DEMO_TASK, f"- {GUESS}", "b.md", actor="system")
    return current.id, candidate.id


def typed(engine, version_id: int) -> str:
    """The version as a person types it: its number in its library."""
    with Session(engine) as session:
        return str(session.get(LibraryVersion, version_id).number)


@pytest.fixture
def comparison_required(monkeypatch):
    monkeypatch.setenv("TFGRPO_PROMOTION_REQUIRES_COMPARISON", "1")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def evaluate(engine, version_id: int, right: bool) -> int:
    """A completed evaluation of the version on six test queries, every answer right or every answer wrong."""
    references = {row.query: row.reference for row in demo_rows()}

    def answer(messages: list[dict]) -> str:
        return f"so the answer is \\boxed{{{references[messages[1]['content']] if right else '-12345'}}}"

    gateway = Gateway(engine, concurrency=4, mock=ScriptedModel({**default_replies(), "rollout": answer}),
                      backoff_s=0.001)
    evaluation_id = create_evaluation(engine, DEMO_TASK, typed(engine, version_id), k=1, limit=6, created_by="system")
    assert execute_evaluation(engine, evaluation_id, gateway=gateway).status == "completed"
    return evaluation_id


def production(engine) -> int:
    with Session(engine) as session:
        library = queries.library_by_name(session, queries.task_by_name(session, DEMO_TASK).id, "default")
        return queries.label_by_name(session, library.id, PRODUCTION).version_id


def moves(engine) -> list[AuditEvent]:
    with Session(engine) as session:
        return list(session.exec(select(AuditEvent).where(AuditEvent.action == "label.move")
                                 .order_by(col(AuditEvent.id))))


def test_the_first_production_version_needs_no_comparison_and_says_so(engine, versions):
    [first] = moves(engine)
    assert first.after["version_id"] == versions[0] and first.after["reason"] is None
    assert first.after["evidence"].startswith("No version is in production yet")


@pytest.mark.parametrize("move", [
    lambda engine, version_id, **kw: set_label(engine, DEMO_TASK, typed(engine, version_id), PRODUCTION, "system", **kw),
    lambda engine, version_id, **kw: set_label(engine, DEMO_TASK, "latest", " production ", "system", **kw),
    lambda engine, version_id, **kw: promote(engine, version_id, "system", **kw),
], ids=["set_label", "set_label by ref", "promote"])
def test_without_comparison_a_move_needs_a_reason_which_the_audit_keeps(engine, versions, move):
    current, candidate = versions
    for reason in ("", "   "):
        with pytest.raises(InvalidInput, match="has no paired comparison with production #2; compare them first") as err:
            move(engine, candidate, reason=reason)
        assert "or give a reason for promoting without one" in str(err.value)
        assert f"python -m core compare --task '{DEMO_TASK}' {current} {candidate}" in str(err.value)
    assert production(engine) == current and len(moves(engine)) == 1  # nothing moved, nothing audited

    move(engine, candidate, reason=f"  {REASON} ")
    assert production(engine) == candidate
    event = moves(engine)[-1]
    assert event.before == {"version_id": current, "number": int(typed(engine, current))}
    assert event.after["reason"] == REASON and event.after["comparison"] is None
    assert event.after["evidence"].startswith("No paired comparison with production")


def test_with_a_paired_comparison_it_moves_and_the_audit_keeps_the_verdict(engine, versions):
    current, candidate = versions
    a, b = evaluate(engine, current, right=True), evaluate(engine, candidate, right=True)
    promote(engine, candidate, "system")
    assert production(engine) == candidate
    after = moves(engine)[-1].after
    assert after["reason"] is None and after["from_version_id"] == current
    assert after["comparison"]["evaluations"] == [a, b]
    assert (after["comparison"]["split"], after["comparison"]["k"], after["comparison"]["queries"]) == ("test", 1, 6)
    assert after["comparison"]["verdict"].startswith("no detectable difference on 6 queries")
    assert after["comparison"]["worse"] is False and after["evidence"].startswith(f"Against production (evaluation {a}")


def test_a_candidate_the_comparison_finds_worse_needs_a_reason(engine, versions):
    current, candidate = versions
    a, b = evaluate(engine, current, right=True), evaluate(engine, candidate, right=False)
    with pytest.raises(InvalidInput, match=f"the paired comparison \\(evaluation {a} vs {b}, test, k=1\\) finds "
                                           "version #3 worse than production #2") as err:
        set_label(engine, DEMO_TASK, typed(engine, candidate), PRODUCTION, "system")
    assert str(err.value).endswith("to promote it anyway, give a reason")
    assert production(engine) == current
    set_label(engine, DEMO_TASK, typed(engine, candidate), PRODUCTION, "system", reason=REASON)
    after = moves(engine)[-1].after
    assert production(engine) == candidate and after["reason"] == REASON
    assert after["comparison"]["worse"] is True and after["comparison"]["verdict"].startswith("B is worse: -1.000")


def test_a_comparison_that_cannot_decide_needs_a_reason():
    from dataclasses import replace

    from core.records.evaluation.comparison import EvaluationComparison, paired
    from core.records.library.promotion import PromotionPreview
    from storage.tables import Evaluation

    stats = replace(paired({1: [1.0], 2: [0.0]}, {1: [1.0], 2: [0.0]}), undecided="3 of 6 queries lack answers")
    comparison = EvaluationComparison(a=Evaluation(id=7, split="test", k=1), b=Evaluation(id=8, split="test", k=1),
                                      stats=stats)
    preview = PromotionPreview(version_id=3, version_number=3, production_id=2, production_number=2,
                               comparison=comparison)
    assert preview.needs_reason and not preview.blocked
    with pytest.raises(InvalidInput, match=r"\(evaluation 7 vs 8, test, k=1\) cannot decide \(3 of 6 queries lack"):
        preview.approve("")
    assert preview.approve(REASON).record["reason"] == REASON


def test_the_setting_makes_the_comparison_mandatory(engine, versions, comparison_required):
    current, candidate = versions
    with pytest.raises(InvalidInput, match="requires one before a promotion .*a reason is not enough"):
        set_label(engine, DEMO_TASK, typed(engine, candidate), PRODUCTION, "system", reason=REASON)
    with pytest.raises(InvalidInput, match="TFGRPO_PROMOTION_REQUIRES_COMPARISON"):
        promote(engine, candidate, "system", reason=REASON)
    assert production(engine) == current and len(moves(engine)) == 1
    evaluate(engine, current, right=True)
    evaluate(engine, candidate, right=True)
    promote(engine, candidate, "system")
    assert production(engine) == candidate and moves(engine)[-1].after["comparison"]["verdict"]


def test_other_labels_move_freely(engine, versions):
    current, candidate = versions
    set_label(engine, DEMO_TASK, typed(engine, candidate), "candidate", "system")
    set_label(engine, DEMO_TASK, typed(engine, current), "candidate", "system", reason="back to the old one")
    events = moves(engine)
    assert [e.after for e in events[1:]] == [{"name": "candidate", "version_id": candidate,
                                             "number": int(typed(engine, candidate))},
                                            {"name": "candidate", "version_id": current,
                                             "number": int(typed(engine, current)), "reason": "back to the old one"}]
    assert production(engine) == current


def test_the_label_moves_only_with_an_approval_of_the_production_it_replaces(engine, versions):
    current, candidate = versions
    with session_scope(engine) as session, pytest.raises(InvalidInput, match="only through promote"):
        _move_label(session, session.get(LibraryVersion, candidate), PRODUCTION, "system")
    approval = preview_promotion(engine, candidate).approve(REASON)
    other = import_library(engine, DEMO_TASK, "- Check the units.", "c.md", actor="system")
    promote(engine, other.id, "system", reason="meanwhile, someone else promoted")
    with session_scope(engine) as session, pytest.raises(Conflict, match="production was moved to version #4"):
        _move_label(session, session.get(LibraryVersion, candidate), PRODUCTION, "system", approval=approval)
    with session_scope(engine) as session, pytest.raises(InvalidInput, match="only through promote"):
        _move_label(session, session.get(LibraryVersion, other.id), PRODUCTION, "system", approval=approval)
    assert production(engine) == other.id


# ---------------------------------------------------------------------------------------------- command line


def cli(capsys, engine, *argv: str) -> tuple[int, str, str]:
    code = main(["--db", url_with_password(engine), *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_label_production_needs_a_comparison_or_a_reason(engine, versions, capsys):
    current, candidate = versions
    code, out, err = cli(capsys, engine, "label", "--task", DEMO_TASK, "--version", "latest", "production")
    assert code == 2 and out == ""
    assert err.startswith("error: production was not moved: version #3 has no paired comparison with production #2")
    assert "compare them first" in err and "or give a reason" in err and production(engine) == current
    code, out, _ = cli(capsys, engine, "label", "--task", DEMO_TASK, "--version", "latest", "production",
                       "--reason", REASON)
    assert code == 0 and out.strip() == "production -> version #3"
    assert production(engine) == candidate and moves(engine)[-1].after["reason"] == REASON
    assert moves(engine)[-1].actor == "cli"
    code, _, _ = cli(capsys, engine, "label", "--task", DEMO_TASK, "--version", str(current), "candidate")
    assert code == 0  # any other label: no guard


def test_cli_promote_shows_the_preview_and_is_guarded(engine, versions, capsys):
    current, candidate = versions
    code, out, _ = cli(capsys, engine, "promote", "--task", DEMO_TASK, "--version", str(candidate), "--dry-run")
    assert code == 0 and production(engine) == current
    assert "promote version #3 to production; production now: #2" in out
    assert f"- [E1] {GOOD}" in out and f"+ [E2] {GUESS}" in out
    assert "dry run: nothing moved; as given, promoting would be refused: version #3 has no paired comparison" in out
    code, out, _ = cli(capsys, engine, "promote", "--task", DEMO_TASK, "--version", str(candidate), "--dry-run",
                       "--reason", REASON)
    assert code == 0 and out.splitlines()[-1] == "dry run: nothing moved" and production(engine) == current

    code, _, err = cli(capsys, engine, "promote", "--task", DEMO_TASK, "--version", str(candidate))
    assert code == 2 and "compare them first" in err and "or give a reason" in err
    assert production(engine) == current and len(moves(engine)) == 1
    code, out, _ = cli(capsys, engine, "promote", "--task", DEMO_TASK, "--version", str(candidate), "--reason", REASON)
    assert code == 0 and out.splitlines()[-1] == "production -> version #3"
    assert moves(engine)[-1].after["reason"] == REASON


def test_cli_promote_with_a_comparison_records_it(engine, versions, capsys):
    current, candidate = versions
    a, b = evaluate(engine, current, right=True), evaluate(engine, candidate, right=True)
    code, out, _ = cli(capsys, engine, "promote", "--task", DEMO_TASK, "--version", "latest")
    assert code == 0 and f"Against production (evaluation {a} vs {b}, test, k=1)" in out
    assert production(engine) == candidate and moves(engine)[-1].after["comparison"]["evaluations"] == [a, b]


def test_cli_promote_with_the_setting_refuses_a_reason(engine, versions, capsys, comparison_required):
    current, candidate = versions
    code, _, err = cli(capsys, engine, "promote", "--task", DEMO_TASK, "--version", str(candidate), "--reason", REASON)
    assert code == 2 and "a reason is not enough" in err and production(engine) == current
    code, _, err = cli(capsys, engine, "label", "--task", DEMO_TASK, "--version", str(candidate), "production",
                       "--reason", REASON)
    assert code == 2 and "a reason is not enough" in err and production(engine) == current


def test_cli_promote_help(capsys):
    with pytest.raises(SystemExit) as info:
        main(["promote", "--help"])
    assert info.value.code == 0 and "--reason" in capsys.readouterr().out
