"""The bundled calculator tool: exact arithmetic on a typed expression, without `eval`.

Design choices:

- The expression is parsed by `ast` and walked; only numbers, parentheses, unary +/- and the
  operators + - * / // % ** are accepted, so no name, call or attribute can ever run.
- Exact: every value is a `fractions.Fraction`; a decimal literal is read from its source text
  ("0.1" is exactly 1/10, not the float nearest it), so 0.1 + 0.2 is "0.3".
- Bounded: `**` takes only integer exponents, and every intermediate result is refused past
  MAX_BITS bits (before it is computed, for powers), so `9**9**9` is an error in microseconds, not
  a hang or an out-of-memory. Expressions are at most MAX_CHARS characters.
- The result is a string: an integer exactly ("1769307"); any other value as a decimal, exact when
  it ends within DECIMALS digits after the point ("1.75"), else rounded half-even to DECIMALS
  digits ("0.666666666667"). Errors are raised as ValueError with a message for the model.
"""

from __future__ import annotations

import ast
import operator
from decimal import ROUND_HALF_EVEN, Decimal, localcontext
from fractions import Fraction

MAX_CHARS = 1000  # longest expression accepted
MAX_BITS = 4096  # largest numerator or denominator of any value (about 1233 decimal digits)
DECIMALS = 12  # digits after the decimal point of a result that is not exact within them

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod}
_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
           ast.Mod: "%", ast.Pow: "**"}


def _bits(x: Fraction) -> int:
    return max(x.numerator.bit_length(), x.denominator.bit_length())


def _checked(x: Fraction) -> Fraction:
    if _bits(x) > MAX_BITS:
        raise ValueError(f"number too large (more than {MAX_BITS} bits)")
    return x


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator != 1:
        raise ValueError("only whole-number exponents are supported")
    # |base ** e| has about bits(base) * |e| bits: refuse before computing it.
    if base not in (0, 1, -1) and _bits(base) * abs(exponent.numerator) > MAX_BITS + 64:
        raise ValueError(f"number too large (more than {MAX_BITS} bits)")
    if base == 0 and exponent < 0:
        raise ValueError("division by zero")
    return _checked(base ** exponent.numerator)


def _evaluate(node: ast.AST, source: str) -> Fraction:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, source)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        if type(node.value) is int:
            return _checked(Fraction(node.value))
        text = ast.get_source_segment(source, node).replace("_", "").lower()
        mantissa, _, power = text.partition("e")
        if power and abs(int(power)) > MAX_BITS:  # "1e999999999": refused before it is built
            raise ValueError(f"number too large (more than {MAX_BITS} bits)")
        return _checked(Fraction(text))  # "0.1" exactly, not the float nearest it
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _evaluate(node.operand, source)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _SYMBOL:
        left, right = _evaluate(node.left, source), _evaluate(node.right, source)
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        if right == 0 and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)):
            raise ValueError("division by zero")
        return _checked(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.BinOp):
        raise ValueError(f"unsupported operator {type(node.op).__name__}; use + - * / // % **")
    raise ValueError(f"unsupported input {ast.get_source_segment(source, node)!r}: use numbers, "
                     "parentheses and + - * / // % **")


def format_number(x: Fraction) -> str:
    """An integer exactly; else a decimal, exact within DECIMALS digits, rounded past them."""
    if x.denominator == 1:
        return str(x.numerator)
    with localcontext() as ctx:
        ctx.prec = MAX_BITS  # enough digits for any integer part we let through
        ctx.rounding = ROUND_HALF_EVEN
        scaled = Decimal(x.numerator) / Decimal(x.denominator)
        text = format(scaled.quantize(Decimal(1).scaleb(-DECIMALS)), "f")
    text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Supports integers and decimals, parentheses and the operators + - * / // % ** (whole-number
    exponents only). Division gives a decimal, rounded to 12 digits after the point when it
    does not end sooner.

    Args:
        expression: The expression to evaluate, for example "4821 * 367" or "(12.5 + 3) / 4".
    """
    if not isinstance(expression, str):
        raise ValueError(f"expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_CHARS:
        raise ValueError(f"expression too long (more than {MAX_CHARS} characters)")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, RecursionError, MemoryError) as err:
        shown = expression if len(expression) <= 60 else expression[:60] + "..."
        raise ValueError(f"not an arithmetic expression: {shown!r}") from err
    try:
        return format_number(_evaluate(tree, expression.strip()))
    except RecursionError as err:
        raise ValueError("expression nested too deeply") from err
