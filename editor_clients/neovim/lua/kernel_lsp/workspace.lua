-- The whole workspace: :KernelLspSummary (the server's kernelLsp/workspaceSummary in a scratch buffer, the files
-- with errors in the quickfix list) and kernelLsp/visibleDocuments (which buffers the windows show, so the server
-- checks those first). init.lua wires both; the formatting here needs no server.
local handlers = require("kernel_lsp.handlers")

local M = {}

M.SUMMARY_REQUEST = "kernelLsp/workspaceSummary"
M.VISIBLE_NOTIFICATION = "kernelLsp/visibleDocuments"
M.DEBOUNCE_MS = 150
M.BUFFER_NAME = "kernel-lsp://workspace-summary"
M.QUICKFIX_TITLE = "kernel-lsp: files with errors"

local STATES = { "errors", "warnings", "checking", "not checked", "compiles" } -- the order files are listed in
local STATE_WIDTH = 11 -- #"not checked"

local present = handlers.present

local function text(value)
  value = present(value)
  if type(value) == "string" and value:match("%S") then
    return vim.trim(value)
  end
  return nil
end

local function number(value)
  value = present(value)
  return type(value) == "number" and value or 0
end

local function plural(count, one, many)
  return string.format("%d %s", count, count == 1 and one or (many or one .. "s"))
end

-- `path` relative to `root` (with a slash after it), else as it is.
function M.relative(path, root)
  if root and root ~= "" then
    local prefix = root:gsub("/+$", "") .. "/"
    if path:sub(1, #prefix) == prefix then
      return path:sub(#prefix + 1)
    end
  end
  return path
end

-- The verification as the server gives it: the code lens line ("correct 5/5 · 1.84× eager · …", "rejected · …",
-- "not verified: …", "verifying…"), or a table with a verdict (or state), speedups and a summary line.
function M.verify_text(verify)
  verify = present(verify)
  if type(verify) == "string" then
    return text(verify)
  end
  if type(verify) ~= "table" then
    return nil
  end
  local verdict = text(verify.verdict) or text(verify.state)
  local summary = text(verify.summary) or text(verify.title)
  if summary then
    return summary
  end
  local speedups = present(verify.speedups) or present(verify.speedup)
  local parts = { verdict }
  if type(speedups) == "table" then
    for _, kind in ipairs({ "eager", "compile" }) do
      local value = present(speedups[kind])
      if type(value) == "number" then
        table.insert(parts, string.format("%.3g× %s", value, kind))
      end
    end
  end
  return #parts > 0 and table.concat(parts, " ") or nil
end

local function rank(state)
  for index, known in ipairs(STATES) do
    if known == state then
      return index
    end
  end
  return #STATES + 1
end

-- The summary's header line: the scan's and the background queue's state.
function M.header(summary, root)
  local facts = {
    string.format("%s of %d scanned%s", plural(number(summary.kernelFiles), "kernel file"), number(summary.scanned),
      present(summary.truncated) and " (truncated)" or ""),
    "watching: " .. (text(summary.watching) or "off"),
    string.format("%d queued", number(summary.queued)),
  }
  if number(summary.dropped) > 0 then
    table.insert(facts, string.format("%d dropped", number(summary.dropped)))
  end
  for _, problem in ipairs({ text(summary.watchProblem), text(summary.cacheProblem) }) do
    table.insert(facts, problem)
  end
  if present(summary.ready) == false then
    table.insert(facts, "still scanning")
  end
  return string.format("kernel-lsp [%s]: %s", root or "?", table.concat(facts, " · "))
end

-- The files in the order shown (errors first, then warnings, checking, not checked, compiles; each group in the
-- server's order, which is by path).
function M.sorted_files(summary)
  local files = {}
  for index, file in ipairs(present(summary.files) or {}) do
    if type(file) == "table" and type(file.path) == "string" then
      table.insert(files, { file = file, index = index, rank = rank(text(file.compile) or "not checked") })
    end
  end
  table.sort(files, function(a, b)
    if a.rank ~= b.rank then
      return a.rank < b.rank
    end
    return a.index < b.index
  end)
  return vim.tbl_map(function(entry) return entry.file end, files)
end

-- One line per file: state, path, [kernels], then counts, verification and the top hint, split by " | ".
-- Returns the lines and, for each, the file it is about (nil for the header and notes).
function M.summary_lines(summary, root)
  if type(summary) ~= "table" then
    return { "kernel-lsp: the server gave no workspace summary" }, {}
  end
  local lines, targets = { M.header(summary, root) }, { false }
  local files = M.sorted_files(summary)
  if #files == 0 then
    if present(summary.ready) == false then
      table.insert(lines, "the workspace is still being scanned; run :KernelLspSummary again in a moment")
    else
      table.insert(lines, "no kernel files in the workspace")
    end
    return lines, targets
  end
  local width = 0
  for _, file in ipairs(files) do
    width = math.max(width, vim.fn.strdisplaywidth(M.relative(file.path, root)))
  end
  for _, file in ipairs(files) do
    local path = M.relative(file.path, root)
    local kernels = present(file.kernels) or {}
    local line = string.format("%-" .. STATE_WIDTH .. "s  %s%s  [%s]", text(file.compile) or "not checked", path,
      string.rep(" ", width - vim.fn.strdisplaywidth(path)), table.concat(kernels, ", "))
    local extra = {}
    local counts = {}
    if number(file.errors) > 0 then
      table.insert(counts, plural(number(file.errors), "error"))
    end
    if number(file.warnings) > 0 then
      table.insert(counts, plural(number(file.warnings), "warning"))
    end
    if #counts > 0 then
      table.insert(extra, table.concat(counts, ", "))
    end
    local verify = M.verify_text(file.verify)
    if verify then
      table.insert(extra, "verify: " .. verify)
    end
    local hint = text(file.topHint)
    if hint then
      table.insert(extra, "hint: " .. hint)
    end
    if present(file.open) then
      table.insert(extra, "open")
    end
    if #extra > 0 then
      line = line .. " | " .. table.concat(extra, " | ")
    end
    table.insert(lines, (line:gsub("\n", " ")))
    table.insert(targets, file)
  end
  return lines, targets
end

-- Quickfix items for the files with errors: their error diagnostics where Neovim has them (closed files' too, as
-- the server publishes them), else one item on the file's first line.
function M.error_items(summary)
  local items = {}
  for _, file in ipairs(M.sorted_files(summary)) do
    if number(file.errors) > 0 or text(file.compile) == "errors" then
      local found = {}
      if type(file.uri) == "string" then
        local bufnr = vim.uri_to_bufnr(file.uri)
        found = vim.diagnostic.toqflist(vim.diagnostic.get(bufnr, { severity = vim.diagnostic.severity.ERROR }))
      end
      if #found == 0 then
        found = { { filename = file.path, lnum = 1, col = 1, type = "E",
                    text = "kernel-lsp: " .. plural(math.max(number(file.errors), 1), "error") } }
      end
      vim.list_extend(items, found)
    end
  end
  return items
end

local function summary_buffer()
  local bufnr = vim.fn.bufnr(M.BUFFER_NAME)
  if bufnr == -1 or not vim.api.nvim_buf_is_valid(bufnr) then
    bufnr = vim.api.nvim_create_buf(false, true)
    vim.api.nvim_buf_set_name(bufnr, M.BUFFER_NAME)
    vim.bo[bufnr].buftype = "nofile"
    vim.bo[bufnr].bufhidden = "hide"
    vim.bo[bufnr].swapfile = false
    vim.bo[bufnr].filetype = "kernellspsummary"
    local function map(lhs, callback)
      vim.api.nvim_buf_set_keymap(bufnr, "n", lhs, "", { noremap = true, silent = true, callback = callback })
    end
    map("<CR>", function() M.open_under_cursor(bufnr) end)
    map("q", function() vim.cmd("close") end)
  end
  return bufnr
end

M.targets = {} -- summary buffer line (1-based) -> file entry, for <CR>

function M.open_under_cursor(bufnr)
  local file = M.targets[vim.api.nvim_win_get_cursor(0)[1]]
  if not file then
    return
  end
  local shown_in = vim.fn.bufwinid(bufnr)
  vim.cmd("wincmd p") -- the window used before the summary, where files open
  if vim.api.nvim_get_current_win() == shown_in then
    vim.cmd("aboveleft new")
  end
  vim.cmd("edit " .. vim.fn.fnameescape(file.path))
end

-- Shows `lines` in the summary buffer, in a window at the bottom (the one already showing it, if any).
function M.show(lines, targets)
  local bufnr = summary_buffer()
  vim.bo[bufnr].modifiable = true
  vim.api.nvim_buf_set_lines(bufnr, 0, -1, false, lines)
  vim.bo[bufnr].modifiable = false
  M.targets = {}
  for index, file in ipairs(targets) do
    M.targets[index] = file or nil
  end
  local win = vim.fn.bufwinid(bufnr)
  if win == -1 then
    vim.cmd(string.format("botright %dsplit", math.min(math.max(#lines, 3), 15)))
    vim.api.nvim_win_set_buf(0, bufnr)
  else
    vim.api.nvim_set_current_win(win)
  end
  return bufnr
end

-- What :KernelLspSummary does with the server's answer: the buffer, the quickfix list, a line in the command line.
function M.present_summary(summary, root)
  local lines, targets = M.summary_lines(summary, root)
  M.show(lines, targets)
  if type(summary) ~= "table" then
    return lines
  end
  local items = M.error_items(summary)
  local with_errors = {}
  for _, item in ipairs(items) do
    with_errors[item.bufnr or item.filename] = true
  end
  local files = vim.tbl_count(with_errors)
  if files > 0 then
    vim.fn.setqflist({}, " ", { title = M.QUICKFIX_TITLE, items = items })
    handlers.echo(string.format("%s with errors in the quickfix list (:copen)", plural(files, "file")), true)
  elseif vim.fn.getqflist({ title = 1 }).title == M.QUICKFIX_TITLE then
    vim.fn.setqflist({}, "r", { title = M.QUICKFIX_TITLE, items = {} }) -- the errors listed before are gone
  end
  return lines
end

-- ---- kernelLsp/visibleDocuments --------------------------------------------------------------------------------

-- The params for one client: the current buffer's URI when the client is attached to it (else null), and the
-- URIs of the attached buffers the current tab's windows show, each once, sorted.
function M.visible_documents(client_id)
  local function attached(bufnr)
    return vim.api.nvim_buf_is_valid(bufnr) and vim.bo[bufnr].buftype == ""
      and vim.lsp.buf_is_attached(bufnr, client_id)
  end
  local current = vim.api.nvim_get_current_buf()
  local seen, visible = {}, {}
  for _, win in ipairs(vim.api.nvim_tabpage_list_wins(0)) do
    local bufnr = vim.api.nvim_win_get_buf(win)
    if attached(bufnr) then
      local uri = vim.uri_from_bufnr(bufnr)
      if not seen[uri] then
        seen[uri] = true
        table.insert(visible, uri)
      end
    end
  end
  table.sort(visible)
  return { active = attached(current) and vim.uri_from_bufnr(current) or vim.NIL, visible = visible }
end

M.last_visible = {} -- client id -> the params last sent to it

local function same(a, b)
  if a == nil or a.active ~= b.active or #a.visible ~= #b.visible then
    return false
  end
  for index, uri in ipairs(b.visible) do
    if a.visible[index] ~= uri then
      return false
    end
  end
  return true
end

local function notify(client, method, params)
  if vim.fn.has("nvim-0.11") == 1 then
    return client:notify(method, params)
  end
  return client.notify(method, params)
end

-- Sends each running client its params, unless they are the ones it was sent last.
function M.send_visible(client_ids)
  for _, id in ipairs(client_ids) do
    local client = vim.lsp.get_client_by_id(id)
    if client and client.initialized == true then -- nothing before the initialize handshake is done
      local params = M.visible_documents(id)
      if not same(M.last_visible[id], params) then
        M.last_visible[id] = params
        notify(client, M.VISIBLE_NOTIFICATION, params)
      end
    end
  end
end

local generation = 0

-- Called on BufEnter / WinEnter / WinClosed: sends after DEBOUNCE_MS without another call (a window closed
-- fires several events, and WinClosed comes while the window is still listed).
function M.schedule_visible(client_ids)
  generation = generation + 1
  local mine = generation
  vim.defer_fn(function()
    if mine == generation then
      M.send_visible(client_ids())
    end
  end, M.DEBOUNCE_MS)
end

return M
