-- The clock every validity is counted on: rl_now_ms reads CLOCK_BOOTTIME,
-- which goes on while the machine is suspended, as the nodes' expiries do
-- (CLOCK_MONOTONIC stops: a lock would outlive its keys by the time
-- suspended). Suspending is out of a spec's reach; a time namespace
-- (unshare --time) is not: there, CLOCK_BOOTTIME runs 10^6 s ahead of
-- CLOCK_MONOTONIC, so a reading of the wrong clock, or a deadline on one
-- clock waited for on the other, is off by 11 days.

local cluster = require "helpers.cluster"
local proc = require "helpers.proc"

local res = cluster.names("clock")

local OFFSET_S = 1000000

local function namespaces_work()
  local out, rc = proc.sh("unshare --time --boottime " .. OFFSET_S .. " --fork cat /proc/uptime")
  return rc == 0 and tonumber(out:match("^(%S+)")) and tonumber(out:match("^(%S+)")) > OFFSET_S
end

describe("the clock", function()
  local cl

  lazy_setup(function() cl = cluster.start(3) end)
  lazy_teardown(function() if cl then cl:stop() end end)

  -- Before: rl_now_ms read CLOCK_MONOTONIC (10^9 ms behind /proc/uptime here).
  it("is CLOCK_BOOTTIME, and every wait in the library waits on it", function()
    if not namespaces_work() then
      pending("unshare --time does not work here (it needs root and Linux >= 5.6)")
      return
    end
    local r = res("kept")
    local cmd = ("unshare --time --boottime %d --fork env LUA_PATH=%s LUA_CPATH=%s timeout 30 luajit %s %s %s"):format(
      OFFSET_S, proc.quote(package.path), proc.quote(package.cpath),
      proc.quote(proc.root .. "/spec/helpers/boottime_client.lua"), proc.quote(table.concat(cl.urls, ",")), proc.quote(r))
    local out, rc = proc.sh(cmd)
    assert.equals(0, rc, out)
    local offset = tonumber(out:match("clock (%-?%d+)"))
    assert.is_true(offset ~= nil and math.abs(offset) < 1000, out)
    local run_until = tonumber(out:match("run_until (%d+)"))
    assert.is_true(run_until ~= nil and run_until >= 199 and run_until < 5000, out)
    local valid, lost, left = out:match("kept (%a+) (%a+) (%-?%d+)")
    assert.equals("true", valid, out)
    assert.equals("false", lost, out)
    assert.is_true(tonumber(left) > 0 and tonumber(left) <= 1000, out)
    local closed = tonumber(out:match("closed (%d+)"))
    assert.is_true(closed ~= nil and closed < 5000, out)
    for i = 1, 3 do assert.is_nil(cluster.get(cl, i, r), "left held on node " .. i) end
  end)
end)
