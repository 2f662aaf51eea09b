--- Where the servers come from (--servers, --servers-file, else
-- REDLOCK_SERVERS), the TLS settings (flags, else REDLOCK_* variables), and
-- the host's thin layer over the Lua API: one client per process, keep-alive on.

local _M = {}

_M.OPTIONS = {
  { name = "servers", long = "servers", arg = "URL,...",
    help = "the Redis nodes (default: $REDLOCK_SERVERS)" },
  { name = "servers_file", long = "servers-file", arg = "FILE",
    help = "read the nodes from FILE, one URL a line, # comments (keeps passwords out of argv)" },
  { name = "cacert", long = "cacert", arg = "FILE",
    help = "rediss://: verify nodes with the CAs in FILE (default: $REDLOCK_CACERT, else the system's)" },
  { name = "cacertdir", long = "cacertdir", arg = "DIR",
    help = "rediss://: ... and with the hashed CA certificates in DIR ($REDLOCK_CACERTDIR)" },
  { name = "cert", long = "cert", arg = "FILE",
    help = "rediss://: client certificate for mutual TLS ($REDLOCK_CERT)" },
  { name = "key", long = "key", arg = "FILE",
    help = "rediss://: its private key ($REDLOCK_KEY)" },
  { name = "sni", long = "sni", arg = "NAME",
    help = "rediss://: server name to send and verify instead of each URL's host ($REDLOCK_SNI)" },
  { name = "insecure", long = "insecure",
    help = "rediss://: do not verify the nodes' certificates ($REDLOCK_INSECURE=1)" },
  { name = "prefix", long = "prefix", arg = "PREFIX",
    help = "prepended to RESOURCE to form the key (default: $REDLOCK_PREFIX)" },
}

--- A command's option spec: its own options, then the server options and --help.
function _M.spec(own)
  local spec = {}
  for _, o in ipairs(own) do spec[#spec + 1] = o end
  for _, o in ipairs(_M.OPTIONS) do spec[#spec + 1] = o end
  spec[#spec + 1] = require("redlock.host.args").HELP
  return spec
end

local NO_SERVERS = "no servers configured: pass --servers URL,URL,... or set REDLOCK_SERVERS"
  .. " (`redlock dev` starts a throwaway local cluster and prints the line to use)"

--- Split "a, b,c" into a list.
function _M.split(text)
  local list = {}
  for url in text:gmatch("[^,%s]+") do list[#list + 1] = url end
  return list
end

--- The URLs in a servers file: one a line (commas too), blank lines and
-- # comments skipped. nil and a message (never the file's text) on error.
local function read_servers_file(path)
  local f, err = io.open(path, "rb")
  if not f then return nil, "--servers-file: cannot read " .. tostring(err) end
  local text, rerr = f:read("*a")
  f:close()
  if not text then
    return nil, ("--servers-file: cannot read %s: %s"):format(path, tostring(rerr))
  end
  text = text:gsub("#[^\n]*", "")
  if not text:find("[^,%s]") then return nil, "--servers-file " .. path .. " names no servers" end
  return text
end

--- The server list from opts.servers, opts.servers_file or REDLOCK_SERVERS;
-- nil and a message if none.
function _M.servers(opts)
  local text = opts.servers
  local from = "--servers"
  if text ~= nil and opts.servers_file ~= nil then
    return nil, "--servers and --servers-file: give one of them"
  end
  if text == nil and opts.servers_file ~= nil then
    local err
    text, err = read_servers_file(opts.servers_file)
    if not text then return nil, err end
    from = "--servers-file"
  end
  if text == nil then
    text = os.getenv("REDLOCK_SERVERS")
    from = "REDLOCK_SERVERS"
  end
  if text == nil or text:match("^[,%s]*$") then
    if text ~= nil then return nil, from .. " is empty; " .. NO_SERVERS end
    return nil, NO_SERVERS
  end
  return _M.split(text)
end

local function env(name)
  local v = os.getenv(name)
  if v == "" then return nil end
  return v
end

local FALSE_WORDS = { ["0"] = true, no = true, ["false"] = true, off = true }

-- REDLOCK_INSECURE=1 (or yes, true, ...): anything set but 0, no, false, off.
local function truthy(v)
  return v ~= nil and not FALSE_WORDS[v:lower():match("^%s*(.-)%s*$")]
end

local warned_insecure = false

-- The flag that sets each tls option (the REDLOCK_* variable is the
-- fallback: redlock.tls_from_env).
local TLS_FLAGS = { cacert = "cafile", cacertdir = "capath", cert = "certfile", key = "keyfile", sni = "server_name" }

--- The tls option table from the flags, else the REDLOCK_* variables (nil
-- when nothing is set). --insecure warns on stderr, once.
function _M.tls_options(opts)
  local t = require("redlock").tls_from_env() or {}
  for flag, option in pairs(TLS_FLAGS) do
    if opts[flag] then t[option] = opts[flag] end
  end
  local insecure = opts.insecure or truthy(env("REDLOCK_INSECURE"))
  if insecure then
    t.verify = false
    if not warned_insecure then
      warned_insecure = true
      io.stderr:write("redlock: warning: TLS certificate verification is off (",
        opts.insecure and "--insecure" or "REDLOCK_INSECURE", "): anyone on the path can pose as a node\n")
    end
  end
  if next(t) == nil then return nil end
  return t
end

--- Client options from the command line and environment (nil, err without servers).
function _M.client_options(opts)
  local servers, err = _M.servers(opts)
  if not servers then return nil, err end
  local prefix = opts.prefix or os.getenv("REDLOCK_PREFIX")
  return { servers = servers, prefix = prefix ~= "" and prefix or nil, keepalive = true,
    tls = _M.tls_options(opts) }
end

-- An error that is the user's configuration, not the script: `redlock run`
-- exits 64 with its message and no traceback.
local USAGE_MT = { __tostring = function(e) return e.msg end }

function _M.is_usage_error(e)
  return type(e) == "table" and getmetatable(e) == USAGE_MT
end

-- Signals while a lock is being acquired (see rl_host_acquire_begin in
-- core/host/host.h). Every client of the host acquires between
-- sys.acquire_begin and sys.acquire_end, so a SIGTERM then waits for the
-- acquisition to be over (the lock is the keeper's, which releases it, or
-- the library released what it got) instead of leaving its SETs on the
-- nodes for the whole ttl. The retry policy gives up once a signal is ending
-- the host, and the delays between attempts are slept here in slices of
-- SLICE_MS that look for one (a release heard still ends them early).
local SLICE_MS = 20
local MAX_MS = 2147483647

-- How long an acquisition may take once the policy gives up: an attempt
-- (two rounds with a fencing token, on connections still being made), the
-- releases after a failed one, and a second to spare.
local function acquire_bound(dlm)
  local node, connect = 50, 1000
  local o = dlm.options
  if o ~= nil then
    local ok, n, c = pcall(function() return tonumber(o.node_timeout_ms), tonumber(o.connect_timeout_ms) end)
    if ok and n and n > 0 then node = n end
    if ok and c and c > 0 then connect = c end
  end
  return 2 * (node + connect) + 1000
end

-- policy, its delays slept here in slices (then 0 to the library), and nil
-- once a signal is ending the host. a: the resource (or list) being locked.
-- As in the library, a release heard during a delay earns an extra attempt
-- that the policy does not count: after it the rest of the delay is slept
-- without asking the policy again, and the policy sees its own attempt
-- numbers.
local function sliced(dlm, a, policy, wait)
  local sys = require "redlock.host.sys"
  local deadline = wait and sys.now_ms() + wait
  local client = dlm.client
  local single = type(a) == "string" and dlm.notify and client ~= nil
  local function heard()
    if single then return client:heard(a, #a) end
  end
  local seen = heard()
  local n, resume_until = 0, nil
  return function(_, err, detail)
    if sys.stopping() then return nil end
    local until_ms = resume_until
    resume_until = nil
    if until_ms == nil or until_ms <= sys.now_ms() then
      n = n + 1
      local delay = policy(n, err, detail)
      if type(delay) ~= "number" or not (delay >= 0 and delay <= MAX_MS) then return delay end
      if sys.stopping() then return nil end
      until_ms = sys.now_ms() + math.floor(delay)
      if deadline and until_ms > deadline then until_ms = deadline end
    end
    local now = heard()
    if now ~= seen then -- a release heard during the attempt: the library tries again at once
      seen = now
      resume_until = until_ms
      return 0
    end
    while true do
      local left = until_ms - sys.now_ms()
      if left <= 0 then break end
      local ms = math.min(SLICE_MS, math.ceil(left))
      if single then
        if client:sleep_until(a, #a, seen, ms) ~= 0 then
          resume_until = until_ms -- woken: an extra attempt, then the rest of the delay
          break
        end
      else
        _M.sleep(dlm, ms)
      end
      if sys.stopping() then return nil end
    end
    seen = heard()
    return 0
  end
end

local guarded = false

local WRAPPER = [[
local f, begin, done, prepare = ...
local error, pcall = error, pcall
local function finish(ok, ...)
  done()
  if not ok then error((...), 0) end
  return ...
end
return function(self, a, opts, ...)
  if prepare then opts = prepare(self, a, opts) end
  begin(self)
  return finish(pcall(f, self, a, opts, ...))
end
]]

--- Make every client's lock, try_lock and lock_many acquire as above (once,
-- on the client class that dlm belongs to). Return dlm.
function _M.guard(dlm)
  if guarded then return dlm end
  local mt = getmetatable(dlm)
  local methods = type(mt) == "table" and mt.__index
  if type(methods) ~= "table" or type(methods.lock) ~= "function" then return dlm end
  guarded = true
  local sys = require "redlock.host.sys"
  local retry = require("redlock").retry

  -- opts with the policy that lock() would use, sliced
  local function prepare(self, a, opts)
    if type(self) ~= "table" or self.client == nil or (opts ~= nil and type(opts) ~= "table") then
      return opts
    end
    local o = {}
    if opts then
      if opts.retry ~= nil and type(opts.retry) ~= "function" then return opts end
      for key, v in pairs(opts) do o[key] = v end
    end
    local wait = type(o.wait) == "number" and o.wait or nil
    local policy = o.retry or (wait and retry.forever()) or self.retry or retry.default
    o.retry = sliced(self, a, policy, wait)
    return o
  end
  local function begin(self)
    sys.acquire_begin(type(self) == "table" and acquire_bound(self) or 0)
  end

  -- The library blames the first frame outside its own for a bad argument:
  -- that must stay the caller's line, not a wrapper's.
  local chunkname = "=redlock.host.acquire_guard"
  require("redlock")._pass_over(chunkname)
  for _, name in ipairs { "lock", "lock_many", "try_lock" } do
    local f = methods[name]
    if type(f) == "function" then
      local make = assert(loadstring(WRAPPER, chunkname))
      methods[name] = make(f, begin, sys.acquire_end, name ~= "try_lock" and prepare or nil)
    end
  end
  return dlm
end

--- Make redlock.default() return a client built from the host configuration,
-- and make keep-alive the default for every client created in the host (so
-- that the signal thread's rl_keeper_release_all covers every held lock).
function _M.install(opts)
  local redlock = require "redlock"
  local copts, err = _M.client_options(opts)
  if copts then
    redlock.configure(copts)
  elseif not redlock._host_default then
    local default = redlock.default
    redlock._host_default = default
    redlock.default = function()
      if _M.servers({}) then return default() end -- REDLOCK_SERVERS set by the script
      error(setmetatable({ msg = err }, USAGE_MT), 2)
    end
  end
  if not redlock._host_new then
    local new = redlock.new
    redlock._host_new = new
    redlock.new = function(o)
      if type(o) == "table" and o.keepalive == nil then
        local copy = {}
        for k, v in pairs(o) do copy[k] = v end
        copy.keepalive = true
        o = copy
      end
      if not guarded then
        -- the first client shows guard its class; a failure is raised again
        -- by a tail call, so that it blames the caller's line
        local ok, dlm = pcall(new, o)
        if ok then return _M.guard(dlm) end
      end
      return new(o)
    end
  end
  return redlock
end

-- "tls.<option>:" said as "--<flag>:", for error messages.
local FLAG_OF_TLS_OPTION = {}
for flag, option in pairs(TLS_FLAGS) do FLAG_OF_TLS_OPTION[option] = "--" .. flag .. ":" end

--- msg with a leading "tls.<option>:" said as the flag that sets it.
function _M.flag_message(msg)
  return (msg:gsub("^tls%.([%w_]+):", FLAG_OF_TLS_OPTION))
end

--- A client from the host configuration, or nil and a message.
function _M.client(opts)
  local copts, err = _M.client_options(opts)
  if not copts then return nil, err end
  local redlock = require "redlock"
  local ok, dlm = pcall(redlock.new, copts)
  if not ok then
    local msg = tostring(dlm):gsub("^bad argument #1 to 'new' %((.*)%)$", "%1")
    return nil, _M.flag_message(msg)
  end
  return _M.guard(dlm)
end

--- Acquire resource with keep-alive. o: ttl, margin, policy, nonblock, wait,
-- and unreachable: function(err, detail, ms) called after each failed
-- attempt that was not "busy", with how long the attempts have failed that
-- way. Without nonblock, wait or policy, waits as long as it takes.
function _M.lock(dlm, resource, o)
  local sys = require "redlock.host.sys"
  local lopts = { ttl = o.ttl, keepalive = true, margin = o.margin, fence = o.fence or false }
  if o.nonblock then return dlm:try_lock(resource, lopts) end
  local policy = o.policy or require("redlock").retry.forever()
  local since -- when the attempts began failing for another reason than busy
  lopts.wait = o.wait
  lopts.retry = function(attempt, err, detail)
    if err == "busy" then
      since = nil
    elseif o.unreachable then
      since = since or sys.now_ms()
      o.unreachable(err, detail, sys.now_ms() - since)
    end
    return policy(attempt, err, detail)
  end
  return dlm:lock(resource, lopts)
end

--- Sleep ms while serving dlm's connections (late replies, reconnects), so
-- that an idle client is never mistaken for a stalled node.
function _M.sleep(dlm, ms)
  if dlm.client ~= nil then
    require("redlock.cdefs").lib.rl_sleep(dlm.client, ms)
  else
    require("redlock.host.sys").sleep_ms(ms)
  end
end

function _M.release(lock)
  return lock:unlock()
end

function _M.lost(lock)
  return lock:lost()
end

function _M.remaining(lock)
  return lock:remaining()
end

--- Per-node lines for a failure's detail.
function _M.describe_detail(detail)
  local lines = {}
  for i, node in ipairs(detail) do
    lines[#lines + 1] = ("  node %d %s: %s%s"):format(i, node.server or "?", node.state or "?",
      node.error and (" (" .. node.error .. ")") or "")
  end
  return table.concat(lines, "\n")
end

return _M
