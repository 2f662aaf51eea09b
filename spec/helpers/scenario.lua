-- Spec helper: fault scenarios as histories (the safety_*_spec.lua files).
--
-- Several worker processes (spec/helpers/scenario_worker.lua) contend for
-- one resource, each critical section logged to a shared history and doing
-- a read-modify-write of a shared counter; the spec injects faults while
-- they run, then stops them and checks the history (helpers/history.lua)
-- and every attempt's outcome and latency.
--
--   local scenario = require "helpers.scenario"
--   local run = scenario.start { servers = urls, workers = 5, ttl = 2000, node_timeout = 100 }
--   run:await_acquisitions(20)                -- the workers are going
--   local t0 = run:inject({ "signal KILL " .. cl.pids[5] }, 100)
--   run:sleep(2000)                           -- the fault lasts
--   local r = run:finish()                    -- stops the workers, reads everything
--   r.overlaps, r.lost_updates, r:attempts_in(t0, t1), r:entered_in(t0, t1) ...
--   scenario.stop_all()                       -- teardown: whatever is left
--   scenario.assert_overlaps(run, 500)        -- a broken lock: sleep, finish, overlaps seen
--   scenario.assert_gone(cl, { px })          -- last test: no worker, node, proxy or directory left
--
-- inject(actions, hold_ms) makes the fault begin inside a critical section:
-- the next worker to enter one runs the actions (see scenario_worker.lua:
-- "signal SIG PID", "write PATH TEXT") while holding the lock, and stays
-- inside hold_ms more. It returns when they ran, with their start time.
--
-- All times are CLOCK_MONOTONIC microseconds (proc.now_us()), the history
-- log's clock. An attempt is one try_lock (one round); windows count
-- attempts by when they started: an attempt started after a node was seen
-- dead cannot have been helped by it.

local proc = require "helpers.proc"
local history = require "helpers.history"
local cluster = require "helpers.cluster"
local faults = require "helpers.faults"
local luassert = require "luassert"

local M = {}

local spawned, dirs = {}, {}

local Run = {}
Run.__index = Run

--- Start opts.workers (default 5) workers on opts.servers.
-- opts.mode: "redlock" (default) or "failover:P,S" (a broken lock, to show
-- the checker sees what it lets through); opts.resource (default: a fresh
-- name); opts.ttl (ms, default 2000); opts.node_timeout (ms, default 100);
-- opts.hold_ms (the pause inside each critical section, default 2).
function M.start(opts)
  local self = setmetatable({
    dir = proc.tmpdir(),
    workers = opts.workers or 5,
    pids = {},
    t_start = proc.now_us(),
  }, Run)
  dirs[#dirs + 1] = self.dir
  self.log = self.dir .. "/history.log"
  self.counter = self.dir .. "/counter"
  local resource = opts.resource or ("spec:scenario:%d:%d"):format(proc.getpid(), #dirs)
  for k = 1, self.workers do
    local argv = { "luajit", "spec/helpers/scenario_worker.lua", self.dir, tostring(k),
      opts.mode or "redlock", resource, tostring(opts.ttl or 2000),
      tostring(opts.node_timeout or 100), tostring(opts.hold_ms or 2) }
    for _, u in ipairs(opts.servers) do argv[#argv + 1] = u end
    local pid = proc.spawn_luajit(argv, ("%s/w%d.out"):format(self.dir, k))
    self.pids[k] = pid
    spawned[#spawned + 1] = pid
  end
  return self
end

-- Raise (with what the workers printed) if a worker has quit: they only
-- stop when told to.
function Run:check_alive()
  for k, pid in ipairs(self.pids) do
    if not proc.alive(pid) then
      error(("worker %d quit early; it printed:\n%s"):format(k,
        proc.read_file(("%s/w%d.out"):format(self.dir, k)) or ""), 3)
    end
  end
end

--- Sleep ms while the workers run; raises if one of them quit.
function Run:sleep(ms)
  local deadline = proc.now_ms() + ms
  repeat
    proc.sleep_ms(math.min(50, math.max(0, deadline - proc.now_ms())))
    self:check_alive()
  until proc.now_ms() >= deadline
end

--- Critical sections completed so far (exits in the history log).
function Run:acquisitions()
  local n = 0
  for _ in (proc.read_file(self.log) or ""):gmatch("exit ") do n = n + 1 end
  return n
end

--- Wait until at least n critical sections were completed (the workers
-- have started and contend); raises after timeout_ms (default 15000).
function Run:await_acquisitions(n, timeout_ms)
  local deadline = proc.now_ms() + (timeout_ms or 15000)
  while self:acquisitions() < n do
    self:check_alive()
    if proc.now_ms() > deadline then
      error(("fewer than %d acquisitions after %d ms"):format(n, timeout_ms or 15000), 2)
    end
    proc.sleep_ms(20)
  end
end

--- Have the next worker to enter its critical section run actions (a list
-- of lines, see scenario_worker.lua) and stay inside hold_ms more. Returns
-- the time the actions began and the time they were done (us) and the
-- pid of the worker. Raises if no worker fired it within timeout_ms.
function Run:inject(actions, hold_ms, timeout_ms)
  local fired = self.dir .. "/fired"
  os.remove(fired)
  local lines = { "hold " .. tostring(hold_ms or 0) }
  for _, a in ipairs(actions) do lines[#lines + 1] = a end
  proc.write_file(self.dir .. "/trigger", table.concat(lines, "\n") .. "\n")
  local deadline = proc.now_ms() + (timeout_ms or 10000)
  while true do
    local text = proc.read_file(fired)
    local t0, t1, pid = (text or ""):match("^(%d+) (%d+) (%d+)")
    if t0 then return tonumber(t0), tonumber(t1), tonumber(pid) end
    self:check_alive()
    if proc.now_ms() > deadline then
      os.remove(self.dir .. "/trigger")
      error("no worker entered a critical section to inject the fault", 2)
    end
    proc.sleep_ms(2)
  end
end

local Result = {}
Result.__index = Result

local function parse_attempts(text, k, attempts, unlocks)
  for line in text:gmatch("[^\n]+") do
    local kind, start, lat, outcome, states = line:match("^([au]) (%d+) (%d+) (%S+) ?(%S*)$")
    assert(kind, ("worker %d: bad attempt line %q"):format(k, line))
    local rec = { worker = k, start = tonumber(start), ms = tonumber(lat) / 1000, outcome = outcome,
                  states = states ~= "" and states ~= "-" and states or nil }
    if kind == "a" then attempts[#attempts + 1] = rec else unlocks[#unlocks + 1] = rec end
  end
end

--- Stop the workers (they finish the attempt under way, close their
-- clients and exit), read the history, their attempts and summaries, and
-- remove the directory. Returns a result (see Result methods below) with
-- the checker's counts: acquisitions, overlaps, lost_updates, unfinished,
-- malformed, examples; intervals; attempts; unlocks; summaries.
function Run:finish()
  proc.write_file(self.dir .. "/stop", "stop\n")
  local late = {}
  for k, pid in ipairs(self.pids) do
    if not proc.wait_gone(pid, 20000) then late[#late + 1] = k end
    proc.stop(pid)
  end
  local text = proc.read_file(self.log) or ""
  local r = setmetatable({ attempts = {}, unlocks = {}, summaries = {} }, Result)
  local intervals, unfinished, malformed = history.parse(text)
  r.intervals, r.unfinished, r.malformed = intervals, unfinished, malformed
  r.acquisitions = #intervals
  r.overlaps, r.examples = history.overlaps(intervals) -- sorts intervals by enter
  r.counter = history.read_counter(self.counter)
  r.lost_updates = r.acquisitions - r.counter
  for k = 1, self.workers do
    parse_attempts(proc.read_file(("%s/w%d.attempts"):format(self.dir, k)) or "", k, r.attempts, r.unlocks)
    r.summaries[k] = (proc.read_file(("%s/w%d.out"):format(self.dir, k)) or ""):gsub("%s+$", "")
  end
  table.sort(r.attempts, function(a, b) return a.start < b.start end)
  proc.rmdir(self.dir)
  if #late > 0 then
    error(("workers %s did not stop within 20 s:\n%s"):format(table.concat(late, ","), r:info()), 2)
  end
  return r
end

--- Attempts that started in [t0, t1) (us), optionally only those whose
-- outcome is outcome ("ok", "busy", "unavailable", ...).
function Result:attempts_in(t0, t1, outcome)
  local t = {}
  for _, a in ipairs(self.attempts) do
    if a.start >= t0 and a.start < t1 and (outcome == nil or a.outcome == outcome) then t[#t + 1] = a end
  end
  return t
end

--- How many of a list of attempts saw node i fail: its state in the
-- failed round was timeout or error ("T" or "e", see scenario_worker.lua).
function M.saw_fail(list, i)
  local n = 0
  for _, a in ipairs(list) do
    local c = a.states and a.states:sub(i, i)
    if c == "T" or c == "e" then n = n + 1 end
  end
  return n
end

--- Unlocks that started in [t0, t1).
function Result:unlocks_in(t0, t1)
  local t = {}
  for _, u in ipairs(self.unlocks) do
    if u.start >= t0 and u.start < t1 then t[#t + 1] = u end
  end
  return t
end

--- Critical sections entered in [t0, t1).
function Result:entered_in(t0, t1)
  local n = 0
  for _, iv in ipairs(self.intervals) do
    if iv.enter >= t0 and iv.enter < t1 then n = n + 1 end
  end
  return n
end

--- Critical sections under way at time t (entered before, left after).
function Result:spanning(t)
  local n = 0
  for _, iv in ipairs(self.intervals) do
    if iv.enter <= t and iv.exit > t then n = n + 1 end
  end
  return n
end

--- The first critical section entered at or after t: its enter time, or nil.
function Result:first_enter_after(t)
  for _, iv in ipairs(self.intervals) do -- sorted by enter
    if iv.enter >= t then return iv.enter end
  end
  return nil
end

--- One text with the counts, the overlap examples and the workers' summaries,
-- for assertion messages.
function Result:info()
  return ("acquisitions=%d overlaps=%d lost=%d unfinished=%d malformed=%d attempts=%d %s\n  %s")
    :format(self.acquisitions, self.overlaps, self.lost_updates, self.unfinished, self.malformed,
      #self.attempts, table.concat(self.examples, "; "), table.concat(self.summaries, "\n  "))
end

--- The p-th percentile (0 < p <= 100) of a list of attempts' latencies, ms
-- (nearest rank); 0 for an empty list.
function M.percentile(list, p)
  local v = {}
  for i, a in ipairs(list) do v[i] = a.ms end
  if #v == 0 then return 0 end
  table.sort(v)
  return v[math.max(1, math.ceil(#v * p / 100))]
end

--- How many of list have outcome.
function M.count(list, outcome)
  local n = 0
  for _, a in ipairs(list) do if a.outcome == outcome then n = n + 1 end end
  return n
end

--- Outcomes of a list of attempts, as "ok=3 unavailable=40".
function M.outcomes(list)
  local c, keys = {}, {}
  for _, a in ipairs(list) do
    if not c[a.outcome] then keys[#keys + 1] = a.outcome end
    c[a.outcome] = (c[a.outcome] or 0) + 1
  end
  table.sort(keys)
  for i, k in ipairs(keys) do keys[i] = k .. "=" .. c[k] end
  return table.concat(keys, " ")
end

--- Print the line a row's numbers are copied from (docs/SAFETY.md):
-- "safety row N: k1=v1 ...", as helpers/safety.lua does.
M.report = require("helpers.safety").report

--- Stop every worker started here and remove every directory.
function M.stop_all()
  for _, pid in ipairs(spawned) do proc.stop(pid) end
  for _, d in ipairs(dirs) do proc.rmdir(d) end
end

--- Workers started here that are still alive, and directories still there.
function M.leftovers()
  local pids, left = {}, {}
  for _, pid in ipairs(spawned) do if proc.alive(pid) then pids[#pids + 1] = pid end end
  for _, d in ipairs(dirs) do if proc.exists(d) then left[#left + 1] = d end end
  return pids, left
end

--- Let a run of a deliberately broken lock go on ms more (then call
-- before_finish, if given), finish it and assert the checker saw overlaps.
function M.assert_overlaps(run, ms, before_finish)
  run:sleep(ms)
  if before_finish then before_finish() end
  local r = run:finish()
  luassert.is_true(r.overlaps > 0, r:info())
end

--- The last test of a scenario spec: stop every worker, then the fault
-- proxies (a list, may be nil) and every cluster, and assert that no node
-- of cl, no proxy, no worker and no directory is left.
function M.assert_gone(cl, proxies)
  M.stop_all()
  local pids, dir = {}, cl.dir
  for i = 1, cl.n do pids[i] = cl.pids[i] end
  local ppids, pdirs = {}, {}
  for i, px in ipairs(proxies or {}) do ppids[i], pdirs[i] = px.pid, px.dir end
  if proxies then faults.stop_all() end
  cluster.stop_all()
  for i, pid in ipairs(pids) do luassert.is_false(proc.alive(pid), "node " .. i) end
  luassert.is_false(proc.exists(dir), dir)
  for i = 1, #ppids do
    luassert.is_false(proc.alive(ppids[i]), "proxy " .. i)
    luassert.is_false(proc.exists(pdirs[i]), pdirs[i])
  end
  local left, left_dirs = M.leftovers()
  luassert.same({}, left)
  luassert.same({}, left_dirs)
end

return M
