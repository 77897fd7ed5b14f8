"""A tiny PromQL evaluator over instant samples: vector selectors with `=`, `!=`, `=~`, `!~` matchers,
`sum|avg|max|min|count` aggregations with `by`/`without`, `topk`/`bottomk`, `rate`/`irate`
of a range selector, comparisons with a number as filters, `label_replace` and `or`: enough
for the queries the pipeline makes.

The simulator keeps no history: counters grow at a steady rate, so `rate(x[d])` is that rate
whatever `d` is. Callers pass the per-second rates of counters beside the instant samples."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

Labels = dict[str, str]
Series = tuple[Labels, float]

AGGREGATIONS = ("sum", "avg", "max", "min", "count")
SELECTIONS = ("topk", "bottomk")
RATE_FUNCTIONS = ("rate", "irate")
COMPARISONS = {
    "<": lambda a, b: a < b,
    ">": lambda a, b: a > b,
    "<=": lambda a, b: a <= b,
    ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}


class PromQLError(ValueError):
    """A query this evaluator cannot parse or does not support; Prometheus answers `bad_data`."""


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str
    value: str

    def matches(self, labels: Labels) -> bool:
        # An absent label matches as the empty string, as in Prometheus.
        actual = labels.get(self.label, "")
        if self.op == "=":
            return actual == self.value
        if self.op == "!=":
            return actual != self.value
        found = re.fullmatch(self.value, actual) is not None
        return found if self.op == "=~" else not found


@dataclass(frozen=True)
class Selector:
    matchers: tuple[Matcher, ...]

    def evaluate(self, series: Iterable[Series], rates: Iterable[Series] = ()) -> list[Series]:
        return [(labels, value) for labels, value in series if all(m.matches(labels) for m in self.matchers)]


@dataclass(frozen=True)
class Rate:
    """`rate(selector[range])` (and `irate`): the per-second rate of each matching counter, without
    its metric name; a series with no counter behind it (a gauge that does not move) has rate 0."""

    selector: Selector

    def evaluate(self, series: Iterable[Series], rates: Iterable[Series] = ()) -> list[Series]:
        moving = {_identity(labels): value for labels, value in self.selector.evaluate(rates)}
        return [
            ({k: v for k, v in labels.items() if k != "__name__"}, moving.get(_identity(labels), 0.0))
            for labels, _ in self.selector.evaluate(series)
        ]


@dataclass(frozen=True)
class Comparison:
    """`expr <op> number`: keeps the samples for which the comparison holds, as Prometheus filters."""

    inner: Expr
    op: str
    threshold: float

    def evaluate(self, series: Iterable[Series], rates: Iterable[Series] = ()) -> list[Series]:
        test = COMPARISONS[self.op]
        return [
            (labels, value)
            for labels, value in self.inner.evaluate(series, rates)
            if test(value, self.threshold)
        ]


def _identity(labels: Labels) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(labels.items()))


@dataclass(frozen=True)
class LabelReplace:
    """`label_replace(v, dst, replacement, src, regex)`: where `regex` matches the whole of `src`'s
    value, `dst` becomes `replacement` with `$1` / `${1}` / `${name}` expanded (removed when empty)."""

    inner: Expr
    destination: str
    replacement: str
    source: str
    regex: str

    def evaluate(self, series: Iterable[Series], rates: Iterable[Series] = ()) -> list[Series]:
        out = []
        for labels, value in self.inner.evaluate(series, rates):
            found = re.fullmatch(self.regex, labels.get(self.source, ""))
            if found is not None:
                text = _expand(found, self.replacement)
                labels = {k: v for k, v in labels.items() if k != self.destination}
                if text:
                    labels[self.destination] = text
            out.append((labels, value))
        return out


def _expand(found: re.Match[str], replacement: str) -> str:
    """`replacement` with `$1`, `${1}` and `${name}` taken from the match, as Go's Expand does."""
    return re.sub(
        r"\$(?:\{(\w+)\}|(\d+))",
        lambda g: found.group(int(g[2]) if g[2] else _group_key(g[1])) or "",
        replacement,
    )


def _group_key(name: str) -> int | str:
    return int(name) if name.isdigit() else name


@dataclass(frozen=True)
class Union:
    """`a or b`: every sample of `a`, and those of `b` whose labels (but the metric name) `a` has not."""

    left: Expr
    right: Expr

    def evaluate(self, series: Iterable[Series], rates: Iterable[Series] = ()) -> list[Series]:
        series, rates = list(series), list(rates)
        left = self.left.evaluate(series, rates)
        seen = {_identity(_without_name(labels)) for labels, _ in left}
        return left + [
            (labels, value)
            for labels, value in self.right.evaluate(series, rates)
            if _identity(_without_name(labels)) not in seen
        ]


def _without_name(labels: Labels) -> Labels:
    return {k: v for k, v in labels.items() if k != "__name__"}


@dataclass(frozen=True)
class Aggregation:
    op: str
    grouping: tuple[str, ...]
    without: bool
    inner: Expr

    def evaluate(self, series: Iterable[Series], rates: Iterable[Series] = ()) -> list[Series]:
        groups: dict[tuple[Any, ...], list[float]] = {}
        if self.without:
            dropped = {*self.grouping, "__name__"}
            for labels, value in self.inner.evaluate(series, rates):
                key = tuple(sorted((k, v) for k, v in labels.items() if k not in dropped))
                groups.setdefault(key, []).append(value)
            return [(dict(key), _aggregate(self.op, values)) for key, values in groups.items()]
        names = sorted(self.grouping)
        for labels, value in self.inner.evaluate(series, rates):
            groups.setdefault(tuple(labels.get(name, "") for name in names), []).append(value)
        # Prometheus drops empty label values from the output label set.
        return [
            ({name: v for name, v in zip(names, key, strict=True) if v}, _aggregate(self.op, values))
            for key, values in groups.items()
        ]


@dataclass(frozen=True)
class TopK:
    """`topk(k, expr)` / `bottomk(k, expr)`: the k samples of highest (lowest) value, labels kept;
    NaN sorts last either way, as in Prometheus."""

    k: int
    largest: bool
    inner: Expr

    def evaluate(self, series: Iterable[Series], rates: Iterable[Series] = ()) -> list[Series]:
        samples = self.inner.evaluate(series, rates)
        sign = -1.0 if self.largest else 1.0
        ordered = sorted(
            samples,
            key=lambda item: (math.isnan(item[1]), sign * item[1] if not math.isnan(item[1]) else 0.0),
        )
        return ordered[: max(self.k, 0)]


Expr = Selector | Aggregation | Rate | Comparison | LabelReplace | Union | TopK


def _aggregate(op: str, values: Sequence[float]) -> float:
    if op == "sum":
        return math.fsum(values)
    if op == "avg":
        return math.fsum(values) / len(values)
    if op in ("max", "min"):
        # Prometheus passes over NaN unless every value is NaN.
        numbers = [v for v in values if not math.isnan(v)] or list(values)
        return max(numbers) if op == "max" else min(numbers)
    return float(len(values))


# -- parsing -----------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
      | (?P<cmp><=|>=|==|<|>)
      | (?P<op>=~|!~|!=|=)
      | (?P<range>\[[0-9]+[smhdwy]\])
      | (?P<number>[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?)
      | (?P<punct>[{}(),])
      | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
    )""",
    re.VERBOSE,
)
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "'": "'"}


def _unquote(literal: str) -> str:
    if literal[0] == "`":
        return literal[1:-1]
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), literal[1:-1])


def _tokenize(query: str) -> list[tuple[str, str]]:
    tokens, position = [], 0
    while position < len(query):
        if query[position:].strip() == "":
            break
        m = _TOKEN.match(query, position)
        if m is None:
            raise PromQLError(
                f"unexpected character {query[position:].lstrip()[:1]!r} at position {position} "
                f"(the simulator supports selectors, sum/avg/max/min/count, rate/irate, comparisons, "
                f"label_replace and or only)"
            )
        kind = m.lastgroup or ""
        tokens.append((kind, m.group(kind)))
        position = m.end()
    return tokens


class _Parser:
    def __init__(self, query: str) -> None:
        self.query = query
        self.tokens = _tokenize(query)
        self.position = 0

    def peek(self, offset: int = 0) -> tuple[str, str] | None:
        index = self.position + offset
        return self.tokens[index] if index < len(self.tokens) else None

    def take(self, kind: str, text: str | None = None) -> str:
        token = self.peek()
        if token is None or token[0] != kind or (text is not None and token[1] != text):
            found = "end of input" if token is None else repr(token[1])
            raise PromQLError(f"parse error in {self.query!r}: expected {text or kind}, found {found}")
        self.position += 1
        return token[1]

    def at(self, kind: str, text: str | None = None) -> bool:
        token = self.peek()
        return token is not None and token[0] == kind and (text is None or token[1] == text)

    def parse(self) -> Expr:
        expr = self.expr()
        if self.peek() is not None:
            raise PromQLError(f"parse error in {self.query!r}: unexpected {self.peek()[1]!r}")  # type: ignore[index]
        return expr

    def expr(self) -> Expr:
        # `or` binds loosest: `a > 1 or b` is `(a > 1) or b`.
        union = self.comparisons()
        while self.at("ident", "or"):
            self.position += 1
            union = Union(union, self.comparisons())
        return union

    def comparisons(self) -> Expr:
        inner = self.operand()
        token = self.peek()
        # Comparisons with a number filter in turn, left to right (`x >= 0 <= 100`).
        while token is not None and (token[0] == "cmp" or token == ("op", "!=")):
            self.position += 1
            inner = Comparison(inner, token[1], float(self.take("number")))
            token = self.peek()
        return inner

    def operand(self) -> Expr:
        token = self.peek()
        if (
            token is not None
            and token[0] == "ident"
            and token[1] in RATE_FUNCTIONS
            and self.peek(1) == ("punct", "(")
        ):
            self.position += 2
            selector = self.selector()
            self.take("range")
            self.take("punct", ")")
            return Rate(selector)
        if token == ("ident", "label_replace") and self.peek(1) == ("punct", "("):
            return self.label_replace()
        if (
            token is not None
            and token[0] == "ident"
            and token[1] in SELECTIONS
            and self.peek(1) == ("punct", "(")
        ):
            self.position += 2
            k = int(float(self.take("number")))
            self.take("punct", ",")
            inner = self.expr()
            self.take("punct", ")")
            return TopK(k, token[1] == "topk", inner)
        if token is not None and token[0] == "ident" and token[1] in AGGREGATIONS:
            following = self.peek(1)
            if following is not None and (following[1] == "(" or following[1] in ("by", "without")):
                return self.aggregation()
        if token is not None and (token[0] == "ident" or token[1] == "{"):
            return self.selector()
        found = "end of input" if token is None else repr(token[1])
        raise PromQLError(f"parse error in {self.query!r}: expected a selector or aggregation, found {found}")

    def label_replace(self) -> LabelReplace:
        self.position += 2
        inner = self.expr()
        texts = []
        for _ in range(4):
            self.take("punct", ",")
            texts.append(_unquote(self.take("string")))
        self.take("punct", ")")
        try:
            re.compile(texts[3])
        except re.error as exc:
            raise PromQLError(f"invalid regular expression {texts[3]!r}: {exc}") from exc
        return LabelReplace(inner, *texts)

    def grouping(self) -> tuple[bool, tuple[str, ...]]:
        without = self.take("ident") == "without"
        self.take("punct", "(")
        labels: list[str] = []
        while not self.at("punct", ")"):
            labels.append(self.take("ident"))
            if not self.at("punct", ")"):
                self.take("punct", ",")
        self.take("punct", ")")
        return without, tuple(labels)

    def aggregation(self) -> Aggregation:
        op = self.take("ident")
        without, labels = False, ()
        if self.at("ident", "by") or self.at("ident", "without"):
            without, labels = self.grouping()
        self.take("punct", "(")
        inner = self.expr()
        self.take("punct", ")")
        if self.at("ident", "by") or self.at("ident", "without"):
            if labels:
                raise PromQLError(f"parse error in {self.query!r}: grouping given twice")
            without, labels = self.grouping()
        return Aggregation(op, labels, without, inner)

    def selector(self) -> Selector:
        matchers: list[Matcher] = []
        if self.at("ident"):
            matchers.append(Matcher("__name__", "=", self.take("ident")))
        if self.at("punct", "{"):
            self.take("punct", "{")
            while not self.at("punct", "}"):
                label = self.take("ident")
                op = self.take("op")
                value = _unquote(self.take("string"))
                if op in ("=~", "!~"):
                    try:
                        re.compile(value)
                    except re.error as exc:
                        raise PromQLError(f"invalid regular expression {value!r}: {exc}") from exc
                matchers.append(Matcher(label, op, value))
                if not self.at("punct", "}"):
                    self.take("punct", ",")
            self.take("punct", "}")
        if not any(not m.matches({}) for m in matchers):
            raise PromQLError("vector selector must contain at least one non-empty matcher")
        return Selector(tuple(matchers))


def parse(query: str) -> Expr:
    return _Parser(query).parse()


def metric_names(expr: Expr) -> frozenset[str] | None:
    """The metric names whose series the expression can read, or None when a selector has no
    `__name__="..."` matcher (then every series is a candidate)."""
    if isinstance(expr, Union):
        left, right = metric_names(expr.left), metric_names(expr.right)
        return None if left is None or right is None else left | right
    if isinstance(expr, (Aggregation, Comparison, LabelReplace, TopK)):
        return metric_names(expr.inner)
    selector = expr.selector if isinstance(expr, Rate) else expr
    names = [m.value for m in selector.matchers if m.label == "__name__" and m.op == "="]
    return frozenset(names[:1]) if names else None


def evaluate(query: str, series: Iterable[Series], rates: Iterable[Series] = ()) -> list[Series]:
    """Evaluate an instant query; results are sorted by label set so answers are deterministic.
    `rates` are the per-second rates of the counters among `series`, for `rate` and `irate`."""
    result = parse(query).evaluate(list(series), list(rates))
    return sorted(result, key=lambda item: sorted(item[0].items()))


def format_value(value: float) -> str:
    """Format a sample value as Prometheus does (Go's strconv 'f', -1): no exponent, shortest form."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 1e21:
        return str(int(value))
    text = repr(value)
    return format(Decimal(text), "f") if "e" in text else text
