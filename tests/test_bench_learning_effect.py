"""bench/learning_effect.py on a tiny dataset with scripted model replies: a row per arm with figures, the default
path's run created as `train` creates it (create_run_with_defaults) and marked in the table, the JSON."""

from __future__ import annotations

import json
import re
import sqlite3
from contextlib import closing
from pathlib import Path

from bench.learning_effect import main, read_records
from core.domain.selection import DEFAULT_K
from tests.conftest import per_query

TRAIN = [{"question": f"Tom has {n} apples and buys {n + 1} more. How many apples does he have?", "answer": 2 * n + 1}
         for n in range(1, 9)]  # 4 to train on and 4 to validate (a gate needs at least 4)
TEST = [{"Body": f"A box holds {n} pens.", "Question": f"How many pens are in {n} boxes?", "Answer": float(n * n)}
        for n in range(2, 5)]


def write_jsonl(path, rows) -> str:
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n", encoding="utf-8")
    return str(path)


def alternating(references: dict[str, str]):
    """Right, then wrong, per query: every group of G >= 2 is mixed and Mean@k lies strictly inside (0, 1)."""
    return per_query(lambda query, n: f"So the answer is \\boxed{{{references[query] if n % 2 else '-1'}}}")


def test_alternative_field_names_are_mapped(tmp_path):
    records, note = read_records(Path(write_jsonl(tmp_path / "svamp.jsonl", TEST)))
    assert records[0] == {"query": "A box holds 2 pens. How many pens are in 2 boxes?", "answer": 4.0}
    assert "query = Body + ' ' + Question, answer = Answer (3)" in note


def example_reply(references: dict[str, str]):
    """The learner's compression of a successful attempt: its problem, two steps and the right answer."""
    def reply(messages: list[dict]) -> str:
        query = re.search(r"Problem:\n(.*?)\n\nThe agent's solution", messages[-1]["content"], re.S).group(1)
        return json.dumps({"problem": query, "steps": ["Add the two amounts", "Check the sum"],
                           "answer": references[query]})
    return reply


REFERENCES = ({row["question"]: str(row["answer"]) for row in TRAIN}
              | {f"{row['Body']} {row['Question']}": str(int(row["Answer"])) for row in TEST})


def scripted_gateways(scripted, models: list):
    """The benchmark's `gateway_for`: a gateway per database with scripted replies (mixed groups, worked
    examples), each database's model kept in `models` in the order the arms ran."""
    def gateway_for(engine):
        model, gateway = scripted(engine, rollout=alternating(REFERENCES), example=example_reply(REFERENCES))
        models.append(model)
        return gateway
    return gateway_for


ARMS = ["default", "default+lessons", "default-hold", "paper", "lessons+reference", "direct"]
SIZES = {"epochs", "batch_size", "group_size", "seed", "validation_size", "gate_k"}  # what train would be given


def test_one_row_per_arm_with_figures_gate_decisions_and_the_goal(tmp_path, capsys, scripted, monkeypatch):
    from core.grpo import training

    given = {}  # arm's library -> what create_run_with_defaults was given

    def spy(engine, task_name, settings, **kwargs):
        given[kwargs["library_name"]] = dict(settings)
        return create_run_with_defaults(engine, task_name, settings, **kwargs)

    create_run_with_defaults = training.create_run_with_defaults
    monkeypatch.setattr(training, "create_run_with_defaults", spy)
    train = write_jsonl(tmp_path / "train.jsonl", TRAIN)
    test = write_jsonl(tmp_path / "test.jsonl", TEST)
    models = []
    gateway_for = scripted_gateways(scripted, models)
    out_json = tmp_path / "result.json"
    result = main(["--train", train, "--test", test, "--train-limit", "4", "--validation-size", "4", "--test-limit",
                   "3", "--epochs", "1", "--batch-size", "2", "--group-size", "2", "--k", "2", "--modes", "direct",
                   "--arms", ",".join(ARMS), "--json", str(out_json), "--db", str(tmp_path / "le.db"),
                   "--no-share-cache"],
                  gateway_for=gateway_for)
    out = capsys.readouterr().out

    rows = {row["name"]: row for row in result["rows"]}
    assert list(rows) == ["empty (direct)", *ARMS]
    assert result["queries"] == {"train": 4, "validation": 4, "test": 3}
    for row in rows.values():
        assert row["evaluation_status"] == "completed" and row["n"] == 3 and row["mode"] == "direct"
        assert 0 <= row["mean_at_k"] <= 1 and row["wall_s"] >= 0
    assert rows["empty (direct)"]["experiences"] == 0 and rows["empty (direct)"]["comparison"] is None
    assert rows["direct"]["experiences"] == 2  # the scripted direct reply has two
    for name in ARMS:
        assert rows[name]["run_status"] == "completed" and rows[name]["reference"] == "empty (direct)"
        c = rows[name]["comparison"]
        assert c["n"] == 3 and c["ci_low"] <= c["delta"] <= c["ci_high"] and 0 <= c["p_value"] <= 1
        assert c["detectable"] > 0
        assert rows[name]["calls"] + rows[name]["cached"] > 0
        assert rows[name]["gate"] == "no_worse"  # the run's default gate: --gate not given
    for name in ARMS[:-1]:  # every trained arm gated, step by step
        assert sum(rows[name]["gate_decisions"].values()) == rows[name]["steps"] == 2, name
        assert rows[name]["groups"]["ok"] == 4 and rows[name]["groups"]["from_reference"] == 0  # every group mixed

    # The default path: created as `train` creates a run given only the sizes, the defaults chosen for the
    # embedded learner stored with it; each other arm gives only the switches it changes.
    assert set(given["default"]) == SIZES
    assert given["default+lessons"] == {**given["default"], "lessons": True}
    assert given["default-hold"] == {**given["default"], "hold_flagged": False}
    assert given["paper"] == {**given["default"], "lessons": True, "examples": False, "reference_when_all_fail": False}
    with closing(sqlite3.connect(tmp_path / "le.default.db")) as db:
        (stored,) = db.execute("SELECT settings FROM run").fetchone()
    stored = json.loads(stored)
    assert stored["examples"] is True and stored["lessons"] is False and stored["reference_when_all_fail"] is True
    assert stored["hold_flagged"] is True and stored["selection"] == {"mode": "top_k", "k": DEFAULT_K}
    assert stored["learner_model"].startswith("local/") and stored["gate"] == "no_worse"
    assert rows["default"]["switches"] == result["default_path"]["switches"] == {
        "examples": True, "lessons": False, "reference_when_all_fail": True, "hold_flagged": True,
        "selection": f"top_k {DEFAULT_K}"}
    assert rows["default"]["changes"] == []
    assert rows["default+lessons"]["changes"] == ["lessons on"]
    assert rows["default-hold"]["changes"] == ["hold_flagged off"]
    assert rows["paper"]["changes"] == ["examples off", "lessons on", "reference off", "selection all"]
    assert rows["lessons+reference"]["changes"] == ["examples off", "lessons on", "selection all"]
    assert [line.split(":")[0] for line in rows["default"]["choices"]] == [
        "worked examples", "lessons", "learning from the reference where every attempt failed",
        "example replies by the learner", "entries per query", "worked examples kept"]

    assert rows["paper"]["examples"] == 0
    assert len(models) == 1 + len(ARMS)  # a gateway per database: the empty library's, then one copy per arm
    by_arm = dict(zip(rows, models, strict=True))
    for name in ("default", "default-hold"):  # examples only
        assert by_arm[name].count("advantage") == 0 < by_arm[name].count("example"), name
    for name in ("paper", "lessons+reference"):
        assert by_arm[name].count("example") == 0 < by_arm[name].count("advantage"), name
    assert by_arm["default+lessons"].count("example") > 0 and by_arm["default+lessons"].count("advantage") > 0
    assert all(by_arm[name].count("gate") > 0 for name in ARMS[:-1])
    assert rows["default+lessons"]["cached"] == 0  # --no-share-cache: nothing answered from another arm's calls
    assert json.loads(out_json.read_text())["rows"][2]["name"] == "default+lessons"
    assert result["goal"].startswith("goal (Δ ≥ +0.05, p < 0.05, interval above 0): ")

    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if "Δ vs empty [95% CI]" in line)
    assert "Mean@2" in lines[header] and "detectable" in lines[header] and "wall s" in lines[header]
    assert lines[header].endswith("against the default path")
    table = lines[header + 2 : header + 3 + len(ARMS)]
    assert [line.split("  ")[0].strip() for line in table] == list(rows)
    assert "(reference)" in table[0] and all("[" in line for line in table[1:])
    against = {line.split("  ")[0].strip(): line.rsplit("  ", 1)[1].strip() for line in table}
    assert against == {"empty (direct)": "-", "default": "the default path", "default+lessons": "lessons on",
                       "default-hold": "hold_flagged off",
                       "paper": "examples off, lessons on, reference off, selection all",
                       "lessons+reference": "examples off, lessons on, selection all",
                       "direct": "a direct run: experiences asked for, no rollouts"}
    chosen = lines.index(next(line for line in lines if line.startswith("the default path (its run's)")))
    assert "for the learner local/" in lines[chosen]
    assert [line.strip() for line in lines[chosen + 1 : chosen + 7]] == rows["default"]["choices"]
    assert lines[chosen + 1].strip().startswith("worked examples: on. ")
    assert lines[chosen + 2].strip().startswith("lessons: off. ")
    assert lines[chosen + 4].strip().startswith("example replies by the learner: off. ")
    assert lines[chosen + 5].strip().startswith(f"entries per query: the {DEFAULT_K} entries most similar")
    assert any(line.startswith("default: run") and "gate no_worse: passed" in line for line in lines)
    assert any(line.startswith("default: run") and "refused before the gate: invalid, or flagged)" in line
               for line in lines)
    assert any(line.startswith("default-hold: run") and "refused before the gate: invalid)" in line for line in lines)
    assert lines[-1].startswith("command: PYTHONPATH=. .venv/bin/python bench/learning_effect.py --train")


def test_a_later_arm_answers_what_an_earlier_arm_asked_from_its_calls_unless_told_not_to(tmp_path, scripted):
    """Both arms start from the same empty library with the same seeds, so `default+lessons` asks for the first
    step's answers `default` already paid for: shared, they come from the cache; not shared, they are paid
    again."""
    train = write_jsonl(tmp_path / "train.jsonl", TRAIN)
    test = write_jsonl(tmp_path / "test.jsonl", TEST)

    def run(folder: str, *extra: str) -> tuple[dict, dict]:
        models = []
        gateway_for = scripted_gateways(scripted, models)
        (tmp_path / folder).mkdir()
        result = main(["--train", train, "--test", test, "--train-limit", "4", "--validation-size", "4",
                       "--test-limit", "3", "--batch-size", "4", "--group-size", "2", "--modes", "direct",
                       "--arms", "default,default+lessons", "--db", str(tmp_path / folder / "b.db"), *extra],
                      gateway_for=gateway_for)
        rows = {row["name"]: row for row in result["rows"]}
        return rows, dict(zip(rows, models, strict=True))

    shared, shared_models = run("shared")
    alone, alone_models = run("alone", "--no-share-cache")
    assert shared["default"]["calls"] == alone["default"]["calls"] > 0  # the first trained arm has nothing to share
    later = "default+lessons"
    assert shared[later]["cached"] > alone[later]["cached"]
    assert shared[later]["calls"] < alone[later]["calls"]
    assert shared_models[later].count("rollout") < alone_models[later].count("rollout")
    assert shared[later]["run_status"] == alone[later]["run_status"] == "completed"
    with closing(sqlite3.connect(tmp_path / "shared" / "b.default_lessons.db")) as db:  # shared rows: no run's
        assert db.execute("SELECT count(*) FROM llmcall WHERE run_id IS NULL AND evaluation_id IS NULL "
                          "AND cache_hit = 0").fetchone()[0] > 0


def test_the_default_paths_examples_written_by_hand_are_a_row_compared_with_the_default_path(tmp_path, capsys,
                                                                                           scripted):
    """`--by-hand`: the default path's library, each example's answer replaced by the person's reply for its
    message, as the next version of the same library; evaluated and compared with the empty library and, query by
    query, with the default path."""
    train = write_jsonl(tmp_path / "train.jsonl", TRAIN)
    test = write_jsonl(tmp_path / "test.jsonl", TEST)
    replies = write_jsonl(tmp_path / "replies.jsonl", [
        {"query": row["question"], "reply": f"He has {row['answer']} apples."} for row in TRAIN])
    result = main(["--train", train, "--test", test, "--train-limit", "4", "--validation-size", "4",
                   "--test-limit", "3", "--batch-size", "2", "--group-size", "2", "--modes", "direct",
                   "--arms", "default", "--by-hand", "--replies", replies, "--db", str(tmp_path / "b.db")],
                  gateway_for=scripted_gateways(scripted, []))
    rows = {row["name"]: row for row in result["rows"]}
    assert list(rows) == ["empty (direct)", "default", "default, by hand"]
    default, hand = rows["default"], rows["default, by hand"]
    assert hand["by_hand"] and hand["evaluation_status"] == "completed" and hand["reference"] == "empty (direct)"
    assert hand["examples"] == default["examples"] > 0 and hand["version_id"] > default["version_id"]
    with closing(sqlite3.connect(tmp_path / "b.by-hand.db")) as db:
        texts = [json.loads(row[0]) for row in db.execute(
            "SELECT experiences FROM libraryversion WHERE id IN (?, ?) ORDER BY id", (default["version_id"],
                                                                                  hand["version_id"]))]
    before, after = ([entry["text"] for entry in version] for version in texts)
    assert [e["id"] for e in texts[0]] == [e["id"] for e in texts[1]]  # the same entries, in the same order
    assert all(" Steps: " in text for text in before)
    assert all(text.endswith(" apples.") and " Steps: " not in text for text in after)
    c = hand["against_default_path"]
    assert c["n"] == 3 and c["ci_low"] <= c["delta"] <= c["ci_high"] and c["wins"] + c["losses"] + c["ties"] == 3
    out = capsys.readouterr().out
    assert "default, by hand: version" in out and "against the default path, paired (by hand minus default): " in out


def test_an_unknown_arm_is_refused_with_the_choices(capsys):
    import pytest

    with pytest.raises(SystemExit):
        main(["--arms", "default,everything"])
    assert ("--arms: everything; choose from default, default+lessons, default-hold, paper, lessons+reference, "
            "direct") in capsys.readouterr().err


def test_the_policy_set_reports_per_policy_figures_and_what_the_library_covers(tmp_path, scripted):
    """Issue 44: on the shop policies the report gives Mean@k per policy for each arm and says which train
    references the default path's library covers and which needs no example states."""
    def gateway_for(engine):
        _model, gateway = scripted(engine, rollout="Thank you for your message. I will look into it.",
                                   example="no JSON here")  # the template writes each reference's reply
        return gateway

    result = main(["--dataset", "policy", "--arms", "default", "--train-limit", "4", "--validation-size", "4",
                   "--test-limit", "3", "--k", "1", "--group-size", "2", "--no-by-hand",
                   "--json", str(tmp_path / "le.json")], gateway_for=gateway_for)
    rows = {row["name"]: row for row in result["rows"]}
    assert set(rows["empty (direct)"]["per_policy"]) == {"return window: 45 days", "ticket reference: PC-…",
                                                         "refund to the original payment method within: 7 business days"}
    assert all(score == 0.0 for scores in rows["empty (direct)"]["per_policy"].values() for score in scores)
    default = rows["default"]
    assert default["examples"] >= 1 and default["coverage"].startswith("coverage: ")
    assert re.search(r"(\d+) of 4 train references", default["coverage"])


def test_the_second_knowledge_task_takes_its_validation_split_from_its_own_file(tmp_path, scripted):
    """Issue 52: `--dataset fernhill` builds the frozen second task, its train, validation and test messages as the
    file splits them (not the train rows' tail), its instructions from bench/fernhill_task.json, and per-need figures."""
    def gateway_for(engine):
        _model, gateway = scripted(engine, rollout="Thanks for asking. I will check with the team.",
                                   example="no JSON here")
        return gateway

    result = main(["--dataset", "fernhill", "--arms", "default", "--train-limit", "4", "--validation-size", "4",
                   "--test-limit", "3", "--k", "1", "--group-size", "2", "--epochs", "1", "--batch-size", "4",
                   "--db", str(tmp_path / "f.db")], gateway_for=gateway_for)
    assert result["queries"] == {"train": 4, "validation": 4, "test": 3}
    with closing(sqlite3.connect(tmp_path / "f.db")) as db:
        validation = [q for (q,) in db.execute("select query from sample where split = 'validation' order by id")]
        instructions = db.execute("select instructions from task").fetchone()[0]
    frozen = [json.loads(line) for line in (Path("bench") / "fernhill_limits.jsonl").read_text().splitlines()]
    assert validation == [row["query"] for row in frozen if row["split"] == "validation"][:4]
    assert instructions.startswith("You are a developer support engineer at Fernhill")
    rows = {row["name"]: row for row in result["rows"]}
    assert set(rows["empty (direct)"]["per_policy"]) == {"rate limit per API key: 600 requests per minute",
                                                         "maximum request body size: 25 MB", "log retention: 14 days"}
    assert "default, by hand" not in rows


def test_a_persons_lessons_are_a_row_and_every_arm_counts_copied_blocks_and_what_it_was_shown(tmp_path, capsys,
                                                                                                scripted):
    """Issue 59: where bench/person_lessons/<dataset>.txt exists, its lessons are imported into a library of their
    own under the default path's selection and evaluated as the ceiling; every arm counts the test replies that
    copy the library's block, and a library's rows count the rollouts shown an entry stating their message's need."""
    def gateway_for(engine):
        _model, gateway = scripted(engine, rollout="[E1] Problem: my upload fails. Answer: In your case: 25 MB.",
                                   example="no JSON here")
        return gateway

    result = main(["--dataset", "fernhill", "--arms", "default", "--train-limit", "4", "--validation-size", "4",
                   "--test-limit", "3", "--k", "1", "--group-size", "2", "--epochs", "1", "--batch-size", "4"],
                  gateway_for=gateway_for)
    rows = {row["name"]: row for row in result["rows"]}
    assert list(rows) == ["empty (direct)", "default", "a person's lessons"]
    person = rows["a person's lessons"]
    lessons = Path("bench/person_lessons/fernhill.txt").read_text().splitlines()
    assert person["person"] and person["experiences"] == len(lessons) and person["examples"] == 0
    assert person["switches"] == {"selection": "top_k 2"} and person["reference"] == "empty (direct)"
    assert all(row["copied_format"] == row["replies"] == 3 for row in rows.values())
    assert person["shown_total"] == 3 and sum(t for _s, t in person["shown_per_need"].values()) == 3
    assert 0 <= person["shown_needs"] == sum(s for s, _t in person["shown_per_need"].values()) <= 3
    assert rows["empty (direct)"]["shown_total"] == 0  # nothing is shown from an empty library
    out = capsys.readouterr().out
    assert "copies 3 of 3 replies (100.0%)" in out and f"shown every need {person['shown_needs']} of 3" in out
