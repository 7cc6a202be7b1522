"""A conversation that outgrows `agentContextTokens` is compacted before its next turn instead of being resent whole.

What each turn costs grows with the conversation: every tool result (a profile, a source listing, a verifier's
report) is sent again with every later turn, at the cache's read price at best and at the full price after any
change before it. Past the threshold (the prompt's size as the API counted it on the last turn: fresh input plus
cache writes and reads), the older part is replaced by a digest:

- the first message (the expansion prompt: the node's source, its facts, the machine) is kept whole;
- the last KEEP_RECENT_EXCHANGES exchanges (an assistant turn and the tool results that answer it) are kept whole,
  thinking blocks included, as the Messages API requires for a tool loop in progress;
- before them, each tool result becomes its first line and its size, each long string in a tool call's input
  (a whole `source`) its size, long text is cut, and thinking blocks are dropped (the API ignores earlier turns'
  thinking anyway); a note tells the model that it may call a tool again for anything it needs.

Every tool call keeps its id and its result, so the conversation stays well-formed. Compacting again changes
nothing that was compacted already, so a conversation whose recent exchanges alone pass the threshold is not
compacted turn after turn into nothing.
"""

from __future__ import annotations

from typing import Any

KEEP_RECENT_EXCHANGES = 2
RESULT_HEAD_CHARS = 240  # a compacted tool result keeps its first line, cut here
INPUT_STRING_CHARS = 400  # a tool call's string input longer than this is replaced by its size
TEXT_CHARS = 1200  # the model's text in an older turn is cut here
ELIDED_MARK = "[elided"
NOTE_START = "[kernel-lsp: the conversation passed"
COMPACTED_NOTE = (NOTE_START + " {limit:,} tokens, so the tool results and long inputs before the last {recent} "
                  "exchanges were shortened to their first line; call a tool again for anything you need from them "
                  "(read_candidate, read_reference, profile).]")


def prompt_tokens(usage: Any) -> int:
    """The size of the prompt the API read on a turn: fresh input plus the cache's writes and reads."""
    return int((getattr(usage, "input_tokens", 0) or 0) + (getattr(usage, "cache_creation_input_tokens", 0) or 0)
               + (getattr(usage, "cache_read_input_tokens", 0) or 0))


def compact(messages: list[dict[str, Any]], limit: int, recent: int = KEEP_RECENT_EXCHANGES) -> dict[str, int]:
    """Compacts `messages` in place (module docstring); returns what changed: blocks shortened, characters saved."""
    end = len(messages) - 2 * recent  # messages[end:] are the recent exchanges
    changed = {"blocks": 0, "chars_saved": 0}
    if end <= 1:
        return changed
    for message in messages[1:end]:
        content = message.get("content")
        if not isinstance(content, list):
            if isinstance(content, str) and len(content) > TEXT_CHARS and not content.startswith(ELIDED_MARK):
                message["content"] = _cut(content, changed)
            continue
        kept = []
        for block in content:
            kept.extend(_compacted(block, changed))
        message["content"] = kept or [{"type": "text", "text": f"{ELIDED_MARK}]"}]
    last_elided = messages[end - 1]
    if changed["blocks"] and last_elided.get("role") == "user" and isinstance(last_elided.get("content"), list):
        for message in messages[1:end - 1]:  # one note, after the last shortened message
            if isinstance(message.get("content"), list):
                message["content"] = [block for block in message["content"] if not _is_note(block)] or \
                    [{"type": "text", "text": f"{ELIDED_MARK}]"}]
        if not any(_is_note(block) for block in last_elided["content"]):
            last_elided["content"].append({"type": "text", "text": COMPACTED_NOTE.format(limit=limit, recent=recent)})
    return changed


def _is_note(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") == "text" and \
        str(block.get("text", "")).startswith(NOTE_START)


def _compacted(block: Any, changed: dict[str, int]) -> list[Any]:
    if not isinstance(block, dict):
        return [block]
    kind = block.get("type")
    if kind in ("thinking", "redacted_thinking"):
        changed["blocks"] += 1
        changed["chars_saved"] += len(str(block.get("thinking") or block.get("data") or ""))
        return []
    if kind == "tool_result":
        text = _result_text(block.get("content"))
        if len(text) <= RESULT_HEAD_CHARS or text.startswith(ELIDED_MARK):
            return [block]
        head = text.strip().splitlines()[0][:RESULT_HEAD_CHARS] if text.strip() else ""
        changed["blocks"] += 1
        changed["chars_saved"] += len(text) - len(head)
        return [{**block, "content": f"{ELIDED_MARK}: {len(text):,} chars; it began] {head}"}]
    if kind == "tool_use" and isinstance(block.get("input"), dict):
        long = {key: value for key, value in block["input"].items()
                if isinstance(value, str) and len(value) > INPUT_STRING_CHARS}
        if not long:
            return [block]
        changed["blocks"] += 1
        changed["chars_saved"] += sum(len(value) for value in long.values())
        return [{**block, "input": {**block["input"],
                                    **{key: f"{ELIDED_MARK}: {len(value):,} chars]" for key, value in long.items()}}}]
    if kind == "text" and len(block.get("text") or "") > TEXT_CHARS and not block["text"].startswith(ELIDED_MARK):
        return [{**block, "text": _cut(block["text"], changed)}]
    return [block]


def _cut(text: str, changed: dict[str, int]) -> str:
    changed["blocks"] += 1
    changed["chars_saved"] += len(text) - TEXT_CHARS
    return f"{ELIDED_MARK}: {len(text):,} chars; it began] {text[:TEXT_CHARS]}"


def _result_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""
