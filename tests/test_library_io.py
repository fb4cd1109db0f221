import json
import re

import pytest

from core.domain.library_io import (
    LibraryFormatError,
    parse_library_text,
    to_json,
    to_markdown,
    to_prompt_block,
)

LIBRARY = [
    {"id": "e1", "text": "Check that the units of the answer match the question."},
    {"id": "e7", "text": "When a quantity is removed twice, subtract both amounts."},
    {"id": "e9", "text": "Write 2.5, not 5/2, and [brackets] stay as they are."},
]
TEXTS = [e["text"] for e in LIBRARY]


def test_json_list_of_strings():
    assert parse_library_text('["  first ", "", "second"]') == ["first", "second"]


def test_json_object_with_g_keys_is_ordered_by_number():
    text = json.dumps({"G10": "eleventh", "G2": "third", "G0": "first", "G1": "second"})
    assert parse_library_text(text) == ["first", "second", "third", "eleventh"]


def test_json_object_with_other_keys_keeps_insertion_order():
    text = json.dumps({"units": "Check units.", "arith": "Recompute sums.", "G1": "Other."})
    assert parse_library_text(text) == ["Check units.", "Recompute sums.", "Other."]


def test_json_list_of_text_objects_and_experiences_wrapper():
    objects = [{"id": "a", "text": "one"}, {"text": "two", "score": 3}]
    assert parse_library_text(json.dumps(objects)) == ["one", "two"]
    assert parse_library_text(json.dumps({"experiences": objects, "task": "math"})) == ["one", "two"]
    assert parse_library_text(json.dumps({"experiences": {"G1": "b", "G0": "a"}})) == ["a", "b"]


def test_markdown_bullets_with_heading_and_continuation_lines():
    text = "# My library\n\nSome intro line.\n- first item\n  wraps here\n* second\n\n+ third\n"
    assert parse_library_text(text, "lib.md") == ["first item wraps here", "second", "third"]


def test_numbered_and_bracketed_lists():
    text = "1. one\n2) two\n[G2]. three\n[G3] four\n[4]. five\n- [G5] six\n- [G6]. seven"
    assert parse_library_text(text) == ["one", "two", "three", "four", "five", "six", "seven"]


def test_prompt_block_output_is_parsed_back():
    assert parse_library_text(to_prompt_block(LIBRARY)) == TEXTS


def test_plain_lines_without_markers_are_one_experience_each():
    assert parse_library_text("Check units.\n\nRecompute the sum.\n") == [
        "Check units.",
        "Recompute the sum.",
    ]


def test_headings_and_code_fences_are_skipped_but_hash_text_is_kept():
    text = "```markdown\n## Library\n#1 rule: check units.\nRecompute the sum.\n```\n"
    assert parse_library_text(text) == ["#1 rule: check units.", "Recompute the sum."]


def test_numbers_at_line_start_are_not_markers():
    assert parse_library_text("- Halve it:\n1.5 becomes 0.75\n-3 stays negative") == [
        "Halve it: 1.5 becomes 0.75 -3 stays negative"
    ]


def test_to_markdown_format():
    assert to_markdown(LIBRARY[:2], title="Math") == (
        "# Math\n\n"
        "- [e1] Check that the units of the answer match the question.\n"
        "- [e7] When a quantity is removed twice, subtract both amounts.\n"
    )


def test_to_json_format_keeps_ids_and_meta():
    document = json.loads(to_json(LIBRARY, {"library": "math", "version": 3}))
    assert document == {"experiences": LIBRARY, "library": "math", "version": 3}
    assert to_json(LIBRARY).startswith('{\n  "experiences": [\n')


def test_to_json_rejects_meta_that_would_hide_the_experiences():
    with pytest.raises(ValueError, match="experiences"):
        to_json(LIBRARY, {"experiences": []})


def test_to_prompt_block_names_each_entry_by_its_id():
    """The agent reads each entry under the id the pages, the learner and the API's `entries` use (E7 stays E7 in
    every version and under every query's selection), not the paper's renumbering G0, G1, ..."""
    assert to_prompt_block(LIBRARY[:2]) == (
        "[e1] Check that the units of the answer match the question.\n"
        "[e7] When a quantity is removed twice, subtract both amounts."
    )
    assert to_prompt_block([{"text": "no id given"}, {"text": "nor here"}]) == "[E1] no id given\n[E2] nor here"
    assert to_prompt_block([]) == ""


def test_prompt_block_and_markdown_keep_each_experience_on_one_line():
    library = [{"id": "E4", "text": "line one\nline two"}]
    assert to_prompt_block(library) == "[E4] line one line two"
    assert parse_library_text(to_markdown(library)) == ["line one line two"]
    assert parse_library_text(to_prompt_block(library)) == ["line one line two"]


@pytest.mark.parametrize("export", [to_markdown, to_json])
def test_round_trip(export):
    assert parse_library_text(export(LIBRARY)) == TEXTS


def test_round_trip_of_tricky_texts():
    library = [
        {"id": "1", "text": "- starts with a dash"},
        {"id": "2", "text": "[G7] starts with a bracketed id"},
        {"id": "3", "text": "#1 rule: check units"},
        {"id": "4", "text": 'Quotes "and" unicode: 5 € ≥ 3 €'},
    ]
    texts = [e["text"] for e in library]
    assert parse_library_text(to_markdown(library)) == texts
    assert parse_library_text(to_json(library), "lib.json") == texts


def test_json_round_trip_keeps_inner_newlines():
    library = [{"id": "x", "text": "line one\nline two"}]
    assert parse_library_text(to_json(library)) == ["line one\nline two"]


def test_bom_is_ignored():
    assert parse_library_text('\ufeff["a"]') == ["a"]


@pytest.mark.parametrize("text", ["", "   \n\t\n"])
def test_empty_file(text):
    with pytest.raises(LibraryFormatError, match="lib.md: the file is empty"):
        parse_library_text(text, "lib.md")


@pytest.mark.parametrize(
    "text", ["[]", "{}", '["", "  "]', '{"experiences": []}', "# Only a heading\n", "- \n* \n"]
)
def test_no_experiences(text):
    with pytest.raises(LibraryFormatError, match="no experiences found"):
        parse_library_text(text)


@pytest.mark.parametrize(
    ("text", "filename", "fragment"),
    [
        ('{"G0": "a",', "", "not valid JSON"),
        ("- a markdown list", "lib.json", "lib.json: not valid JSON"),
        ("[1, 2]", "", "item 1 is neither a string nor an object"),
        ('[{"content": "x"}]', "", "item 1 is neither"),
        ('{"G0": "a", "G1": 2}', "", "value of 'G1' is not a string"),
        ('{"experiences": "a"}', "", "'experiences' must be a list"),
        ('"just a string"', "x.json", "expected a JSON list or object, got str"),
    ],
)
def test_unparsable(text, filename, fragment):
    with pytest.raises(LibraryFormatError, match=fragment):
        parse_library_text(text, filename)


def test_library_format_error_is_a_value_error():
    assert issubclass(LibraryFormatError, ValueError)


# --- the learner's limits on an import (issue 12) -------------------------------------------------------


def test_an_import_has_the_learners_limits():
    from core.domain.library import MAX_CHARS, MAX_EXPERIENCES, MAX_WORDS
    from core.records.runs.settings import RunSettings

    assert RunSettings.model_fields["max_experiences"].default == MAX_EXPERIENCES  # one number, not two
    fits = ["Check the units. " * 20 + "Then answer."] * MAX_EXPERIENCES  # 62 words, 352 characters
    assert len(fits[0].split()) <= MAX_WORDS and len(fits[0]) <= MAX_CHARS
    assert parse_library_text(json.dumps(fits)) == [t.strip() for t in fits]


@pytest.mark.parametrize("texts, message", [
    (["Check the units of the answer."] * 31, "lib.json: 31 experiences; an import holds at most 30"),
    (["x" * 501], "lib.json: experience 1 is too long (1 words, 501 characters"),
    (["ok then fine", "word " * 65], "lib.json: experience 2 is too long (65 words, 324 characters"),
])
def test_too_many_or_too_long_experiences_are_refused(texts, message):
    with pytest.raises(LibraryFormatError, match="^" + re.escape(message)):
        parse_library_text(json.dumps(texts), "lib.json")


def test_a_file_over_two_megabytes_is_refused_before_it_is_parsed():
    from core.domain.library_io import MAX_FILE_BYTES, decode_library

    five_million = json.dumps(["x" * 5_000_000])
    with pytest.raises(LibraryFormatError, match=r"^lib.json: the file is 4.8 MB; the limit for a library is 2 MB$"):
        parse_library_text(five_million, "lib.json")
    with pytest.raises(LibraryFormatError, match=r"^up.md: the file is 2.1 MB"):
        decode_library(b"- a\n" * (MAX_FILE_BYTES // 4 + 20_000), "up.md")
    with pytest.raises(LibraryFormatError, match="not UTF-8"):
        decode_library(b"\xff\xfe\x00\x81", "lib.txt")
    assert decode_library("\ufeff- Check the units.".encode(), "lib.md") == "- Check the units."
