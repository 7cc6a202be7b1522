"""What an editor test does when a tool it needs is missing: fail in CI (env CI set), where everything must be
installed, and skip with the reason elsewhere."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def missing(message: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)
