-- Spec helper: real Redis Clusters on loopback, each of `masters` masters
-- (and, if asked, a replica of each), formed with `redis-cli --cluster create`.
--
--   local rcluster = require "helpers.rcluster"
--   local c = rcluster.start(3)      -- { ports = {...}, pids = {...}, url = "redis-cluster://...", dir = ... }
--   rcluster.cli(c, j, "CLUSTER", "INFO")  -- redis-cli on master j; output, ok
--   rcluster.owner(c, key)           -- the index j of the master serving key's slot
--   rcluster.calls(c, j, "publish")  -- calls of a command on master j (INFO commandstats)
--   rcluster.stop(c)                 -- every process, by pid; its directory removed
--   rcluster.start(3, { tls = pki })  -- TLS only (helpers.tls' certificates), the cluster bus too;
--                                       c.url is then rediss-cluster://, c.seeds rediss://
--   rcluster.start(3, { replicas = 1 }) -- a replica of each master: c.ports[c.n + j] is
--                                       master j's replica (c.replica_of[c.n + j] == j)
--   rcluster.start(3, { config = { "--cluster-preferred-endpoint-type", "unknown-endpoint" } })
--                                    -- more redis-server arguments, for every server
--
-- start waits until every master reports cluster_state:ok and all 16384
-- slots assigned, so a client may use the cluster at once.

local proc = require "helpers.proc"
local sys = require "redlock.devcluster.sys"

local M = {}
local started = {}

--- redis-cli's TLS flags for c ("" without TLS).
local function tls_flags(c)
  if not c.tls then return "" end
  return (" --tls --cacert %s --cert %s --key %s"):format(proc.quote(c.tls.ca), proc.quote(c.tls.client_cert),
    proc.quote(c.tls.client_key))
end

local function cli(c, j, ...)
  local words = { "redis-cli" .. tls_flags(c), "-h", "127.0.0.1", "-p", tostring(c.ports[j]) }
  for _, a in ipairs({ ... }) do words[#words + 1] = proc.quote(tostring(a)) end
  local out, rc = proc.sh(table.concat(words, " "))
  return out:gsub("%s+$", ""), rc == 0
end
M.cli = cli

--- Wait until master j says the cluster is ok and every slot is assigned.
local function await_ok(c, j, deadline)
  while true do
    local out = cli(c, j, "CLUSTER", "INFO")
    if out:match("cluster_state:ok") and out:match("cluster_slots_assigned:16384") then return true end
    if proc.now_ms() > deadline then error(("cluster master %d not ok: %s"):format(j, out)) end
    proc.sleep_ms(20)
  end
end

--- Start a cluster of `masters` masters (default 3); opts.tls: TLS only;
--- opts.replicas = 1: a replica of each master, in sync before this returns;
--- opts.config: more redis-server arguments, for every server.
--- Raises if it does not form within 20 s, its processes stopped.
local form
function M.start(masters, opts)
  local c = { n = masters or 3, ports = {}, bus = {}, pids = {}, dir = proc.tmpdir(), tls = (opts or {}).tls,
              replicas = (opts or {}).replicas or 0, replica_of = {}, config = (opts or {}).config or {} }
  started[#started + 1] = c
  local ok, err = pcall(form, c)
  if not ok then
    M.stop(c)
    error(err, 2)
  end
  return c
end

--- Master j's replica (once formed): its index, or nil.
local function replica_index(c, j)
  for r, m in pairs(c.replica_of) do if m == j then return r end end
end

--- Wait until every replica of c has its master's data flowing.
local function await_replicas(c, deadline)
  for r in pairs(c.replica_of) do
    while not cli(c, r, "INFO", "replication"):match("master_link_status:up") do
      if proc.now_ms() > deadline then error("cluster replica " .. r .. " did not sync") end
      proc.sleep_ms(20)
    end
  end
end

form = function(c)
  local masters = c.n
  local count = masters * (1 + c.replicas)
  local ports = sys.free_ports(2 * count) -- each server's, then its cluster bus port
  for j = 1, count do c.ports[j], c.bus[j] = ports[j], ports[count + j] end
  for j = 1, count do
    local dir = ("%s/%d"):format(c.dir, j)
    os.execute("mkdir -p " .. proc.quote(dir))
    local argv = { "redis-server", "--port", tostring(c.ports[j]), "--bind", "127.0.0.1",
      "--cluster-enabled", "yes", "--cluster-config-file", dir .. "/nodes.conf",
      "--cluster-port", tostring(c.bus[j]),
      "--cluster-node-timeout", "2000", "--dir", dir, "--save", "", "--appendonly", "no",
      "--pidfile", dir .. "/redis.pid" }
    if c.tls then
      argv[3] = "0"
      for _, a in ipairs({ "--tls-port", tostring(c.ports[j]), "--tls-cert-file", c.tls.server_cert,
        "--tls-key-file", c.tls.server_key, "--tls-ca-cert-file", c.tls.ca, "--tls-cluster", "yes",
        "--tls-client-cert-file", c.tls.client_cert, "--tls-client-key-file", c.tls.client_key,
        "--tls-auth-clients", "optional" }) do argv[#argv + 1] = a end
    end
    for _, a in ipairs(c.config) do argv[#argv + 1] = a end
    c.pids[j] = proc.spawn(argv, { out = dir .. "/log" })
  end
  local deadline = proc.now_ms() + 20000
  for j = 1, count do
    while not select(2, cli(c, j, "PING")) or cli(c, j, "PING") ~= "PONG" do
      if proc.now_ms() > deadline then error("cluster master " .. j .. " did not start") end
      proc.sleep_ms(10)
    end
  end
  local hosts = {}
  for j = 1, masters do hosts[j] = "127.0.0.1:" .. c.ports[j] end
  local out, rc = proc.sh("timeout 20 redis-cli" .. tls_flags(c) .. " --cluster create " .. table.concat(hosts, " ")
    .. " --cluster-replicas 0 --cluster-yes")
  assert(rc == 0, out)
  for j = 1, masters do await_ok(c, j, deadline) end
  for j = masters + 1, count do -- master j - masters's replica
    local m = j - masters
    out, rc = proc.sh(("timeout 20 redis-cli%s --cluster add-node 127.0.0.1:%d %s --cluster-slave --cluster-master-id %s")
      :format(tls_flags(c), c.ports[j], hosts[1], (cli(c, m, "CLUSTER", "MYID"))))
    assert(rc == 0, out)
    c.replica_of[j] = m
  end
  for j = masters + 1, count do await_ok(c, j, deadline) end
  await_replicas(c, deadline)
  local scheme = c.tls and "rediss" or "redis"
  c.url = scheme .. "-cluster://" .. table.concat(hosts, "+")
  c.seeds = {}
  for j = 1, masters do c.seeds[j] = scheme .. "://" .. hosts[j] end
end

--- The hash slot of key (CLUSTER KEYSLOT on master 1).
function M.slot(c, key)
  return tonumber((cli(c, 1, "CLUSTER", "KEYSLOT", key)))
end

--- The index of the master serving slot (from CLUSTER SLOTS on master 1).
function M.slot_owner(c, slot)
  local out = cli(c, 1, "CLUSTER", "NODES")
  for line in out:gmatch("[^\n]+") do
    local port = tonumber(line:match("^%S+ [%d%.]+:(%d+)"))
    if line:match("master") then
      for range in line:gmatch(" (%d+%-?%d*)") do
        local lo, hi = range:match("^(%d+)%-(%d+)$")
        lo, hi = tonumber(lo or range), tonumber(hi or range)
        if slot >= lo and slot <= hi then
          for j = 1, c.n do if c.ports[j] == port then return j end end
        end
      end
    end
  end
end

--- The master serving key.
function M.owner(c, key)
  return M.slot_owner(c, M.slot(c, key))
end

--- The port of the master serving key.
function M.owner_port(c, key)
  return c.ports[M.owner(c, key)]
end

--- The node id of master j.
function M.id(c, j)
  return (cli(c, j, "CLUSTER", "MYID"))
end

--- Calls of command (lower case) master j has handled (INFO commandstats).
function M.calls(c, j, command)
  local out = cli(c, j, "INFO", "commandstats")
  return tonumber(out:match("cmdstat_" .. command .. ":calls=(%d+)")) or 0
end

--- Every key on master j (KEYS *).
function M.keys(c, j)
  local out = cli(c, j, "KEYS", "*")
  local keys = {}
  for k in out:gmatch("[^\n]+") do keys[#keys + 1] = k end
  return keys
end

function M.flush(c)
  for j = 1, c.n do cli(c, j, "FLUSHALL") end
end

--- The index of master j's replica (a cluster started with replicas).
function M.replica(c, j)
  return replica_index(c, j)
end

function M.stop(c)
  for j = 1, #c.ports do if c.pids[j] then proc.stop(c.pids[j]) end end
  proc.rmdir(c.dir)
end

function M.stop_all()
  for _, c in ipairs(started) do M.stop(c) end
  started = {}
end

return M
