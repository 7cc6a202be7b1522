"""What a keeper (process/keeper.py) reports on its pipe, typed: the first line when its child starts, the last
when the tree has ended. The keeper writes them as JSON (it runs as a file with -I -S, stdlib only); its parent's
KeeperLink decodes them with contracts.codec. Wire names are the keeper's (`leftCount`, `diskBytes`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class KeeperStart:
    child: int  # the program's pid
    subreaper: str | None  # why the tree cannot be followed (PR_SET_CHILD_SUBREAPER refused); None: it can


@dataclass(frozen=True)
class KeeperEnd:
    status: int | None  # the program's exit code, negative for a signal; None: it had not ended
    reason: Literal["lifeline", "disk", "signal"] | None  # None: it ended by itself
    left: list[str]  # processes it left running (named, at most keeper.LISTED), killed since
    left_count: int  # `leftCount`: all of them
    unkilled: list[str]  # processes that outlived SIGKILL
    disk_bytes: int  # `diskBytes`: the most its watched folders took
    disk_limit: int | None  # `diskLimit`
