"""bench/learning_effect.py on a tiny dataset with scripted model replies: four rows with figures, the JSON."""

from __future__ import annotations

import json
import re
import sqlite3
from contextlib import closing
from pathlib import Path

from bench.learning_effect import main, read_records
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


def test_one_row_per_arm_with_figures_gate_decisions_and_the_goal(tmp_path, capsys, scripted):
    train = write_jsonl(tmp_path / "train.jsonl", TRAIN)
    test = write_jsonl(tmp_path / "test.jsonl", TEST)
    models = []
    gateway_for = scripted_gateways(scripted, models)
    out_json = tmp_path / "result.json"
    result = main(["--train", train, "--test", test, "--train-limit", "4", "--validation-size", "4", "--test-limit",
                   "3", "--epochs", "1", "--batch-size", "2", "--group-size", "2", "--k", "2", "--modes", "direct",
                   "--arms", "lessons,lessons+reference,examples,both,direct", "--json", str(out_json),
                   "--no-share-cache"],
                  gateway_for=gateway_for)
    out = capsys.readouterr().out

    rows = {row["name"]: row for row in result["rows"]}
    assert list(rows) == ["empty (direct)", "lessons", "lessons+reference", "examples", "both", "direct"]
    assert result["queries"] == {"train": 4, "validation": 4, "test": 3}
    for row in rows.values():
        assert row["evaluation_status"] == "completed" and row["n"] == 3 and row["mode"] == "direct"
        assert 0 <= row["mean_at_k"] <= 1 and row["wall_s"] >= 0
    assert rows["empty (direct)"]["experiences"] == 0 and rows["empty (direct)"]["comparison"] is None
    assert rows["direct"]["experiences"] == 2  # the scripted direct reply has two
    for name in ("lessons", "lessons+reference", "examples", "both", "direct"):
        assert rows[name]["run_status"] == "completed" and rows[name]["reference"] == "empty (direct)"
        c = rows[name]["comparison"]
        assert c["n"] == 3 and c["ci_low"] <= c["delta"] <= c["ci_high"] and 0 <= c["p_value"] <= 1
        assert c["detectable"] > 0
        assert rows[name]["calls"] + rows[name]["cached"] > 0
    for name in ("lessons", "lessons+reference", "examples", "both"):  # every trained arm gated, step by step
        assert sum(rows[name]["gate_decisions"].values()) == rows[name]["steps"] == 2, name
        assert rows[name]["groups"]["ok"] == 4 and rows[name]["groups"]["from_reference"] == 0  # every group mixed
    assert rows["lessons"]["examples"] == 0
    assert len(models) == 6  # a gateway per database: the empty library's, then one copy per arm
    by_arm = dict(zip(rows, models, strict=True))
    assert by_arm["examples"].count("advantage") == 0 < by_arm["examples"].count("example")  # examples only
    assert by_arm["lessons"].count("example") == 0 < by_arm["lessons"].count("advantage")
    assert by_arm["both"].count("example") > 0 and by_arm["both"].count("advantage") > 0
    assert all(by_arm[name].count("gate") > 0 for name in ("lessons", "examples", "both"))
    assert rows["both"]["cached"] == 0  # --no-share-cache: nothing answered from another arm's calls
    assert json.loads(out_json.read_text())["rows"][4]["name"] == "both"
    assert result["goal"].startswith("goal (Δ ≥ +0.05, p < 0.05, interval above 0): ")

    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if "Δ vs empty [95% CI]" in line)
    assert "Mean@2" in lines[header] and "detectable" in lines[header] and "wall s" in lines[header]
    table = lines[header + 2 : header + 8]
    assert [line.split("  ")[0].strip() for line in table] == list(rows)
    assert "(reference)" in table[0] and all("[" in line for line in table[1:])
    assert any(line.startswith("lessons: run") and "gate no_worse: passed" in line for line in lines)
    assert lines[-1].startswith("command: PYTHONPATH=. .venv/bin/python bench/learning_effect.py --train")


def test_a_later_arm_answers_what_an_earlier_arm_asked_from_its_calls_unless_told_not_to(tmp_path, scripted):
    """Both arms start from the same empty library with the same seeds, so `both` asks for the first step's
    answers `lessons` already paid for: shared, they come from the cache; not shared, they are paid again."""
    train = write_jsonl(tmp_path / "train.jsonl", TRAIN)
    test = write_jsonl(tmp_path / "test.jsonl", TEST)

    def run(folder: str, *extra: str) -> tuple[dict, dict]:
        models = []
        gateway_for = scripted_gateways(scripted, models)
        (tmp_path / folder).mkdir()
        result = main(["--train", train, "--test", test, "--train-limit", "4", "--validation-size", "4",
                       "--test-limit", "3", "--batch-size", "4", "--group-size", "2", "--modes", "direct",
                       "--arms", "lessons,both", "--db", str(tmp_path / folder / "b.db"), *extra],
                      gateway_for=gateway_for)
        rows = {row["name"]: row for row in result["rows"]}
        return rows, dict(zip(rows, models, strict=True))

    shared, shared_models = run("shared")
    alone, alone_models = run("alone", "--no-share-cache")
    assert shared["lessons"]["calls"] == alone["lessons"]["calls"] > 0  # the first trained arm has nothing to share
    assert shared["both"]["cached"] > alone["both"]["cached"]
    assert shared["both"]["calls"] < alone["both"]["calls"]
    assert shared_models["both"].count("rollout") < alone_models["both"].count("rollout")
    assert shared["both"]["run_status"] == alone["both"]["run_status"] == "completed"
    with closing(sqlite3.connect(tmp_path / "shared" / "b.both.db")) as db:  # the shared rows belong to no run
        assert db.execute("SELECT count(*) FROM llmcall WHERE run_id IS NULL AND evaluation_id IS NULL "
                          "AND cache_hit = 0").fetchone()[0] > 0


def test_an_unknown_arm_is_refused_with_the_choices(capsys):
    import pytest

    with pytest.raises(SystemExit):
        main(["--arms", "lessons,everything"])
    assert "--arms: everything; choose from lessons, lessons+reference, examples, both, direct" in capsys.readouterr().err
