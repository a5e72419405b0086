"""JMS message selectors, the language: tokens, the AST and the parser.

See :mod:`core.selectors` for the grammar and for what a selector means;
this module only turns text into a tree, or a :class:`SelectorError` that
says where and what was expected."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Union

if TYPE_CHECKING:
    from core.messages import Message


MAX_SELECTOR_CHARS = 4096
# Deepest AST accepted: bounds the parser's and the closures' recursion.
MAX_DEPTH = 64
# Most AST nodes accepted: bounds what one message costs each subscription
# (every node is a closure call per message).
MAX_NODES = 1024

Value = Union[None, bool, int, float, str]
Eval = Callable[["Message"], Value]


class SelectorError(ValueError):
    """An invalid selector; ``position`` is the offset in the text where parsing failed."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(f"{message} (at offset {position})")
        self.reason = message
        self.position = position


# -- tokens ---------------------------------------------------------------------


class TokenKind(enum.Enum):
    IDENT = "identifier"
    STRING = "string"
    NUMBER = "number"
    KEYWORD = "keyword"
    OP = "operator"
    EOF = "end of selector"


KEYWORDS = frozenset({"AND", "OR", "NOT", "BETWEEN", "IN", "LIKE", "ESCAPE", "IS", "NULL", "TRUE", "FALSE"})
_OPERATORS = ("<>", "<=", ">=", "<", ">", "=", "+", "-", "*", "/", "(", ")", ",")


@dataclass(frozen=True, slots=True)
class Token:
    kind: TokenKind
    value: Value
    pos: int
    text: str

    def describe(self) -> str:
        return "end of selector" if self.kind is TokenKind.EOF else f"{self.kind.value} {self.text!r}"


_SPACE = re.compile(r"[ \t\r\n\f]*")
_NUMBER_TOKEN = re.compile(r"0[xX][0-9a-fA-F]+|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_IDENT_START = re.compile(r"[^\W\d]|\$")
_IDENT = re.compile(r"[\w$]+")


def _is_ident_part(char: str) -> bool:
    return char == "$" or char.isalnum() or char == "_"


def _scan_quoted(text: str, start: int, quote: str, what: str) -> tuple[str, int]:
    """Scan from the opening quote at ``start``; a doubled quote is one quote character."""
    parts: list[str] = []
    i = start + 1
    while True:
        end = text.find(quote, i)
        if end < 0:
            raise SelectorError(f"expected closing {quote} of the {what} opened at offset {start}", len(text))
        parts.append(text[i:end])
        if text.startswith(quote, end + 1):
            parts.append(quote)
            i = end + 2
        else:
            return "".join(parts), end + 1


def tokenize(text: str) -> list[Token]:
    tokens: list[Token] = []
    i = 0
    n = len(text)
    while True:
        i = _SPACE.match(text, i).end()  # type: ignore[union-attr]  # always matches
        if i >= n:
            tokens.append(Token(TokenKind.EOF, None, n, ""))
            return tokens
        char = text[i]
        if char == "'":
            value, end = _scan_quoted(text, i, "'", "string literal")
            tokens.append(Token(TokenKind.STRING, value, i, text[i:end]))
        elif char == '"':
            value, end = _scan_quoted(text, i, '"', "quoted identifier")
            if not value:
                raise SelectorError("expected a name inside the quoted identifier", i + 1)
            tokens.append(Token(TokenKind.IDENT, value, i, text[i:end]))
        elif char.isdigit() or (char == "." and text[i + 1 : i + 2].isdigit()):
            match = _NUMBER_TOKEN.match(text, i)
            if match is None:
                raise SelectorError(f"unexpected character {char!r}", i)
            end = match.end()
            if end < n and (_is_ident_part(text[end]) or text[end] == "."):
                raise SelectorError("expected an operator or space after the number", end)
            lexeme = match.group()
            number: int | float
            if lexeme[:2] in ("0x", "0X"):
                number = int(lexeme, 16)
            elif "." in lexeme or "e" in lexeme or "E" in lexeme:
                number = float(lexeme)
            else:
                number = int(lexeme)
            tokens.append(Token(TokenKind.NUMBER, number, i, lexeme))
        elif _IDENT_START.match(char):
            end = _IDENT.match(text, i).end()  # type: ignore[union-attr]  # char is a word char or $
            word = text[i:end]
            if word.upper() in KEYWORDS:
                tokens.append(Token(TokenKind.KEYWORD, word.upper(), i, word))
            else:
                tokens.append(Token(TokenKind.IDENT, word, i, word))
        else:
            for op in _OPERATORS:
                if text.startswith(op, i):
                    end = i + len(op)
                    tokens.append(Token(TokenKind.OP, op, i, op))
                    break
            else:
                raise SelectorError(f"unexpected character {char!r}", i)
        i = end


# -- AST ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Literal:
    pos: int
    value: Value


@dataclass(frozen=True, slots=True)
class Ident:
    pos: int
    name: str


@dataclass(frozen=True, slots=True)
class Negate:
    pos: int
    operand: Node


@dataclass(frozen=True, slots=True)
class Arith:
    pos: int
    op: str  # + - * /
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Compare:
    pos: int
    op: str  # = <> < > <= >=
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Not:
    pos: int
    operand: Node


@dataclass(frozen=True, slots=True)
class Logic:
    pos: int
    op: str  # AND, OR; chains are flattened so long ones do not nest deeply
    operands: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Between:
    pos: int
    operand: Node
    low: Node
    high: Node
    negated: bool


@dataclass(frozen=True, slots=True)
class In:
    pos: int
    operand: Node
    items: tuple[Value, ...]
    negated: bool


@dataclass(frozen=True, slots=True)
class Like:
    pos: int
    operand: Node
    pattern: str
    escape: str | None
    negated: bool


@dataclass(frozen=True, slots=True)
class IsNull:
    pos: int
    operand: Node
    negated: bool


Node = Union[Literal, Ident, Negate, Arith, Compare, Not, Logic, Between, In, Like, IsNull]


def _children(node: Node) -> tuple[Node, ...]:
    if isinstance(node, (Literal, Ident)):
        return ()
    if isinstance(node, (Negate, Not, In, Like, IsNull)):
        return (node.operand,)
    if isinstance(node, (Arith, Compare)):
        return (node.left, node.right)
    if isinstance(node, Between):
        return (node.operand, node.low, node.high)
    return node.operands


# -- parser ---------------------------------------------------------------------

_COMPARISONS = frozenset({"=", "<>", "<", ">", "<=", ">="})
# Binary operators by precedence; the parser climbs each table separately because
# comparisons and the predicates sit between the logical and the arithmetic ones.
_LOGICAL_PRECEDENCE = {"OR": 1, "AND": 2}
_ARITH_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


class _Parser:
    def __init__(self, text: str) -> None:
        self.tokens = tokenize(text)
        self.index = 0
        self.nesting = 0

    @property
    def token(self) -> Token:
        return self.tokens[self.index]

    def advance(self) -> Token:
        token = self.tokens[self.index]
        self.index += 1
        return token

    def at(self, kind: TokenKind, value: Value) -> bool:
        token = self.token
        return token.kind is kind and token.value == value

    def fail(self, expected: str) -> SelectorError:
        return SelectorError(f"expected {expected}, found {self.token.describe()}", self.token.pos)

    def expect(self, kind: TokenKind, value: str, expected: str) -> Token:
        if not self.at(kind, value):
            raise self.fail(expected)
        return self.advance()

    def nest(self) -> None:
        self.nesting += 1
        if self.nesting > MAX_DEPTH:
            raise SelectorError(f"expected at most {MAX_DEPTH} levels of nesting", self.token.pos)

    def at_end(self) -> bool:
        return self.token.kind is TokenKind.EOF

    def selector(self) -> Node | None:
        if self.token.kind is TokenKind.EOF:
            return None
        node = self.logical(1)
        if not self.at_end():  # a method, so mypy does not carry the check above past logical()
            raise self.fail("AND, OR or end of selector")
        return node

    def logical(self, min_precedence: int) -> Node:
        node = self.negation()
        while self.token.kind is TokenKind.KEYWORD:
            op = str(self.token.value)
            precedence = _LOGICAL_PRECEDENCE.get(op)
            if precedence is None or precedence < min_precedence:
                break
            self.advance()
            right = self.logical(precedence + 1)
            if isinstance(node, Logic) and node.op == op:
                node = Logic(node.pos, op, (*node.operands, right))
            else:
                node = Logic(node.pos, op, (node, right))
        return node

    def negation(self) -> Node:
        if self.at(TokenKind.KEYWORD, "NOT"):
            pos = self.advance().pos
            self.nest()
            operand = self.negation()
            self.nesting -= 1
            return Not(pos, operand)
        return self.predicate()

    def predicate(self) -> Node:
        left = self.arithmetic(1)
        token = self.token
        if token.kind is TokenKind.OP and token.value in _COMPARISONS:
            self.advance()
            return Compare(token.pos, str(token.value), left, self.arithmetic(1))
        if self.at(TokenKind.KEYWORD, "IS"):
            self.advance()
            negated = self.at(TokenKind.KEYWORD, "NOT")
            if negated:
                self.advance()
            self.expect(TokenKind.KEYWORD, "NULL", "NULL or NOT NULL after IS")
            return IsNull(token.pos, left, negated)
        negated = self.at(TokenKind.KEYWORD, "NOT")
        if negated:
            self.advance()
        if self.at(TokenKind.KEYWORD, "BETWEEN"):
            self.advance()
            low = self.arithmetic(1)
            self.expect(TokenKind.KEYWORD, "AND", "AND in BETWEEN ... AND ...")
            return Between(token.pos, left, low, self.arithmetic(1), negated)
        if self.at(TokenKind.KEYWORD, "IN"):
            self.advance()
            return In(token.pos, left, self.in_list(), negated)
        if self.at(TokenKind.KEYWORD, "LIKE"):
            self.advance()
            return self.like(token.pos, left, negated)
        if negated:
            raise self.fail("BETWEEN, IN or LIKE after NOT")
        return left

    def in_list(self) -> tuple[Value, ...]:
        self.expect(TokenKind.OP, "(", "'(' to open the IN list")
        items = [self.in_item()]
        while self.at(TokenKind.OP, ","):
            self.advance()
            items.append(self.in_item())
        self.expect(TokenKind.OP, ")", "',' or ')' in the IN list")
        return tuple(items)

    def in_item(self) -> Value:
        token = self.token
        sign = 1
        if token.kind is TokenKind.OP and token.value in ("+", "-"):
            sign = -1 if token.value == "-" else 1
            self.advance()
            if self.token.kind is not TokenKind.NUMBER:
                raise self.fail("a number after the sign")
        token = self.token
        if token.kind is TokenKind.STRING:
            self.advance()
            return token.value
        if token.kind is TokenKind.NUMBER:
            self.advance()
            assert isinstance(token.value, (int, float))
            return sign * token.value
        raise self.fail("a string or number literal in the IN list")

    def like(self, pos: int, operand: Node, negated: bool) -> Like:
        if self.token.kind is not TokenKind.STRING:
            raise self.fail("a string literal pattern after LIKE")
        pattern_token = self.advance()
        escape: str | None = None
        if self.at(TokenKind.KEYWORD, "ESCAPE"):
            self.advance()
            if self.token.kind is not TokenKind.STRING or len(str(self.token.value)) != 1:
                raise self.fail("a one-character string literal after ESCAPE")
            escape = str(self.advance().value)
        pattern = str(pattern_token.value)
        if escape is not None and _ends_in_lone_escape(pattern, escape):
            raise SelectorError(
                "expected a character after the escape character at the end of the pattern", pattern_token.pos
            )
        return Like(pos, operand, pattern, escape, negated)

    def arithmetic(self, min_precedence: int) -> Node:
        node = self.unary()
        while self.token.kind is TokenKind.OP:
            op = str(self.token.value)
            precedence = _ARITH_PRECEDENCE.get(op)
            if precedence is None or precedence < min_precedence:
                break
            pos = self.advance().pos
            node = Arith(pos, op, node, self.arithmetic(precedence + 1))
        return node

    def unary(self) -> Node:
        token = self.token
        if token.kind is TokenKind.OP and token.value in ("+", "-"):
            self.advance()
            self.nest()
            operand = self.unary()
            self.nesting -= 1
            if token.value == "+":
                return operand
            if isinstance(operand, Literal) and type(operand.value) in (int, float):
                return Literal(token.pos, -operand.value)  # type: ignore[operator]  # checked just above
            return Negate(token.pos, operand)
        return self.primary()

    def primary(self) -> Node:
        token = self.token
        if token.kind in (TokenKind.STRING, TokenKind.NUMBER):
            self.advance()
            return Literal(token.pos, token.value)
        if token.kind is TokenKind.IDENT:
            self.advance()
            return Ident(token.pos, str(token.value))
        if token.kind is TokenKind.KEYWORD and token.value in ("TRUE", "FALSE"):
            self.advance()
            return Literal(token.pos, token.value == "TRUE")
        if self.at(TokenKind.OP, "("):
            self.advance()
            self.nest()
            node = self.logical(1)
            self.nesting -= 1
            self.expect(TokenKind.OP, ")", "')'")
            return node
        raise self.fail("an identifier, a literal or '('")


def _ends_in_lone_escape(pattern: str, escape: str) -> bool:
    i = 0
    while i < len(pattern):
        i += 2 if pattern[i] == escape else 1
    return i > len(pattern)


def _check_size(root: Node) -> None:
    stack = [(root, 1)]
    count = 0
    while stack:
        node, depth = stack.pop()
        count += 1
        if depth > MAX_DEPTH:
            raise SelectorError(f"expected at most {MAX_DEPTH} levels of nesting", node.pos)
        if count > MAX_NODES:
            raise SelectorError(f"expected at most {MAX_NODES} terms", node.pos)
        stack.extend((child, depth + 1) for child in _children(node))


def parse(text: str) -> Node | None:
    """The AST of ``text``; None for an empty selector."""
    if len(text) > MAX_SELECTOR_CHARS:
        raise SelectorError(f"expected at most {MAX_SELECTOR_CHARS} characters", MAX_SELECTOR_CHARS)
    root = _Parser(text).selector()
    if root is not None:
        _check_size(root)
    return root
