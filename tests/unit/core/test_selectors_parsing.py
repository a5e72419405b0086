"""JMS 1.1 message selectors (core/selectors.py) parsed: invalid selectors
refused with the position and the reason, the limits on depth, length and
terms, arbitrary text, and compiling once so that matching does no parsing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core import selectors
from core.selectors import SelectorError, compile_selector
from tests.support.selector_helpers import F, H, T, U, msg


@pytest.mark.parametrize(
    ("text", "position", "says"),
    [
        ("a = ", 4, "expected an identifier, a literal or '('"),
        ("a == 1", 3, "found operator '='"),
        ("a = 'abc", 8, "expected closing ' of the string literal opened at offset 4"),
        ("a LIKE", 6, "expected a string literal pattern after LIKE"),
        ("a LIKE b", 7, "expected a string literal pattern after LIKE"),
        ("a = 1 # 2", 6, "unexpected character '#'"),
        ("a != 1", 2, "unexpected character '!'"),
        ("a = 1 b", 6, "expected AND, OR or end of selector"),
        ("a = 1 = 2", 6, "expected AND, OR or end of selector"),
        ("(a = 1", 6, "expected ')'"),
        ("a = 1)", 5, "expected AND, OR or end of selector"),
        ("a AND", 5, "expected an identifier"),
        ("AND a", 0, "expected an identifier"),
        ("a NOT 1", 6, "expected BETWEEN, IN or LIKE after NOT"),
        ("a BETWEEN 1 OR 2", 12, "expected AND in BETWEEN"),
        ("a IN 'x'", 5, "expected '(' to open the IN list"),
        ("a IN ()", 6, "expected a string or number literal in the IN list"),
        ("a IN ('x' 'y')", 10, "expected ',' or ')' in the IN list"),
        ("a IN (b)", 6, "expected a string or number literal"),
        ("a IN (-'x')", 7, "expected a number after the sign"),
        ("a IS 1", 5, "expected NULL or NOT NULL after IS"),
        ("a IS NOT", 8, "expected NULL or NOT NULL after IS"),
        ("a LIKE 'x' ESCAPE 'ab'", 18, "expected a one-character string literal after ESCAPE"),
        ("a LIKE 'x' ESCAPE", 17, "expected a one-character string literal after ESCAPE"),
        ("a LIKE 'x!' ESCAPE '!'", 7, "expected a character after the escape character"),
        ("a = NULL", 4, "expected an identifier"),
        ('"abc = 1', 8, 'expected closing " of the quoted identifier opened at offset 0'),
        ('"" = 1', 1, "expected a name inside the quoted identifier"),
        ("a = 1e", 5, "expected an operator or space after the number"),
        ("a = 0x", 5, "expected an operator or space after the number"),
        ("a = 1.2.3", 7, "expected an operator or space after the number"),
        ("a = 12abc", 6, "expected an operator or space after the number"),
        ("n=5AND s = 1", 3, "expected an operator or space after the number"),
        ("a = .", 4, "unexpected character '.'"),
        ("a = \u00b2", 4, "unexpected character"),
        ("a;", 1, "unexpected character ';'"),
        ("()", 1, "expected an identifier, a literal or '('"),
    ],
)
def test_invalid_selectors(text: str, position: int, says: str) -> None:
    with pytest.raises(SelectorError) as caught:
        compile_selector(text)
    assert caught.value.position == position
    assert says in caught.value.reason
    assert isinstance(caught.value, ValueError)


def test_limits() -> None:
    compile_selector("(" * selectors.MAX_DEPTH + "a" + ")" * selectors.MAX_DEPTH + " IS NULL")
    with pytest.raises(SelectorError, match="levels of nesting"):
        compile_selector("(" * 1000 + "a" + ")" * 1000)
    with pytest.raises(SelectorError, match="levels of nesting"):
        compile_selector("NOT " * 1000 + "a")
    with pytest.raises(SelectorError, match="levels of nesting"):
        compile_selector("-" * 1000 + "a = 1")
    with pytest.raises(SelectorError, match="levels of nesting"):
        compile_selector("a = " + " + ".join(["1"] * 200))
    with pytest.raises(SelectorError, match="characters") as caught:
        compile_selector("a = 1 " + " " * selectors.MAX_SELECTOR_CHARS)
    assert caught.value.position == selectors.MAX_SELECTOR_CHARS
    # Long flat chains are fine: AND and OR operands are held in one node.
    long_chain = " OR ".join(f"n = {i}" for i in range(300))
    assert len(long_chain) < selectors.MAX_SELECTOR_CHARS
    assert compile_selector(long_chain).matches(msg(H))


def test_compiles_once_and_matching_does_no_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    selector = compile_selector("JMSPriority > 3 AND (kind IN ('a', 'b') OR n BETWEEN 10 AND 20) AND s LIKE 'x%'")
    assert callable(selector.predicate)

    def no_parsing(*args: object) -> None:
        raise AssertionError("parsed while matching")

    monkeypatch.setattr(selectors, "tokenize", no_parsing)
    monkeypatch.setattr(selectors, "parse", no_parsing)
    messages = [msg({"kind": "ab"[i % 2], "n": str(i % 30), "s": "xy" if i % 3 else "yx"}) for i in range(10_000)]
    matched = sum(selector.matches(m) for m in messages)
    expected = sum(1 for i in range(10_000) if i % 3)  # kind is always a or b; s starts with x unless i % 3 == 0
    assert matched == expected


@given(st.text(alphabet="ab1.'\"()=<>!-+*/% _xINOTANDLIKE", max_size=40))
def test_arbitrary_text_parses_or_raises_selector_error(text: str) -> None:
    try:
        selector = compile_selector(text)
    except SelectorError as error:
        assert 0 <= error.position <= len(text)
    else:
        assert selector.evaluate(msg({"a": "1", "b": "x"})) in (T, F, U)


def test_too_many_terms_are_refused() -> None:
    many = " OR ".join(f"n = {i}" for i in range(selectors.MAX_NODES // 3 + 1))
    assert len(many) < selectors.MAX_SELECTOR_CHARS
    with pytest.raises(SelectorError, match=f"at most {selectors.MAX_NODES} terms"):
        compile_selector(many)
