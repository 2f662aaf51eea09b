-- Spec helper: nodes that are each a master with one replica, and the
-- failover of one of them to a replica that never got the latest writes.
--
--   local replicated = require "helpers.replicated"
--   local rs = replicated.start(3)   -- rs.masters, rs.replicas (devclusters), rs.links[i] (proxies)
--   rs.urls                          -- the masters' URLs (what a client is given)
--   rs:cut(i)                        -- replica i hears nothing more from master i (a partition)
--   rs:failover(i)                   -- SIGKILL master i; replica i becomes a master on master i's port
--   rs:stop()
--
-- Replica i replicates from master i through a fault proxy
-- (spec/tools/faultproxy.c), so cutting the link is the proxy's
-- "blackhole": the master still counts its replica as connected, and the
-- replica never gets (or acknowledges) what the master writes from then on.
-- The failover is what a sentinel or an operator moving an address would
-- do: the old master is gone (SIGKILL), its replica stops replicating
-- (REPLICAOF NO ONE) and takes over the port clients use (CONFIG SET port,
-- which Redis 7 allows at run time), so a client reconnects to it unawares.
local devcluster = require "redlock.devcluster"
local faults = require "helpers.faults"
local proc = require "helpers.proc"

local M = {}
local RS = {}
RS.__index = RS

--- Wait until every replica's link to its master is up (raises after ms).
local function await_links(self, ms)
  local deadline = proc.now_ms() + (ms or 15000)
  for i = 1, self.n do
    while not self.replicas:cli(i, "INFO", "replication"):find("master_link_status:up", 1, true) do
      if proc.now_ms() > deadline then error("replica " .. i .. " never caught up with its master", 2) end
      proc.sleep_ms(20)
    end
  end
end

--- n masters, each with a replica that replicates from it through a proxy.
function M.start(n)
  -- the replica's full sync starts at once (no diskless delay)
  local self = setmetatable({ n = n, links = {} }, RS)
  self.masters = devcluster.start { n = n, args = { "--repl-diskless-sync-delay", "0" } }
  self.replicas = devcluster.start { n = n, args = { "--repl-diskless-sync-delay", "0" } }
  self.urls = self.masters.urls
  for i = 1, n do
    self.links[i] = faults.proxy(self.masters.ports[i])
    local out = self.replicas:cli(i, "REPLICAOF", "127.0.0.1", tostring(self.links[i].port))
    assert(out == "OK", out)
  end
  await_links(self)
  return self
end

--- Replica i gets nothing more from master i, nor master i its acknowledgements.
function RS:cut(i)
  self.links[i]:set("blackhole")
end

--- Master i dies (SIGKILL); replica i, with whatever it had got, becomes a
-- master and listens on master i's port. Returns the time (µs) the master died.
function RS:failover(i)
  local pid = self.masters.pids[i]
  assert(self.masters:kill(i, "KILL"))
  local killed_us = proc.now_us()
  assert(proc.wait_gone(pid, 10000), "master " .. i .. " survived SIGKILL")
  local out = self.replicas:cli(i, "REPLICAOF", "NO", "ONE")
  assert(out == "OK", out)
  out = self.replicas:cli(i, "CONFIG", "SET", "port", tostring(self.masters.ports[i]))
  assert(out == "OK", out)
  self.replicas.ports[i] = self.masters.ports[i] -- redis-cli reaches it there now
  return killed_us
end

function RS:stop()
  for i = 1, self.n do self.links[i]:stop() end
  self.masters:stop()
  self.replicas:stop()
end

return M
