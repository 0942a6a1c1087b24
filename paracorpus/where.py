"""Row filters for Parquet scans (``--where``), parsed without ever evaluating the text.

A clause is a boolean expression over column names and literals::

    rank <= 2
    keep == true and combined_score < 3
    lang_pair in ('cs-en', 'de-en') or not (rank > 1)
    backward_nll is not null

Operators: ``== != < <= > >=`` (``=`` is read as ``==``), chained comparisons (``1 <= rank <= 3``),
``in`` / ``not in`` a list of literals, ``is null`` / ``is not null``, ``and``, ``or``, ``not``,
parentheses. Keywords are case-insensitive (``AND``, ``TRUE``, ``NULL``). The text is split by
Python's own tokenizer and parsed by its ``ast`` module into a tree that is then checked node by
node against this grammar (and each literal against its column's type) and compiled to a
``pyarrow.dataset`` expression, so the filter runs inside the Parquet scan. Anything else (function
calls, attributes, arithmetic) is refused with a message saying what was found.
"""
from __future__ import annotations

import ast
import io
import tokenize

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from common.cli import UsageError

_KEYWORDS = {"and": "and", "or": "or", "not": "not", "in": "in", "is": "is",
             "true": "True", "false": "False", "null": "None", "none": "None"}
_COMPARE = {ast.Eq: "__eq__", ast.NotEq: "__ne__", ast.Lt: "__lt__", ast.LtE: "__le__",
            ast.Gt: "__gt__", ast.GtE: "__ge__"}
_GRAMMAR = "use COLUMN OP VALUE (OP: == != < <= > >= in, not in, is null), joined by and/or/not"


class WhereError(UsageError):
    """A --where clause that does not parse, names an unknown column or compares mismatched types."""


def _normalise(text: str) -> str:
    """SQL-ish spellings to Python's: '=' -> '==', AND/TRUE/NULL -> and/True/None."""
    out = []
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError) as exc:
        raise WhereError(f"cannot read filter {text!r}: {exc}") from None
    for tok in tokens:
        if tok.type == tokenize.OP and tok.string == "=":
            tok = tok._replace(string="==")
        elif tok.type == tokenize.NAME and tok.string.lower() in _KEYWORDS:
            tok = tok._replace(string=_KEYWORDS[tok.string.lower()])
        out.append((tok.type, tok.string))
    return tokenize.untokenize(out)


def _kind(dtype: pa.DataType) -> str:
    if pa.types.is_boolean(dtype):
        return "bool"
    if pa.types.is_integer(dtype) or pa.types.is_floating(dtype) or pa.types.is_decimal(dtype):
        return "number"
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype) or pa.types.is_dictionary(dtype):
        return "string"
    return "other"


def _literal_kind(value) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    return "other"


class _Compiler:
    def __init__(self, clause: str, schema: pa.Schema):
        self.clause, self.schema = clause, schema

    def fail(self, message: str):
        raise WhereError(f"filter {self.clause!r}: {message}")

    def column(self, node: ast.Name) -> tuple[str, str]:
        if node.id not in self.schema.names:
            self.fail(f"no column {node.id!r}; columns are {', '.join(self.schema.names)}")
        return node.id, _kind(self.schema.field(node.id).type)

    def literal(self, node):
        if isinstance(node, ast.Constant) and _literal_kind(node.value) != "other":
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) \
                and isinstance(node.operand, ast.Constant) and _literal_kind(node.operand.value) == "number":
            return -node.operand.value
        self.fail(f"expected a column or a literal, found {ast.unparse(node)!r}; {_GRAMMAR}")

    def operand(self, node):
        """('column', name, kind) or ('literal', value, kind)."""
        if isinstance(node, ast.Name):
            name, kind = self.column(node)
            return "column", name, kind
        value = self.literal(node)
        return "literal", value, _literal_kind(value)

    def check_types(self, left, right, op: str):
        kinds = {left[2], right[2]}
        if "other" in kinds:
            col = left if left[2] == "other" else right
            self.fail(f"column {col[1]!r} ({self.schema.field(col[1]).type}) cannot be compared")
        if len(kinds) > 1:
            col, lit = (left, right) if left[0] == "column" else (right, left)
            self.fail(f"{op} compares {col[1]!r} ({col[2]}) with {lit[1]!r} ({lit[2]})")

    def compile(self, node) -> ds.Expression:
        if isinstance(node, ast.BoolOp):
            parts = [self.compile(v) for v in node.values]
            out = parts[0]
            for p in parts[1:]:
                out = (out & p) if isinstance(node.op, ast.And) else (out | p)
            return out
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return ~self.compile(node.operand)
        if isinstance(node, ast.Compare):
            terms, left = [], node.left
            for op, right in zip(node.ops, node.comparators):
                terms.append(self.comparison(left, op, right))
                left = right
            out = terms[0]
            for t in terms[1:]:
                out = out & t
            return out
        if isinstance(node, ast.Name):
            name, kind = self.column(node)
            if kind != "bool":
                self.fail(f"column {name!r} is not boolean; compare it with a value")
            return pc.field(name) == True  # noqa: E712  (a pyarrow expression, not a Python test)
        self.fail(f"unsupported expression {ast.unparse(node)!r}; {_GRAMMAR}")

    def comparison(self, left_node, op, right_node) -> ds.Expression:
        left = self.operand(left_node)
        if isinstance(op, (ast.In, ast.NotIn)):
            if left[0] != "column" or not isinstance(right_node, (ast.Tuple, ast.List, ast.Set, ast.Constant)):
                self.fail("'in' takes a column on the left and a list of literals on the right, "
                          "e.g. lang_pair in ('cs-en', 'de-en')")
            # SQL's IN ('x') is a one-element list, not Python's parenthesised string
            elts = [right_node] if isinstance(right_node, ast.Constant) else right_node.elts
            values = [self.literal(v) for v in elts]
            for v in values:
                self.check_types(left, ("literal", v, _literal_kind(v)), "in")
            expr = pc.field(left[1]).isin(values)
            return ~expr if isinstance(op, ast.NotIn) else expr
        right = self.operand(right_node)
        if isinstance(op, (ast.Is, ast.IsNot)):
            if left[0] != "column" or right != ("literal", None, "null"):
                self.fail("'is' is only for 'COLUMN is null' and 'COLUMN is not null'")
            expr = pc.field(left[1]).is_null()
            return ~expr if isinstance(op, ast.IsNot) else expr
        if type(op) not in _COMPARE:
            self.fail(f"unsupported operator in {ast.unparse(ast.Compare(left_node, [op], [right_node]))!r}; {_GRAMMAR}")
        if "null" in (left[2], right[2]):
            self.fail("compare with null using 'is null' or 'is not null'")
        if left[0] == right[0] == "literal":
            self.fail("a comparison needs a column")
        self.check_types(left, right, ast.unparse(ast.Compare(left_node, [op], [right_node])))
        as_expr = [pc.field(x[1]) if x[0] == "column" else pc.scalar(x[1]) for x in (left, right)]
        return getattr(as_expr[0], _COMPARE[type(op)])(as_expr[1])


def parse_where(clauses: list[str] | None, schema: pa.Schema) -> ds.Expression | None:
    """CLAUSES (each a boolean expression, see the module doc), joined by AND, as one pyarrow
    filter expression; None when there are none. Raises WhereError before any data is read."""
    expr = None
    for clause in clauses or []:
        if not clause.strip():
            raise WhereError("empty filter")
        try:
            tree = ast.parse(_normalise(clause).strip(), mode="eval")
        except SyntaxError as exc:
            raise WhereError(f"cannot parse filter {clause!r} ({exc.msg}); {_GRAMMAR}") from None
        term = _Compiler(clause, schema).compile(tree.body)
        expr = term if expr is None else expr & term
    return expr
