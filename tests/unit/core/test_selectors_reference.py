"""JMS 1.1 message selectors (core/selectors.py) checked by Hypothesis against
a reference evaluator that works on a generated AST, and LIKE against a
reference matcher."""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from core.messages import Message
from core.selectors import compile_selector
from tests.support.selector_helpers import AND_TABLE, F, NOT_TABLE, OR_TABLE, U, msg


# -- reference evaluator over a generated AST ---------------------------------------
#
# The AST is nested tuples; ``render`` turns it into selector text (fully
# parenthesised) and ``ref_eval`` evaluates it directly from the JMS rules.

NAMES = ["a", "b", "c", '"x-y"', "JMSPriority", "JMSDeliveryMode", "JMSRedelivered", "JMSXGroupSeq"]
HEADER_NAMES = ["a", "b", "c", "x-y", "JMSXGroupSeq"]
HEADER_VALUES = [
    "0", "1", "2", "-1", "7", "2.5", "-0.5", "1e1", "true", "false", "TRUE", "abc", "", "it's", "PERSISTENT",
]
STRINGS = ["", "abc", "a", "1", "2.5", "true", "it's", "PERSISTENT", "NON_PERSISTENT"]
NUMBERS = [0, 1, 2, -1, 7, 2.5, -0.5, 10.0, 4]


def ref_number(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return value
    try:
        return int(value)
    except ValueError:
        pass
    try:
        return float(value)
    except ValueError:
        return None


def ref_bool(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    return None


def ref_compare(op: str, x: Any, y: Any) -> Any:
    if x is None or y is None:
        return U
    if isinstance(x, bool) or isinstance(y, bool):
        bx, by = ref_bool(x), ref_bool(y)
        if bx is None or by is None or op not in ("=", "<>"):
            return U
        return (bx == by) == (op == "=")
    if isinstance(x, str) and isinstance(y, str):
        return U if op not in ("=", "<>") else (x == y) == (op == "=")
    nx, ny = ref_number(x), ref_number(y)
    if nx is None or ny is None:
        return U
    return {"=": nx == ny, "<>": nx != ny, "<": nx < ny, ">": nx > ny, "<=": nx <= ny, ">=": nx >= ny}[op]


def ref_arith(op: str, x: Any, y: Any) -> Any:
    nx, ny = ref_number(x), ref_number(y)
    if nx is None or ny is None:
        return None
    if op == "+":
        return nx + ny
    if op == "-":
        return nx - ny
    if op == "*":
        return nx * ny
    if ny == 0:
        return None
    if isinstance(nx, int) and isinstance(ny, int):
        return math.trunc(Fraction(nx, ny))  # Java: toward zero
    return nx / ny


def ref_like(value: str, pattern: tuple[Any, ...]) -> bool:
    if not pattern:
        return value == ""
    head, rest = pattern[0], pattern[1:]
    if head == "%":
        return any(ref_like(value[i:], rest) for i in range(len(value) + 1))
    if not value:
        return False
    if head == "_":
        return ref_like(value[1:], rest)
    return value[0] == head[1] and ref_like(value[1:], rest)


def lookup(name: str, message: Message) -> Any:
    fields = {
        "JMSPriority": message.priority,
        "JMSDeliveryMode": "PERSISTENT" if message.persistent else "NON_PERSISTENT",
        "JMSRedelivered": message.redeliveries > 0,
    }
    if name in fields:
        return fields[name]
    key = name.strip('"')
    return None if message.headers is None else message.headers.get(key)


def ref_eval(node: tuple[Any, ...], message: Message) -> Any:
    kind = node[0]
    if kind == "id":
        return lookup(node[1], message)
    if kind == "lit":
        return node[1]
    if kind == "neg":
        return ref_arith("-", 0, ref_eval(node[1], message))
    if kind == "arith":
        return ref_arith(node[1], ref_eval(node[2], message), ref_eval(node[3], message))
    if kind == "cmp":
        return ref_compare(node[1], ref_eval(node[2], message), ref_eval(node[3], message))
    if kind == "between":
        x = ref_eval(node[1], message)
        low, high = ref_eval(node[2], message), ref_eval(node[3], message)
        inside = AND_TABLE[ref_compare(">=", x, low), ref_compare("<=", x, high)]
        return NOT_TABLE[inside] if node[4] else inside
    if kind == "in":
        x = ref_eval(node[1], message)
        found: Any = F
        for item in node[2]:
            found = OR_TABLE[found, ref_compare("=", x, item)]
        return NOT_TABLE[found] if node[3] else found
    if kind == "isnull":
        return (ref_eval(node[1], message) is None) != node[2]
    if kind == "like":
        x = ref_eval(node[1], message)
        if not isinstance(x, str):
            return U
        return ref_like(x, node[2]) != node[3]
    if kind == "not":
        return NOT_TABLE[ref_condition(node[1], message)]
    table = AND_TABLE if kind == "and" else OR_TABLE
    return table[ref_condition(node[1], message), ref_condition(node[2], message)]


def ref_condition(node: tuple[Any, ...], message: Message) -> Any:
    return ref_bool(ref_eval(node, message))


def render_literal(value: Any, bare: bool = False) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return f"({value!r})" if value < 0 and not bare else repr(value)


def render_pattern(pattern: tuple[Any, ...]) -> tuple[str, bool]:
    out, escaped = [], False
    for part in pattern:
        if part in ("%", "_"):
            out.append(part)
        elif part[1] in "%_!":
            out.append("!" + part[1])
            escaped = True
        else:
            out.append(part[1])
    return "'" + "".join(out).replace("'", "''") + "'", escaped


def render(node: tuple[Any, ...]) -> str:
    kind = node[0]
    if kind == "id":
        return node[1]
    if kind == "lit":
        return render_literal(node[1])
    if kind == "neg":
        return f"(-{render(node[1])})"
    if kind in ("arith", "cmp"):
        return f"({render(node[2])} {node[1]} {render(node[3])})"
    if kind == "between":
        return f"({render(node[1])} {'NOT ' if node[4] else ''}BETWEEN {render(node[2])} AND {render(node[3])})"
    if kind == "in":
        items = ", ".join(render_literal(i, bare=True) for i in node[2])
        return f"({render(node[1])} {'NOT ' if node[3] else ''}IN ({items}))"
    if kind == "isnull":
        return f"({render(node[1])} IS {'NOT ' if node[2] else ''}NULL)"
    if kind == "like":
        pattern, escaped = render_pattern(node[2])
        escape = " ESCAPE '!'" if escaped else ""
        return f"({render(node[1])} {'NOT ' if node[3] else ''}LIKE {pattern}{escape})"
    if kind == "not":
        return f"(NOT {render(node[1])})"
    return f"({render(node[1])} {kind.upper()} {render(node[2])})"


identifiers = st.sampled_from(NAMES).map(lambda n: ("id", n))
literals = st.one_of(st.sampled_from(STRINGS), st.sampled_from(NUMBERS), st.booleans()).map(lambda v: ("lit", v))
values = st.recursive(
    st.one_of(identifiers, literals),
    lambda inner: st.one_of(
        st.tuples(st.just("arith"), st.sampled_from("+-*/"), inner, inner),
        st.tuples(st.just("neg"), inner),
    ),
    max_leaves=4,
)
in_items = st.lists(st.one_of(st.sampled_from(STRINGS), st.sampled_from(NUMBERS)), min_size=1, max_size=4).map(tuple)
like_patterns = st.lists(
    st.one_of(st.sampled_from(["%", "_"]), st.sampled_from("ab1%_!'").map(lambda c: ("char", c))), max_size=5
).map(tuple)
predicates = st.one_of(
    st.tuples(st.just("cmp"), st.sampled_from(["=", "<>", "<", ">", "<=", ">="]), values, values),
    st.tuples(st.just("between"), values, values, values, st.booleans()),
    st.tuples(st.just("in"), identifiers, in_items, st.booleans()),
    st.tuples(st.just("isnull"), values, st.booleans()),
    st.tuples(st.just("like"), identifiers, like_patterns, st.booleans()),
    identifiers,
    st.booleans().map(lambda v: ("lit", v)),
)
conditions = st.recursive(
    predicates,
    lambda inner: st.one_of(
        st.tuples(st.sampled_from(["and", "or"]), inner, inner),
        st.tuples(st.just("not"), inner),
    ),
    max_leaves=8,
)
messages = st.builds(
    msg,
    st.one_of(
        st.none(),
        st.dictionaries(st.sampled_from(HEADER_NAMES), st.sampled_from(HEADER_VALUES), max_size=len(HEADER_NAMES)),
    ),
    priority=st.integers(0, 9),
    persistent=st.booleans(),
    redeliveries=st.integers(0, 2),
)


@settings(max_examples=1000, deadline=None)
@given(conditions, st.lists(messages, min_size=1, max_size=4))
def test_agrees_with_reference_evaluator(tree: tuple[Any, ...], batch: list[Message]) -> None:
    text = render(tree)
    selector = compile_selector(text)
    for message in batch:
        expected = ref_condition(tree, message)
        assert selector.evaluate(message) is expected, (text, message.headers)
        assert selector.matches(message) is (expected is True)


@given(
    st.lists(st.one_of(st.sampled_from(["%", "_"]), st.sampled_from("ab").map(lambda c: ("char", c))), max_size=8),
    st.text(alphabet="ab", max_size=10),
)
def test_like_agrees_with_the_reference(pattern: list[Any], value: str) -> None:
    text = "".join(p if isinstance(p, str) else p[1] for p in pattern)
    assert compile_selector(f"v LIKE '{text}'").evaluate(msg({"v": value})) is ref_like(value, tuple(pattern))
