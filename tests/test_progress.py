"""core.records.runs.progress: time left over every stage, the estimate before Start, the place in the queue, the status in
words. The arithmetic is tested on hand-made figures; the reads on a real database."""

from __future__ import annotations

from datetime import timedelta

import pytest

from core.grpo.training import create_run
from core.records.runs.progress import (
    DEFAULT_MIXED,
    Shape,
    Speed,
    default_speed,
    estimate_left,
    estimate_run,
    estimate_words,
    measured_speeds,
    ordinal,
    planned_calls,
    queue_position,
    queue_words,
    rough_duration,
    shape_from_counts,
    status_words,
)
from core.records.runs.settings import RunSettings
from core.records.tasks.demos import DEMO_TASK, ensure_demo_task
from storage import db
from storage.tables import LLMCall, Run, Step, Worker, utcnow

MODEL = "local/qwen2.5-coder-0.5b"
# One step of 4 queries x G=4 without a gate, one call in flight: the seconds are plain sums.
SMALL = RunSettings(epochs=1, batch_size=4, group_size=4, limit=4, gate="off", concurrency=1,
                    policy_model=MODEL, learner_model=MODEL)
ONE_STEP = Shape(steps=1, groups=4, validation=0)


def measured(**seconds: float) -> dict[str, Speed]:
    """Speeds measured on this run: `stage=latency seconds`, 10 calls each, 100 tokens in and 50 out."""
    return {stage: Speed(latency, 100, 50, model=MODEL, calls=10, source="run") for stage, latency in seconds.items()}


SPEEDS = measured(rollout=2, summary=4, advantage=6, update=10, judge=1, gate=2)


def test_rollouts_all_done_still_leaves_the_summaries_advantages_and_update():
    """The bug of issue 14: with every rollout done, the learner's stages are two thirds of the time, not 0 s."""
    progress = {"steps_total": 1, "rollouts_total": 16, "rollouts_done": 16}
    estimate = estimate_left(SMALL, ONE_STEP, progress, {"rollout": 16}, SPEEDS)

    # half the groups assumed mixed: 8 summaries x 4 s, 2 advantages x 6 s, 1 update x 10 s
    assert DEFAULT_MIXED == 0.5
    assert estimate.by_stage == {"summary": 32, "advantage": 12, "update": 10}
    assert estimate.seconds == 54
    assert estimate.calls == 11
    assert estimate.basis == "from 30 measured calls of this run"


def test_the_groups_decided_so_far_set_the_share_that_is_summarised():
    progress = {"steps_total": 1, "rollouts_total": 16, "rollouts_done": 16, "advantages": 3, "groups_skipped": 1,
                "summaries": 4}
    estimate = estimate_left(SMALL, ONE_STEP, progress, {"rollout": 16, "summary": 4, "advantage": 1}, SPEEDS)

    # 3 of 4 groups mixed: 12 summaries planned (4 done), 3 advantages (1 done), the update
    assert estimate.by_stage == {"summary": 8 * 4, "advantage": 2 * 6, "update": 10}


def test_calls_in_flight_divide_the_parallel_stages_but_not_the_update():
    wide = SMALL.model_copy(update={"concurrency": 4})
    progress = {"steps_total": 1, "rollouts_total": 16, "rollouts_done": 0}
    estimate = estimate_left(wide, ONE_STEP, progress, {}, SPEEDS)

    assert estimate.by_stage == {"rollout": 16 * 2 / 4, "summary": 8 * 4 / 4, "advantage": 2 * 6 / 4, "update": 10}


def test_a_finished_plan_has_nothing_left():
    progress = {"steps_total": 1, "rollouts_total": 16, "rollouts_done": 16, "advantages": 2, "groups_skipped": 2}
    done = {"rollout": 16, "summary": 8, "advantage": 2, "update": 1}
    estimate = estimate_left(SMALL, ONE_STEP, progress, done, SPEEDS)
    assert (estimate.seconds, estimate.calls, estimate.basis) == (0, 0, "nothing left to call")


def test_without_a_shape_nothing_can_be_said():
    assert estimate_left(SMALL, None, {}, {}, SPEEDS) is None


def test_answers_of_several_turns_are_measured_from_the_run():
    """The python agent mode makes more than one call per answer; the ledger shows how many."""
    progress = {"steps_total": 1, "rollouts_total": 16, "rollouts_done": 8}
    estimate = estimate_left(SMALL, ONE_STEP, progress, {"rollout": 24}, SPEEDS)
    assert estimate.by_stage["rollout"] == (16 * 3 - 24) * 2  # 3 calls per answer so far: 24 calls to come


def test_the_gate_and_the_judge_are_planned_too():
    gated = SMALL.model_copy(update={"gate": "no_worse", "gate_k": 2, "epochs": 2})
    shape = Shape(steps=2, groups=8, validation=10)
    planned = planned_calls(gated, shape, judged=True)

    # the gate evaluates the starting library once and each step's candidate: (2 + 1) x 10 queries x k=2
    assert planned["gate"] == 60
    assert planned["judge"] == 8 * 4 + 60  # one verdict per answer, training and gate alike
    assert planned["update"] == 2


def test_without_ground_truth_every_group_is_summarised():
    majority = SMALL.model_copy(update={"ground_truth": False})
    progress = {"steps_total": 1, "rollouts_total": 16, "advantages": 1, "groups_skipped": 3}
    estimate = estimate_left(majority, ONE_STEP, progress, {"rollout": 16}, SPEEDS)
    assert estimate.by_stage["summary"] == 16 * 4 and estimate.by_stage["advantage"] == 4 * 6


def test_the_shape_of_a_run_not_started_follows_the_task_and_the_gate():
    defaults = RunSettings(policy_model=MODEL, learner_model=MODEL)  # 3 epochs, batch 8, gate no_worse
    # 100 train queries: 20 held out for the gate, 80 trained on in 10 steps per epoch
    assert shape_from_counts(defaults, 100) == Shape(steps=30, groups=240, validation=20)
    # a validation split of its own leaves every train query for training
    assert shape_from_counts(defaults, 100, validation_split=30) == Shape(steps=39, groups=300, validation=30)
    assert shape_from_counts(SMALL, 100) == ONE_STEP


def test_estimate_run_counts_calls_tokens_and_time_for_the_form():
    estimate = estimate_run(SMALL, 200, SPEEDS)

    assert estimate.calls == 16 + 8 + 2 + 1
    assert estimate.tokens == 27 * 150
    assert estimate.seconds == 16 * 2 + 32 + 12 + 10
    assert estimate_words(estimate) == ("about 27 calls, 4.0k tokens, 1 min (from 40 measured calls of this run)")


def test_with_nothing_measured_the_embedded_models_default_speed_is_said_and_not_divided():
    wide = SMALL.model_copy(update={"concurrency": 4})
    estimate = estimate_run(wide, 200, {})
    rollout = default_speed("rollout", MODEL, wide.max_tokens)

    assert rollout.serial  # the embedded server answers one request at a time
    assert estimate.by_stage["rollout"] == pytest.approx(16 * rollout.latency_s)
    assert estimate.basis == "from the embedded model's assumed speed (about 18 tokens/s), nothing measured yet"
    hosted = default_speed("rollout", "openai/gpt-4o-mini")
    assert not hosted.serial and hosted.seconds(4) == pytest.approx(hosted.latency_s / 4)


def test_words_for_durations_and_places():
    assert [rough_duration(s) for s in (20, 90, 720, 3600, 4800)] == [
        "under a minute", "2 min", "12 min", "1 h", "1 h 20 min"]
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 101)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st"]
    from core.records.runs.progress import QueuePlace

    assert queue_words(QueuePlace(2, 240, workers=1)) == "queued: 2nd in line, starts in about 4 min"
    assert queue_words(QueuePlace(1, 0, workers=1)) == "queued: 1st in line, starts in a moment"
    assert queue_words(QueuePlace(3, None, workers=1)) == "queued: 3rd in line"
    assert queue_words(QueuePlace(1, 0, workers=0)) == "queued: 1st in line; no worker is running to take it"


# ---- the status in words ------------------------------------------------------------------------------------


def run_row(status: str, review_mode: str = "manual", steps_total: int = 1, current: int | None = 3) -> Run:
    return Run(id=3, task_id=1, library_id=1, status=status, current_version_id=current,
               settings=SMALL.model_copy(update={"review_mode": review_mode}).model_dump(),
               progress={"steps_total": steps_total})


def step_row(status: str, before: int = 1, after: int | None = None) -> Step:
    return Step(run_id=3, epoch=0, batch_index=0, status=status, version_before_id=before, version_after_id=after)


NUMBERS = {1: 1, 3: 3}


def test_a_step_applied_after_review_and_queued_again_is_said_in_words():
    words = status_words(run_row("queued"), [step_row("completed", after=3)], NUMBERS)
    assert words == "step 1 applied after review (version #3); queued to go on"


@pytest.mark.parametrize(("status", "review_mode", "steps", "shown", "expected"), [
    ("queued", "manual", [step_row("completed", after=1)], None,
     "step 1 reviewed, nothing applied (version #1 stays); queued to go on"),
    ("queued", "auto", [], None, "queued, not started yet"),
    ("completed", "auto", [step_row("completed", after=3)], None, "completed: 1 step, final version #3"),
    ("running", "auto", [step_row("running")], None, "running step 1"),
    ("awaiting_review", "manual", [step_row("awaiting_review")], None, "step 1 waits for review (2 operations pending)"),
    ("running", "auto", [step_row("running")], "stalled", "stalled at step 1: its worker stopped beating"),
    ("cancelled", "auto", [], None, "cancelled before it started"),
    ("failed", "auto", [step_row("failed")], None, "failed at step 1"),
])
def test_every_status_in_words(status, review_mode, steps, shown, expected):
    assert status_words(run_row(status, review_mode), steps, NUMBERS, shown, pending=2) == expected


def test_a_run_of_several_steps_names_the_step_of_how_many():
    steps = [step_row("completed", before=1, after=3), step_row("running", before=3)]
    words = status_words(run_row("paused", "auto", steps_total=4), steps, NUMBERS)
    assert words == "paused at step 2 of 4; step 1 of 4 done (version #3)"


# ---- reads on a database --------------------------------------------------------------------------------------


def add_calls(engine, n: int, *, stage: str, latency_ms: float, run_id: int | None = None, model: str = MODEL,
              **values) -> None:
    with db.session_scope(engine) as session:
        for i in range(n):
            session.add(LLMCall(run_id=run_id, stage=stage, model=model, cache_key=f"{stage}-{run_id}-{i}-{values}",
                                latency_ms=latency_ms, tokens_in=100, tokens_out=40, **values))


def test_speeds_come_from_this_run_then_earlier_calls_of_the_model_then_the_default(engine):
    ensure_demo_task(engine)
    earlier = create_run(engine, DEMO_TASK, SMALL, created_by="cli")
    run_id = create_run(engine, DEMO_TASK, SMALL.model_copy(update={"seed": 1}), created_by="cli")  # not a twin
    add_calls(engine, 3, stage="rollout", latency_ms=2000, run_id=run_id)
    add_calls(engine, 5, stage="rollout", latency_ms=9000, run_id=earlier)
    add_calls(engine, 4, stage="summary", latency_ms=3000, run_id=earlier)
    add_calls(engine, 4, stage="summary", latency_ms=60_000, run_id=earlier, model="local/smollm2-135m")
    add_calls(engine, 2, stage="advantage", latency_ms=5000, run_id=run_id)  # too few to say
    add_calls(engine, 9, stage="update", latency_ms=1, run_id=run_id, cache_hit=True)  # the cache is no speed
    add_calls(engine, 9, stage="update", latency_ms=1, run_id=run_id, error="timeout")

    models = {"rollout": MODEL, "summary": MODEL, "advantage": MODEL, "update": MODEL, "gate": MODEL}
    with db.session_scope(engine) as session:
        speeds = measured_speeds(session, models, run_id)

    assert (speeds["rollout"].source, speeds["rollout"].calls, speeds["rollout"].latency_s) == ("run", 3, 2.0)
    assert (speeds["summary"].source, speeds["summary"].calls, speeds["summary"].latency_s) == ("earlier", 4, 3.0)
    assert speeds["gate"].source == "earlier" and speeds["gate"].latency_s == 9.0  # a gate answers like a rollout
    assert speeds["advantage"].source == "default" and speeds["update"].source == "default"


def test_the_queue_is_in_the_order_the_worker_claims_and_sums_what_is_before(engine):
    from core.grpo.evaluation import create_evaluation

    ensure_demo_task(engine)
    first = create_run(engine, DEMO_TASK, SMALL, created_by="cli")
    evaluation = create_evaluation(engine, DEMO_TASK, "empty", limit=3, k=2)
    last = create_run(engine, DEMO_TASK, SMALL.model_copy(update={"seed": 1}), created_by="cli")  # not a twin
    with db.session_scope(engine) as session:
        places = {run_id: queue_position(session, session.get(Run, run_id)) for run_id in (first, last)}
    assert places[first].position == 1 and places[first].starts_in == 0
    assert places[last].position == 3  # after the run and the evaluation queued before it
    assert places[last].workers == 0

    with db.session_scope(engine) as session:
        session.add(Worker(id="w1", heartbeat_at=utcnow()))
        session.add(Worker(id="w-gone", heartbeat_at=utcnow() - timedelta(hours=1)))
        run = session.get(Run, first)
        run.status, run.heartbeat_at = "running", utcnow()
        session.add(run)
    with db.session_scope(engine) as session:
        place = queue_position(session, session.get(Run, last))
        assert queue_position(session, session.get(Run, first)) is None  # running, not in line
    assert (place.position, place.workers) == (2, 1)
    assert place.starts_in > 0  # the running run's time left and the evaluation's
    assert evaluation


def test_a_conversation_tasks_estimate_counts_every_turn_and_each_judge_rule(engine):
    from sqlmodel import Session

    from core.records.runs.progress import form_estimate, task_facts
    from core.records.tasks.demos import CONVERSATION_TASK, ensure_demo_tasks
    from storage import queries

    ensure_demo_tasks(engine)
    with Session(engine) as session:
        task = queries.task_by_name(session, CONVERSATION_TASK)
        facts = task_facts(session, task)
        judge_rules = sum(1 for rule in task.reward_settings.get("rules", []) if rule.get("check") == "judge")
        estimate = form_estimate(session, task, SMALL)
    assert facts["turns"] == 2 * task.max_turns - 1 and facts["judge_calls"] == 1 + judge_rules
    rollouts = 4 * 4  # 4 scenarios x G=4
    assert estimate.calls == rollouts * facts["turns"] + rollouts * facts["judge_calls"] + 8 + 2 + 1


def test_the_estimate_shows_a_priced_hosted_learners_cost_and_no_cost_for_the_embedded_models():
    from core.models.prices import price_per_token
    from core.records.runs.progress import DEFAULT_TOKENS

    hosted = "openai/gpt-4o-mini"
    prompt_price, completion_price = price_per_token(hosted)  # litellm's local price map
    assert prompt_price > 0 and completion_price > 0
    estimate = estimate_run(SMALL.model_copy(update={"learner_model": hosted}), 200, {})

    # 8 summaries, 2 advantages, 1 update at the assumed tokens of each stage; the embedded policy is free
    calls = {"summary": 8, "advantage": 2, "update": 1}
    learner = sum(n * (DEFAULT_TOKENS[stage][0] * prompt_price + DEFAULT_TOKENS[stage][1] * completion_price)
                  for stage, n in calls.items())
    assert estimate.costs == {"policy": (MODEL, 0.0), "learner": (hosted, pytest.approx(learner))}
    assert estimate.cost == pytest.approx(learner)
    words = estimate_words(estimate)
    assert words.endswith(f"; API cost under $0.01 (learner {hosted} under $0.01, policy {MODEL} $0)")
    bigger = estimate_run(SMALL.model_copy(update={"learner_model": hosted, "epochs": 200}), 200, {})
    assert f"API cost about ${bigger.cost:,.2f} (learner {hosted} ${bigger.costs['learner'][1]:,.2f}," in \
        estimate_words(bigger)

    local = estimate_run(SMALL, 200, {})
    assert local.cost == 0 and "cost" not in estimate_words(local)
    unpriced = estimate_run(SMALL.model_copy(update={"learner_model": "openai/no-such-model"}), 200, {})
    assert unpriced.cost is None and "learner openai/no-such-model price unknown" in estimate_words(unpriced)


def test_a_run_with_worked_examples_plans_one_compression_per_mixed_group():
    from core.records.runs.progress import Shape, planned_calls
    from core.records.runs.settings import RunSettings

    shape = Shape(steps=2, groups=8, validation=0)
    without = planned_calls(RunSettings(gate="off"), shape)
    with_examples = planned_calls(RunSettings(gate="off", examples=True), shape)
    assert without["example"] == 0
    assert with_examples["example"] == with_examples["advantage"] == 4  # 8 groups, half of them mixed
    assert {k: v for k, v in with_examples.items() if k != "example"} == {k: v for k, v in without.items() if k != "example"}


def test_learning_from_the_reference_plans_every_group_and_lessons_off_plans_no_lesson_calls():
    from core.records.runs.progress import Shape, mixed_share, planned_calls

    paper, with_reference = RunSettings(gate="off"), RunSettings(gate="off", reference_when_all_fail=True)
    assert mixed_share(paper, {}) == 0.5 and mixed_share(with_reference, {}) == 1.0
    seen = {"advantages": 3, "groups_skipped": 1}  # once the run shows its own share, that share counts
    assert mixed_share(with_reference, seen) == mixed_share(paper, seen) == 0.75
    shape = Shape(steps=2, groups=8, validation=0)
    examples_only = planned_calls(RunSettings(gate="off", examples=True, lessons=False), shape)
    assert examples_only["summary"] == examples_only["advantage"] == examples_only["update"] == 0
    assert examples_only["example"] == 4 and examples_only["rollout"] == 8 * 5
