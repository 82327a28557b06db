"""The mutants of a lab's solution: one small, plausible mistake each, made inside its BEGIN/END SOLUTION blocks.

:func:`mutants` lists them (what each mutation is: the docstring of :mod:`grading.mutate`);
:mod:`grading.mutant_runs` runs a lab's tests against them, and :mod:`grading.mutate` is the command.
"""

from __future__ import annotations

import ast
import copy
import textwrap
from dataclasses import dataclass, field

from grading.starters import BEGIN, END


@dataclass(frozen=True)
class Mutant:
    """One mutation of a solution file: where, what, and the whole mutated text."""

    function: str  # the enclosing function (``Class.method`` for a method)
    line: int  # 1-based line of the mutated code in solution.py
    description: str  # e.g. "'+' -> '-'", "dropped term 'a'", "return 0"
    before: str  # the original source of the mutated node
    after: str  # its replacement
    text: str = field(repr=False)

    def label(self) -> str:
        return f"{self.function}:{self.line}: {self.description}"


def solution_blocks(text: str) -> list[tuple[int, int]]:
    """(first, last) 1-based line numbers of the code inside each BEGIN/END SOLUTION block."""
    blocks, start = [], None
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip() == BEGIN:
            start = number
        elif line.strip() == END and start is not None:
            blocks.append((start + 1, number - 1))
            start = None
    return blocks


_SWAP_OPS = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div,
    ast.Mod: ast.FloorDiv,
    ast.Pow: ast.Mult,
}
_BOUNDARY = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}
_NEGATE = {
    ast.Lt: ast.GtE,
    ast.LtE: ast.Gt,
    ast.Gt: ast.LtE,
    ast.GtE: ast.Lt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}
_SWAP_CALLS = {"min": "max", "max": "min", "ceil": "floor", "floor": "ceil", "any": "all", "all": "any"}
_OP_TEXT = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.And: "and",
    ast.Or: "or",
}


def _short(text: str, width: int = 50) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _replaced(node, **changes):
    new = copy.copy(node)
    for name, value in changes.items():
        setattr(new, name, value)
    return ast.unparse(new)


def _plus(node, delta: int) -> str:
    source = ast.unparse(node)
    return f"({source}) {'+' if delta > 0 else '-'} 1"


def _expression_mutations(node, parent):
    """(replacement source, description) pairs for one expression node."""
    if isinstance(node, ast.BinOp):
        op = type(node.op)
        if op in _SWAP_OPS:
            new = _SWAP_OPS[op]
            yield _replaced(node, op=new()), f"'{_OP_TEXT[op]}' -> '{_OP_TEXT[new]}'"
        if op in (ast.Add, ast.Sub, ast.Mult, ast.Div):
            kind = "term" if op in (ast.Add, ast.Sub) else "factor"
            yield ast.unparse(node.left), f"dropped {kind} '{_short(ast.unparse(node.right), 30)}'"
            if op in (ast.Add, ast.Mult):  # 'a - b' -> 'b' and 'a / b' -> 'b' are not plausible slips
                yield ast.unparse(node.right), f"dropped {kind} '{_short(ast.unparse(node.left), 30)}'"
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.Not)):
        yield ast.unparse(node.operand), f"dropped '{'-' if isinstance(node.op, ast.USub) else 'not'}'"
    elif isinstance(node, ast.BoolOp):
        new = ast.Or if isinstance(node.op, ast.And) else ast.And
        yield _replaced(node, op=new()), f"'{_OP_TEXT[type(node.op)]}' -> '{_OP_TEXT[new]}'"
    elif isinstance(node, ast.Compare) and len(node.ops) == 1:
        op = type(node.ops[0])
        for table in (_BOUNDARY, _NEGATE):
            if op in table:
                new = table[op]
                yield _replaced(node, ops=[new()]), f"'{_OP_TEXT[op]}' -> '{_OP_TEXT[new]}'"
    elif isinstance(node, ast.Constant) and not isinstance(node.value, bool):
        if isinstance(node.value, int):
            yield repr(node.value + 1), f"{node.value} -> {node.value + 1}"
            yield repr(node.value - 1), f"{node.value} -> {node.value - 1}"
        elif isinstance(node.value, float):
            new = node.value * 2 if node.value else 1.0
            yield repr(new), f"{node.value!r} -> {new!r}"
    elif isinstance(node, ast.Call):
        func = node.func
        name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if name in _SWAP_CALLS:
            new_func = copy.copy(func)
            if isinstance(func, ast.Name):
                new_func.id = _SWAP_CALLS[name]
            else:
                new_func.attr = _SWAP_CALLS[name]
            yield _replaced(node, func=new_func), f"{name}() -> {_SWAP_CALLS[name]}()"
        positional = [a for a in node.args if not isinstance(a, ast.Starred)]
        if len(positional) == len(node.args):
            for i in range(len(node.args) - 1):
                a, b = node.args[i], node.args[i + 1]
                # Two different values, neither a literal string: swapping a check's name and value
                # ('_check("n", n)') is no slip a learner makes, and every test would catch it.
                if ast.unparse(a) != ast.unparse(b) and not any(
                    isinstance(x, ast.Constant) and isinstance(x.value, str) for x in (a, b)
                ):
                    args = list(node.args)
                    args[i], args[i + 1] = args[i + 1], args[i]
                    yield _replaced(node, args=args), f"swapped arguments {i + 1} and {i + 2} of {name or 'a call'}()"
        if name == "range" and node.args:
            bound = node.args[-1] if len(node.args) <= 2 else node.args[1]
            if not isinstance(bound, ast.Constant):
                for delta in (1, -1):
                    args = [ast.parse(_plus(a, delta), mode="eval").body if a is bound else a for a in node.args]
                    yield _replaced(node, args=args), f"range bound {'+' if delta > 0 else '-'} 1"
    if isinstance(parent, ast.Slice) and node in (parent.lower, parent.upper) and not isinstance(node, ast.Constant):
        for delta in (1, -1):
            yield _plus(node, delta), f"slice bound {'+' if delta > 0 else '-'} 1"


def _statement_mutations(node):
    """(replacement source, description) pairs for one statement."""
    if isinstance(node, ast.Return) and node.value is not None:
        if not (isinstance(node.value, ast.Constant) and node.value.value == 0):
            yield "return 0", "return 0"
    elif isinstance(node, ast.AugAssign):
        yield "pass", f"dropped '{_short(ast.unparse(node), 40)}'"
    elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        yield "pass", f"dropped call '{_short(ast.unparse(node), 40)}'"


class _Walker(ast.NodeVisitor):
    """Collects (node, parent, enclosing function) for every node worth mutating inside the blocks."""

    def __init__(self, blocks):
        self.blocks, self.found, self.scope = blocks, [], []

    def inside(self, node) -> bool:
        return any(first <= node.lineno and node.end_lineno <= last for first, last in self.blocks)

    def generic_visit(self, node):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.scope.append(node.name)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Raise, ast.Assert, ast.JoinedStr)):
                continue  # error messages and internal checks: mutants there say nothing about the tests
            if isinstance(child, ast.Expr) and isinstance(child.value, ast.Constant):
                continue  # a docstring
            if isinstance(child, ast.expr) and isinstance(getattr(child, "ctx", None), (ast.Store, ast.Del)):
                continue
            if isinstance(child, (ast.expr, ast.stmt)) and self.inside(child):
                self.found.append((child, node, ".".join(self.scope)))
            self.visit(child)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            self.scope.pop()


def _splice(lines: list[str], node, replacement: str) -> str:
    """The file with ``node``'s source replaced by ``replacement`` (line numbers of the rest kept)."""
    first, last = node.lineno - 1, node.end_lineno - 1
    head = lines[first][: node.col_offset]
    tail = lines[last][node.end_col_offset :]
    if isinstance(node, ast.expr):
        replacement = f"({replacement})"
    middle = replacement.replace("\n", " ")
    new = [*lines[:first], head + middle + tail, *([""] * (last - first)), *lines[last + 1 :]]
    return "\n".join(new) + "\n"


def _segment(lines: list[str], node) -> str:
    """The source of ``node`` (``ast.get_source_segment`` re-splits the whole file each call: minutes here)."""
    first, last = node.lineno - 1, node.end_lineno - 1
    if first == last:
        return lines[first][node.col_offset : node.end_col_offset]
    return "\n".join([lines[first][node.col_offset :], *lines[first + 1 : last], lines[last][: node.end_col_offset]])


def _shape(source: str) -> str:
    """The syntax tree of a code fragment, without its layout (the fragment itself if it does not parse alone)."""
    try:
        return ast.dump(ast.parse(textwrap.dedent(source).strip() or "pass"))
    except SyntaxError:
        return " ".join(source.split())


def mutants(text: str) -> list[Mutant]:
    """Every distinct mutant of ``text`` whose mutation lies inside a BEGIN/END SOLUTION block."""
    tree = ast.parse(text)
    lines = text.splitlines()
    walker = _Walker(solution_blocks(text))
    walker.visit(tree)
    seen = set()
    found = []
    for node, parent, function in walker.found:
        pairs = _statement_mutations(node) if isinstance(node, ast.stmt) else _expression_mutations(node, parent)
        where = (node.lineno, node.col_offset, node.end_lineno, node.end_col_offset)
        seen.add((where, _shape(_segment(lines, node))))
        for replacement, description in pairs:
            mutated = _splice(lines, node, replacement)
            try:
                ast.parse(mutated)
            except SyntaxError:
                continue
            # Two mutants are the same when their replacements of the same node parse alike (comparing
            # whole files instead costs minutes on a 700-line solution).
            key = (where, _shape(replacement))
            if key in seen:
                continue
            seen.add(key)
            found.append(
                Mutant(
                    function or "<module>",
                    node.lineno,
                    description,
                    _short(_segment(lines, node), 60),
                    _short(replacement, 60),
                    mutated,
                )
            )
    return found
