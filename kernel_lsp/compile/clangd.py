"""A first squiggle for plain `.cu` files from clangd, before nvcc's exact result.

nvcc cannot answer an edit faster than it parses the CUDA headers again (0.23 s for a one-line file on the 2-core
machine, benchmarks/RESULTS.md); clangd keeps them parsed (its preamble) and answers in about half that. When clangd
is installed (setting `clangd`), the check of a `.cu` hands the text to one clangd child, over LSP on its stdio,
and shows clangd's errors, marked preliminary, until nvcc's result replaces them.

clang is not nvcc: it rejects code nvcc accepts (architecture-guarded intrinsics, nvcc's extensions, headers clang
does not support) and words its messages its own way. So a document's clang errors are shown only while clang has
**agreed** with nvcc on it: on the last version nvcc compiled without an error, clang found none either. A version
clang rejects and nvcc accepts withdraws the agreement until they agree again; the first check of a document shows
nothing from clang. clangd reads the project's own compile_commands.json or compile_flags.txt when it has one,
else the flags given here (`-xcuda`, the CUDA path and the include folders).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from kernel_lsp.findings import Finding, Range, Severity

log = logging.getLogger(__name__)

PRELIMINARY = "preliminary: clang's front end; nvcc's result follows"
ANSWER_S = 10.0  # longer than this for one version's diagnostics: nothing to show early
# the newest GPU architecture each clang release knows; an older clang is told the oldest one it does
_CLANG_ARCH = "sm_80"


def find_clangd(setting: str) -> str | None:
    """The clangd to run: the setting's path, or on PATH `clangd`, else the newest `clangd-NN`; None when the setting
    is `off` or none is installed."""
    if setting == "off":
        return None
    if setting:
        return shutil.which(setting)
    found = shutil.which("clangd")
    if found:
        return found
    for version in range(30, 9, -1):
        found = shutil.which(f"clangd-{version}")
        if found:
            return found
    return None


@dataclass
class _Open:
    version: int = 0
    text: str = ""


class ClangdPass:
    """One clangd child for the server's life, started on first use. `errors(path, text)` is clangd's errors for
    that text, or None (clangd missing, broken, slow). Restarted once if it dies; a second death turns it off."""

    def __init__(self, clangd: str, fallback_flags: list[str]) -> None:
        self.clangd = clangd
        self.fallback_flags = fallback_flags
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task | None = None
        self._next_id = 0
        self._replies: dict[int, asyncio.Future] = {}
        self._published: dict[tuple[str, int], asyncio.Future] = {}
        self._open: dict[str, _Open] = {}
        self._lock = asyncio.Lock()
        self._deaths = 0
        self.agreed: dict[str, bool] = {}  # per URI: clang and nvcc agreed on its last nvcc-clean version

    async def errors(self, path: Path, text: str) -> list[dict] | None:
        """clangd's error diagnostics (LSP dicts) for `text` as the content of `path`."""
        async with self._lock:
            if not await self._started():
                return None
            uri = path.as_uri()
            document = self._open.setdefault(uri, _Open())
            document.version += 1
            document.text = text
            key = (_path_of(uri), document.version)
            published = self._published[key] = asyncio.get_running_loop().create_future()
            if document.version == 1:
                self._send({"method": "textDocument/didOpen", "params": {"textDocument": {
                    "uri": uri, "languageId": "cuda", "version": 1, "text": text}}})
            else:
                self._send({"method": "textDocument/didChange", "params": {
                    "textDocument": {"uri": uri, "version": document.version}, "contentChanges": [{"text": text}]}})
        try:
            diagnostics = await asyncio.wait_for(published, ANSWER_S)
        except (asyncio.TimeoutError, ConnectionError):
            return None
        finally:
            self._published.pop(key, None)
        return [d for d in diagnostics if d.get("severity") == 1]

    def findings(self, uri: str, errors: list[dict]) -> list[Finding]:
        """The errors as preliminary findings, when clang and nvcc agree on this document; else none."""
        if not self.agreed.get(uri):
            return []
        found = []
        for error in errors:
            try:
                start, end = error["range"]["start"], error["range"]["end"]
                rng = Range.of(start["line"], start["character"], end["line"], end["character"])
            except (KeyError, TypeError):
                continue
            message = str(error.get("message", "")).split("\n\n", 1)[0].replace(" (fix available)", "")
            found.append(Finding(uri, rng, Severity.ERROR, "kernel-lsp", "clang-error", f"{message} ({PRELIMINARY})",
                                 data={"tool": "clangd", "preliminary": True}))
        return found

    def judge(self, uri: str, clang_errors: list[dict] | None, nvcc_errors: int) -> None:
        """After both answered one version: on a version nvcc compiled without error, clang agreed or not."""
        if clang_errors is None or nvcc_errors:
            return
        agreed = not clang_errors
        if self.agreed.get(uri) and not agreed:
            log.info("clang rejects what nvcc accepts in %s (%s); its errors are not shown early for it", uri,
                     clang_errors[0].get("message"))
        self.agreed[uri] = agreed

    async def close(self) -> None:
        process = self._process
        if process is None or process.returncode is not None:
            return
        try:
            await asyncio.wait_for(self._request("shutdown", None), 2.0)
            self._send({"method": "exit"})
            await asyncio.wait_for(process.wait(), 2.0)
        except (asyncio.TimeoutError, ConnectionError, OSError):
            process.kill()
            await process.wait()

    # --- the connection ---------------------------------------------------------------------------------------

    async def _started(self) -> bool:
        if self._process is not None and self._process.returncode is None:
            return True
        if self._deaths >= 2:
            return False
        if self._process is not None:
            self._deaths += 1
            log.warning("clangd ended (exit %s)%s", self._process.returncode,
                        "; starting it again" if self._deaths < 2 else "; not starting it again")
            if self._deaths >= 2:
                return False
        try:
            # --sync: each change is parsed as it comes, without the debounce an editor's clangd waits (50 ms or
            # more) for the typing to pause; the check asks once per version, after its own debounce
            self._process = await asyncio.create_subprocess_exec(
                self.clangd, "--log=error", "--background-index=false", "--pch-storage=memory", "--sync",
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL)
        except OSError as exc:
            log.warning("clangd could not be started: %s", exc)
            self._deaths = 2
            return False
        self._open.clear()
        self._reader = asyncio.ensure_future(self._read(self._process))
        try:
            await asyncio.wait_for(self._request("initialize", {
                "processId": None, "rootUri": None, "capabilities": {
                    "textDocument": {"publishDiagnostics": {"versionSupport": True}}},
                "initializationOptions": {"fallbackFlags": self.fallback_flags}}), ANSWER_S)
        except (asyncio.TimeoutError, ConnectionError) as exc:
            log.warning("clangd did not answer initialize: %s", exc or "timed out")
            self._process.kill()
            return False
        self._send({"method": "initialized", "params": {}})
        return True

    def _send(self, message: dict) -> None:
        if self._process is None or self._process.stdin is None:
            raise ConnectionError("clangd is not running")
        body = json.dumps({"jsonrpc": "2.0", **message}).encode()
        self._process.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)

    async def _request(self, method: str, params: object) -> object:
        self._next_id += 1
        reply = self._replies[self._next_id] = asyncio.get_running_loop().create_future()
        self._send({"id": self._next_id, "method": method, "params": params})
        return await reply

    async def _read(self, process: asyncio.subprocess.Process) -> None:
        stream = process.stdout
        try:
            while True:
                length = None
                while (line := await stream.readline()) not in (b"\r\n", b"\n"):
                    if not line:
                        raise ConnectionError("clangd closed its output")
                    name, _, value = line.decode("ascii", "replace").partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                if length is None:
                    continue
                self._receive(json.loads(await stream.readexactly(length)))
        except (ConnectionError, asyncio.IncompleteReadError, ValueError) as exc:
            log.info("clangd's connection ended: %s", exc)
        finally:
            for waiting in [*self._replies.values(), *self._published.values()]:
                if not waiting.done():
                    waiting.set_exception(ConnectionError("clangd ended"))
            self._replies.clear()

    def _receive(self, message: dict) -> None:
        if "id" in message and "method" in message:  # a request of clangd's (progress, configuration): declined
            self._send({"id": message["id"], "result": None})
            return
        if "id" in message:
            reply = self._replies.pop(message["id"], None)
            if reply is not None and not reply.done():
                reply.set_result(message.get("result"))
            return
        if message.get("method") == "textDocument/publishDiagnostics":
            params = message.get("params") or {}
            waiting = self._published.get((_path_of(str(params.get("uri"))), params.get("version")))
            if waiting is not None and not waiting.done():
                waiting.set_result(params.get("diagnostics") or [])


def _path_of(uri: str) -> str:
    """A file URI's path, however the server quoted it."""
    return unquote(urlsplit(uri).path)


def cuda_home_for(nvcc: str) -> str | None:
    """The CUDA toolkit folder clang should read headers from: nvcc's own (through symlinks), else $CUDA_HOME,
    $CUDA_PATH or /usr/local/cuda; the first that has include/cuda_runtime.h (nvcc may be a wrapper script)."""
    for home in (Path(nvcc).resolve().parent.parent, os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"),
                 "/usr/local/cuda"):
        if home and (Path(home) / "include" / "cuda_runtime.h").is_file():
            return str(home)
    return None


def fallback_flags(cuda_home: str | None, include_dirs: tuple[str, ...]) -> list[str]:
    """The flags clangd uses for a `.cu` in a project without a compilation database of its own (quoted includes
    are found beside the file as always)."""
    flags = ["-xcuda", f"--cuda-gpu-arch={_CLANG_ARCH}", "--no-cuda-version-check", "-std=c++17", "-nocudalib"]
    if cuda_home:
        flags.append(f"--cuda-path={cuda_home}")
    flags += [f"-I{d}" for d in include_dirs]
    return flags
