-- The lock/unlock hot path must stay compilable by LuaJIT: run it in a child
-- luajit with hotloop low, against a real 3-node cluster, and require that
-- every line of the loop was recorded into a trace that compiled, and no
-- "NYI" abort anywhere.
-- (A child process, so the JIT settings do not leak into busted.)
--
-- Whether the loop's code lands in a root trace at the loop or in side traces
-- of an inner loop it calls (the per-node loop that builds a round's detail)
-- depends on which gets hot first; either way it runs compiled. So the child
-- watches the recorder (jit.attach "record") and reports the loop's lines
-- that a finished trace recorded. (One handler per event: the child writes its
-- own log of traces and aborts rather than run jit.v beside it.)

local devcluster = require "redlock.devcluster"
local proc = require "helpers.proc"

local ITERATIONS = 300

-- The loop under test; "-- HOT LOOP" marks its first line, "-- END" its last.
local CHILD = [==[
local logfile, n = arg[1], tonumber(arg[2])
local urls = {}
for i = 3, #arg do urls[#urls + 1] = arg[i] end
assert(jit and jit.status(), "the JIT is off")
local funcinfo = require("jit.util").funcinfo
local traceerr = require("jit.vmdef").traceerr

local redlock = require "redlock"
-- A generous node timeout: a busy CI machine must not turn a slow reply into a failed round.
local dlm = redlock.new { servers = urls, ttl = 10000, node_timeout = 1000 }

-- Warm up: every connection established before we measure anything.
local warm = assert(dlm:lock("jit-spec:warmup", { wait = 5000 }))
assert(warm:unlock())

-- Lines of this chunk each trace being recorded went through; those of the
-- traces that finished are covered. Every trace's end goes to the log.
local log = assert(io.open(logfile, "w"))
local main, recording, covered = debug.getinfo(1, "f").func, {}, {}
local function where(func, pc)
  local fi = funcinfo(func, pc)
  return fi.loc or "?"
end
local function on_record(tr, func, pc)
  if func == main and recording[tr] then recording[tr][funcinfo(func, pc).currentline] = true end
end
local function on_trace(what, tr, func, pc, err, info)
  if what == "start" then
    recording[tr] = {}
  elseif what == "stop" or what == "abort" then
    if what == "stop" then
      for line in pairs(recording[tr] or {}) do covered[line] = true end
      log:write(("[TRACE %d stopped]\n"):format(tr))
    else
      if type(info) == "function" then info = where(info, 0) end
      local ok, why = pcall(string.format, traceerr[err] or tostring(err), info)
      log:write(("[TRACE --- %s -- %s]\n"):format(where(func, pc), ok and why or tostring(err)))
    end
    recording[tr] = nil
  end
end

jit.opt.start("hotloop=2", "hotexit=2")
jit.attach(on_record, "record")
jit.attach(on_trace, "trace")
local held, failed = 0, 0
for i = 1, n do                                           -- HOT LOOP
  local lock = dlm:try_lock("jit-spec:resource")
  if lock and lock:unlock() then
    held = held + 1
  else
    failed = failed + 1
  end
end                                                       -- END
jit.attach(on_trace)
jit.attach(on_record)
log:close()
local lines = {}
for line in pairs(covered) do lines[#lines + 1] = line end
table.sort(lines)
io.write("held ", held, " failed ", failed, "\n")
io.write("covered ", table.concat(lines, " "), "\n")
]==]

local read = proc.read_file

local q = proc.quote

describe("the lock/unlock hot path", function()
  local cl, dir, log, out

  setup(function()
    cl = devcluster.start { n = 3 }
    dir = proc.tmpdir()
    local f = assert(io.open(dir .. "/jit_loop.lua", "w"))
    f:write(CHILD)
    f:close()

    local root = assert(io.popen("pwd")):read("*l")
    local urls = {}
    for i, u in ipairs(cl.urls) do urls[i] = q(u) end
    -- Run from dir with a short script name, so the trace log says "jit_loop.lua:LINE".
    local cmd = ("cd %s && LUA_PATH=%s LUA_CPATH=%s timeout 120 luajit jit_loop.lua %s %d %s 2>&1")
      :format(q(dir), q(root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;;"),
              q(root .. "/build/?.so;;"), q(dir .. "/jit.log"), ITERATIONS,
              table.concat(urls, " "))
    local p = assert(io.popen(cmd))
    out = p:read("*a")
    p:close()
    log = read(dir .. "/jit.log") or ""
  end)

  teardown(function()
    if cl then cl:stop() end
    proc.rmdir(dir)
  end)

  it("runs every iteration", function()
    assert.are.equal("held " .. ITERATIONS .. " failed 0", out:match("held %d+ failed %d+"),
      "child output:\n" .. out)
  end)

  it("compiles traces that cover the loop", function()
    local first, last
    local n = 0
    for line in (CHILD .. "\n"):gmatch("([^\n]*)\n") do
      n = n + 1
      if line:find("-- HOT LOOP", 1, true) then first = n end
      if line:find("-- END", 1, true) then last = n end
    end
    local covered = {}
    for line in (out:match("covered ([%d ]*)") or ""):gmatch("%d+") do covered[tonumber(line)] = true end
    -- the lines that run on every successful turn: the call, the test, the count
    local missing = {}
    for _, line in ipairs { first + 1, first + 2, first + 3 } do
      if not covered[line] then missing[#missing + 1] = line end
    end
    assert.is_true(last > first + 3)
    assert.are.same({}, missing, ("loop lines %d-%d not in a compiled trace; trace log:\n%s\nchild output:\n%s")
      :format(first, last, log, out))
  end)

  it("has no NYI abort", function()
    local nyi = {}
    for line in log:gmatch("[^\n]+") do
      if line:find("NYI", 1, true) then nyi[#nyi + 1] = line end
    end
    assert.is_true(#log > 0, "the trace log is empty; child output:\n" .. out)
    assert.are.same({}, nyi)
  end)
end)
