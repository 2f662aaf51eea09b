-- The host with shared holds: `redlock exec --shared` runs commands beside
-- each other and apart from an exclusive exec, and `redlock status` lists
-- the shared holders. The real binary (build/redlock) on real nodes.

local cluster = require "helpers.cluster"
local proc = require "helpers.proc"

local res = cluster.names("host_shared")
local BIN = os.getenv("REDLOCK_HOST") or (proc.build .. "/redlock")
if BIN:sub(1, 1) ~= "/" then BIN = proc.root .. "/" .. BIN end
local q = proc.quote

describe("redlock exec --shared and redlock status", function()
  local cl, dir, env

  setup(function()
    cl = cluster.start(5)
    dir = proc.tmpdir()
    env = { REDLOCK_SERVERS = table.concat(cl.urls, ",") }
  end)

  teardown(function()
    cluster.stop_all()
    if dir then proc.rmdir(dir) end
  end)

  -- Start `redlock exec FLAGS r -- sh -c SCRIPT`; its pid. SCRIPT may use
  -- $MARKS, a file of lines "<tag> start|end <CLOCK_MONOTONIC us>".
  local function exec(tag, flags, r, script)
    return proc.spawn({ BIN, "exec", flags, r, "--", "sh", "-c", script },
      { out = ("%s/%s.out"):format(dir, tag), env = env })
  end

  local function marked(tag, ms)
    return ([[echo "%s start $(date +%%s%%6N) $REDLOCK_VALUE" >> %s; sleep %s; echo "%s end $(date +%%s%%6N)" >> %s]])
      :format(tag, q(dir .. "/marks"), ms / 1000, tag, q(dir .. "/marks"))
  end

  -- tag -> { start =, stop =, value = } from the marks file
  local function spans()
    local t = {}
    for line in (proc.read_file(dir .. "/marks") or ""):gmatch("[^\n]+") do
      local tag, what, at, value = line:match("^(%S+) (%a+) (%d+) ?(%S*)$")
      t[tag] = t[tag] or {}
      t[tag][what == "start" and "start" or "stop"] = tonumber(at)
      if value ~= "" then t[tag].value = value end
    end
    return t
  end

  it("runs shared commands together, an exclusive one alone, and status lists the shared holders", function()
    local r = res("exec")
    local r1 = exec("r1", "--shared", r, marked("r1", 1500))
    local r2 = exec("r2", "-s", r, marked("r2", 1500))
    -- both hold: status shows them
    local deadline = proc.now_ms() + 10000
    repeat proc.sleep_ms(20) until (spans().r1 or {}).start and (spans().r2 or {}).start or proc.now_ms() > deadline
    local out, rc = proc.sh(("env REDLOCK_SERVERS=%s %s status %s"):format(q(env.REDLOCK_SERVERS), q(BIN), q(r)))
    local w = exec("w", "--ttl=3s", r, marked("w", 100))
    for _, pid in ipairs { r1, r2, w } do assert(proc.wait_gone(pid, 20000), "an exec did not finish") end
    local s = spans()
    assert.are.equal(0, rc, out)
    assert.matches("read%s+2 shared holders, pttl %d+ ms", out)
    assert.matches("\nshared holders:\n  ", out, 1, true)
    for _, tag in ipairs { "r1", "r2" } do
      assert.matches("\n  " .. s[tag].value:sub(1, 12):gsub("%p", "%%%0") .. "%.%.%.  on 5 nodes, pttl %d+ ms\n", out)
    end
    assert.matches("held shared: 2 holders on a quorum; the mark on 5 of 5 nodes (quorum 3)", out, 1, true)
    -- shared values, and the two ran together; the exclusive one after both
    assert.matches("^[^/]+/%x+s$", s.r1.value) -- the host's label, then hex, a reader's 's' last
    assert.is_true(s.r1.start < s.r2.stop and s.r2.start < s.r1.stop, "the shared commands did not overlap")
    assert.is_true(s.w.start > s.r1.stop and s.w.start > s.r2.stop, "the exclusive command ran beside a shared one")
    assert.matches("^[^/]+/%x+$", s.w.value)
    -- all gone: status says free
    out, rc = proc.sh(("env REDLOCK_SERVERS=%s %s status %s"):format(q(env.REDLOCK_SERVERS), q(BIN), q(r)))
    assert.are.equal(1, rc, out)
    assert.matches("free: no node holds", out, 1, true)
  end)

  it("refuses --shared with --fence as a usage error", function()
    local out, rc = proc.sh(("env REDLOCK_SERVERS=%s %s exec --shared --fence %s -- true"):format(
      q(env.REDLOCK_SERVERS), q(BIN), q(res("fence"))))
    assert.are.equal(64, rc, out)
    assert.matches("--shared and --fence exclude each other", out, 1, true)
  end)
end)
