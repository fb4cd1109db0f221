import pytest

from core.domain.answers import extract_final_answer, normalize_answer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"First \boxed{3} then finally \boxed{12}.", "12"),
        (r"So the result is \boxed{\frac{3}{4}}", r"\frac{3}{4}"),
        (r"\boxed{x^{2} + \sqrt{y_{1}}}", r"x^{2} + \sqrt{y_{1}}"),
        (r"\fbox{42}", "42"),
        (r"\boxed {7}", "7"),
        ("Reasoning...\nFinal answer: 42.", "42"),
        ("**Final Answer:** $12$.", "12"),
        ("Answer: **B**", "B"),
        ("Answer:\n\n  17.\n", "17"),
        ("We add 3 and 4 to get 7 apples.", "7"),
        ("The cost was -4.5 dollars", "-4.5"),
        ("5-3 = 2", "2"),
        ("There are 1,234,567 people", "1234567"),
        ("average 0.25", "0.25"),
    ],
)
def test_extract_final_answer(text, expected):
    assert extract_final_answer(text) == expected


def test_extract_prefers_boxed_over_answer_label_and_numbers():
    text = r"answer: 5, but after checking \boxed{6} and 7 more words 8"
    assert extract_final_answer(text) == "6"


def test_extract_prefers_label_over_trailing_numbers():
    assert extract_final_answer("Final answer: twelve\n(checked in 3 steps)") == "twelve"


def test_unbalanced_box_falls_back_to_number():
    assert extract_final_answer(r"we get 9 so \boxed{9") == "9"


@pytest.mark.parametrize("text", ["", "I have no idea.", r"\boxed{}"])
def test_extract_returns_none_without_answer(text):
    assert extract_final_answer(text) is None


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("12.0", "12"),
        ("1,000", "1000"),
        ("0.50", "0.5"),
        (" $12$ ", "12"),
        ("12.", "12"),
        ("-0.0", "0"),
        ("+3", "3"),
        (".5", "0.5"),
        (r"\text{Yes}", "yes"),
        (r"$\text{ Paris }$.", "paris"),
        ("Hello   World", "hello world"),
        ("1,2", "1,2"),
        (r"\frac{3}{4}", r"\frac{3}{4}"),
    ],
)
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


@pytest.mark.parametrize("raw", [None, "", "   ", "$ $", "."])
def test_normalize_blank_is_none(raw):
    assert normalize_answer(raw) is None


def test_normalize_huge_exponent_does_not_explode():
    assert normalize_answer("1e400") == "1E+400"
