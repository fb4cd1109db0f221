"""Validation and application of library operations."""

from core.domain.library import ProposedOp, apply_ops, diff, next_id_number, validate_ops

LIB = [
    {"id": "E1", "text": "Write down every quantity with its unit."},
    {"id": "E2", "text": "Check the final answer against the question."},
    {"id": "E3", "text": "Prefer exact fractions over rounded decimals."},
]


def errors(ops):
    return [c.error for c in validate_ops(LIB, ops)]


def test_valid_operations_pass():
    ops = [
        ProposedOp("ADD", [], "Estimate the size of the answer before computing it."),
        ProposedOp("MODIFY", ["E1"], "Write down every quantity with its unit and its meaning."),
        ProposedOp("DELETE", ["E3"]),
        ProposedOp("KEEP"),
    ]
    assert errors(ops) == [None, None, None, None]


def test_unknown_ids_empty_long_and_duplicate_texts_are_rejected_with_reasons():
    ops = [
        ProposedOp("MODIFY", ["E9"], "Something new and useful for later problems."),
        ProposedOp("ADD", [], "   "),
        ProposedOp("ADD", [], "word " * 80),
        ProposedOp("ADD", [], "check the FINAL answer against the question"),
        ProposedOp("MERGE", ["E1"], "Only one target is not a merge at all."),
        ProposedOp("FROB", [], "x"),
        ProposedOp("ADD", [], "..."),
        ProposedOp("ADD", [], "<experience>"),
    ]
    result = errors(ops)
    assert result[0] == "unknown experience id E9"
    assert result[1] == "empty text"
    assert result[2].startswith("text too long (80 words")
    assert result[3] == "duplicates an existing experience"
    assert result[4] == "MERGE takes 2 target id(s), got 1"
    assert result[5] == "unknown operation 'FROB'"
    assert result[6].startswith("too short")
    assert result[7] == "a placeholder, not an experience"


def test_a_target_changed_earlier_in_the_batch_cannot_be_changed_again():
    ops = [ProposedOp("DELETE", ["E2"]), ProposedOp("MODIFY", ["E2"], "Check the answer twice before writing it.")]
    assert errors(ops) == [None, "E2 already changed by an earlier operation of this batch"]


def test_two_adds_of_the_same_text_in_one_batch():
    ops = [ProposedOp("ADD", [], "Draw a small table of the quantities."),
           ProposedOp("ADD", [], "Draw a small table of the quantities!")]
    assert errors(ops) == [None, "duplicates an existing experience"]


def test_apply_keeps_ids_and_places_and_numbers_new_ones():
    ops = [
        ProposedOp("MODIFY", ["E2"], "Check the final answer against what the question asks."),
        ProposedOp("MERGE", ["E1", "E3"], "Write quantities with units and keep exact fractions."),
        ProposedOp("ADD", [], "Estimate the size of the answer first."),
    ]
    assert all(c.valid for c in validate_ops(LIB, ops))
    new = apply_ops(LIB, ops, first_new_id=4)
    assert new == [
        {"id": "E4", "text": "Write quantities with units and keep exact fractions."},
        {"id": "E2", "text": "Check the final answer against what the question asks."},
        {"id": "E5", "text": "Estimate the size of the answer first."},
    ]
    assert LIB[1]["text"] == "Check the final answer against the question."  # the old version is untouched
    changes = {(c["change"], c["id"]) for c in diff(LIB, new)}
    assert changes == {("removed", "E1"), ("removed", "E3"), ("changed", "E2"), ("added", "E4"), ("added", "E5")}


def test_next_id_number_never_reuses_an_id():
    assert next_id_number(["E1", "E7", "E3", "X9"]) == 8
    assert next_id_number([]) == 1


def test_add_beyond_the_size_limit_is_rejected_unless_room_is_made():
    add = ProposedOp("ADD", [], "Estimate the size of the answer before computing it.")
    assert [c.error for c in validate_ops(LIB, [add], max_size=3)] == [
        "the library is full (3 experiences): merge or delete first"]
    ops = [ProposedOp("DELETE", ["E3"]), add]
    assert [c.error for c in validate_ops(LIB, ops, max_size=3)] == [None, None]
