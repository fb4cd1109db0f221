r"""Whether a regular expression can take exponential time: a repeated group that can match the same text in
more than one way.

Python's `re` backtracks: when a repeated group can split the same text in many ways (`(a+)+`, `(\w+\s?)*`,
`(a|aa)*`), a failing match tries every split, 2^n of them. A repeated group is safe here when each of
its variable-length parts is followed (within the group, or at the start of the next repetition) by a
required part that cannot start with any character the variable part can match, and its alternatives
cannot start alike: `(\.[\w-]+)+`, `(,\s*\d+)*` and `(\w+\s)*` pass. Character sets are compared on a
sample of characters (ASCII, Latin, a few others), folded for case; the scoring process's time limit
remains the guard for whatever this misses.

Used by the `regex` reward (core.domain.rewards) and by the task files' checks (core.records.tasks.demos) before a
pattern written by a task's author ever runs.
"""

from __future__ import annotations

import re
import re._constants as sre
import re._parser as sre_parse
from typing import Any

_COSTLY_PATTERN = ("pattern can take exponential time: a repeated group can match the same text in more than "
                   r"one way (like (a+)+, (\w+\s?)* or (a|aa)*); make each repetition match one way only")
_SAMPLE = frozenset(map(chr, range(0x250))) | frozenset("\u00a0\u0394\u0436\u0663\u2003\u2028\u4e2d\U0001f600")
_CATEGORIES = {sre.CATEGORY_DIGIT: r"\d", sre.CATEGORY_NOT_DIGIT: r"\D", sre.CATEGORY_SPACE: r"\s",
               sre.CATEGORY_NOT_SPACE: r"\S", sre.CATEGORY_WORD: r"\w", sre.CATEGORY_NOT_WORD: r"\W",
               sre.CATEGORY_LINEBREAK: r"\n", sre.CATEGORY_NOT_LINEBREAK: r"[^\n]"}
_REPEATS = (sre.MAX_REPEAT, sre.MIN_REPEAT)
_ZERO_WIDTH = (sre.AT, sre.ASSERT, sre.ASSERT_NOT)
_ONE_CHAR = (sre.LITERAL, sre.NOT_LITERAL, sre.ANY, sre.IN)
Item = tuple[Any, Any]  # one (opcode, argument) of re._parser's parse tree


def _folded(chars: frozenset[str]) -> frozenset[str]:
    """Both cases of every character: the pattern may be matched ignoring case."""
    return chars | {c.lower() for c in chars} | {c.upper() for c in chars if len(c.upper()) == 1}


def _in_set(char: str, members: list[Item]) -> bool:
    """Whether `char` matches a character set's members (LITERAL, RANGE, CATEGORY)."""
    for op, av in members:
        if op is sre.LITERAL and char == chr(av):
            return True
        if op is sre.RANGE and av[0] <= ord(char) <= av[1]:
            return True
        if op is sre.CATEGORY and re.fullmatch(_CATEGORIES.get(av, r"(?s:.)"), char):
            return True
    return False


def _one_char(op: Any, av: Any) -> frozenset[str]:
    """The characters (of the sample, folded) a one-character element can match."""
    if op is sre.LITERAL:
        return _folded(frozenset(chr(av)))
    if op is sre.NOT_LITERAL or op is sre.ANY:
        return _SAMPLE
    negate = bool(av) and av[0][0] is sre.NEGATE
    members = av[1:] if negate else av
    chars = frozenset(c for c in _SAMPLE if _in_set(c, members) != negate)
    return _folded(chars | {chr(a) for o, a in members if o is sre.LITERAL and not negate})


def _children(op: Any, av: Any) -> list:
    """The sub-sequences of one element of the parse tree."""
    if op is sre.SUBPATTERN:
        return [av[3]]
    if op is sre.BRANCH:
        return list(av[1])
    if op in _REPEATS or op is sre.POSSESSIVE_REPEAT:
        return [av[2]]
    if op is sre.ATOMIC_GROUP:
        return [av]
    if op in (sre.ASSERT, sre.ASSERT_NOT):
        return [av[1]]
    if op is sre.GROUPREF_EXISTS:
        return [part for part in av[1:] if part is not None]
    return []


def _all_chars(items: Any) -> frozenset[str]:
    """Every character some element of `items` can match (a back-reference: any)."""
    chars: frozenset[str] = frozenset()
    for op, av in items:
        if op in _ONE_CHAR:
            chars |= _one_char(op, av)
        elif op is sre.GROUPREF:
            return _SAMPLE
        else:
            for child in _children(op, av):
                chars |= _all_chars(child)
    return chars


def _first(items: Any) -> tuple[frozenset[str], bool]:
    """The characters a match of `items` can start with, and whether it can match nothing."""
    chars: frozenset[str] = frozenset()
    for item in items:
        first, empty = _first_of(*item)
        chars |= first
        if not empty:
            return chars, False
    return chars, True


def _first_of(op: Any, av: Any) -> tuple[frozenset[str], bool]:
    if op in _ONE_CHAR:
        return _one_char(op, av), False
    if op in _ZERO_WIDTH:
        return frozenset(), True
    if op in _REPEATS or op is sre.POSSESSIVE_REPEAT:
        first, empty = _first(av[2])
        return first, empty or av[0] == 0
    if op in (sre.SUBPATTERN, sre.ATOMIC_GROUP, sre.BRANCH):
        parts = [_first(child) for child in _children(op, av)]
        return frozenset().union(*(f for f, _ in parts)), any(e for _, e in parts)
    return _SAMPLE, True  # a back-reference or a conditional group: it could start with anything


def _flat(items: Any) -> list[Item]:
    """The elements of a sequence with plain groups opened and zero-width ones (anchors, look-arounds) left out."""
    flat: list[Item] = []
    for op, av in items:
        if op is sre.SUBPATTERN:
            flat.extend(_flat(av[3]))
        elif op not in _ZERO_WIDTH:
            flat.append((op, av))
    return flat


def _alternatives_overlap(items: Any) -> bool:
    """Whether some alternation in `items` has two alternatives that can start with the same character."""
    for op, av in items:
        if op is sre.BRANCH:
            firsts = [_first(alternative) for alternative in av[1]]
            for i, (first, empty) in enumerate(firsts):
                for other, other_empty in firsts[i + 1:]:
                    if first & other or (empty and other_empty):
                        return True
        if any(_alternatives_overlap(child) for child in _children(op, av)):
            return True
    return False


def _ambiguous_body(body: Any, state: Any) -> bool:
    """Whether the body of a repetition can match the same text in more than one way (see above)."""
    if _alternatives_overlap(body):
        return True
    items = _flat(body)
    for index, (op, av) in enumerate(items):
        if op is sre.POSSESSIVE_REPEAT or op is sre.ATOMIC_GROUP:  # never gives characters back
            continue
        low, high = sre_parse.SubPattern(state, [(op, av)]).getwidth()
        if low == high:
            continue
        following, can_be_empty = _first_of(*items[(index + 1) % len(items)])
        if can_be_empty or following & _all_chars([(op, av)]):
            return True
    return False


def _costly(items: Any, state: Any) -> bool:
    """Whether some repetition (of more than one) in the parse tree has an ambiguous body."""
    for op, av in items:
        if op in _REPEATS and av[1] > 1 and _ambiguous_body(av[2], state):
            return True
        if any(_costly(child, state) for child in _children(op, av)):
            return True
    return False


def pattern_problem(pattern: str) -> str | None:
    """Why `pattern` can take exponential time to match (a nested quantifier, overlapping alternatives in a
    repetition), or None. An invalid pattern is none of this function's business (re.compile says why)."""
    try:
        parsed = sre_parse.parse(pattern)
    except (re.error, RecursionError, OverflowError):
        return None
    return _COSTLY_PATTERN if _costly(parsed, parsed.state) else None
