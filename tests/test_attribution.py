"""Measure experiences (leave-one-out attribution) on scripted model replies: the agent answers right or wrong
depending on which experiences its system prompt holds, so each experience's effect is known in advance."""

from __future__ import annotations

import asyncio
import json

import pytest
from sqlmodel import Session, select

from core.errors import Conflict, InvalidInput, NotFound
from core.grpo import attribution
from core.grpo.attribution import (
    Verdict,
    create_attribution,
    effects_for_library,
    estimate,
    experience_effects,
    measure_experiences,
    remove_hurting,
    run_effects,
)
from core.grpo.training import execute_run
from core.records.library.versions import import_library
from core.records.tasks.demos import DEMO_TASK, demo_rows
from core.records.tasks.lookup import get_task
from storage import queries
from storage.db import url_with_password
from storage.statuses import EvaluationPurpose, JobStatus, RunKind
from storage.tables import AuditEvent, Evaluation, LibraryVersion, LLMCall, Rollout, Run, Sample

HELPFUL = "Re-read the question to find which quantity it asks for."
HARMFUL = "Always subtract the smaller number from the larger one."
NEUTRAL = "Write the unit next to every number you compute."
REFERENCES = {row.query: row.reference for row in demo_rows()}
QUERIES, K = 8, 2
VARIANTS = 4  # the version and one without each of its three experiences
CALLS = VARIANTS * QUERIES * K


def import_texts(engine, *texts: str) -> int:
    return import_library(engine, DEMO_TASK, "\n".join(f"- {t}" for t in texts), "lib.md", actor="bob").id


def typed(engine, version_id: int) -> str:
    """The version as a person types it: its number in its library."""
    with Session(engine) as s:
        return str(s.get(LibraryVersion, version_id).number)


def first_queries(engine, split: str = "test", n: int = QUERIES) -> list[str]:
    with Session(engine) as s:
        return [sample.query for sample in queries.samples(s, get_task(s, DEMO_TASK).id, split, limit=n)]


def answers(engine):
    """Right on every query with HELPFUL and without HARMFUL; with both, right on every other query only;
    without HELPFUL, always wrong. So HELPFUL helps (+0.5), HARMFUL hurts (-0.5), NEUTRAL changes nothing."""
    every_other = set(first_queries(engine)[::2])

    def reply(messages: list[dict]) -> str:
        system, query = messages[0]["content"], messages[1]["content"]
        right = HELPFUL in system and (HARMFUL not in system or query in every_other)
        return f"So the answer is \\boxed{{{REFERENCES[query] if right else '-12345'}}}"

    return reply


def measured(engine, scripted, *texts: str) -> tuple[int, int]:
    """(version id, run id): a version of `texts` measured on 8 test queries x k=2 to completion."""
    version_id = import_texts(engine, *(texts or (HELPFUL, HARMFUL, NEUTRAL)))
    run_id = create_attribution(engine, DEMO_TASK, typed(engine, version_id), k=K, limit=QUERIES, created_by="bob")
    _model, gateway = scripted(engine, rollout=answers(engine))
    run = execute_run(engine, run_id, gateway=gateway)
    assert run.status == JobStatus.COMPLETED, run.error
    return version_id, run_id


def paid_attribution_calls(engine) -> list[LLMCall]:
    with Session(engine) as s:
        return list(s.exec(select(LLMCall).where(LLMCall.stage == "attribution", LLMCall.cache_hit.is_(False),
                                                 LLMCall.error.is_(None))))


def test_each_experience_carries_its_effect_helps_hurts_or_unclear(engine, demo_task, scripted):
    version_id = import_texts(engine, HELPFUL, HARMFUL, NEUTRAL)
    run_id = create_attribution(engine, DEMO_TASK, typed(engine, version_id), k=K, limit=QUERIES, created_by="bob")
    model, gateway = scripted(engine, rollout=answers(engine))
    run = execute_run(engine, run_id, gateway=gateway)
    assert run.status == JobStatus.COMPLETED, run.error
    assert run.kind == RunKind.ATTRIBUTE and run.progress["variants_done"] == run.progress["variants_total"] == 4

    effects = experience_effects(engine, version_id)
    assert list(effects) == ["E1", "E2", "E3"]
    helpful, harmful, neutral = effects["E1"], effects["E2"], effects["E3"]
    assert (helpful.text, helpful.verdict, helpful.delta) == (HELPFUL, Verdict.HELPS, 0.5)
    assert helpful.ci_low > 0 and helpful.mean_with == 0.5 and helpful.mean_without == 0.0
    assert (harmful.text, harmful.verdict, harmful.delta) == (HARMFUL, Verdict.HURTS, -0.5)
    assert harmful.ci_high < 0 and harmful.mean_without == 1.0
    assert (neutral.verdict, neutral.delta, neutral.ci_low, neutral.ci_high) == (Verdict.UNCLEAR, 0.0, 0.0, 0.0)
    assert {(e.n, e.k, e.run_id, e.version_id, e.split) for e in effects.values()} == {(QUERIES, K, run_id, version_id,
                                                                                         "test")}
    assert helpful.p_value == pytest.approx(0.125) and neutral.p_value == 1.0  # sign test: 4 wins, 4 ties

    # Every variant on the same queries and k, the left-out experience recorded, every agent call an attribution's.
    with Session(engine) as s:
        evaluations = s.exec(select(Evaluation).where(Evaluation.run_id == run_id)).all()
    assert sorted((e.left_out or "") for e in evaluations) == ["", "E1", "E2", "E3"]
    assert {e.purpose for e in evaluations} == {EvaluationPurpose.ATTRIBUTION}
    assert len({tuple(e.sample_ids) for e in evaluations}) == 1 and {e.k for e in evaluations} == {K}
    full = next(e for e in evaluations if e.left_out is None)
    assert full.version_id == version_id and [x["id"] for x in full.experiences] == ["E1", "E2", "E3"]
    without_e2 = next(e for e in evaluations if e.left_out == "E2")
    assert without_e2.version_id is None and [x["id"] for x in without_e2.experiences] == ["E1", "E3"]
    assert model.count("attribution") == CALLS and len(model.calls) == CALLS
    assert len(paid_attribution_calls(engine)) == CALLS
    assert run_effects(engine, run_id) == effects


def test_the_estimate_counts_variants_calls_and_cost_before_starting(engine, demo_task):
    version_id = import_texts(engine, HELPFUL, HARMFUL, NEUTRAL)
    est = estimate(engine, DEMO_TASK, typed(engine, version_id), k=K, limit=QUERIES)
    assert (est["variants"], est["experiences"], est["queries"], est["k"]) == (4, 3, QUERIES, K)
    assert est["agent_calls"] == CALLS and est["judge_calls"] == 0
    assert est["estimated_cost"] == 0.0 and "costs nothing" in est["cost_basis"]
    assert est["split"] == "test" and "no validation split" in est["note"]
    line = attribution.estimate_line(est)
    assert "4 variants" in line and f"{CALLS} agent calls" in line and "$0.00" in line

    with Session(engine) as s:  # a paid model: the average cost of the task's past paid rollouts
        task = get_task(s, DEMO_TASK)
        task.policy_model = "openai/gpt-4o-mini"
        s.add(task)
        sample_id = queries.samples(s, task.id, "train", limit=1)[0].id
        s.add_all([Rollout(sample_id=sample_id, cost=0.002), Rollout(sample_id=sample_id, cost=0.004),
                   Rollout(sample_id=sample_id, cost=0.0)])
        s.commit()
    est = estimate(engine, DEMO_TASK, "latest", k=K, limit=QUERIES)
    assert est["estimated_cost"] == pytest.approx(CALLS * 0.003)
    assert "2 paid rollouts" in est["cost_basis"]


def test_the_validation_split_is_preferred_when_the_task_has_one(engine, demo_task):
    import_texts(engine, HELPFUL)
    with Session(engine) as s:
        s.add_all([Sample(task_id=demo_task.id, external_id=f"v{i}", query=f"What is {i} + 1?", reference=str(i + 1),
                          split="validation") for i in range(3)])
        s.commit()
    est = estimate(engine, DEMO_TASK, "latest")
    assert (est["split"], est["queries"], est["k"], est["note"]) == ("validation", 3, 2, "")
    assert estimate(engine, DEMO_TASK, "latest", split="test", limit=5)["split"] == "test"


def test_what_cannot_be_measured_is_refused_clearly(engine, demo_task):
    with pytest.raises(InvalidInput, match="empty library has no experiences"):
        create_attribution(engine, DEMO_TASK, "empty")
    with pytest.raises(InvalidInput, match="has no experiences to measure"):
        create_attribution(engine, DEMO_TASK, "latest")  # the initial, empty version
    import_texts(engine, HELPFUL)
    with pytest.raises(InvalidInput, match="no 'nope' samples"):
        create_attribution(engine, DEMO_TASK, "latest", split="nope")
    with pytest.raises(InvalidInput, match="k must be at least 1"):
        create_attribution(engine, DEMO_TASK, "latest", k=0)
    with pytest.raises(NotFound):
        create_attribution(engine, DEMO_TASK, "no-such-label")
    run_id = create_attribution(engine, DEMO_TASK, "latest", limit=2)
    with pytest.raises(Conflict, match=f"already being measured by run {run_id}"):
        create_attribution(engine, DEMO_TASK, "latest", limit=2)
    with Session(engine) as s:
        [event] = s.exec(select(AuditEvent).where(AuditEvent.action == "run.create")).all()
        run = s.get(Run, run_id)
    assert event.object_id == run_id and event.after["kind"] == RunKind.ATTRIBUTE and event.after["queries"] == 2
    assert run.status == JobStatus.QUEUED and run.settings["split"] == "test" and len(run.settings["sample_ids"]) == 2
    assert experience_effects(engine, run.start_version_id) == {}  # nothing measured yet


def test_resume_after_a_kill_pays_for_no_completed_call_again(engine, demo_task, scripted):
    version_id = import_texts(engine, HELPFUL, HARMFUL, NEUTRAL)
    run_id = create_attribution(engine, DEMO_TASK, typed(engine, version_id), k=K, limit=QUERIES)
    right = answers(engine)
    calls = {"n": 0}

    def dies_midway(messages):
        calls["n"] += 1
        if calls["n"] == 40:  # in the third variant
            raise KeyboardInterrupt  # the worker is killed
        return right(messages)

    _model, gateway = scripted(engine, rollout=dies_midway)
    with pytest.raises(KeyboardInterrupt):
        execute_run(engine, run_id, gateway=gateway)
    paid_before = len(paid_attribution_calls(engine))
    assert 2 * QUERIES * K <= paid_before < CALLS
    with Session(engine) as s:
        assert s.get(Run, run_id).progress["variants_done"] == 2

    model, gateway = scripted(engine, rollout=right)
    run = execute_run(engine, run_id, gateway=gateway)
    assert run.status == JobStatus.COMPLETED, run.error
    assert model.count("attribution") == CALLS - paid_before
    assert len(paid_attribution_calls(engine)) == CALLS
    with Session(engine) as s:
        assert len(s.exec(select(Evaluation).where(Evaluation.run_id == run_id)).all()) == VARIANTS
    assert experience_effects(engine, version_id)["E2"].verdict == Verdict.HURTS


def test_a_stop_between_variants_keeps_what_is_done(engine, demo_task, scripted):
    """`check` is the run machinery's tick: a pause or cancel raises there; the next execution goes on. It is
    called before and after each variant, and every second while one runs (core.grpo.evaluation.until_stopped)."""

    class Stop(Exception):
        pass

    version_id = import_texts(engine, HELPFUL, HARMFUL)
    run_id = create_attribution(engine, DEMO_TASK, typed(engine, version_id), k=1, limit=4)
    model, gateway = scripted(engine, rollout=answers(engine))

    def check() -> None:
        with Session(engine) as s:
            if s.get(Run, run_id).progress.get("variants_done") == 2:  # the full version and the first variant
                raise Stop()

    with pytest.raises(Stop):
        asyncio.run(measure_experiences(engine, run_id, gateway, check))
    assert model.count("attribution") == 2 * 4
    with Session(engine) as s:
        assert s.get(Run, run_id).progress["variants_done"] == 2
    run = execute_run(engine, run_id, gateway=gateway)
    assert run.status == JobStatus.COMPLETED, run.error
    assert model.count("attribution") == 3 * 4
    assert set(experience_effects(engine, version_id)) == {"E1", "E2"}


def test_remove_hurting_makes_an_audited_version_without_them(engine, demo_task, scripted):
    version_id, run_id = measured(engine, scripted)
    new = remove_hurting(engine, DEMO_TASK, version_id, "carol")
    assert [e["text"] for e in new.experiences] == [HELPFUL, NEUTRAL]
    assert [e["id"] for e in new.experiences] == ["E1", "E3"]
    assert (new.source, new.created_by, new.parent_id) == ("manual", "carol", version_id)
    assert f"run {run_id}" in new.note and "E2" in new.note
    with Session(engine) as s:
        assert s.get(LibraryVersion, version_id).experiences[1]["text"] == HARMFUL  # versions are immutable
        manual = s.exec(select(AuditEvent).where(AuditEvent.action == "version.manual")).all()
        removal = s.exec(select(AuditEvent).where(AuditEvent.action == "attribution.remove_hurting")).one()
    assert [e.object_id for e in manual] == [new.id] and manual[0].actor == "carol"
    assert (removal.actor, removal.object_id, removal.after) == ("carol", run_id, {"version_id": new.id,
                                                                                    "removed": ["E2"]})
    with pytest.raises(Conflict, match="no longer the latest"):
        remove_hurting(engine, DEMO_TASK, version_id, "carol")
    with pytest.raises(InvalidInput, match="has not been measured"):
        remove_hurting(engine, DEMO_TASK, new.id, "carol")


def test_remove_hurting_refuses_when_nothing_hurts(engine, demo_task, scripted):
    version_id, _run_id = measured(engine, scripted, HELPFUL, NEUTRAL)
    assert {e.verdict for e in experience_effects(engine, version_id).values()} == {Verdict.HELPS, Verdict.UNCLEAR}
    with pytest.raises(InvalidInput, match="no experience of version #2 hurts"):
        remove_hurting(engine, DEMO_TASK, version_id, "carol")


def test_effects_for_library_keeps_the_newest_measurement_of_each_id(engine, demo_task, scripted):
    version_id, first_run = measured(engine, scripted)
    new = remove_hurting(engine, DEMO_TASK, version_id, "carol")
    second_run = create_attribution(engine, DEMO_TASK, str(new.number), k=K, limit=QUERIES)
    _model, gateway = scripted(engine, rollout=answers(engine))
    assert execute_run(engine, second_run, gateway=gateway).status == JobStatus.COMPLETED
    with Session(engine) as s:
        library_id = s.get(LibraryVersion, version_id).library_id
    effects = effects_for_library(engine, library_id)
    assert {k: (e.run_id, e.version_id) for k, e in effects.items()} == {
        "E1": (second_run, new.id), "E2": (first_run, version_id), "E3": (second_run, new.id)}
    assert effects["E1"].delta == 1.0 and effects["E2"].verdict == Verdict.HURTS
    assert effects["E1"].version_number == 3


def test_cli_attribute_prints_the_estimate_then_the_effects(engine, demo_task, scripted, capsys, monkeypatch):
    import core.grpo.training as training
    from core.cli import main

    version_id = import_texts(engine, HELPFUL, HARMFUL, NEUTRAL)
    monkeypatch.setattr(training, "Gateway", lambda engine, **kw: scripted(engine, rollout=answers(engine))[1])
    url = url_with_password(engine)
    code = main(["--db", url, "attribute", "--task", DEMO_TASK, "--version", str(version_id), "--k", str(K),
                 "--limit", str(QUERIES), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"{CALLS} agent calls" in err and "no validation split" in err
    rows = json.loads(out)
    assert [(r["experience_id"], r["verdict"], r["delta"]) for r in rows] == [
        ("E1", "helps", 0.5), ("E2", "hurts", -0.5), ("E3", "unclear", 0.0)]
    assert rows[1]["text"] == HARMFUL and rows[1]["ci_high"] < 0 and rows[0]["n"] == QUERIES and rows[0]["k"] == K

    # Measured again as text: the agent's calls are all in the ledger's cache, so nothing is paid twice.
    code = main(["--db", url, "attribute", "--task", DEMO_TASK, "--version", "latest", "--k", str(K),
                 "--limit", str(QUERIES)])
    out, _err = capsys.readouterr()
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("estimate: version #2: 4 variants")
    table = lines[lines.index(next(line for line in lines if line.startswith("id "))) + 1:]
    assert table[0].split()[:6] == ["E1", "+0.500", "[+0.125,", "+0.875]", "0.125", "helps"]
    assert table[1].split()[:6] == ["E2", "-0.500", "[-0.875,", "-0.125]", "0.125", "hurts"]
    assert table[1].endswith(HARMFUL) and table[2].split()[5] == "unclear"
    assert "1 hurt (E2)" in out
    assert len(paid_attribution_calls(engine)) == CALLS


@pytest.mark.parametrize(("argv", "reason"), [
    (["--version", "empty"], "empty library has no experiences"),
    (["--version", "latest", "--k", "0"], "k must be at least 1"),
    ([], "--task and --version are required"),
])
def test_cli_attribute_bad_input_exits_2(engine, demo_task, capsys, argv, reason):
    from core.cli import main

    task = ["--task", DEMO_TASK] if argv else []
    code = main(["--db", url_with_password(engine), "attribute", *task, *argv])
    assert code == 2
    assert reason in capsys.readouterr().err


def test_cli_attribute_queue_only_queues(engine, demo_task, capsys):
    from core.cli import main

    import_texts(engine, HELPFUL)
    assert main(["--db", url_with_password(engine), "attribute", "--task", DEMO_TASK, "--version", "latest", "--queue",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    with Session(engine) as s:
        run = s.get(Run, out["run_id"])
    assert run.status == JobStatus.QUEUED and run.kind == RunKind.ATTRIBUTE
