"""What earlier passes on the same file tried, kept between passes and offered to the next one.

One JSON file per optimized file (by its resolved path) under the trajectory folder's memory/: a list of entries,
newest last, each one attempt of a pass: the pass, when, the attempt's memory line (outcome, feedback, dead end), its
eager speedup when verified, whether it was that pass's fastest, the gist of its last profile (the top hints) where
one ran, and, on the fastest, how the model summed up the pass when it finished. A pass reads the newest entries into its
prompts and adds its own attempts when it ends, whatever ended it. Writes go to a temporary file and replace the old
one, so a crash leaves the old memory or the new one; a memory that cannot be read is started afresh (logged).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

from kernel_lsp.agent.evaluation import report_of
from kernel_lsp.agent.search import SearchTree, memory_line, source_hash

log = logging.getLogger(__name__)
MAX_ENTRIES = 200  # the oldest go first
PROMPT_LINES = 15
NOTE_CHARS = 240  # a profile's gist, a finish summary: cut here


class KernelMemory:
    def __init__(self, folder: Path, original: Path) -> None:
        digest = hashlib.sha256(str(original.resolve()).encode()).hexdigest()[:12]
        self.path = folder / f"{original.stem}-{digest}.json"
        self.original = original

    def entries(self) -> list[dict[str, Any]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            log.warning("optimize: the memory of earlier passes %s cannot be read (%s); starting afresh",
                        self.path, exc)
            return []
        return [e for e in data.get("entries", []) if isinstance(e, dict) and isinstance(e.get("line"), str)] \
            if isinstance(data, dict) else []

    def prompt(self, limit: int = PROMPT_LINES) -> str:
        """The newest entries, one line each, newest first: '[pass p1 2026-12-04] #3 from #1: verified 1.4× eager'
        with '(fastest of that pass)' where it was; '' when there were no earlier passes."""
        lines = []
        for entry in reversed(self.entries()[-limit:]):
            fastest = " (fastest of that pass)" if entry.get("fastest") else ""
            line = f"[pass {entry.get('pass', '?')} {str(entry.get('when', ''))[:10]}] {entry['line']}{fastest}"
            if entry.get("profile"):
                line += f" · its profile: {entry['profile']}"
            if entry.get("finish"):
                line += f" · the pass ended: {entry['finish']}"
            lines.append(line)
        return "\n".join(lines)

    def add_pass(self, pass_id: str, tree: SearchTree, profiles: dict[str, str] | None = None,
                 finish: str = "") -> None:
        """The pass's evaluated attempts (not the original, which every pass starts from), with the gist of each one's
        last profile (`profiles`: source hash -> gist) and the model's `finish` summary on the fastest, then the file
        rewritten; a failure to write is logged, never raised: the pass's result matters more than its memory."""
        best = tree.best_verified()
        when = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        added = []
        for node in tree.nodes:
            if node.rubric is None or node.parent_id is None:
                continue
            report = report_of(node.evaluation)
            speedup = report.speedup if report is not None else {}
            fastest = best is not None and node.id == best.id
            entry = {"pass": pass_id, "when": when, "line": memory_line(node), "verified": node.rubric.verified,
                     "speedup_eager": speedup.get("eager") if node.rubric.verified else None, "fastest": fastest}
            gist = (profiles or {}).get(source_hash(node.source))
            if gist:
                entry["profile"] = _cut(gist)
            if fastest and finish.strip():
                entry["finish"] = _cut(" ".join(finish.split()))
            added.append(entry)
        if not added:
            return
        entries = (self.entries() + added)[-MAX_ENTRIES:]
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle, temporary = tempfile.mkstemp(dir=self.path.parent, prefix=".memory-", suffix=".json")
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump({"file": str(self.original.resolve()), "entries": entries}, out, ensure_ascii=False)
            os.replace(temporary, self.path)
        except OSError as exc:
            log.warning("optimize: cannot write the memory of this pass to %s: %s", self.path, exc)


def _cut(text: str) -> str:
    return text if len(text) <= NOTE_CHARS else text[:NOTE_CHARS - 1] + "…"
