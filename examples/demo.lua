-- examples/demo.lua — redlock on a throwaway local 5-node cluster.
--
--   luajit examples/demo.lua [--workers N] [--rounds N] [--nodes N]
--   (scripts/demo sets the paths, builds, and runs this)
--
-- Starts N redis-server nodes on free loopback ports, then several worker OS
-- processes that contend for one resource. Under the lock each worker does a
-- deliberately unsafe read-modify-write of a shared counter file and logs
-- "enter"/"exit" to a shared log. Afterwards the log is checked for overlaps
-- (two holders at once) and the counter for lost updates. Every node is
-- stopped at the end, also when something fails.

local ffi = require "ffi"

if not pcall(ffi.typeof, "rl_demo_timespec") then
  ffi.cdef [[
    typedef struct { long tv_sec; long tv_nsec; } rl_demo_timespec;
    int rl_demo_clock_gettime(int clk, rl_demo_timespec *ts) asm("clock_gettime");
    int rl_demo_poll(void *fds, unsigned long nfds, int timeout) asm("poll");
    int rl_demo_getpid(void) asm("getpid");
  ]]
end
local C = ffi.C
local ts = ffi.new("rl_demo_timespec")
local function now_ms()
  C.rl_demo_clock_gettime(1, ts) -- CLOCK_MONOTONIC
  return tonumber(ts.tv_sec) * 1000 + tonumber(ts.tv_nsec) / 1e6
end
local function sleep_ms(ms) C.rl_demo_poll(nil, 0, ms) end

local function read_file(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("*a")
  f:close()
  return s
end

local function write_file(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

local function q(s) return "'" .. tostring(s):gsub("'", [['\'']]) .. "'" end

local RESOURCE = "demo:counter"

-- A Lua table literal for v (numbers, strings, lists and records of them).
local function literal(v)
  if type(v) == "table" then
    local items = {}
    for i, x in ipairs(v) do items[i] = literal(x) end
    for k, x in pairs(v) do
      if type(k) == "string" then items[#items + 1] = k .. "=" .. literal(x) end
    end
    return "{" .. table.concat(items, ",") .. "}"
  elseif type(v) == "string" then
    return (("%q"):format(v):gsub("\n", "n"))
  end
  return tostring(v)
end

----------------------------------------------------------------------------
-- Worker: luajit examples/demo.lua --worker ID ROUNDS DIR URL...
-- Prints one line: a Lua table literal with its statistics.
----------------------------------------------------------------------------
local function worker(id, rounds, dir, urls)
  local redlock = require "redlock"
  math.randomseed(C.rl_demo_getpid())

  local dlm = redlock.new { servers = urls, ttl = 5000 }
  local policy = redlock.retry.jitter(5, 40, 1000) -- wait 5-40 ms between attempts
  local log = assert(io.open(dir .. "/events.log", "a"))
  log:setvbuf("no") -- one write(2) per event, appended atomically (O_APPEND)

  local stats = { id = id, acquired = 0, failed = 0, retries = 0, wait_ms = 0, max_wait_ms = 0,
                  won = {}, votes = {}, against = {}, errors = {} }
  for i = 1, #urls do stats.won[i], stats.votes[i], stats.against[i] = 0, 0, 0 end

  -- dlm:lock(RESOURCE, { wait = ms, retry = policy }) does this loop in one
  -- call; it is written out here to show what each attempt saw, per node.
  local function acquire()
    local attempt = 0
    while true do
      attempt = attempt + 1
      local lock, err, detail = dlm:try_lock(RESOURCE)
      if lock then return lock end
      stats.retries = stats.retries + 1
      for i, node in ipairs(detail) do
        -- ok: this node granted us the key; taken: another worker holds it there
        if node.state == "ok" then stats.votes[i] = stats.votes[i] + 1
        elseif node.state == "taken" then stats.against[i] = stats.against[i] + 1 end
      end
      local delay = policy(attempt, err)
      if not delay then return nil, err, detail end
      sleep_ms(math.floor(delay))
    end
  end

  for _ = 1, rounds do
    local t0 = now_ms()
    local lock, err = acquire()
    local waited = now_ms() - t0
    stats.wait_ms = stats.wait_ms + waited
    if waited > stats.max_wait_ms then stats.max_wait_ms = waited end
    if lock then
      log:write(("enter %d %s\n"):format(id, lock.value))
      -- The unsafe part: read, think a little, write back.
      local n = tonumber(read_file(dir .. "/counter")) or 0
      sleep_ms(math.random(5, 15))
      write_file(dir .. "/counter", tostring(n + 1))
      log:write(("exit %d %s\n"):format(id, lock.value))
      for i, node in ipairs(type(lock.detail) == "table" and lock.detail or {}) do
        if node.state == "ok" then stats.won[i] = stats.won[i] + 1 end
      end
      local ok, uerr = lock:unlock()
      if not ok then stats.errors[#stats.errors + 1] = "unlock: " .. tostring(uerr) end
      stats.acquired = stats.acquired + 1
    else
      stats.failed = stats.failed + 1
      stats.errors[#stats.errors + 1] = "lock: " .. tostring(err)
    end
    sleep_ms(math.random(0, 3))
  end
  log:close()
  dlm:close()

  io.write(literal(stats), "\n")
end

----------------------------------------------------------------------------
-- Checker: replay the shared log; an "enter" while someone holds the lock is
-- an overlap. Returns overlaps, entries.
----------------------------------------------------------------------------
local function check_history(path)
  local holder, overlaps, entries = nil, 0, 0
  for line in io.lines(path) do
    local what, id, value = line:match("^(%a+) (%d+) (%x+)$")
    if what == "enter" then
      entries = entries + 1
      if holder then overlaps = overlaps + 1 end
      holder = id .. " " .. value
    elseif what == "exit" then
      if holder ~= id .. " " .. value then overlaps = overlaps + 1 end
      holder = nil
    end
  end
  return overlaps, entries
end

----------------------------------------------------------------------------
-- Main
----------------------------------------------------------------------------
local function parse_args(argv)
  local o = { workers = 4, rounds = 10, nodes = 5 }
  local i = 1
  while argv[i] do
    local a, v = argv[i], tonumber(argv[i + 1])
    local key = a:match("^%-%-(%a+)$")
    if not (key and o[key] and v and v >= 1 and v % 1 == 0) then
      io.stderr:write("usage: luajit examples/demo.lua [--workers N] [--rounds N] [--nodes N]\n")
      os.exit(2)
    end
    o[key] = v
    i = i + 2
  end
  return o
end

local function run(cl, o)
  local dir = os.tmpname()
  os.remove(dir)
  assert(os.execute("mkdir -p " .. q(dir)) == 0)
  write_file(dir .. "/counter", "0")
  write_file(dir .. "/events.log", "")

  print(("%d workers (separate luajit processes) x %d rounds on resource %q ...")
    :format(o.workers, o.rounds, RESOURCE))
  local luajit = arg[-1] or "luajit"
  local script = arg[0]
  local urls = {}
  for i, u in ipairs(cl.urls) do urls[i] = q(u) end
  local started = now_ms()
  local pipes = {}
  for id = 1, o.workers do
    pipes[id] = assert(io.popen(("%s %s --worker %d %d %s %s"):format(
      q(luajit), q(script), id, o.rounds, q(dir), table.concat(urls, " "))))
  end
  local results = {}
  for id, p in ipairs(pipes) do
    local out = p:read("*a")
    p:close()
    local chunk = loadstring("return " .. (out:match("(%b{})%s*$") or "nil"))
    results[id] = chunk and chunk()
    if not results[id] then
      error(("worker %d failed:\n%s"):format(id, out), 0)
    end
  end
  local elapsed = now_ms() - started

  local overlaps, entries = check_history(dir .. "/events.log")
  local counter = tonumber(read_file(dir .. "/counter"))
  os.execute("rm -rf " .. q(dir))

  print()
  print(" worker  acquired  failed  attempts lost  avg wait  max wait")
  local acquired, failed, won, votes, against, lost = 0, 0, {}, {}, {}, 0
  for i = 1, #cl.urls do won[i], votes[i], against[i] = 0, 0, 0 end
  for _, r in ipairs(results) do
    local rounds = r.acquired + r.failed
    print(("   %2d    %5d    %5d     %6d     %6.1f ms %6.1f ms"):format(r.id, r.acquired, r.failed,
      r.retries, rounds > 0 and r.wait_ms / rounds or 0, r.max_wait_ms))
    acquired, failed, lost = acquired + r.acquired, failed + r.failed, lost + r.retries
    for i = 1, #cl.urls do
      won[i], votes[i], against[i] = won[i] + r.won[i], votes[i] + r.votes[i], against[i] + r.against[i]
    end
    for _, e in ipairs(r.errors) do print("          error: " .. e) end
  end
  print()
  print(("per-node votes in the %d attempts that lost (busy: another worker held a quorum):"):format(lost))
  print("  node                        for  against   (a node whose answer was not needed counts as neither)")
  for i, u in ipairs(cl.urls) do
    print(("  %-24s %6d   %6d"):format(u, votes[i], against[i]))
  end
  local any_won = 0
  for i = 1, #cl.urls do any_won = any_won + won[i] end
  if any_won > 0 then
    print("per-node votes for the winning attempts:")
    for i, u in ipairs(cl.urls) do print(("  %-24s %6d of %d"):format(u, won[i], acquired)) end
  end
  print()
  print(("acquisitions: %d (failed: %d) in %.1f s"):format(acquired, failed, elapsed / 1000))
  print(("overlaps:     %d   (two holders inside the critical section at once)"):format(overlaps))
  print(("lost updates: %d   (counter is %s, expected %d)"):format(acquired - (counter or 0),
    tostring(counter), acquired))
  local good = overlaps == 0 and counter == acquired and entries == acquired and acquired > 0
  return good
end

local function main(argv)
  local o = parse_args(argv)
  local devcluster = require "redlock.devcluster"
  local redlock = require "redlock"
  print(("redlock %s demo: starting a throwaway %d-node cluster ..."):format(
    tostring(redlock.version or redlock._VERSION), o.nodes))
  -- REDLOCK_DEMO_DIR (set by scripts/demo) holds the nodes' pid files, so the
  -- script can stop them even if this process is interrupted.
  local cl = devcluster.start { n = o.nodes, dir = os.getenv("REDLOCK_DEMO_DIR") }
  for i, u in ipairs(cl.urls) do print(("  node %d  %s  (pid %s)"):format(i, u, tostring(cl.pids[i]))) end
  local ok, res = pcall(run, cl, o)
  print()
  print(("stopping %d nodes ..."):format(o.nodes))
  local stopped, serr = cl:stop()
  if not stopped then io.stderr:write("demo: ", tostring(serr), "\n") end
  if not ok then
    if tostring(res):find("interrupted!", 1, true) then
      io.stderr:write("demo: interrupted; every node was stopped\n")
      return 130
    end
    io.stderr:write("demo: ", tostring(res), "\n")
    return 1
  end
  if not res then
    print("FAILED: mutual exclusion was violated or nothing was acquired")
    return 1
  end
  print("OK: every acquisition was exclusive; no update was lost.")
  return 0
end

if arg[1] == "--worker" then
  local urls = {}
  for i = 5, #arg do urls[#urls + 1] = arg[i] end
  local ok, err = pcall(worker, tonumber(arg[2]), tonumber(arg[3]), arg[4], urls)
  if not ok then
    if tostring(err):find("interrupted!", 1, true) then os.exit(130) end -- Ctrl-C: the parent reports
    io.stderr:write("worker ", arg[2], ": ", tostring(err), "\n")
    os.exit(1)
  end
else
  os.exit(main(arg))
end
