-- kernel-lsp for Neovim's built-in LSP client: starts `kernel-lsp serve` for CUDA and Python buffers
-- (vim.lsp.start_client + buf_attach_client on 0.7, vim.lsp.start on 0.8 and later) and adds the
-- :KernelLsp* commands. Usage: require("kernel_lsp").setup({ ... }) (see the README for the options).
local handlers = require("kernel_lsp.handlers")
local workspace = require("kernel_lsp.workspace")

local M = {}

local NAME = "kernel-lsp"
local DEFAULTS = {
  cmd = nil, -- the server's argv; default: { python, "-m", "kernel_lsp", "serve" } or { "kernel-lsp", "serve" }
  python = nil, -- an interpreter with kernel_lsp installed (used when cmd is not given)
  filetypes = { "cuda", "python" },
  root_markers = { "pyproject.toml", ".git" },
  settings = {}, -- kernel-lsp settings (camelCase, as in the README): initializationOptions and workspace/configuration
}

M.config = vim.deepcopy(DEFAULTS)
local clients = {} -- root folder -> client id
local SUMMARY_TIMEOUT_MS = 10000

-- The ids of the running kernel-lsp clients.
local function running_ids()
  local ids = {}
  for _, id in pairs(clients) do
    if vim.lsp.get_client_by_id(id) then
      table.insert(ids, id)
    end
  end
  return ids
end

local function server_cmd()
  if M.config.cmd then
    return M.config.cmd
  end
  if M.config.python then
    return { M.config.python, "-m", "kernel_lsp", "serve" }
  end
  return { "kernel-lsp", "serve" }
end

-- The nearest folder above the file that holds a root marker, else the file's own folder.
function M.root_dir(path)
  local start = vim.fn.fnamemodify(path, ":p:h")
  local folder = start
  while true do
    for _, marker in ipairs(M.config.root_markers) do
      if vim.loop.fs_stat(folder .. "/" .. marker) then
        return folder
      end
    end
    local parent = vim.fn.fnamemodify(folder, ":h")
    if parent == folder then
      return start
    end
    folder = parent
  end
end

local function capabilities()
  local capabilities = vim.lsp.protocol.make_client_capabilities()
  -- handlers.apply_edit asks before applying an edit whose change annotation needs confirmation
  capabilities.workspace.workspaceEdit = vim.tbl_extend("force", capabilities.workspace.workspaceEdit or {}, {
    documentChanges = true,
    changeAnnotationSupport = { groupsOnLabel = false },
  })
  -- handlers.codelens_refresh fetches the lenses again when the server says they changed
  capabilities.workspace.codeLens = { refreshSupport = true }
  return capabilities
end

local function client_config(root)
  local settings = next(M.config.settings) and M.config.settings or nil -- nil: no empty list on the wire
  return {
    name = NAME,
    cmd = server_cmd(),
    root_dir = root,
    init_options = settings,
    settings = settings and { kernelLsp = settings } or nil,
    capabilities = capabilities(),
    handlers = handlers.for_client(),
    on_init = function()
      workspace.schedule_visible(running_ids) -- what the windows show, once the server can hear it
    end,
    on_attach = function(_, bufnr)
      handlers.refresh_lenses(bufnr)
    end,
    on_exit = function(code, signal, client_id)
      handlers.tasks[client_id] = nil
      handlers.worker_status[client_id] = nil
      workspace.last_visible[client_id] = nil
      if code ~= 0 and signal ~= 15 then
        vim.schedule(function()
          handlers.notify(string.format("the server exited (code %d, signal %d); :KernelLspRestart starts it again",
            code, signal), vim.log.levels.WARN)
        end)
      end
    end,
  }
end

local function wanted(bufnr)
  return vim.api.nvim_buf_is_valid(bufnr) and vim.bo[bufnr].buftype == ""
    and vim.api.nvim_buf_get_name(bufnr) ~= ""
    and vim.tbl_contains(M.config.filetypes, vim.bo[bufnr].filetype)
end

-- The running client for a root folder, or nil (0.7 has no vim.lsp.start to reuse one).
local function running(root)
  local id = clients[root]
  local client = id and vim.lsp.get_client_by_id(id)
  if client and not client.is_stopped() then
    return id
  end
  return nil
end

function M.attach(bufnr)
  if not wanted(bufnr) then
    return
  end
  local root = M.root_dir(vim.api.nvim_buf_get_name(bufnr))
  local id
  if vim.fn.has("nvim-0.8") == 1 then
    id = vim.lsp.start(client_config(root), { bufnr = bufnr })
  else
    id = running(root) or vim.lsp.start_client(client_config(root))
    if id then
      vim.lsp.buf_attach_client(bufnr, id)
    end
  end
  if not id then
    handlers.notify("could not start " .. table.concat(server_cmd(), " "), vim.log.levels.ERROR)
    return
  end
  clients[root] = id
end

-- kernel-lsp's client attached to the buffer, or nil.
function M.client(bufnr)
  for _, id in pairs(clients) do
    if vim.lsp.buf_is_attached(bufnr, id) then
      return vim.lsp.get_client_by_id(id)
    end
  end
  return nil
end

local function request(client, method, params, on_result, bufnr)
  if vim.fn.has("nvim-0.11") == 1 then
    return client:request(method, params, on_result, bufnr)
  end
  return client.request(method, params, on_result, bufnr)
end

-- workspace/executeCommand on the current buffer's document; the answer is shown unless the server said it already.
function M.execute(command, extra)
  local bufnr = vim.api.nvim_get_current_buf()
  local client = M.client(bufnr)
  if not client then
    handlers.notify("not attached to this buffer (filetypes: " .. table.concat(M.config.filetypes, ", ") .. ")",
      vim.log.levels.WARN)
    return
  end
  if vim.bo[bufnr].modified then
    handlers.notify(vim.fn.expand("%:t") .. " has unsaved changes; " .. command .. " uses the file as saved",
      vim.log.levels.WARN)
  end
  local arguments = { vim.uri_from_bufnr(bufnr) }
  vim.list_extend(arguments, extra or {})
  request(client, "workspace/executeCommand", { command = command, arguments = arguments }, function(err, result)
    if err then
      handlers.notify(command .. " failed: " .. (err.message or vim.inspect(err)), vim.log.levels.ERROR)
      return
    end
    M.last_result = result
    local text = type(result) == "table" and (result.summary or result.message or result.status) or nil
    if text and not handlers.already_said(text) then
      handlers.echo(command:gsub("^kernel%-lsp%.", "") .. ": " .. text, true)
    end
  end, bufnr)
end

-- kernelLsp/workspaceSummary to the current buffer's server (else the first one running): the kernel files in the
-- summary buffer (<CR> on a line opens its file), the files with errors in the quickfix list. `callback(lines,
-- summary)`, when given, gets what was shown; the answer also stays in `require("kernel_lsp").last_summary`.
function M.summary(callback)
  local bufnr = vim.api.nvim_get_current_buf()
  local client = M.client(bufnr)
  if not client then
    local id = running_ids()[1]
    client = id and vim.lsp.get_client_by_id(id)
  end
  if not client then
    handlers.notify("no server running (open a CUDA or Python file first)", vim.log.levels.WARN)
    return
  end
  local answered = false
  vim.defer_fn(function()
    if not answered then
      handlers.notify(string.format("no workspace summary from the server within %d s (it may be busy scanning); "
        .. "try again", SUMMARY_TIMEOUT_MS / 1000), vim.log.levels.WARN)
    end
  end, SUMMARY_TIMEOUT_MS)
  -- no parameters, but an empty object: pygls cannot read a request without `params`, and then never answers
  request(client, workspace.SUMMARY_REQUEST, vim.empty_dict(), function(err, result)
    answered = true
    if err then
      handlers.notify("the workspace summary failed: " .. (err.message or vim.inspect(err)), vim.log.levels.ERROR)
      return
    end
    M.last_summary = result
    local lines = workspace.present_summary(result, client.config.root_dir)
    if callback then
      callback(lines, result)
    end
  end, bufnr)
end

-- One line per running server: its root, the worker's state, and the tasks in progress.
function M.status_lines()
  local lines = {}
  for root, id in pairs(clients) do
    if vim.lsp.get_client_by_id(id) then
      local worker = handlers.worker_status[id]
      local text
      if worker then
        local facts = { "worker " .. worker.state .. " (" .. worker.address .. ")" }
        if worker.gpu and worker.gpu ~= vim.NIL then
          table.insert(facts, worker.gpu)
        elseif worker.state == "connected" then
          table.insert(facts, "no GPU")
        end
        if worker.driver and worker.driver ~= vim.NIL then
          table.insert(facts, "driver " .. worker.driver)
        end
        table.insert(facts, string.format("%d running job(s), %d restart(s)", worker.running_jobs or 0,
          worker.restarts or 0))
        if worker.message and worker.message ~= vim.NIL then
          table.insert(facts, worker.message)
        end
        text = table.concat(facts, ", ")
      else
        text = "worker not started yet (the first verification, or profile of a .py, starts it)"
      end
      table.insert(lines, string.format("%s [%s]: %s", NAME, root, text))
      for _, task in pairs(handlers.tasks[id] or {}) do
        table.insert(lines, "  " .. handlers.describe_task(task))
      end
    end
  end
  if #lines == 0 then
    table.insert(lines, NAME .. ": no server running")
  end
  return lines
end

-- Stops every kernel-lsp client, then starts them again for the buffers that want one.
function M.restart()
  local ids = vim.tbl_values(clients)
  clients = {}
  vim.lsp.stop_client(ids)
  local stopped = vim.wait(5000, function()
    for _, id in ipairs(ids) do
      if vim.lsp.get_client_by_id(id) then
        return false
      end
    end
    return true
  end, 50)
  if not stopped then
    vim.lsp.stop_client(ids, true)
  end
  for _, bufnr in ipairs(vim.api.nvim_list_bufs()) do
    if vim.api.nvim_buf_is_loaded(bufnr) then
      M.attach(bufnr)
    end
  end
end

local function define_commands()
  local command = vim.api.nvim_create_user_command
  command("KernelLspVerify", function()
    M.execute("kernel-lsp.verify")
  end, { desc = "kernel-lsp: verify this candidate against its reference" })
  command("KernelLspProfile", function(opts)
    M.execute("kernel-lsp.profile", opts.args ~= "" and { opts.args } or nil)
  end, { nargs = "?", desc = "kernel-lsp: profile this file's kernels (or the one named)" })
  command("KernelLspOptimize", function()
    M.execute("kernel-lsp.optimize")
  end, { desc = "kernel-lsp: start an optimization pass on this candidate" })
  command("KernelLspSanitize", function()
    M.execute("kernel-lsp.sanitize")
  end, { desc = "kernel-lsp: check this candidate's memory safety with compute-sanitizer (a GPU worker)" })
  command("KernelLspRestart", M.restart, { desc = "kernel-lsp: restart the server" })
  command("KernelLspSummary", function()
    M.summary()
  end, { desc = "kernel-lsp: the workspace's kernel files, their compile and verify state; errors to quickfix" })
  command("KernelLspStatus", function()
    for _, line in ipairs(M.status_lines()) do
      vim.api.nvim_echo({ { line } }, true, {})
    end
  end, { desc = "kernel-lsp: the server's worker and running tasks" })
end

function M.setup(options)
  M.config = vim.tbl_deep_extend("force", vim.deepcopy(DEFAULTS), options or {})
  if options and options.filetypes then
    M.config.filetypes = options.filetypes -- a list replaces the default, it does not merge into it
  end
  local group = vim.api.nvim_create_augroup("kernel_lsp", { clear = true })
  -- Vim's own detection knows .cu; this covers setups where it is off or says otherwise
  vim.api.nvim_create_autocmd({ "BufRead", "BufNewFile" }, {
    group = group,
    pattern = { "*.cu", "*.cuh" },
    callback = function(args)
      if vim.bo[args.buf].filetype ~= "cuda" then
        vim.bo[args.buf].filetype = "cuda"
      end
    end,
  })
  vim.api.nvim_create_autocmd("FileType", {
    group = group,
    pattern = M.config.filetypes,
    callback = function(args)
      M.attach(args.buf)
    end,
  })
  -- kernelLsp/visibleDocuments: the server checks the current buffer first, then the ones the windows show
  vim.api.nvim_create_autocmd({ "BufEnter", "WinEnter", "WinClosed" }, {
    group = group,
    callback = function()
      if next(clients) then
        workspace.schedule_visible(running_ids)
      end
    end,
  })
  -- the lenses of a saved buffer (the server also asks, with workspace/codeLens/refresh, once its checks end)
  vim.api.nvim_create_autocmd("BufWritePost", {
    group = group,
    callback = function(args)
      if M.client(args.buf) then
        handlers.refresh_lenses(args.buf)
      end
    end,
  })
  define_commands()
  for _, bufnr in ipairs(vim.api.nvim_list_bufs()) do -- buffers opened before setup ran
    if vim.api.nvim_buf_is_loaded(bufnr) then
      M.attach(bufnr)
    end
  end
end

-- For a statusline: "kernel-lsp: <worker state>" of the current buffer's server, or "".
function M.statusline()
  local client = M.client(vim.api.nvim_get_current_buf())
  local worker = client and handlers.worker_status[client.id]
  if not client then
    return ""
  end
  return NAME .. ": " .. (worker and worker.state or "ready")
end

return M
