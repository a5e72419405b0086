"""JMS 1.1 message selectors (core/selectors.py) evaluated: the grammar table,
the JMS fields, the three-valued truth tables, odd header values and LIKE
(without backtracking)."""

from __future__ import annotations

from typing import Any

import pytest

from core.selectors import compile_selector
from tests.support.selector_helpers import AND_TABLE, F, H, NOT_TABLE, OR_TABLE, T, U, msg

# (selector, expected three-valued result against msg(H))
TABLE: list[tuple[str, bool | None]] = [
    # literals and identifiers
    ("TRUE", T), ("false", F), ("tRuE", T), ("missing", U), ("t", T), ("fa", F), ("s", U),
    ("n = 5", T), ("n = 5.0", T), ("n = 0x5", T), ("n = 0X05", T), ("f = 2.5", T), ("f = 25e-1", T),
    ("f = .25E1", T), ("n = 5.", T), ("n <> 5", F), ("n = '5'", T), ("s = 'hello'", T),
    ("s = 'Hello'", F), ("s <> 'x'", T), ("q = 'it''s'", T), ("'a''b' = 'a''b'", T), ("empty = ''", T),
    ('"content-type" = \'text/plain\'', T), ('"and" = \'kw\'', T), ('"s" = \'hello\'', T),
    ('"a""b" IS NULL', T), ("content-type = 'text/plain'", U),  # unquoted: content minus type
    # comparisons, numbers held in strings
    ("n > 4", T), ("n >= 5", T), ("n < 5", F), ("n <= 5", T), ("n > 4.9", T), ("neg < 0", T),
    ("f < n", U),  # two header strings: strings, and strings are not ordered
    ("n = neg", F), ("s > 1", U), ("s < 'z'", U), ("s = 1", U), ("missing = 1", U), ("missing <> 1", U),
    ("1 < 2", T), ("2 < 1", F), ("1 = 1.0", T),
    # booleans
    ("t = TRUE", T), ("t = FALSE", F), ("fa = FALSE", T), ("t <> FALSE", T), ("TRUE = TRUE", T),
    ("t > FALSE", U), ("s = TRUE", U), ("n = TRUE", U), ("(n = 5) = TRUE", T), ("(n = 5) = t", T),
    # arithmetic
    ("n + 1 = 6", T), ("n - 1 = 4", T), ("n * 2 = 10", T), ("n / 2 = 2", T), ("-n = -5", T),
    ("n / 2.0 = 2.5", T), ("-7 / 2 = -3", T), ("7 / -2 = -3", T), ("+n = 5", T), ("- -n = 5", T),
    ("1 + 2 * 3 = 7", T), ("(1 + 2) * 3 = 9", T), ("10 - 4 - 3 = 3", T), ("12 / 3 / 2 = 2", T),
    ("n / 0 = 1", U), ("n / 0.0 = 1", U), ("n / (n - 5) IS NULL", T), ("s + 1 = 1", U), ("missing + 1 = 1", U),
    ("t + 1 = 2", U), ("-s = 1", U), ("f * 2 = 5", T), ("n-1 = 4", T),
    # BETWEEN
    ("n BETWEEN 1 AND 10", T), ("n BETWEEN 5 AND 5", T), ("n BETWEEN 6 AND 10", F),
    ("n NOT BETWEEN 6 AND 10", T), ("n NOT BETWEEN 1 AND 10", F), ("missing BETWEEN 1 AND 2", U),
    ("missing NOT BETWEEN 1 AND 2", U), ("n BETWEEN missing AND 10", U), ("n BETWEEN missing AND 4", F),
    ("n BETWEEN 1 + 1 AND n * 2", T), ("s BETWEEN 'a' AND 'z'", U),
    # IN
    ("s IN ('a', 'hello')", T), ("s IN ('a')", F), ("s NOT IN ('a', 'b')", T), ("s NOT IN ('hello')", F),
    ("missing IN ('a')", U), ("missing NOT IN ('a')", U), ("n IN (1, 5)", T), ("n IN (1, -5)", F),
    ("neg IN (-3)", T), ("n IN ('5')", T), ("s IN (1, 'hello')", T), ("s IN (1, 2)", U),
    ("s NOT IN (1, 2)", U), ("type in ('order')", T),
    # LIKE
    ("s LIKE 'h%'", T), ("s LIKE 'h_llo'", T), ("s LIKE 'h_lo'", F), ("s LIKE '%'", T), ("empty LIKE '%'", T),
    ("empty LIKE '_'", F), ("s NOT LIKE 'x%'", T), ("s NOT LIKE '%o'", F), ("missing LIKE '%'", U),
    ("missing NOT LIKE '%'", U), ("n LIKE '5'", T), ("pct LIKE '50!%' ESCAPE '!'", T),
    ("s LIKE 'hel!%' ESCAPE '!'", F), ("pct LIKE '5_\\%' ESCAPE '\\'", T), ("s LIKE 'h.*'", F),
    ("s LIKE 'HELLO'", F), ("q LIKE 'it''_'", T), ("JMSPriority LIKE '4'", U), ("s LIKE '!!' ESCAPE '!'", F),
    # IS NULL
    ("missing IS NULL", T), ("missing IS NOT NULL", F), ("s IS NULL", F), ("s IS NOT NULL", T),
    ("empty IS NULL", F), ("missing + 1 IS NULL", T), ("JMSType is not null", T),
    # JMS fields
    ("JMSMessageID = 'ID:1'", T), ("JMSPriority = 4", T), ("JMSPriority > 3", T), ("JMSTimestamp = 0", T),
    ("JMSExpiration = 0", T), ("JMSDeliveryMode = 'NON_PERSISTENT'", T), ("JMSRedelivered = FALSE", T),
    ("NOT JMSRedelivered", T), ("JMSDestination = '/queue/orders'", T), ("JMSCorrelationID = 'c-1'", T),
    ("JMSType = 'order'", T), ("JMSReplyTo = '/queue/replies'", T), ("JMSXGroupID = 'g1'", T),
    ("JMSXGroupSeq = 3", T), ("JMSXDeliveryCount = 1", T), ("jmspriority = 4", U),
    # precedence and parentheses
    ("NOT n = 5", F), ("NOT NOT n = 5", T), ("n = 5 OR s = 'x' AND s = 'y'", T),
    ("(n = 5 OR s = 'x') AND s = 'y'", F), ("n = 1 OR n = 2 OR n = 5", T), ("n = 5 AND n > 1 AND s = 'hello'", T),
    ("NOT (n = 5 AND s = 'x')", T), ("((((n))))= 5", T), ("n=5 AND(s='hello')", T),
    ("\tn\n=\r5 ", T), ("", T), ("   ", T),
]


@pytest.mark.parametrize(("text", "expected"), TABLE)
def test_grammar_table(text: str, expected: bool | None) -> None:
    selector = compile_selector(text)
    assert selector.evaluate(msg(H)) is expected
    assert selector.matches(msg(H)) is (expected is True)


@pytest.mark.parametrize(
    ("text", "fields", "headers", "expected"),
    [
        ("JMSDeliveryMode = 'PERSISTENT'", {"persistent": True}, {}, T),
        ("JMSRedelivered", {"redeliveries": 2}, {}, T),
        ("JMSRedelivered = TRUE", {"redeliveries": 1}, {}, T),
        ("JMSXDeliveryCount = 3", {"redeliveries": 2}, {}, T),
        ("JMSPriority BETWEEN 7 AND 9", {"priority": 9}, {}, T),
        ("JMSTimestamp > 1000 AND JMSExpiration = 2000", {"timestamp": 1500, "expires": 2000}, {}, T),
        ("JMSDestination LIKE '/topic/a.%'", {"destination": "/topic/a.b"}, {}, T),
        ("JMSMessageID IN ('m-7')", {"id": "m-7"}, {}, T),
        # No headers (a stub): only the JMS fields are known.
        ("JMSPriority = 4", {}, None, T),
        ("a IS NULL", {}, None, T),
        ("a = 'x'", {}, None, U),
        ("JMSType IS NULL AND JMSPriority = 4", {}, None, T),
    ],
)
def test_jms_fields(text: str, fields: dict[str, Any], headers: dict[str, str] | None, expected: bool | None) -> None:
    assert compile_selector(text).evaluate(msg(headers, **fields)) is expected


# Conditions with each truth value against msg(H), in several shapes.
TRUTHS = {T: ["n = 5", "t", "s IS NOT NULL"], F: ["n = 6", "fa", "s LIKE 'x'"], U: ["missing = 1", "s", "s < 'a'"]}


@pytest.mark.parametrize(("pair", "expected"), AND_TABLE.items())
def test_and_truth_table(pair: tuple[bool | None, bool | None], expected: bool | None) -> None:
    for left in TRUTHS[pair[0]]:
        for right in TRUTHS[pair[1]]:
            assert compile_selector(f"{left} AND {right}").evaluate(msg(H)) is expected, (left, right)


@pytest.mark.parametrize(("pair", "expected"), OR_TABLE.items())
def test_or_truth_table(pair: tuple[bool | None, bool | None], expected: bool | None) -> None:
    for left in TRUTHS[pair[0]]:
        for right in TRUTHS[pair[1]]:
            assert compile_selector(f"{left} OR {right}").evaluate(msg(H)) is expected, (left, right)


@pytest.mark.parametrize(("value", "expected"), NOT_TABLE.items())
def test_not_truth_table(value: bool | None, expected: bool | None) -> None:
    for operand in TRUTHS[value]:
        assert compile_selector(f"NOT ({operand})").evaluate(msg(H)) is expected, operand


def test_odd_values_never_raise() -> None:
    weird = {"big": "9" * 5000, "huge": "1e999", "x": "1" + "0" * 400}
    for text in ["big = 1", "big + 1 = 1", "huge > 1", "huge * 0 = 0", "x / 1.5 > 1", "x * 1.0 > 1", "huge - huge = 0"]:
        assert compile_selector(text).evaluate(msg(weird)) in (T, F, U)


# -- LIKE without backtracking ------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "value", "expected"),
    [
        ("%a%b", "xaxb", T), ("%a%b", "xbxa", F), ("a%", "a", T), ("%a", "a", T), ("%%", "", T),
        ("a%a", "a", F), ("a%a", "aa", T), ("_%_", "a", F), ("_%_", "ab", T), ("%_b_%", "abc", T),
        ("%ab%ab%", "abab", T), ("%ab%ab%", "aba", F), ("%aab", "aaab", T), ("x%y%z", "xyyz", T),
        ("x%y%z", "xzy", F), ("%\n%", "a\nb", T), ("_", "é", T), ("a\\%b", "a%b", T), ("a\\%b", "axb", F),
        ("a\\_%", "a_b", T), ("a\\_%", "axb", F), ("%\\\\", "a\\", T),
    ],
)
def test_like_semantics(pattern: str, value: str, expected: bool) -> None:
    text = f"v LIKE '{pattern}' ESCAPE '\\'"
    assert compile_selector(text).evaluate(msg({"v": value})) is expected


def test_like_pattern_that_backtracks_exponentially_in_a_regex_answers() -> None:
    # As a regex, '.*a.*a...b' against 32 (or 10,000) a's takes exponential time;
    # here each piece is searched once.
    selector = compile_selector("h LIKE '%a%a%a%a%a%a%a%a%a%a%b'")
    assert selector.evaluate(msg({"h": "a" * 32})) is F
    assert selector.evaluate(msg({"h": "a" * 10_000})) is F
    assert selector.evaluate(msg({"h": "a" * 10_000 + "b"})) is T
    assert compile_selector("h LIKE '%a_a_a_a_b%'").evaluate(msg({"h": "a" * 10_000})) is F
