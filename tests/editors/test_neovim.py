"""Headless Neovim with editor_clients/neovim talking to the real `kernel-lsp serve`: diagnostics where nvcc puts
them, the profile and status commands, the workspace summary (an open broken file and a closed good one) with its
quickfix list and the kernelLsp/visibleDocuments it sends, the edit handler, code_action()'s menu on a kernel that
cannot be optimized here, and a server stdout that holds nothing but LSP frames."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PLUGIN = Path(__file__).resolve().parents[2] / "editor_clients" / "neovim"
BAD = "// two lines before the kernel,\n// so line numbers must follow\n__global__ void f(int* p){ p[0] = y; }\n"
GOOD = "__global__ void scale(float* p){ p[threadIdx.x] *= 2.0f; }\n"
NVIM_TIMEOUT_S = 50

needs_nvcc = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH (install the CUDA toolkit)")
pytestmark = pytest.mark.timeout(60, func_only=True)  # func_only: installing Neovim (a session fixture) is not timed

# Installed before setup: what the plugin shows (command line and vim.notify) is recorded for the test.
RECORDER = """
_G.shown = {}
local echo = vim.api.nvim_echo
vim.api.nvim_echo = function(chunks, history, opts)
  local text = {}
  for _, chunk in ipairs(chunks) do table.insert(text, chunk[1]) end
  table.insert(_G.shown, { kind = "echo", text = table.concat(text), history = history })
  return echo(chunks, history, opts)
end
vim.notify = function(message, level)
  table.insert(_G.shown, { kind = "notify", text = message, level = level })
end
"""

# Runs BODY, then writes `out` (and what was shown, and any error) as JSON and quits, whatever happened.
SCRIPT = """
local out = {{}}
local ok, problem = pcall(function()
{body}
end)
out.error = (not ok) and tostring(problem) or nil
out.shown = _G.shown
vim.fn.writefile({{ vim.fn.json_encode(out) }}, {out_path})
vim.cmd("qa!")
"""


def lua(value: str | Path) -> str:
    return json.dumps(str(value))  # a JSON string is a Lua string literal for these paths


def run_nvim(nvim: str, workspace: Path, document: Path | None, setup: str, body: str) -> dict:
    """nvim --headless with the plugin set up by `setup` (Lua), `document` opened, `body` (Lua) run; its `out`."""
    init, script, out, log = (workspace / name for name in ("init.lua", "script.lua", "out.json", "nvim.log"))
    init.write_text(f"vim.opt.runtimepath:prepend({lua(PLUGIN)})\n{RECORDER}\n{setup}\n")
    script.write_text(SCRIPT.format(body=body, out_path=lua(out)))
    xdg = workspace / ".xdg"  # Neovim's and kernel-lsp's own folders, away from the user's
    env = {**os.environ, **{f"XDG_{kind}_HOME": str(xdg / kind.lower())
                            for kind in ("CONFIG", "DATA", "CACHE", "STATE")}}
    # the script quits by itself; one that does not even load is written down here, so nvim never waits for input
    run = (f"lua local ok, problem = pcall(dofile, {lua(script)}) if not ok then "
           f"vim.fn.writefile({{ vim.fn.json_encode({{ error = tostring(problem) }}) }}, {lua(out)}) end "
           "vim.cmd('qa!')")
    argv = [nvim, "--headless", "-n", "-i", "NONE", "-u", str(init), "-c", run]
    with log.open("w") as output:  # a file, not a pipe: a lingering child cannot hold the test up
        done = subprocess.run(argv + ([str(document)] if document else []), cwd=workspace, env=env,
                              stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, timeout=NVIM_TIMEOUT_S)
    assert out.exists(), f"nvim wrote no result (exit {done.returncode}); its output:\n{log.read_text()}"
    result = json.loads(out.read_text())
    assert result.get("error") is None, f"{result['error']}\nnvim's output:\n{log.read_text()}"
    return result


def nvcc_errors(path: Path) -> list[tuple[int, str]]:
    """(1-based line, message) of each error nvcc itself reports for the file."""
    done = subprocess.run(["nvcc", "-c", str(path), "-o", str(path.with_suffix(".o"))], capture_output=True, text=True)
    return [(int(m[1]), m[2]) for m in re.finditer(r"^.*\((\d+)\): error: (.*)$", done.stderr, re.MULTILINE)]


def lsp_frames(stream: bytes) -> list[dict]:
    """The JSON-RPC messages of a server's stdout; fails on any byte that is not part of an LSP frame."""
    messages, at = [], 0
    while at < len(stream):
        end = stream.find(b"\r\n\r\n", at)
        assert end >= 0, f"stdout holds bytes outside an LSP frame at {at}: {stream[at:at + 200]!r}"
        headers = dict(line.split(": ", 1) for line in stream[at:end].decode("ascii").split("\r\n"))
        assert set(headers) <= {"Content-Length", "Content-Type"}, f"not an LSP header at {at}: {headers}"
        length = int(headers["Content-Length"])
        body = stream[end + 4:end + 4 + length]
        assert len(body) == length, f"a frame at {at} is cut short"
        messages.append(json.loads(body))
        at = end + 4 + length
    return messages


@pytest.mark.nvcc
@needs_nvcc
def test_diagnostics_of_a_broken_cu_file_match_nvcc(nvim: str, tmp_path: Path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'neovim-test'\n")
    document = tmp_path / "kernels" / "bad.cu"
    document.parent.mkdir()
    document.write_text(BAD)
    fixed = GOOD.replace("scale", "f")
    setup = f'require("kernel_lsp").setup({{ python = {lua(sys.executable)} }})'  # the venv's interpreter
    result = run_nvim(nvim, tmp_path, document, setup, f"""
  local function errors()
    return vim.diagnostic.get(0, {{ severity = vim.diagnostic.severity.ERROR }})
  end
  out.waited = vim.wait(30000, function() return #errors() > 0 end, 50)
  out.filetype = vim.bo.filetype
  local client = require("kernel_lsp").client(0)
  out.root = client and client.config.root_dir
  out.diagnostics = {{}}
  for _, d in ipairs(errors()) do
    table.insert(out.diagnostics, {{ lnum = d.lnum, col = d.col, end_col = d.end_col, message = d.message,
                                    severity = d.severity, source = d.source, code = d.code }})
  end
  -- the fix, typed and saved: the errors go away (didChange / didSave from Neovim)
  vim.api.nvim_buf_set_lines(0, 2, 3, false, {{ {lua(fixed.strip())} }})
  vim.cmd("silent write")
  out.cleared = vim.wait(30000, function() return #errors() == 0 end, 50)
""")
    assert result["waited"], f"no diagnostics within 30 s: {result}"
    assert result["filetype"] == "cuda"
    assert result["root"] == str(tmp_path)  # the nearest pyproject.toml, not the file's folder
    (tmp_path / "expected.cu").write_text(BAD)
    expected = nvcc_errors(tmp_path / "expected.cu")
    assert expected == [(3, 'identifier "y" is undefined')], expected
    found = [(d["lnum"] + 1, d["message"]) for d in result["diagnostics"]]
    assert found == expected
    [error] = result["diagnostics"]
    assert "undefined" in error["message"]
    column = BAD.splitlines()[2].index("= y") + 2
    assert (error["col"], error["end_col"]) == (column, column + 1)
    assert error["severity"] == 1 and error["code"] == "nvcc-error" and error["source"] == "kernel-lsp"
    assert result["cleared"], "the errors stayed after the fix was saved"


@pytest.mark.nvcc
@needs_nvcc
def test_profile_status_and_restart_commands_and_a_clean_server_stdout(nvim: str, tmp_path: Path):
    document = tmp_path / "good.cu"
    document.write_text(GOOD)
    stdout_copy, server_log = tmp_path / "server.stdout", tmp_path / "server.stderr"
    # the server's stdout goes through tee, so the test sees every byte Neovim read; logs at INFO go to stderr
    command = ["sh", "-c", '"$0" -m kernel_lsp --log-level INFO serve 2>>"$1" | tee -a "$2"',
               sys.executable, str(server_log), str(stdout_copy)]
    result = run_nvim(nvim, tmp_path, document,
                      f'require("kernel_lsp").setup({{ cmd = vim.fn.json_decode({lua(json.dumps(command))}) }})', """
  local kernel_lsp = require("kernel_lsp")
  assert(vim.wait(10000, function() return kernel_lsp.client(0) ~= nil end, 50), "the client did not attach")
  vim.cmd("KernelLspProfile")
  out.answered = vim.wait(40000, function() return kernel_lsp.last_result ~= nil end, 50)
  out.result = kernel_lsp.last_result
  vim.cmd("KernelLspStatus")  -- the .cu's static profile ran in the server: no worker yet
  -- the worker status command pings the worker, starting it; its kernelLsp/workerStatus notifications follow
  vim.lsp.buf_request_sync(0, "workspace/executeCommand", { command = "kernel-lsp.workerStatus", arguments = {} },
    30000)
  vim.wait(5000, function()
    local worker = require("kernel_lsp.handlers").worker_status[kernel_lsp.client(0).id]
    return worker ~= nil and worker.state == "connected"
  end, 50)
  vim.cmd("KernelLspStatus")
  local before = kernel_lsp.client(0).id
  vim.cmd("KernelLspRestart")
  out.restarted = vim.wait(10000, function()
    local client = kernel_lsp.client(0)
    return client ~= nil and client.id ~= before and client.initialized == true
  end, 50)
  -- the new server shows the profile kept on disk (after its shutdown) for the same text, without profiling again
  local hover = { textDocument = { uri = vim.uri_from_bufnr(0) }, position = { line = 0, character = 17 } }
  vim.wait(15000, function()
    for _, reply in pairs(vim.lsp.buf_request_sync(0, "textDocument/hover", hover, 2000) or {}) do
      local value = reply.result and reply.result.contents and reply.result.contents.value
      if value and value:find("profiled ") then
        out.hover_after_restart = value
        return true
      end
    end
    return false
  end, 200)
""")
    assert result["answered"], f"no answer to kernel-lsp.profile within 40 s: {result['shown']}"
    outcome = result["result"]
    assert (outcome["status"], outcome["source"], outcome["kernels"]) == ("not-profiled", "static", ["scale"]), outcome

    shown = [(entry["kind"], entry["text"]) for entry in result["shown"]]
    echoed = [text for kind, text in shown if kind == "echo"]
    assert "kernel-lsp: Profiling good.cu: good.cu" in echoed  # $/progress begin: title and message
    assert any(text.startswith("kernel-lsp: Profiling good.cu done: 1 kernel (static): scale") for text in echoed)
    assert any(kind == "notify" and "profiled statically, by the server" in text for kind, text in shown)
    assert any(text.startswith("kernel-lsp [") and "worker not started yet" in text for text in echoed), echoed
    assert any(text.startswith("kernel-lsp [") and "worker connected (local)" in text for text in echoed), echoed
    assert result["restarted"], "no new server attached after :KernelLspRestart"
    card = result.get("hover_after_restart") or ""
    assert "**scale**" in card and "no GPU run · profiled just now" in card, result  # kept across the restart

    messages = lsp_frames(stdout_copy.read_bytes())
    assert all(message.get("jsonrpc") == "2.0" for message in messages)
    answers = [message["result"] for message in messages if isinstance(message.get("result"), dict)]
    assert sum("capabilities" in answer for answer in answers) == 2  # both servers answered initialize
    methods = {message.get("method") for message in messages}
    assert {"textDocument/publishDiagnostics", "$/progress", "window/showMessage", "kernelLsp/workerStatus"} <= methods
    assert " INFO: " in server_log.read_text()  # the logs went to stderr


@pytest.mark.nvcc
@needs_nvcc
def test_workspace_summary_lists_open_and_closed_files_and_fills_the_quickfix_list(nvim: str, tmp_path: Path):
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'neovim-summary-test'\n")
    document = tmp_path / "kernels" / "bad.cu"
    document.parent.mkdir()
    document.write_text(BAD)
    (tmp_path / "good.cu").write_text(GOOD)  # never opened: the server's workspace check compiles it
    setup = f'require("kernel_lsp").setup({{ python = {lua(sys.executable)} }})'
    result = run_nvim(nvim, tmp_path, document, setup, """
  local kernel_lsp, workspace = require("kernel_lsp"), require("kernel_lsp.workspace")
  local bad = vim.api.nvim_get_current_buf()
  assert(vim.wait(10000, function() return kernel_lsp.client(bad) ~= nil end, 50), "the client did not attach")
  local id = kernel_lsp.client(bad).id
  out.diagnostics = vim.wait(30000, function()
    return #vim.diagnostic.get(bad, { severity = vim.diagnostic.severity.ERROR }) > 0
  end, 50)
  out.uri = vim.uri_from_bufnr(bad)
  out.visible_at_start = workspace.last_visible[id]
  -- the summary until the closed file has been checked as well (the scan and its check run in the background)
  local deadline, lines = vim.loop.now() + 35000, {}
  repeat
    local answered
    kernel_lsp.summary(function(shown) answered = shown end)
    vim.wait(5000, function() return answered ~= nil end, 20)
    lines = answered or {}
    local text = table.concat(lines, "\\n")
    out.settled = text:find("\\ncompiles +good%.cu") ~= nil and text:find("\\nerrors +kernels/bad%.cu") ~= nil
    if not out.settled then vim.wait(500) end
  until out.settled or vim.loop.now() > deadline
  out.lines = lines
  out.summary = kernel_lsp.last_summary
  local summary_buffer = vim.fn.bufnr(workspace.BUFFER_NAME)
  out.buffer = vim.api.nvim_buf_get_lines(summary_buffer, 0, -1, false)
  out.summary_shown = vim.api.nvim_get_current_buf() == summary_buffer
  local qf = vim.fn.getqflist({ title = 1, items = 1 })
  out.qf_title = qf.title
  out.qf = {}
  for _, item in ipairs(qf.items) do
    table.insert(out.qf, { file = vim.api.nvim_buf_get_name(item.bufnr), lnum = item.lnum, text = item.text })
  end
  -- <CR> on good.cu's line opens it in the window used before; the server hears that it is the active document
  for index, line in ipairs(out.buffer) do
    if line:find("good%.cu") then vim.api.nvim_win_set_cursor(0, { index, 0 }) end
  end
  workspace.open_under_cursor(summary_buffer)
  out.opened = vim.api.nvim_buf_get_name(0)
  local good_uri = vim.uri_from_bufnr(0)
  out.visible_after = vim.wait(10000, function()
    local sent = workspace.last_visible[id]
    return sent ~= nil and sent.active == good_uri
  end, 50) and workspace.last_visible[id]
  -- bad.cu fixed and saved: the next summary empties the quickfix list it filled
  vim.api.nvim_set_current_buf(bad)
  vim.api.nvim_buf_set_lines(bad, 2, 3, false, { "__global__ void f(int* p){ p[0] = 1; }" })
  vim.cmd("silent write")
  local fixed = vim.wait(30000, function()
    local answered
    kernel_lsp.summary(function(shown) answered = shown end)
    vim.wait(5000, function() return answered ~= nil end, 20)
    return answered ~= nil and table.concat(answered, "\\n"):find("\\ncompiles +kernels/bad%.cu") ~= nil
  end, 500)
  out.fixed_qf = fixed and vim.fn.getqflist({ title = 1, size = 1 })
""")
    uri = result["uri"]
    assert result["diagnostics"], f"no diagnostics within 30 s: {result['shown']}"
    assert result["settled"], f"the summary never showed bad.cu with errors and good.cu compiling: {result['lines']}"
    # one line per file: errors first, then the files that compile; each with its kernels and counts
    header, first, second = result["lines"]
    assert header.startswith(f"kernel-lsp [{tmp_path}]: 2 kernel files of "), header
    assert " · watching: " in header and " queued" in header, header
    assert re.fullmatch(r"errors +kernels/bad\.cu +\[f\] \| 1 error \| open", first), first
    assert re.fullmatch(r"compiles +good\.cu +\[scale\]", second), second
    assert result["buffer"] == result["lines"] and result["summary_shown"]
    files = {Path(f["path"]).name: f for f in result["summary"]["files"]}
    assert (files["bad.cu"]["compile"], files["bad.cu"]["open"], files["bad.cu"]["errors"]) == ("errors", True, 1)
    assert (files["good.cu"]["compile"], files["good.cu"]["open"]) == ("compiles", False)
    # the quickfix list: the broken file's error where nvcc puts it
    assert result["qf_title"] == "kernel-lsp: files with errors"
    assert [(Path(q["file"]).name, q["lnum"]) for q in result["qf"]] == [("bad.cu", 3)], result["qf"]
    assert "undefined" in result["qf"][0]["text"]
    assert any("1 file with errors in the quickfix list" in e["text"] for e in result["shown"]), result["shown"]
    # kernelLsp/visibleDocuments: the opened file once the server was up, then the file opened from the summary
    assert result["visible_at_start"] == {"active": uri, "visible": [uri]}, result["visible_at_start"]
    assert result["opened"] == str(tmp_path / "good.cu")
    after = result["visible_after"]
    assert after and after["active"] == (tmp_path / "good.cu").as_uri(), after
    assert (tmp_path / "good.cu").as_uri() in after["visible"], after
    assert result["fixed_qf"] == {"title": "kernel-lsp: files with errors", "size": 0}, result["fixed_qf"]


def test_edit_handler_declines_annotated_edits_without_a_ui_and_applies_plain_ones(nvim: str, tmp_path: Path):
    document = tmp_path / "model_new.py"
    document.write_text("old = 1\n")
    result = run_nvim(nvim, tmp_path, document, "", """  -- the handlers alone: no server needed
  local handlers = require("kernel_lsp.handlers")
  local uri, bufnr = vim.uri_from_bufnr(0), vim.api.nvim_get_current_buf()
  local function edit(annotated, version)
    local change = { range = { start = { line = 0, character = 0 }, ["end"] = { line = 0, character = 7 } },
                     newText = "new = 2", annotationId = annotated and "kernel-lsp.optimize" or nil }
    return { documentChanges = { { textDocument = { uri = uri, version = version }, edits = { change } } },
             changeAnnotations = annotated and { ["kernel-lsp.optimize"] = {
               label = "Optimize this kernel", needsConfirmation = true,
               description = "Optimized: 1.5x eager" } } or nil }
  end
  out.annotated = handlers.apply_edit(nil, { edit = edit(true, vim.NIL), label = "Optimized: 1.5x eager" }, {})
  out.after_annotated = vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)
  vim.lsp.util.buf_versions[bufnr] = 5
  out.stale = handlers.apply_edit(nil, { edit = edit(false, 3) }, {})
  out.plain = handlers.apply_edit(nil, { edit = edit(false, 5) }, {})
  out.after_plain = vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)
  local function create(path)  -- as the optimizer offers a problem file's first candidate
    local new_uri, top = vim.uri_from_fname(path), { line = 0, character = 0 }
    return { documentChanges = {
      { kind = "create", uri = new_uri, options = { overwrite = false, ignoreIfExists = false } },
      { textDocument = { uri = new_uri, version = vim.NIL },
        edits = { { range = { start = top, ["end"] = top },
                    newText = "# kernel-lsp: reference=m.py\\nx = 1\\n" } } } } }
  end
  out.created = handlers.apply_edit(nil, { edit = create(vim.fn.getcwd() .. "/m_new.py") }, {})
  out.created_lines = vim.api.nvim_buf_get_lines(vim.fn.bufnr(vim.fn.getcwd() .. "/m_new.py"), 0, 2, false)
  out.existing = handlers.apply_edit(nil, { edit = create(vim.fn.getcwd() .. "/model_new.py") }, {})
  out.request = handlers.show_message_request(nil, { type = 3, message = "Apply it?",
                                                     actions = { { title = "Apply" }, { title = "Keep mine" } } }, {})
""")
    assert result["annotated"]["applied"] is False
    assert "without a UI" in result["annotated"]["failureReason"]
    assert result["after_annotated"] == ["old = 1"]
    assert result["stale"]["applied"] is False and "changed" in result["stale"]["failureReason"]
    assert result["plain"] == {"applied": True}
    assert result["after_plain"] == ["new = 2"]
    assert result["created"] == {"applied": True}
    assert result["created_lines"] == ["# kernel-lsp: reference=m.py", "x = 1"]
    assert result["existing"]["applied"] is False and "exists already" in result["existing"]["failureReason"]
    assert document.read_text() == "old = 1\n"  # neither applied edit saved it, and the create left it alone
    assert result["request"] is None  # vim.NIL: no answer to the server's question
    assert any("not applied" in entry["text"] for entry in result["shown"] if entry["kind"] == "notify")


@pytest.mark.nvcc
@needs_nvcc
def test_code_lenses_show_the_kernels_figures_after_attach_and_after_a_save(nvim: str, tmp_path: Path):
    """resourceUsage's default is the lens alone: Neovim fetches lenses on attach, on save and on the server's
    workspace/codeLens/refresh, so the figures show on a virtual line above each kernel (at the end of its line, a
    diagnostic's virtual text would push them off the screen), and no diagnostic is left for a healthy kernel."""
    document = tmp_path / "good.cu"
    document.write_text(GOOD)
    setup = f'require("kernel_lsp").setup({{ python = {lua(sys.executable)} }})'
    two = GOOD + "__global__ void twice(float* p){ p[threadIdx.x] *= 3.0f; }\n"
    result = run_nvim(nvim, tmp_path, document, setup, f"""
  local function titles()
    local found = {{}}
    for _, lens in ipairs(vim.lsp.codelens.get(0)) do
      if lens.command and lens.command.title then table.insert(found, lens.command.title) end
    end
    return found
  end
  out.first = vim.wait(30000, function() return #titles() == 1 end, 50)
  out.titles = titles()
  out.diagnostics = #vim.diagnostic.get(0)
  vim.api.nvim_buf_set_lines(0, 0, -1, false, vim.split({lua(two.rstrip())}, "\\n"))
  vim.cmd("silent write")
  out.second = vim.wait(30000, function() return #titles() == 2 end, 50)
  out.after_save = titles()
  out.virtual, out.at_line_end = {{}}, 0  -- the lines a virtual line above shows a lens on; lenses at a line's end
  for _, ns in pairs(vim.api.nvim_get_namespaces()) do
    for _, mark in ipairs(vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, {{ details = true }})) do
      for _, virtual_line in ipairs(mark[4].virt_lines or {{}}) do
        for _, chunk in ipairs(virtual_line) do
          if chunk[1]:find("ptxas sm_90", 1, true) then
            table.insert(out.virtual, {{ line = mark[2], above = mark[4].virt_lines_above or false }})
          end
        end
      end
      for _, chunk in ipairs(mark[4].virt_text or {{}}) do
        if chunk[1]:find("ptxas sm_90", 1, true) then out.at_line_end = out.at_line_end + 1 end
      end
    end
  end
""")
    assert result["first"], f"no code lens within 30 s: {result}"
    assert result["titles"][0].startswith("ptxas sm_90: ") and "registers" in result["titles"][0], result
    assert result["diagnostics"] == 0
    assert result["second"] and len(result["after_save"]) == 2, result
    # shown on a line of its own: below the first line (above it is out of sight), above the second kernel
    assert result["virtual"] == [{"line": 0, "above": False}, {"line": 1, "above": True}], result
    assert result["at_line_end"] == 0


def test_optimize_without_an_api_key_gives_the_neovim_remedy(nvim: str, tmp_path: Path, monkeypatch):
    """No key in Neovim's environment: :KernelLspOptimize says what a Neovim user does about it (the environment
    Neovim starts from), not VS Code's command or a setting Neovim users do not have."""
    from tests.agent.test_tools import REFERENCE, TRITON

    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    (tmp_path / "ref.py").write_text(REFERENCE)
    document = tmp_path / "relu.py"
    document.write_text("# kernel-lsp: reference=ref.py\n" + TRITON)
    command = lua(json.dumps([sys.executable, "-m", "kernel_lsp", "serve"]))
    setup = f'require("kernel_lsp").setup({{ cmd = vim.fn.json_decode({command}), settings = {{ verifyDevice = "cpu" }} }})'
    result = run_nvim(nvim, tmp_path, document, setup, """
  local kernel_lsp = require("kernel_lsp")
  assert(vim.wait(10000, function() return kernel_lsp.client(0) ~= nil end, 50), "the client did not attach")
  vim.cmd("KernelLspOptimize")
  out.answered = vim.wait(20000, function() return kernel_lsp.last_result ~= nil end, 50)
  out.result = kernel_lsp.last_result
""")
    assert result["answered"], result["shown"]
    assert result["result"]["status"] == "error", result["result"]
    said = [entry["text"] for entry in result["shown"] if entry["kind"] == "notify"]
    remedy = [text for text in said if "no Anthropic API key" in text]
    assert remedy and "start Neovim with ANTHROPIC_API_KEY set in its environment" in remedy[0], said
    assert not any("Set Anthropic API Key" in text or "anthropicApiKey" in text for text in said), said


def test_code_action_lists_optimize_with_its_reason_on_a_kernel(nvim: str, tmp_path: Path, monkeypatch):
    """Neovim 0.7 shows no disabled code actions: vim.lsp.buf.code_action() on a Triton kernel without a key (and
    without a GPU) still lists Optimize, its title saying why it cannot run, and choosing it says the remedy."""
    from tests.agent.test_tools import REFERENCE, TRITON

    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    (tmp_path / "ref.py").write_text(REFERENCE)
    document = tmp_path / "relu.py"
    text = "# kernel-lsp: reference=ref.py\n" + TRITON
    document.write_text(text)
    kernel_line = text.splitlines().index("def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):") + 1
    command = lua(json.dumps([sys.executable, "-m", "kernel_lsp", "serve"]))
    setup = f'require("kernel_lsp").setup({{ cmd = vim.fn.json_decode({command}), settings = {{ verifyDevice = "cpu" }} }})'
    result = run_nvim(nvim, tmp_path, document, setup, f"""
  local kernel_lsp = require("kernel_lsp")
  assert(vim.wait(10000, function()  -- attached, and the initialize answer in: the server's code actions known
    local client = kernel_lsp.client(0)
    return client ~= nil and client.resolved_capabilities ~= nil and client.resolved_capabilities.code_action
  end, 50), "the client did not attach")
  vim.api.nvim_win_set_cursor(0, {{ {kernel_line}, 4 }})
  out.titles = nil
  vim.ui.select = function(items, opts, on_choice)  -- the menu code_action() shows: its titles, Optimize chosen
    out.titles = {{}}
    local optimize = nil
    for _, item in ipairs(items) do
      local title = opts.format_item(item)
      table.insert(out.titles, title)
      if title:find("Optimize this kernel", 1, true) then optimize = item end
    end
    on_choice(optimize)
  end
  vim.lsp.buf.code_action()
  out.listed = vim.wait(20000, function() return out.titles ~= nil end, 50)
  out.said = vim.wait(20000, function()
    for _, entry in ipairs(_G.shown) do
      if entry.text:find("no Anthropic API key", 1, true) then return true end
    end
    return false
  end, 50)
""")
    assert result["listed"], result["shown"]
    titles = result["titles"]
    assert "Optimize this kernel (relu_kernel) — unavailable: no Anthropic API key" in titles, titles
    assert any(t.startswith("Profile this kernel (relu_kernel) — unavailable: needs a GPU") for t in titles), titles
    assert result["said"], result["shown"]
    said = [entry["text"] for entry in result["shown"] if "no Anthropic API key" in entry["text"]]
    assert len(said) == 1 and "start Neovim with ANTHROPIC_API_KEY set in its environment" in said[0], said
