-- The lock/unlock hot path must stay compilable by LuaJIT: run it in a child
-- luajit with jit.v on and hotloop low, against a real 3-node cluster, and
-- require a trace that covers the loop and no "NYI" abort anywhere.
-- (A child process, so the JIT settings do not leak into busted.)

local devcluster = require "redlock.devcluster"
local proc = require "helpers.proc"

local ITERATIONS = 300

-- The loop under test; "-- HOT LOOP" marks its first line.
local CHILD = [==[
local logfile, n = arg[1], tonumber(arg[2])
local urls = {}
for i = 3, #arg do urls[#urls + 1] = arg[i] end
assert(jit and jit.status(), "the JIT is off")

local redlock = require "redlock"
-- A generous node timeout: a busy CI machine must not turn a slow reply into a failed round.
local dlm = redlock.new { servers = urls, ttl = 10000, node_timeout = 1000 }

-- Warm up: every connection established before we measure anything.
local warm = assert(dlm:lock("jit-spec:warmup", { wait = 5000 }))
assert(warm:unlock())

jit.opt.start("hotloop=2", "hotexit=2")
local v = require "jit.v"
v.on(logfile)
local held, failed = 0, 0
for i = 1, n do                                           -- HOT LOOP
  local lock = dlm:try_lock("jit-spec:resource")
  if lock and lock:unlock() then
    held = held + 1
  else
    failed = failed + 1
  end
end
v.off()
io.write("held ", held, " failed ", failed, "\n")
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
    -- Run from dir with a short script name, so jit.v prints "jit_loop.lua:LINE".
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

  it("compiles a trace that covers the loop", function()
    local first
    local n = 0
    for line in (CHILD .. "\n"):gmatch("([^\n]*)\n") do
      n = n + 1
      if line:find("-- HOT LOOP", 1, true) then first = n end
    end
    -- A root trace that starts at the loop itself (not at an inner loop),
    -- e.g. "[TRACE   2 jit_loop.lua:17 loop]".
    local found
    for num, at in log:gmatch("%[TRACE%s+(%d+) jit_loop%.lua:(%d+)") do
      if tonumber(at) == first then found = num break end
    end
    assert.is_truthy(found, ("no trace starts at the loop (line %d); jit.v log:\n%s\nchild output:\n%s")
      :format(first, log, out))
  end)

  it("has no NYI abort", function()
    local nyi = {}
    for line in log:gmatch("[^\n]+") do
      if line:find("NYI", 1, true) then nyi[#nyi + 1] = line end
    end
    assert.is_true(#log > 0, "jit.v wrote nothing; child output:\n" .. out)
    assert.are.same({}, nyi)
  end)
end)
