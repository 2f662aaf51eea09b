-- Spec helper script (run as its own OS process, not required; started by
-- spec/helpers/scenario.lua, which documents the files it shares):
--
--   luajit spec/helpers/scenario_worker.lua DIR K MODE RESOURCE TTL NODE_TIMEOUT HOLD_MS URL...
--
-- Until DIR/stop exists: one attempt (try_lock: one round) at RESOURCE;
-- when granted, the critical section: "enter" in the shared history
-- DIR/history.log, a read-modify-write of the counter file DIR/counter
-- (pausing HOLD_MS between the read and the write), "exit"; then unlock.
-- Every attempt and every unlock is a line of DIR/w<K>.attempts:
--
--   a <start_us> <latency_us> <outcome> <states>
--                                          an attempt (ok, busy, unavailable, ...) and,
--                                          when it failed, its per-node states (see states())
--   u <start_us> <latency_us> <outcome>    an unlock of a granted lock
--
-- start_us and latency_us are CLOCK_MONOTONIC microseconds, the clock of
-- the history log.
--
-- The trigger: inside a critical section the worker looks for DIR/trigger.
-- The one worker whose rename of it succeeds runs its actions there, while
-- it holds the lock, so the fault is certain to begin under a holder:
--
--   hold MS                 stay inside the critical section MS more after the actions
--   signal SIG PID          send SIG (KILL, STOP, ...) to PID
--   write PATH TEXT         write TEXT (and a newline) to PATH atomically
--
-- and then writes DIR/fired: "<t_us before the actions> <t_us after> <pid>".
--
-- MODE:
--   redlock                 one client on every URL
--   failover:P,S            a deliberately broken lock for checking the
--                           checker: a single-node lock on URL P, and when
--                           that fails for any reason but "busy", a
--                           single-node lock on URL S instead
--
-- Prints one summary line: "acquired=N failed=M not_busy=B:<first few errors>"
-- (B: failed attempts whose error was not "busy").
-- LUA_PATH / LUA_CPATH come from the spawning spec.

local proc = require "helpers.proc"
local history = require "helpers.history"
local redlock = require "redlock"

local dir, k, mode, resource = arg[1], arg[2], arg[3], arg[4]
local ttl, node_timeout, hold_ms = tonumber(arg[5]), tonumber(arg[6]), tonumber(arg[7])
local urls = {}
for i = 8, #arg do urls[#urls + 1] = arg[i] end

math.randomseed(proc.getpid())
local log = history.open(dir .. "/history.log")
local counter = dir .. "/counter"
local stopfile = dir .. "/stop"
local trigger = dir .. "/trigger"
local claimed = dir .. "/trigger." .. proc.getpid()
local rec = assert(io.open(dir .. "/w" .. k .. ".attempts", "wb"))

local function client(servers)
  return redlock.new { servers = servers, ttl = ttl, node_timeout = node_timeout }
end

-- try(): one attempt; returns a lock or nil, err.
local clients, try = {}
if mode == "redlock" then
  clients[1] = client(urls)
  try = function() return clients[1]:try_lock(resource) end
else
  local p, s = mode:match("^failover:(%d+),(%d+)$")
  assert(p, "unknown mode " .. tostring(mode))
  clients[1] = client { urls[tonumber(p)] }
  clients[2] = client { urls[tonumber(s)] }
  try = function()
    local lock, err, detail = clients[1]:try_lock(resource)
    if lock or err == "busy" then return lock, err, detail end
    return clients[2]:try_lock(resource)
  end
end

-- A failed attempt's per-node states, one letter per node: o ok, t taken,
-- T timeout, e error, p pending (not answered when it was decided); "-"
-- for a granted one (a lock carries no per-node detail).
local LETTERS = { ok = "o", taken = "t", timeout = "T", error = "e", pending = "p" }
local function states(detail)
  if type(detail) ~= "table" then return "-" end
  local t = {}
  for i = 1, #detail do t[i] = LETTERS[detail[i].state] or "?" end
  return table.concat(t)
end

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

-- Run the trigger's actions if this worker is the one to claim it.
local function fire()
  if not exists(trigger) or not os.rename(trigger, claimed) then return end
  local text = proc.read_file(claimed) or ""
  os.remove(claimed)
  local hold = 0
  local t0 = proc.now_us()
  for line in text:gmatch("[^\n]+") do
    local verb, rest = line:match("^(%S+)%s*(.*)$")
    if verb == "hold" then
      hold = tonumber(rest)
    elseif verb == "signal" then
      local sig, pid = rest:match("^(%S+) (%d+)$")
      proc.kill(tonumber(pid), sig)
    elseif verb == "write" then
      local path, body = rest:match("^(%S+) (.*)$")
      proc.write_file(path, body .. "\n")
    end
  end
  local t1 = proc.now_us()
  proc.write_file(dir .. "/fired", ("%d %d %d\n"):format(t0, t1, proc.getpid()))
  if hold > 0 then proc.sleep_ms(hold) end
end

local acquired, failed, other, errors = 0, 0, 0, {}
while not exists(stopfile) do
  local t0 = proc.now_us()
  local lock, err, detail = try()
  local t1 = proc.now_us()
  rec:write(("a %d %d %s %s\n"):format(t0, t1 - t0, lock and "ok" or tostring(err), states(detail)))
  if lock then
    acquired = acquired + 1
    log:enter()
    fire()
    history.bump_counter(counter, hold_ms)
    log:exit()
    local u0 = proc.now_us()
    local ok, uerr = lock:unlock()
    local u1 = proc.now_us()
    rec:write(("u %d %d %s\n"):format(u0, u1 - u0, ok and "ok" or tostring(uerr)))
    proc.sleep_ms(math.random(0, 2))
  else
    failed = failed + 1
    if err ~= "busy" then
      other = other + 1
      if #errors < 5 then errors[#errors + 1] = tostring(err) end
    end
    proc.sleep_ms(math.random(1, 4))
  end
end
for _, c in ipairs(clients) do c:close() end
rec:close()
log:close()
io.write(("acquired=%d failed=%d not_busy=%d:%s\n")
  :format(acquired, failed, other, table.concat(errors, ",")))
