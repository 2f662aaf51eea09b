-- Spec helper for the safety_*_spec.lua fault scenarios: start holders
-- (spec/helpers/safety_client.lua) as their own processes, read what they
-- printed, and print the "safety row N:" lines that docs/SAFETY.md quotes.
--
--   local safety = require "helpers.safety"
--   local run = safety.new()             -- a directory and the pids started
--   local c = run:client("A", { mode = "plain", resource = r, ttl = 3000,
--                              hold = "validity", urls = cl.urls })
--   run:ready(c)                         -- wait until c holds the lock
--   local r = run:result(c)              -- its summary line as a table
--   run:check()                          -- the history checker's counts
--   run:cleanup()                        -- stop what is left, remove the directory
--   safety.report(5, { { "variant", "x" }, { "overlaps", 1 } })
--
-- The scenes of rows 5-7 (the lock's nodes, a one-node fenced store, a
-- socket to the store):
--   local cl, scl, sock = safety.nodes { n = 3 }
--   safety.stop(runs, sock, scl, cl)         -- teardown: whatever is left
--   safety.assert_gone(runs, sock, scl, cl)  -- nothing left: no process, no directory
-- or, the same as one object for a describe block:
--   local scene = safety.scene { n = 3 }
--   setup(function() cl, scl, sock = scene:start() end)
--   teardown(function() scene:stop() end)
--   local run = scene:run()                  -- all nodes and the store flushed, a new run
--   scene:assert_gone()                      -- the last test
-- Row 9's verdicts (a failover to a replica that never got the key), for a
-- scenario that returns A's and the workers' summaries, the checker's
-- counts and the times node 3 was freed and the master killed:
--   safety.failover_verdict("cluster_", with_option, a, others, h, t)
local devcluster = require "redlock.devcluster"
local cluster = require "helpers.cluster"
local proc = require "helpers.proc"
local resp = require "helpers.resp"
local history = require "helpers.history"
local socket = require "socket"

local M = {}
local Run = {}
Run.__index = Run

function M.new()
  local dir = proc.tmpdir()
  return setmetatable({ dir = dir, log = dir .. "/history.log", pids = {} }, Run)
end

--- Start one holder. o: mode ("plain", "fenced", "kept"), resource, ttl,
-- hold (ms or "validity"), urls, store_port (default 0: none).
function Run:client(name, o)
  local c = { name = name, out = ("%s/%s.out"):format(self.dir, name), ready = ("%s/%s.ready"):format(self.dir, name) }
  local argv = { "luajit", "spec/helpers/safety_client.lua", o.mode, self.log, o.resource, tostring(o.ttl),
    tostring(o.store_port or 0), tostring(o.hold), c.ready }
  for _, u in ipairs(o.urls) do argv[#argv + 1] = u end
  c.pid = proc.spawn_luajit(argv, c.out)
  self.pids[#self.pids + 1] = c.pid
  return c
end

--- Wait until c holds its lock (raises with its output if it did not).
function Run:ready(c, timeout_ms) -- luacheck: ignore 212/self
  local deadline = proc.now_ms() + (timeout_ms or 20000)
  while not proc.read_file(c.ready) do
    if not proc.alive(c.pid) or proc.now_ms() > deadline then
      error(("%s never held the lock: %s"):format(c.name, proc.read_file(c.out) or "(no output)"), 2)
    end
    proc.sleep_ms(2)
  end
end

--- Wait until c has exited; its summary line parsed into a table of
-- key = value (numbers where they are numbers). Raises if it printed none.
function Run:result(c, timeout_ms) -- luacheck: ignore 212/self
  assert(proc.wait_gone(c.pid, timeout_ms or 30000), c.name .. " did not exit")
  local text = proc.read_file(c.out) or ""
  local line = text:match("(acquired=[^\n]*)")
  assert(line, ("%s printed no summary:\n%s"):format(c.name, text))
  local r = { line = line }
  for k, v in line:gmatch("([%w_]+)=(%S+)") do r[k] = tonumber(v) or v end
  return r
end

--- The history checker's counts for this run's log.
function Run:check()
  return history.check(self.log)
end

function Run:cleanup()
  for _, pid in ipairs(self.pids) do proc.stop(pid) end
  proc.rmdir(self.dir)
end

--- The lock's nodes (devcluster.start(opts)), a one-node cluster for the
-- fenced store, and a socket to it.
function M.nodes(opts)
  local cl = devcluster.start(opts)
  local scl = devcluster.start { n = 1 }
  local sock = assert(socket.connect("127.0.0.1", scl.ports[1]))
  sock:settimeout(10)
  return cl, scl, sock
end

--- Stop what is left of a scene (any argument may be nil).
function M.stop(runs, sock, scl, cl)
  for _, run in ipairs(runs) do run:cleanup() end
  if sock then sock:close() end
  if scl then scl:stop() end
  if cl then cl:stop() end
end

--- Stop a scene whose holders must have exited, and raise unless every
-- process (holders and nodes) and directory is gone.
function M.assert_gone(runs, sock, scl, cl)
  local pids, dirs = { scl.pids[1] }, { scl.dir, cl.dir }
  for i = 1, cl.n do pids[#pids + 1] = cl.pids[i] end
  for _, run in ipairs(runs) do
    dirs[#dirs + 1] = run.dir
    for _, pid in ipairs(run.pids) do assert(not proc.alive(pid), "holder " .. pid .. " still runs") end
  end
  M.stop(runs, sock, scl, cl)
  for i = 1, #pids do assert(not proc.alive(pids[i]), "node " .. i .. " still runs") end
  for _, d in ipairs(dirs) do assert(not proc.exists(d), d .. " is still there") end
end

local Scene = {}
Scene.__index = Scene

--- A scene (M.nodes(opts)) and the runs made in it, for one describe block.
function M.scene(opts)
  return setmetatable({ opts = opts, runs = {} }, Scene)
end

--- Start the nodes and the store; returns cl, scl, sock (as M.nodes).
function Scene:start()
  self.cl, self.scl, self.sock = M.nodes(self.opts)
  return self.cl, self.scl, self.sock
end

--- Stop whatever is left (teardown).
function Scene:stop()
  M.stop(self.runs, self.sock, self.scl, self.cl)
  self.sock = nil
end

--- A fresh run: every live node and the store flushed, a new M.new() run
-- that stop() and assert_gone() clean up.
function Scene:run()
  cluster.flush(self.cl)
  resp.call(self.sock, "FLUSHALL")
  local run = M.new()
  self.runs[#self.runs + 1] = run
  return run
end

--- M.assert_gone for this scene.
function Scene:assert_gone()
  M.assert_gone(self.runs, self.sock, self.scl, self.cl)
  self.sock = nil
end

--- Print "safety row N: k=v ..." (fields: a list of { key, value } pairs, in
-- that order) on a line of its own.
function M.report(row, fields)
  local parts = {}
  for _, kv in ipairs(fields) do parts[#parts + 1] = ("%s=%s"):format(kv[1], tostring(kv[2])) end
  io.write(("\nsafety row %d: %s\n"):format(row, table.concat(parts, " ")))
  io.flush()
end

--- The first of the workers to enter, and how long before A's exit it did
-- (ms; < 0: after).
local function first_in(a, others)
  local first = others[1]
  for _, w in ipairs(others) do
    if w.enter_us < first.enter_us then first = w end
  end
  return first, math.floor((a.exit_us - first.enter_us) / 1000)
end

--- Report and check row 9's outcome (see the top). Without the option: A's
-- quorum had node 1 (node 3 was taken), the failover hit A's hold, and a
-- second holder got in while A held the lock, costing updates. With it:
-- node 1 never voted for A, which got in only once node 3 was free, and
-- nobody got in before A left.
function M.failover_verdict(prefix, with_option, a, others, h, t)
  local luassert = require "luassert"
  local _, before_ms = first_in(a, others)
  if with_option then
    M.report(9, { { "variant", prefix .. "wait_replicas_1" }, { "overlaps", h.overlaps },
      { "lost_updates", h.lost_updates }, { "acquisitions", h.acquisitions },
      { "a_entered_after_node3_freed_ms", math.floor((a.enter_us - t.freed_us) / 1000) },
      { "second_entered_after_a_exit_ms", -before_ms } })
  else
    M.report(9, { { "variant", prefix .. "no_wait" }, { "overlaps", h.overlaps }, { "lost_updates", h.lost_updates },
      { "acquisitions", h.acquisitions }, { "a_entered_before_node3_freed", tostring(a.enter_us < t.freed_us) },
      { "second_entered_before_a_exit_ms", before_ms } })
  end
  luassert.are.equal(0, h.malformed + h.unfinished)
  luassert.are.equal(1 + #others, h.acquisitions)
  local when = ("%s; A entered %d ms after node 3 was freed"):format(a.line, math.floor((a.enter_us - t.freed_us) / 1000))
  luassert.is_true(a.enter_us < t.killed_us and t.killed_us < a.exit_us, when)
  if with_option then
    luassert.is_true(a.enter_us > t.freed_us, when)
    luassert.are.equal(0, h.overlaps, table.concat(h.examples, "; "))
    luassert.are.equal(0, h.lost_updates)
    luassert.is_true(before_ms <= 0)
  else
    luassert.is_true(a.enter_us < t.freed_us, when)
    luassert.is_true(h.overlaps >= 1, table.concat(h.examples, "; "))
    luassert.is_true(before_ms > 0)
    luassert.is_true(h.lost_updates >= 1)
  end
end

return M
