-- Name resolution never holds up a round. A node named by a host whose DNS
-- server never answers costs rl_client_new at most connect_timeout, and
-- every round after that one failed vote, not the resolver's timeout; once
-- the name resolves, the node joins in on its own.
--
-- The slowness is real: a child process runs in a mount namespace of its own
-- (unshare -m) where /etc/resolv.conf names rl-fakedns (spec/tools), which
-- reads queries and does not answer, with "timeout:3 attempts:1": each
-- lookup of the name hangs for 3 s. That takes root; without it the spec is
-- pending.

local cluster = require "helpers.cluster"
local faults = require "helpers.faults"
local proc = require "helpers.proc"

local CONNECT_TIMEOUT = 500  -- the bound on rl_client_new's lookups, ms
local RESOLVER_MS = 3000     -- how long one lookup of the slow name hangs
local ROUND_BOUND = 1500     -- a round with node_timeout 50 takes a few ms; 30x margin
local SLOW_NAME = "slow.invalid"
local CHILD = "spec/helpers/resolve_child.lua"

-- Run a shell command inside a mount namespace where /etc/resolv.conf is conf.
local function in_namespace(conf, cmd, limit_s)
  return proc.sh(("timeout -k 5 %d unshare -m sh -c %s"):format(limit_s,
    proc.quote("mount --bind " .. proc.quote(conf) .. " /etc/resolv.conf && " .. cmd)))
end

-- Why the fake DNS server cannot be reached from a namespace here, or nil:
-- a name must be looked up through it, answered.
local function unusable(dns, conf)
  dns:set("answer 127.0.0.1")
  local out, rc = in_namespace(conf, "getent ahostsv4 probe.invalid", 20)
  dns:set("deaf")
  if rc ~= 0 or not out:find("127.0.0.1", 1, true) then
    return ("unshare -m with a bind-mounted /etc/resolv.conf does not reach the fake DNS server (exit %s): %s")
      :format(tostring(rc), out)
  end
  return nil
end

-- The child's lines, as lists of fields.
local function records(out)
  local list = {}
  for line in out:gmatch("[^\n]+") do
    local fields = {}
    for f in (line .. "\t"):gmatch("([^\t]*)\t") do fields[#fields + 1] = f end
    list[#list + 1] = fields
  end
  return list
end

-- Run the child once; return its parsed report, the text to show with a
-- failed assertion, and the DNS server's log. Or nil and why it cannot run.
local function run_child(cl, dir)
  local uid = proc.sh("id -u"):gsub("%s", "")
  if uid ~= "0" then return nil, "needs root (unshare -m, UDP port 53); running as uid " .. uid end
  local dns = faults.fakedns()
  local conf = dir .. "/resolv.conf"
  proc.write_file(conf, ("nameserver %s\noptions timeout:%d attempts:1\n"):format(dns.addr, RESOLVER_MS / 1000))
  local why = unusable(dns, conf)
  if why then return nil, why end

  local slow_url = ("redis://%s:%d"):format(SLOW_NAME, cl.ports[3])
  local cmd = ("LUA_PATH=%s LUA_CPATH=%s exec luajit %s %s %s %s %s %d"):format(
    proc.quote(package.path), proc.quote(package.cpath), CHILD,
    proc.quote(cl.urls[1]), proc.quote(cl.urls[2]), proc.quote(slow_url), proc.quote(dns.control), CONNECT_TIMEOUT)
  local out, rc = in_namespace(conf, cmd, 120)
  local log = dns:log()
  local report = { rc = rc, rounds = {}, log = log,
                   context = ("child (exit %s):\n%s\nDNS server:\n%s"):format(tostring(rc), out, log) }
  for _, f in ipairs(records(out)) do
    if f[1] == "round" then
      report.rounds[#report.rounds + 1] = {
        line = table.concat(f, " "), op = f[2], ms = tonumber(f[3]), status = tonumber(f[4]),
        ok = tonumber(f[5]), state3 = tonumber(f[6]), error3 = f[7],
      }
    elseif f[1] == "answering" then
      report.answering = { rounds = tonumber(f[2]), slowest = tonumber(f[3]), failed = tonumber(f[4]) }
    elseif f[1] == "lua_round" then
      report.lua_round = { ms = tonumber(f[2]), result = f[3] }
    else
      report[f[1]] = tonumber(f[2]) -- new, new_two_slow, lua_new, recovered
    end
  end
  return report
end

describe("a node named by a host whose DNS server does not answer", function()
  local cl, dir, report, skip

  lazy_setup(function()
    cl = cluster.start(3)
    dir = proc.tmpdir()
    report, skip = run_child(cl, dir)
  end)
  lazy_teardown(function()
    faults.stop_all()
    cluster.stop_all()
    proc.rmdir(dir)
  end)

  -- The child ran to its end; else the pending reason.
  local function ran()
    if skip then
      pending(skip)
      return false
    end
    assert.equal(0, report.rc, report.context)
    return true
  end

  it("costs rl_client_new connect_timeout, however many such names", function()
    if not ran() then return end
    assert.is_number(report.new, report.context)
    assert.is_true(report.new >= CONNECT_TIMEOUT - 20,
      ("new took %.1f ms: did the lookup not hang? %s"):format(report.new, report.context))
    assert.is_true(report.new < CONNECT_TIMEOUT + 1500, ("new took %.1f ms"):format(report.new))
    -- two such names are looked up at the same time: one bound, not two
    assert.is_number(report.new_two_slow, report.context)
    assert.is_true(report.new_two_slow < 2 * CONNECT_TIMEOUT,
      ("new with two slow names took %.1f ms"):format(report.new_two_slow))
    -- the same through the Lua module
    assert.is_number(report.lua_new, report.context)
    assert.is_true(report.lua_new < CONNECT_TIMEOUT + 1500, ("redlock.new took %.1f ms"):format(report.lua_new))
    -- the resolver really was asked, and left hanging
    assert.matches("query " .. SLOW_NAME .. " %d+ deaf", report.log)
  end)

  it("is one failed vote that says why, in rounds that never wait for the lookup", function()
    if not ran() then return end
    for _, r in ipairs(report.rounds) do
      -- every one a reconnect attempt of the slow node, decided by the two others at once
      assert.is_true(r.ms < ROUND_BOUND, ("round took %.1f ms (a lookup hangs %d ms): %s"):format(r.ms, RESOLVER_MS, r.line))
      assert.equal(1, r.status, r.line) -- RL_STATUS_OK
      assert.equal(2, r.ok, r.line)
      assert.equal(3, r.state3, r.line) -- RL_NODE_ERROR
      assert.matches("name resolution", r.error3, 1, true)
    end
    assert.equal(10, #report.rounds, report.context) -- 5 acquires, 5 releases
    assert.is_table(report.lua_round, report.context)
    assert.is_true(report.lua_round.ms < ROUND_BOUND, report.context)
    assert.equal("ok", report.lua_round.result, report.context)
  end)

  it("votes once the name resolves, and no round waits meanwhile", function()
    if not ran() then return end
    assert.is_number(report.recovered, report.context)
    assert.matches("query " .. SLOW_NAME .. " %d+ answered", report.log)
    assert.is_table(report.answering, report.context)
    assert.equal(0, report.answering.failed, report.context)
    assert.is_true(report.answering.slowest < ROUND_BOUND, report.context)
  end)
end)
