-- A cluster node whose master dies: the cluster promotes the master's
-- replica, and a client that was already using the cluster must find it.
-- A master that is gone sends no MOVED, so before, such a client kept
-- sending that master's slots to its dead address (connection refused)
-- for as long as it lived, while a fresh client locked them at once. Now a
-- shard that cannot be reached makes the client ask the cluster for its
-- map again (at most once a second while it stays unreachable).
local redlock = require "redlock"
local rcluster = require "helpers.rcluster"
local cluster = require "helpers.cluster"
local proc = require "helpers.proc"

local names = cluster.names("cfailover")
local PROMOTION_MS = 20000 -- cluster-node-timeout 2 s, and an election, on a loaded machine

describe("a cluster node whose master dies", function()
  local c

  before_each(function() c = rcluster.start(3, { replicas = 1 }) end)
  after_each(function() rcluster.stop_all() end)

  --- Wait until server j is a master and the cluster, asked there, is ok
  --- again with every slot served.
  local function await_promoted(j)
    local deadline = proc.now_ms() + PROMOTION_MS
    while proc.now_ms() < deadline do
      local role = rcluster.cli(c, j, "ROLE")
      local info = rcluster.cli(c, j, "CLUSTER", "INFO")
      if role:match("^master") and info:match("cluster_state:ok") and info:match("cluster_slots_ok:16384") then
        return true
      end
      proc.sleep_ms(50)
    end
    return false
  end

  it("is found again on the replica the cluster promotes, by a client that was using it", function()
    local dlm = redlock.new { servers = { { cluster = c.seeds } }, ttl = 3000, node_timeout = 200 }
    local name = names("moved-by-failover")
    assert(dlm:lock(name)):unlock() -- the map, and the master serving name, connected
    local m = rcluster.owner(c, name)
    local r = rcluster.replica(c, m)
    assert(proc.kill(c.pids[m], "KILL"))
    proc.wait_gone(c.pids[m], 5000)
    local lock, err = dlm:try_lock(name) -- its master is gone: a failed vote
    assert.is_nil(lock)
    assert.equal("unavailable", err)
    local detail
    assert(await_promoted(r), "the cluster did not promote master " .. m .. "'s replica")
    -- the same client, asking now and then, gets the lock from the promoted replica
    local deadline = proc.now_ms() + 5000
    repeat
      lock, err, detail = dlm:try_lock(name)
      if not lock then proc.sleep_ms(100) end
    until lock or proc.now_ms() > deadline
    assert(lock, tostring(err) .. " " .. cluster.show(detail))
    local key = rcluster.cli(c, r, "GET", name)
    assert.equal(lock.value, key)
    assert(lock:unlock())
    dlm:close()
  end)
end)
