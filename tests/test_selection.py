"""Entries chosen per query (issue 26, point 3): a library shows every prompt all its entries (the paper), or
only the k most similar to the query by BM25; training, evaluation, the gate, attribution and the HTTP API
all choose through core.domain.selection, each rollout stores the ids it was shown, and the API's selection
route gives a live agent the entries the studio evaluated for the same query.

The library and the queries are built by hand so that which entries a query shares words with is plain to read.
"""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from api.app import create_app
from core import cli
from core.domain.selection import (
    DEFAULT_K,
    Selection,
    ranked_entries,
    ranking_text,
    scored_entries,
    select_entries,
)
from core.errors import InvalidInput
from core.grpo.attribution import create_attribution, experience_effects
from core.grpo.comparison_pair import comparison_pair
from core.grpo.evaluation import create_evaluation, execute_evaluation
from core.grpo.training import create_run, execute_run
from core.records.keys.api_keys import create_key
from core.records.library.selection import library_selection, set_selection
from core.records.library.versions import import_library, set_label
from core.records.runs.settings import RunSettings
from core.records.tasks.demos import DEMO_TASK
from storage.db import url_with_password
from storage.statuses import EvaluationPurpose, JobStatus
from storage.tables import AuditEvent, Evaluation, Rollout, Sample, Step
from tests.conftest import mixed_rollouts

HOURS = "Convert hours to minutes before adding the durations of trips."
APPLES = "When friends share something equally, divide it by the number of friends."
DISCOUNT = "A discount price is the original price times one minus the discount rate."
TRAIN = "For a train trip, distance equals speed multiplied by the travel time."
COOKIES = "Subtract the cookies eaten from the cookies baked to find how many are left."
LIBRARY = (HOURS, APPLES, DISCOUNT, TRAIN, COOKIES)
SPLIT = "selection"
# Each query shares words with exactly two entries, ranked: the one it shares more (or rarer) words with first.
QUERIES = {
    "A train travels for 2 hours. What distance does the train cover at 60 miles per hour?": [TRAIN, HOURS],
    "Maria baked 20 cookies and gave the cookies to her 4 friends equally. How many cookies did each of "
    "the friends get?": [COOKIES, APPLES],
    "A shirt has a price of 40 dollars and a discount rate of 25 percent. Paying takes 5 minutes. What is "
    "the price after the discount?": [DISCOUNT, HOURS],
}


def entries(*texts: str) -> list[dict]:
    return [{"id": f"E{i}", "text": text} for i, text in enumerate(texts, 1)]


def ids_of(version, texts: list[str]) -> list[str]:
    by_text = {e["text"]: e["id"] for e in version.experiences}
    return [by_text[text] for text in texts]


@pytest.fixture
def library(engine, demo_task):
    """The hand-built library as the task's latest version, and the hand-built queries as the split SPLIT."""
    with Session(engine) as session:
        session.add_all([Sample(task_id=demo_task.id, external_id=f"s{i}", query=query, reference="0", split=SPLIT)
                         for i, query in enumerate(QUERIES)])
        session.commit()
    return import_library(engine, DEMO_TASK, "\n".join(f"- {text}" for text in LIBRARY), "lib.md", actor="system")


def rollouts_of(engine, evaluation_id: int) -> list[tuple[str, Rollout]]:
    with Session(engine) as session:
        rows = session.exec(select(Rollout, Sample).join(Sample, Sample.id == Rollout.sample_id)
                            .where(Rollout.evaluation_id == evaluation_id)).all()
    return [(sample.query, rollout) for rollout, sample in rows]


def prompts_by_query(model, stage: str = "rollout") -> dict[str, list[str]]:
    """The system prompts the scripted agent received, by the query it answered."""
    seen: dict[str, list[str]] = {}
    for call_stage, messages in model.calls:
        if call_stage == stage:
            seen.setdefault(messages[1]["content"], []).append(messages[0]["content"])
    return seen


# ---------------------------------------------------------------------------------------------- the choice


def test_top_k_keeps_the_k_entries_most_similar_to_the_query_the_most_similar_last():
    library = entries(*LIBRARY)
    for query, expected in QUERIES.items():
        chosen = select_entries(library, query, Selection.build("top_k", 2))
        assert [e["text"] for e in chosen] == expected[::-1]  # the prompt's order: the most similar next to the query
        assert [e["text"] for e, _score in ranked_entries(library, query, Selection.build("top_k", 2))] == expected
    ranked = ranked_entries(library, next(iter(QUERIES)), Selection.build("top_k", 3))
    assert [round(score, 2) for _e, score in ranked] == [1.70, 0.60, 0.0]  # the manual's worked example (docs/tour/library.md)
    cookies = scored_entries(library, list(QUERIES)[1], Selection.build("top_k", 2))
    assert [(e["id"], round(score, 2)) for e, score in cookies] == [("E2", 2.18), ("E5", 3.77)]
    assert ranked[2][0]["text"] == APPLES  # ...and ties keep the library's order (E2 before E3)


def test_top_k_always_shows_k_entries_and_all_shows_the_library_unchanged():
    library = entries(*LIBRARY)
    no_overlap = select_entries(library, "What is 7 + 8?", Selection.build("top_k", 2))
    assert [e["id"] for e in no_overlap] == ["E2", "E1"]  # nothing in common: the library's first k, reversed
    assert [e["id"] for e in select_entries(library, "the of and", Selection.build("top_k", 3))] == ["E3", "E2", "E1"]
    assert len(select_entries(library, "train", Selection.build("top_k", 9))) == len(LIBRARY)
    assert select_entries(library, "anything about trains", Selection()) == library
    assert [score for _e, score in scored_entries(library, "train", Selection())] == [None] * len(LIBRARY)
    assert select_entries([], "train", Selection.build("top_k", 2)) == []


@pytest.mark.parametrize("mode, k, words", [("best", 3, "selection must be one of"), ("top_k", 0, "k must be"),
                                           ("top_k", 31, "k must be"), ("top_k", True, "k must be")])
def test_a_bad_selection_is_refused_naming_what_is_wrong(mode, k, words):
    with pytest.raises(InvalidInput, match=words):
        Selection.build(mode, k)


def test_changing_the_selection_is_checked_and_audited(engine, demo_task):
    assert library_selection(engine, DEMO_TASK) == Selection()  # the default: all, k DEFAULT_K
    with pytest.raises(InvalidInput, match="k must be"):
        set_selection(engine, DEMO_TASK, "default", "top_k", 0, "alice")
    assert set_selection(engine, DEMO_TASK, "default", "top_k", 2, "alice") == Selection.build("top_k", 2)
    set_selection(engine, DEMO_TASK, "default", "top_k", 2, "alice")  # no change: no second event
    with Session(engine) as session:
        events = session.exec(select(AuditEvent).where(AuditEvent.action == "library.selection")).all()
    assert [(e.actor, e.before, e.after) for e in events] == [
        ("alice", {"mode": "all", "k": DEFAULT_K}, {"mode": "top_k", "k": 2})]


# ---------------------------------------------------------------------------------------------- evaluation


def test_top_k_shows_each_rollout_exactly_k_entries_the_most_similar_and_stores_them(engine, library, scripted):
    set_selection(engine, DEMO_TASK, "default", "top_k", 2, "system")
    eval_id = create_evaluation(engine, DEMO_TASK, str(library.number), split=SPLIT, k=2)
    set_selection(engine, DEMO_TASK, "default", "all", None, "system")  # frozen: the evaluation still uses top 2
    model, gateway = scripted(engine)
    ev = execute_evaluation(engine, eval_id, gateway=gateway)
    assert ev.status == JobStatus.COMPLETED and ev.selection == {"mode": "top_k", "k": 2}

    rows = rollouts_of(engine, eval_id)
    assert len(rows) == len(QUERIES) * 2
    prompts = prompts_by_query(model)
    for query, rollout in rows:
        assert rollout.shown_ids == ids_of(library, QUERIES[query][::-1])  # exactly k, the most similar last
    for query, expected in QUERIES.items():
        for system in prompts[query]:
            assert [text for text in LIBRARY if text in system] == [t for t in LIBRARY if t in expected]
            assert system.index(expected[0]) > system.index(expected[1])


def test_all_shows_every_rollout_the_whole_library_in_order_as_before(engine, library, scripted):
    eval_id = create_evaluation(engine, DEMO_TASK, str(library.number), split=SPLIT, k=1)
    model, gateway = scripted(engine)
    execute_evaluation(engine, eval_id, gateway=gateway)
    every_id = [e["id"] for e in library.experiences]
    assert {tuple(rollout.shown_ids) for _q, rollout in rollouts_of(engine, eval_id)} == {tuple(every_id)}
    for [system] in prompts_by_query(model).values():
        positions = [system.index(text) for text in LIBRARY]
        assert positions == sorted(positions)


def test_a_comparison_reuses_an_evaluation_only_under_the_same_selection(engine, library, scripted):
    _model, gateway = scripted(engine)
    first = comparison_pair(engine, DEMO_TASK, str(library.number), "empty", split=SPLIT)
    for eval_id in first.ids:
        execute_evaluation(engine, eval_id, gateway=gateway)
    assert comparison_pair(engine, DEMO_TASK, str(library.number), "empty", split=SPLIT).ids == first.ids
    set_selection(engine, DEMO_TASK, "default", "top_k", 2, "system")
    second = comparison_pair(engine, DEMO_TASK, str(library.number), "empty", split=SPLIT)
    assert second.ids[0] != first.ids[0] and second.ids[1] == first.ids[1]  # the empty library shows nothing either way
    with Session(engine) as session:
        assert session.get(Evaluation, second.ids[0]).selection == {"mode": "top_k", "k": 2}


# ---------------------------------------------------------------------------------------------- training, gate


def test_a_run_and_its_gate_show_k_entries_and_the_learner_reads_what_was_shown(engine, library, scripted):
    set_selection(engine, DEMO_TASK, "default", "top_k", 1, "system")
    run_id = create_run(engine, DEMO_TASK, RunSettings(epochs=1, limit=2, batch_size=2, group_size=2,
                                                       validation_size=4, gate_k=1))
    set_selection(engine, DEMO_TASK, "default", "all", None, "system")  # frozen into the run when it was made
    model, gateway = scripted(engine, rollout=mixed_rollouts())
    run = execute_run(engine, run_id, gateway=gateway)
    assert run.status == JobStatus.COMPLETED, run.error
    assert run.settings["selection"] == {"mode": "top_k", "k": 1}

    with Session(engine) as session:
        step = session.exec(select(Step).where(Step.run_id == run_id)).one()
        trained = session.exec(select(Rollout).where(Rollout.step_id == step.id)).all()
        gates = session.exec(select(Evaluation).where(Evaluation.run_id == run_id,
                                                      Evaluation.purpose == EvaluationPurpose.GATE)).all()
        gated = session.exec(select(Rollout).where(Rollout.evaluation_id.in_([e.id for e in gates]))).all()
    assert len(trained) == 4 and all(len(r.shown_ids) == 1 for r in trained)
    assert len(gates) == 2 and {json.dumps(e.selection) for e in gates} == {'{"mode": "top_k", "k": 1}'}
    assert len(gated) == 8 and all(len(r.shown_ids) == 1 for r in gated)
    for _stage, messages in (c for c in model.calls if c[0] == "rollout"):
        assert sum(text in messages[0]["content"] for text in LIBRARY) == 1
    texts = {e["id"]: e["text"] for e in library.experiences}
    summaries = [messages[1]["content"] for stage, messages in model.calls if stage == "summary"]
    assert summaries
    for prompt in summaries:  # the learner is told the one entry the attempt saw, not the whole library
        given = prompt.split("Experiences the agent was given:")[1].split("The agent's attempt:")[0]
        assert sum(text in given for text in texts.values()) == 1


# ---------------------------------------------------------------------------------------------- attribution


def test_attribution_counts_how_often_each_entry_was_shown(engine, library, scripted):
    set_selection(engine, DEMO_TASK, "default", "top_k", 2, "system")
    run_id = create_attribution(engine, DEMO_TASK, str(library.number), split=SPLIT, k=2, created_by="system")
    _model, gateway = scripted(engine)
    assert execute_run(engine, run_id, gateway=gateway).status == JobStatus.COMPLETED
    effects = experience_effects(engine, library.id)
    by_text = {e.text: e for e in effects.values()}
    shown = {text: sum(2 for expected in QUERIES.values() if text in expected) for text in LIBRARY}
    assert {text: effect.shown for text, effect in by_text.items()} == shown  # k=2 rollouts per query
    assert {effect.rollouts for effect in effects.values()} == {len(QUERIES) * 2}
    assert by_text[HOURS].shown_line == "4 of 6 rollouts"
    with Session(engine) as session:
        variants = session.exec(select(Evaluation).where(Evaluation.run_id == run_id)).all()
    assert {json.dumps(v.selection) for v in variants} == {'{"mode": "top_k", "k": 2}'}


# ---------------------------------------------------------------------------------------------- the HTTP API, CLI


def test_the_api_selection_route_returns_what_the_evaluation_used(engine, library, scripted):
    set_selection(engine, DEMO_TASK, "default", "top_k", 2, "system")
    set_label(engine, DEMO_TASK, str(library.number), "production", "system")
    eval_id = create_evaluation(engine, DEMO_TASK, "production", split=SPLIT, k=1)
    model, gateway = scripted(engine)
    execute_evaluation(engine, eval_id, gateway=gateway)
    prompts = prompts_by_query(model)
    api = TestClient(create_app(engine), headers={"X-API-Key": create_key(engine, "agent", "read", "cli").secret})
    url = f"/v1/tasks/{DEMO_TASK}/libraries/default"

    served = api.get(url).json()
    assert served["selection"] == {"mode": "top_k", "k": 2} and len(served["experiences"]) == len(LIBRARY)
    for query, rollout in rollouts_of(engine, eval_id):
        response = api.get(f"{url}/select", params={"query": query})
        assert response.status_code == 200, response.text
        body = response.json()
        assert [e["id"] for e in body["entries"]] == rollout.shown_ids
        assert body["experiences"] == QUERIES[query][::-1] and body["selection"] == {"mode": "top_k", "k": 2}
        assert (body["version_id"], body["label"], body["query"]) == (library.id, "production", query)
        assert all(text in prompts[query][0] for text in body["experiences"])
        assert 0 < body["entries"][0]["score"] <= body["entries"][1]["score"]  # the most similar last
        again = api.get(f"{url}/select", params={"query": query},
                        headers={"If-None-Match": response.headers["ETag"]})
        assert again.status_code == 304

    assert api.get(f"{url}/select", params={"query": "   "}).status_code == 422
    assert api.get(f"{url}/select").status_code == 422
    assert api.get(f"/v1/tasks/{DEMO_TASK}/libraries/nope/select", params={"query": "x"}).status_code == 404


def test_the_cli_sets_the_selection_and_shows_what_a_query_gets(engine, library, capsys):
    url = url_with_password(engine)
    assert cli.main(["--db", url, "library", "selection", "--task", DEMO_TASK, "--mode", "top_k", "--k", "2"]) == 0
    assert "selection top_k (k=2)" in capsys.readouterr().out
    assert library_selection(engine, DEMO_TASK) == Selection.build("top_k", 2)
    query = next(iter(QUERIES))
    assert cli.main(["--db", url, "library", "select", "--task", DEMO_TASK, "--query", query,
                     "--version", str(library.number), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["experiences"] == QUERIES[query][::-1]
    assert cli.main(["--db", url, "library", "selection", "--task", DEMO_TASK, "--k", "40"]) != 0
    assert "k must be a whole number from 1 to 30" in capsys.readouterr().err
    assert library_selection(engine, DEMO_TASK) == Selection.build("top_k", 2)


def test_an_example_is_ranked_by_what_it_answers_not_by_the_other_customers_story():
    """Issue 52: the agent states the facts of the example it reads last (the most similar). A shipping question
    that mentions tent pegs was shown the tent warranty example last, because that customer's story shared the word
    "tent"; ranked by what each example answers, the free-shipping example comes last (a shop development message)."""
    warranty = {"id": "E3", "kind": "example", "text": "Problem: I bought a two-person tent from you last spring for "
                "our canoe trips. What warranty does it come with? Answer: The tent warranty is 3 years."}
    shipping = {"id": "E2", "kind": "example", "text": "Problem: How much do I have to spend to get free delivery? My "
                "basket is at 48 euros right now with a fleece and some hiking socks. Answer: We offer free shipping "
                "on orders over 60 euros."}
    lesson = {"id": "E1", "text": "State the policy's number."}
    query = ("I was charged 5.90 for shipping on a 35 euro order of tent pegs. At what order total does shipping "
             "become free?")
    shown = select_entries([warranty, shipping, lesson], query, Selection.build("top_k", 2))
    assert [entry["id"] for entry in shown] == ["E3", "E2"]
    assert ranking_text(lesson) == lesson["text"]
    assert ranking_text(shipping).count("free shipping on orders over 60 euros") == 2
