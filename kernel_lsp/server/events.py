"""What one feature tells the others, without setting their attributes: a feature publishes an event by name with
its arguments; a feature set up later subscribes a handler to it in its own setup. A handler that raises is logged
and the others still run: one feature's failure never stops another's work, or the server."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

CANDIDATE_VERIFIED = "candidate-verified"  # (uri, pairing, job): a run verified the candidate (VerifyFeature)


class Events:
    def __init__(self) -> None:
        self._handlers: dict[str, list[Callable[..., Any]]] = {}

    def subscribe(self, name: str, handler: Callable[..., Any]) -> None:
        self._handlers.setdefault(name, []).append(handler)

    def publish(self, name: str, *args: Any) -> None:
        for handler in self._handlers.get(name, []):
            try:
                handler(*args)
            except Exception:  # noqa: BLE001 - a subscriber's bug is logged, the publisher goes on
                log.exception("a handler of %r failed", name)
