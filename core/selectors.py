"""JMS message selectors: the SQL-92 conditional-expression subset of JMS 1.1 §3.8.

``compile_selector(text)`` tokenizes and parses the text once into a small AST,
then compiles the AST into nested closures; ``Selector.matches(message)`` only
calls them, so no parsing happens per message.

Grammar (keywords are case-insensitive, identifiers case-sensitive)::

    selector   := [ or_expr ] EOF              -- empty text: no selector, matches all
    or_expr    := and_expr { OR and_expr }
    and_expr   := not_expr { AND not_expr }
    not_expr   := NOT not_expr | predicate
    predicate  := sum [ cmp_op sum
                      | [NOT] BETWEEN sum AND sum
                      | [NOT] IN '(' literal { ',' literal } ')'
                      | [NOT] LIKE string [ ESCAPE string ]
                      | IS [NOT] NULL ]
    cmp_op     := '=' | '<>' | '<' | '>' | '<=' | '>='
    sum        := product { ('+' | '-') product }
    product    := unary { ('*' | '/') unary }
    unary      := ('+' | '-') unary | primary
    primary    := literal | identifier | '(' or_expr ')'
    literal    := string | number | TRUE | FALSE
    string     := "'" { char | "''" } "'"
    number     := digits | 0x hexdigits | digits '.' [digits] [exp] | '.' digits [exp] | digits exp
    identifier := java-letter { java-letter-or-digit }  |  '"' { char | '""' } '"'

A header whose name is not a Java identifier (``content-type``) or is a keyword
is reached by quoting it: ``"content-type" = 'text/plain'``.  Unquoted, ``a-b``
is ``a`` minus ``b`` as in SQL.

Values are ``None`` (NULL), ``bool``, ``int``, ``float`` or ``str``.  Header
values are strings; one compared with or used in arithmetic with a number is
read as a number when it spells one (``'10' > 9``), and ``'true'``/``'false'``
(any case) compare with TRUE/FALSE.  Two strings compare only with ``=`` and
``<>`` (JMS 1.1 §3.8.1.2); ordering them, mixing types that do not convert,
NULL operands and division by zero all give UNKNOWN, never an exception.
Integer division truncates toward zero ("numeric promotion in the Java
programming language", §3.8.1.2).  AND, OR and NOT follow the three-valued
tables of §3.8.1.2; a selector that is UNKNOWN does not match.
"""

from __future__ import annotations

import operator
import re
from typing import TYPE_CHECKING, Any, Callable

from core.selector_syntax import (
    MAX_SELECTOR_CHARS,
    MAX_DEPTH,
    MAX_NODES,
    SelectorError,
    Token,
    TokenKind,
    tokenize,
    parse,
    Node,
    Value,
    Eval,
    Literal,
    Ident,
    Negate,
    Arith,
    Compare,
    Not,
    Logic,
    Between,
    In,
    Like,
    IsNull,
    KEYWORDS,
)

if TYPE_CHECKING:
    from core.messages import Message

# The language lives in core.selector_syntax; this is the one door to both.
__all__ = [
    "KEYWORDS", "MAX_DEPTH", "MAX_NODES", "MAX_SELECTOR_CHARS", "Selector", "SelectorError", "Token", "TokenKind",
    "compile_selector", "parse", "tokenize",
]


# -- values ---------------------------------------------------------------------

_NUMERIC_TEXT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def as_number(value: Value) -> int | float | None:
    """``value`` as a number: numbers as they are, strings that spell one parsed."""
    kind = type(value)
    if kind is int or kind is float:
        return value  # type: ignore[return-value]  # exactly int or float
    if kind is str and _NUMERIC_TEXT.fullmatch(value):  # type: ignore[arg-type]
        text: str = value  # type: ignore[assignment]
        try:
            return float(text) if ("." in text or "e" in text or "E" in text) else int(text)
        except ValueError:  # more digits than int() will read
            return None
    return None


def as_bool(value: Value) -> bool | None:
    """``value`` as a truth value: booleans, and the strings 'true'/'false' in any case."""
    if type(value) is bool:
        return value
    if type(value) is str:
        lowered = value.lower()
        if lowered == "true":
            return True
        if lowered == "false":
            return False
    return None


# operator's comparisons, typed over Any: compare() only ever hands one two
# operands of a kind that compares (two bools, two strs, two numbers).
Comparison = Callable[[Any, Any], bool]
_COMPARE_OPS: dict[str, Comparison] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    ">": operator.gt,
    "<=": operator.le,
    ">=": operator.ge,
}
_EQUALITY = frozenset({operator.eq, operator.ne})


def compare(op: Comparison, left: Value, right: Value) -> bool | None:
    """One comparison with JMS's UNKNOWN (None) for NULLs and mismatched types."""
    if left is None or right is None:
        return None
    if type(left) is bool or type(right) is bool:
        a, b = as_bool(left), as_bool(right)
        if a is None or b is None or op not in _EQUALITY:
            return None
        return op(a, b)
    if type(left) is str and type(right) is str:
        return op(left, right) if op in _EQUALITY else None
    x, y = as_number(left), as_number(right)
    if x is None or y is None:
        return None
    return op(x, y)


def _divide(x: int | float, y: int | float) -> int | float:
    if type(x) is int and type(y) is int:
        if y == 0:
            raise ZeroDivisionError
        quotient = abs(x) // abs(y)
        return quotient if (x < 0) == (y < 0) else -quotient
    return x / y


_ARITH_OPS: dict[str, Callable[[int | float, int | float], int | float]] = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": _divide,
}


def arithmetic(op: Callable[[int | float, int | float], int | float], left: Value, right: Value) -> Value:
    x, y = as_number(left), as_number(right)
    if x is None or y is None:
        return None
    try:
        return op(x, y)
    except (ZeroDivisionError, OverflowError):
        return None


def like_matcher(pattern: str, escape: str | None) -> Callable[[str], bool]:
    """``%`` is any run of characters, ``_`` any one; ``escape`` makes the next one literal.

    Never a backtracking regex over the whole pattern: a client's pattern and
    a client's header value would then choose how long the broker's one
    thread spends on a message (``'%a%a%a...%b'`` against ``aaa...`` is
    exponential).  The pattern is cut at each ``%`` into fixed-length pieces
    (literals and ``_``); the first must start the value, the last end it,
    and each middle one is taken at its leftmost place after the previous one
    (leftmost is always as good as any later place, since what follows can
    only gain room).  Each piece is searched once, so the cost is at most the
    value's length times the pattern's, and usually one pass in C."""
    pieces: list[list[str | None]] = [[]]  # None: '_'
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == escape:
            i += 1
            pieces[-1].append(pattern[i])
        elif char == "%":
            pieces.append([])
        elif char == "_":
            pieces[-1].append(None)
        else:
            pieces[-1].append(char)
        i += 1
    compiled = [_Piece(piece) for piece in pieces]
    if len(compiled) == 1:
        only = compiled[0]
        return lambda value: len(value) == only.size and only.at(value, 0)
    first, middle, last = compiled[0], compiled[1:-1], compiled[-1]

    def match(value: str) -> bool:
        end = len(value) - last.size
        if end < first.size or not first.at(value, 0) or not last.at(value, end):
            return False
        position = first.size
        for piece in middle:
            found = piece.find(value, position, end)
            if found < 0:
                return False
            position = found + piece.size
        return True

    return match


class _Piece:
    """A stretch of a LIKE pattern between two ``%``: literal characters and
    ``_`` wildcards, a fixed number of characters long."""

    __slots__ = ("size", "text", "regex")

    def __init__(self, chars: list[str | None]) -> None:
        self.size = len(chars)
        # Without '_' plain string search (str.find is linear in practice);
        # with it a regex of literals and '.', which has no quantifier and so
        # no backtracking beyond its own length at each place it tries.
        self.text = None if None in chars else "".join(chars)  # type: ignore[arg-type]
        self.regex = None if self.text is not None else re.compile(
            "".join("." if c is None else re.escape(c) for c in chars), re.DOTALL
        )

    def at(self, value: str, position: int) -> bool:
        if self.text is not None:
            return value.startswith(self.text, position)
        assert self.regex is not None
        return self.regex.match(value, position) is not None

    def find(self, value: str, start: int, end: int) -> int:
        if self.text is not None:
            return value.find(self.text, start, end)
        assert self.regex is not None
        found = self.regex.search(value, start, end)
        return -1 if found is None else found.start()


# -- fields ---------------------------------------------------------------------


def _header(name: str) -> Eval:
    def read(message: Message) -> Value:
        headers = message.headers
        return None if headers is None else headers.get(name)

    return read


# JMS 1.1 §3.8.1.1: the header fields a selector may name, and where the core keeps them.
JMS_FIELDS: dict[str, Eval] = {
    "JMSMessageID": lambda m: m.id,
    "JMSPriority": lambda m: m.priority,
    "JMSTimestamp": lambda m: m.timestamp,
    "JMSExpiration": lambda m: m.expires,
    "JMSDeliveryMode": lambda m: "PERSISTENT" if m.persistent else "NON_PERSISTENT",
    "JMSRedelivered": lambda m: m.redeliveries > 0,
    "JMSDestination": lambda m: m.address.text,
    "JMSXDeliveryCount": lambda m: m.redeliveries + 1,
    "JMSCorrelationID": _header("correlation-id"),
    "JMSType": _header("type"),
    "JMSReplyTo": _header("reply-to"),
    "JMSXGroupID": _header("JMSXGroupID"),
    "JMSXGroupSeq": _header("JMSXGroupSeq"),
}


# -- compiler -------------------------------------------------------------------


def _compile_literal(node: Literal) -> Eval:
    value = node.value
    return lambda m: value


def _compile_ident(node: Ident) -> Eval:
    return JMS_FIELDS.get(node.name) or _header(node.name)


def _compile_negate(node: Negate) -> Eval:
    operand = _compile(node.operand)
    return lambda m: arithmetic(operator.sub, 0, operand(m))


def _compile_arith(node: Arith) -> Eval:
    op, left, right = _ARITH_OPS[node.op], _compile(node.left), _compile(node.right)
    return lambda m: arithmetic(op, left(m), right(m))


def _compile_compare(node: Compare) -> Eval:
    op, left = _COMPARE_OPS[node.op], _compile(node.left)
    if isinstance(node.right, Literal) and type(node.right.value) is str and op in _EQUALITY:
        # The common ``header = 'text'``: a string header needs no conversion.
        literal, equal = node.right.value, op is operator.eq

        def compare_text(m: Message) -> Value:
            value = left(m)
            if type(value) is str:
                return (value == literal) is equal
            return compare(op, value, literal)

        return compare_text
    right = _compile(node.right)
    return lambda m: compare(op, left(m), right(m))


def _condition(node: Node) -> Eval:
    """``node`` compiled to give True, False or None (UNKNOWN)."""
    evaluate = _compile(node)
    if isinstance(node, (Compare, Not, Logic, Between, In, Like, IsNull)):
        return evaluate
    return lambda m: as_bool(evaluate(m))


def _compile_not(node: Not) -> Eval:
    operand = _condition(node.operand)

    def negate(m: Message) -> Value:
        value = operand(m)
        return None if value is None else not value

    return negate


def _compile_logic(node: Logic) -> Eval:
    operands = tuple(_condition(child) for child in node.operands)
    # AND: FALSE if any is FALSE, else UNKNOWN if any is UNKNOWN; OR is its dual.
    decisive = node.op == "OR"

    def combine(m: Message) -> Value:
        unknown = False
        for operand in operands:
            value = operand(m)
            if value is decisive:
                return decisive
            if value is None:
                unknown = True
        return None if unknown else not decisive

    return combine


def _compile_between(node: Between) -> Eval:
    operand, low, high = _compile(node.operand), _compile(node.low), _compile(node.high)
    negated = node.negated

    def between(m: Message) -> Value:
        value = operand(m)
        above = compare(operator.ge, value, low(m))
        below = compare(operator.le, value, high(m))
        if above is False or below is False:
            result: bool | None = False
        elif above is None or below is None:
            result = None
        else:
            result = True
        return None if result is None else result is not negated

    return between


def _compile_in(node: In) -> Eval:
    operand, items, negated = _compile(node.operand), node.items, node.negated
    texts = frozenset(item for item in items if type(item) is str)
    all_text = len(texts) == len(items)

    def member(m: Message) -> Value:
        value = operand(m)
        if value is None:
            return None
        if type(value) is str and all_text:
            return (value in texts) is not negated
        unknown = False
        for item in items:
            equal = compare(operator.eq, value, item)
            if equal:
                return not negated
            if equal is None:
                unknown = True
        return None if unknown else negated

    return member


def _compile_like(node: Like) -> Eval:
    operand, negated = _compile(node.operand), node.negated
    matches = like_matcher(node.pattern, node.escape)

    def like(m: Message) -> Value:
        value = operand(m)
        if type(value) is not str:
            return None
        return matches(value) is not negated

    return like


def _compile_is_null(node: IsNull) -> Eval:
    operand, negated = _compile(node.operand), node.negated
    return lambda m: (operand(m) is None) is not negated


_COMPILERS: dict[type, Callable[[Node], Eval]] = {
    Literal: _compile_literal,  # type: ignore[dict-item]
    Ident: _compile_ident,  # type: ignore[dict-item]
    Negate: _compile_negate,  # type: ignore[dict-item]
    Arith: _compile_arith,  # type: ignore[dict-item]
    Compare: _compile_compare,  # type: ignore[dict-item]
    Not: _compile_not,  # type: ignore[dict-item]
    Logic: _compile_logic,  # type: ignore[dict-item]
    Between: _compile_between,  # type: ignore[dict-item]
    In: _compile_in,  # type: ignore[dict-item]
    Like: _compile_like,  # type: ignore[dict-item]
    IsNull: _compile_is_null,  # type: ignore[dict-item]
}


def _compile(node: Node) -> Eval:
    return _COMPILERS[type(node)](node)


# -- the door -------------------------------------------------------------------


class Selector:
    """A compiled selector.  ``predicate(message)`` is True, False or None (UNKNOWN)."""

    __slots__ = ("text", "predicate")

    def __init__(self, text: str, predicate: Eval) -> None:
        self.text = text
        self.predicate = predicate

    def evaluate(self, message: Message) -> bool | None:
        """The three-valued result of the selector for ``message``."""
        return as_bool(self.predicate(message))

    def matches(self, message: Message) -> bool:
        """JMS 1.1 §3.8.1: a message is selected only if the selector is TRUE."""
        return self.predicate(message) is True

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


def _always(message: Message) -> Value:
    return True


def compile_selector(text: str) -> Selector:
    """Parse and compile ``text``; raise :class:`SelectorError` if it is not a selector.

    An empty (or all-blank) selector selects every message (JMS 1.1 §3.8.1:
    "treated as a null and indicates that there is no message selector").
    """
    root = parse(text)
    return Selector(text, _always if root is None else _condition(root))
