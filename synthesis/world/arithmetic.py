"""Safe arithmetic for `calculate`-like tools (no eval)."""

from __future__ import annotations

import ast
import operator

from tracegym.synthesis.world.errors import (
    ToolError,
)

# Safe arithmetic for `calculate`-like tools ------------------------------------------------------
_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _arith(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _arith(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return float(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_arith(node.left), _arith(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_arith(node.operand))
    raise ValueError("only + - * / on numbers")


def calculate(expression: str) -> str:
    if len(expression) > 200:
        raise ToolError("expression too long")
    try:
        return str(round(_arith(ast.parse(expression, mode="eval")), 2))
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        raise ToolError(f"cannot calculate {expression!r}: {exc}") from None
