-- What kernel-lsp sends that Neovim's defaults show poorly or not at all: $/progress in the command line,
-- window/showMessage through vim.notify, workspace/applyEdit with change annotations (confirmed first),
-- window/showMessageRequest without a UI, and the custom kernelLsp/workerStatus notification.
local M = {}

local PREFIX = "kernel-lsp: "
local LEVELS = { vim.log.levels.ERROR, vim.log.levels.WARN, vim.log.levels.INFO, vim.log.levels.DEBUG }

M.tasks = {} -- client id -> progress token -> { title, message, percentage }
M.worker_status = {} -- client id -> the last kernelLsp/workerStatus params
local said = {} -- the last few texts shown (messages, ends of progress), so a command's answer does not repeat them

local function headless()
  return #vim.api.nvim_list_uis() == 0
end

local function prefixed(text)
  text = tostring(text or "")
  if text:sub(1, #PREFIX) == PREFIX then
    return text
  end
  return PREFIX .. text
end

local function remember(text)
  table.insert(said, 1, tostring(text or ""))
  said[6] = nil
end

-- Whether `text` was part of something shown lately.
function M.already_said(text)
  for _, earlier in ipairs(said) do
    if earlier:find(text, 1, true) then
      return true
    end
  end
  return false
end

function M.notify(text, level)
  vim.notify(prefixed(text), level or vim.log.levels.INFO)
end

-- One line in the command line; shortened to fit, so progress never asks for "Press ENTER".
function M.echo(text, keep)
  local line = prefixed(text):gsub("\n", " ")
  local width = math.max(vim.v.echospace or 0, 20)
  if not keep and vim.fn.strdisplaywidth(line) > width then
    line = vim.fn.strcharpart(line, 0, width - 1) .. "…"
  end
  vim.api.nvim_echo({ { line } }, keep or false, {})
end

local function present(value) -- JSON null arrives as vim.NIL
  if value == vim.NIL then
    return nil
  end
  return value
end
M.present = present

function M.describe_task(task)
  local parts = { task.title or "working" }
  if task.message and task.message ~= "" then
    table.insert(parts, task.message)
  end
  local text = table.concat(parts, ": ")
  if task.percentage then
    text = string.format("%s (%d%%)", text, task.percentage)
  end
  return text
end

function M.progress(err, result, ctx, config)
  -- Neovim's own handler first: it keeps client.messages / vim.lsp.status() and LspProgressUpdate working
  local default = vim.lsp.handlers["$/progress"]
  if default and default ~= M.progress then
    pcall(default, err, result, ctx, config)
  end
  local value = result and result.value
  if type(value) ~= "table" or not value.kind then
    return vim.NIL
  end
  local tasks = M.tasks[ctx.client_id] or {}
  M.tasks[ctx.client_id] = tasks
  local token = result.token
  if value.kind == "begin" then
    tasks[token] = { title = present(value.title), message = present(value.message),
                     percentage = present(value.percentage) }
    M.echo(M.describe_task(tasks[token]))
  elseif value.kind == "report" then
    local task = tasks[token] or {}
    tasks[token] = task
    task.message = present(value.message) or task.message
    task.percentage = present(value.percentage) or task.percentage
    M.echo(M.describe_task(task))
  elseif value.kind == "end" then
    local task = tasks[token] or {}
    tasks[token] = nil
    remember(present(value.message))
    M.echo(M.describe_task({ title = (task.title or "task") .. " done", message = present(value.message) }), true)
  end
  return vim.NIL
end

function M.show_message(_, result, _, _)
  remember(result.message)
  M.notify(result.message, LEVELS[result.type] or vim.log.levels.INFO)
  return vim.NIL
end

-- The server asks this when the client cannot preview edits; without a UI nobody can answer.
function M.show_message_request(_, result, _, _)
  local actions = result.actions or {}
  if #actions == 0 then
    return M.show_message(nil, result)
  end
  if headless() then
    M.notify(result.message .. " (not answered: Neovim runs without a UI)", vim.log.levels.WARN)
    return vim.NIL
  end
  local choices = {}
  for _, action in ipairs(actions) do
    table.insert(choices, "&" .. action.title:gsub("&", "&&"))
  end
  local choice = vim.fn.confirm(prefixed(result.message), table.concat(choices, "\n"), 0)
  return actions[choice] or vim.NIL
end

-- The labels of the change annotations that ask for confirmation (the optimizer's whole-file rewrite does).
local function confirmations(edit)
  local labels = {}
  for _, annotation in pairs(edit.changeAnnotations or {}) do
    if annotation.needsConfirmation then
      table.insert(labels, annotation.description or annotation.label)
    end
  end
  return labels
end

-- Why the edit cannot be applied as meant, or nil: a document that changed since it was computed (0.7 would only
-- print), or a file it creates that exists already (0.7 would empty it, whatever `overwrite` says).
local function refusal(edit)
  for _, change in ipairs(edit.documentChanges or {}) do
    local document = change.textDocument
    if document and type(document.version) == "number" then
      local versions = vim.lsp.util.buf_versions
      local current = versions and versions[vim.uri_to_bufnr(document.uri)]
      if current and current > document.version then
        return vim.uri_to_fname(document.uri) .. " changed after the edit was computed"
      end
    elseif change.kind == "create" then
      local options = change.options or {}
      local path = vim.uri_to_fname(change.uri)
      if vim.loop.fs_stat(path) and not options.overwrite and not options.ignoreIfExists then
        return path .. " exists already"
      end
    end
  end
  return nil
end

function M.apply_edit(_, params, ctx, _)
  local edit = params and params.edit
  if not edit then
    return { applied = false, failureReason = "no edit" }
  end
  local labels = confirmations(edit)
  if #labels > 0 then
    local what = params.label or table.concat(labels, "; ")
    if headless() then
      M.notify("not applied, since Neovim runs without a UI to confirm it: " .. what, vim.log.levels.WARN)
      return { applied = false, failureReason = "Neovim runs without a UI, so the edit could not be confirmed" }
    end
    if vim.fn.confirm(prefixed(what) .. "\nApply this edit?", "&Apply\n&Keep mine", 2) ~= 1 then
      return { applied = false, failureReason = "you kept your version" }
    end
  end
  local refused = refusal(edit)
  if refused then
    return { applied = false, failureReason = refused }
  end
  local client = ctx and vim.lsp.get_client_by_id(ctx.client_id)
  local ok, problem = pcall(vim.lsp.util.apply_workspace_edit, edit, client and client.offset_encoding or "utf-16")
  if not ok then
    return { applied = false, failureReason = tostring(problem) }
  end
  return { applied = true }
end

-- Code lenses (ptxas figures, verdicts) on a virtual line of their own above the line they belong to: at the end of
-- the line (vim.lsp.codelens's place) a diagnostic's virtual text came first and pushed them off a 160-column screen.
-- Fetched on attach, on save and when the server asks (workspace/codeLens/refresh); vim.lsp.codelens keeps them too,
-- so vim.lsp.codelens.get() and .run() work as ever.
function M.show_lenses(err, result, ctx, _)
  local bufnr = ctx and ctx.bufnr
  if err or not (bufnr and vim.api.nvim_buf_is_valid(bufnr) and vim.api.nvim_buf_is_loaded(bufnr)) then
    return
  end
  local lenses = type(result) == "table" and result or {}
  vim.lsp.codelens.save(lenses, bufnr, ctx.client_id)
  local namespace = vim.api.nvim_create_namespace("kernel_lsp_lenses:" .. ctx.client_id) -- one per server
  vim.api.nvim_buf_clear_namespace(bufnr, namespace, 0, -1)
  local titles = {} -- line -> the titles of its lenses
  for _, lens in ipairs(lenses) do
    local title = lens.command and present(lens.command.title)
    if title and title ~= "" then
      local line = lens.range.start.line
      titles[line] = titles[line] or {}
      table.insert(titles[line], title)
    end
  end
  local count = vim.api.nvim_buf_line_count(bufnr)
  for line, texts in pairs(titles) do
    if line < count then
      local code = vim.api.nvim_buf_get_lines(bufnr, line, line + 1, false)[1] or ""
      local indent = string.rep(" ", vim.fn.strdisplaywidth(code:match("^%s*"))) -- under the code's first column
      vim.api.nvim_buf_set_extmark(bufnr, namespace, line, 0, {
        virt_lines = { { { indent .. table.concat(texts, " | "), "LspCodeLens" } } },
        virt_lines_above = line > 0, -- above the first line would be out of sight until scrolled
      })
    end
  end
end

function M.refresh_lenses(bufnr)
  if not (vim.api.nvim_buf_is_valid(bufnr) and vim.api.nvim_buf_is_loaded(bufnr)) then
    return
  end
  local params = { textDocument = { uri = vim.uri_from_bufnr(bufnr) } }
  vim.lsp.buf_request(bufnr, "textDocument/codeLens", params, M.show_lenses)
end

function M.codelens_refresh(_, _, ctx, _)
  vim.schedule(function()
    for _, bufnr in ipairs(vim.api.nvim_list_bufs()) do
      if vim.lsp.buf_is_attached(bufnr, ctx.client_id) then
        M.refresh_lenses(bufnr)
      end
    end
  end)
  return vim.NIL
end

-- Kept for :KernelLspStatus and statuslines; the server itself tells the user when the worker fails.
function M.worker_status_changed(_, result, ctx, _)
  M.worker_status[ctx.client_id] = result
  return vim.NIL
end

function M.for_client()
  return {
    ["$/progress"] = M.progress,
    ["window/showMessage"] = M.show_message,
    ["window/showMessageRequest"] = M.show_message_request,
    ["workspace/applyEdit"] = M.apply_edit,
    ["kernelLsp/workerStatus"] = M.worker_status_changed,
    ["workspace/codeLens/refresh"] = M.codelens_refresh,
  }
end

return M
