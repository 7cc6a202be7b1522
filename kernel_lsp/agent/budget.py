"""Budgets of an optimization pass: what may be spent (Budget) and what has been (Spend).

A limit of None is unlimited. A limit is spent once the counter reaches it, so a budget of 20 model calls allows
exactly 20. Limits are checked in the order of LIMIT_ORDER (model calls, tokens, dollars, wall seconds, evaluations),
so when several are spent at once the message names the first of them. Tokens count input (prompt-cache writes
and reads included: the model read them all) and output together.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

LIMIT_ORDER = ("model_calls", "tokens", "dollars", "wall_s", "evaluations")
MODEL_CALL_LIMITS = ("model_calls", "tokens", "dollars", "wall_s")  # what one more model call would spend
EVALUATION_LIMITS = ("evaluations", "wall_s")  # what one more worker evaluation would spend


@dataclass
class Spend:
    """Counters of one pass; wall seconds run from `started` (time.monotonic) to now."""

    model_calls: int = 0
    input_tokens: int = 0  # billed at the input price (not from or into the prompt cache)
    output_tokens: int = 0
    cache_write_tokens: int = 0
    cache_read_tokens: int = 0
    dollars: float = 0.0
    evaluations: int = 0
    started: float = field(default_factory=time.monotonic)

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens + self.cache_write_tokens + self.cache_read_tokens

    @property
    def wall_s(self) -> float:
        return time.monotonic() - self.started

    def add_model_call(self, input_tokens: int, output_tokens: int, dollars: float, cache_write_tokens: int = 0,
                       cache_read_tokens: int = 0) -> None:
        self.model_calls += 1
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        self.cache_write_tokens += cache_write_tokens
        self.cache_read_tokens += cache_read_tokens
        self.dollars += dollars

    def add_evaluation(self) -> None:
        self.evaluations += 1

    def to_dict(self) -> dict[str, Any]:
        """The counters as the trajectory's "spend" events and the progress line show them."""
        return {"model_calls": self.model_calls, "input_tokens": self.input_tokens,
                "output_tokens": self.output_tokens, "cache_write_tokens": self.cache_write_tokens,
                "cache_read_tokens": self.cache_read_tokens, "dollars": round(self.dollars, 6),
                "evaluations": self.evaluations, "wall_s": round(self.wall_s, 3)}


@dataclass(frozen=True)
class Budget:
    """Limits of one pass; None means no limit on that counter."""

    model_calls: int | None = None
    tokens: int | None = None
    dollars: float | None = None
    wall_s: float | None = None
    evaluations: int | None = None

    def exceeded(self, spend: Spend) -> str | None:
        """The first spent limit in LIMIT_ORDER, as a sentence; None while every limit has room left."""
        return self._first_spent(spend, LIMIT_ORDER)

    def refuses_model_call(self, spend: Spend) -> str | None:
        """Why the next model call may not start (a limit it would add to is already spent), else None."""
        return self._first_spent(spend, MODEL_CALL_LIMITS)

    def refuses_evaluation(self, spend: Spend) -> str | None:
        """Why the next compile-and-verify run may not start, else None."""
        return self._first_spent(spend, EVALUATION_LIMITS)

    def wall_left_s(self, spend: Spend) -> float | None:
        """What the wall-time budget leaves (None: no wall budget); bounds a model call in flight."""
        return None if not self.wall_s else max(0.0, self.wall_s - spend.wall_s)

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in LIMIT_ORDER}

    def _first_spent(self, spend: Spend | Totals, names: tuple[str, ...]) -> str | None:
        for name in LIMIT_ORDER:
            limit = getattr(self, name)
            if name in names and limit is not None and getattr(spend, name) >= limit:
                return spent_message(name, limit, getattr(spend, name))
        return None


def spent_message(name: str, limit: float, used: float) -> str:
    """'the budget of 20 model calls is spent' and its kin, with the amount used where it can overshoot."""
    if name == "model_calls":
        return f"the budget of {counted(limit, 'model call')} is spent"
    if name == "tokens":
        return f"the budget of {counted(limit, 'token')} is spent ({used} used)"
    if name == "dollars":
        return f"the budget of ${limit:.2f} is spent (${used:.2f} used)"
    if name == "wall_s":
        return f"the wall-time budget of {limit:g} s is spent ({used:.0f} s elapsed)"
    return f"the budget of {counted(limit, 'evaluation')} is spent"


def counted(number: float, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


@dataclass(frozen=True)
class Totals:
    """Counters summed over several passes, as a campaign's ledger keeps them (Spend's names)."""

    model_calls: int = 0
    tokens: int = 0
    dollars: float = 0.0
    wall_s: float = 0.0
    evaluations: int = 0


class Ledger(Protocol):
    def totals(self) -> Totals: ...


@dataclass(frozen=True)
class SharedBudget(Budget):
    """A pass's own limits, and a total shared with other passes (a campaign's): whichever is spent first stops
    it. The ledger sums every pass's spend, those running included; its message says "the campaign's"."""

    total: Budget = field(default_factory=Budget)
    ledger: Ledger | None = field(default=None, compare=False)

    def _first_spent(self, spend: Spend, names: tuple[str, ...]) -> str | None:
        own = super()._first_spent(spend, names)
        if own is not None or self.ledger is None:
            return own
        shared = self.total._first_spent(self.ledger.totals(), names)
        return f"the campaign's total {shared.removeprefix('the ')}" if shared else None

    def wall_left_s(self, spend: Spend) -> float | None:
        own = super().wall_left_s(spend)
        if self.ledger is None or not self.total.wall_s:
            return own
        shared = max(0.0, self.total.wall_s - self.ledger.totals().wall_s)
        return shared if own is None else min(own, shared)

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "total": self.total.to_dict()}
