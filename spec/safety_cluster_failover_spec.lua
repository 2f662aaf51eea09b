-- Fault row 9 (docs/SAFETY.md) on a cluster node: the master serving the
-- lock's slot is killed, and the cluster itself promotes its replica, which
-- never got the lock's key.
--
-- Node 1 is a Redis Cluster of 3 masters with a replica each
-- (spec/helpers/rcluster.lua); nodes 2 and 3 are plain. The replica of the
-- master that serves the resource's slot is stopped (SIGSTOP), and that
-- master is given 80 MB of writes in the same slot first: more than the
-- kernel's socket buffers hold (a receive buffer grows to tcp_rmem's
-- maximum at most, 32 MB on some kernels), so what the master writes after them
-- (A's key) waits in the master's own memory for its replica. Node 3 holds
-- another value under the key while A starts, so A's quorum must include
-- node 1; after 1 s the spec deletes it. A holds the lock until its
-- validity has all but run out (ttl 20 s). While A holds it, the master is
-- SIGKILLed and its replica continued: the cluster fails the master over
-- to the replica (cluster-node-timeout 2 s), which has everything but
-- A's key. Then B, C and D contend for the lock (50 ms each), all writing
-- a shared counter.
--
-- 1. Without the option: A got node 1 and node 2 at once; the promoted
--    master is empty, so B makes a majority with it and node 3 while A
--    still holds node 2. The checker counts the overlaps and lost updates.
-- 2. With ?replicas=1 on the cluster's URL: the master's WAIT reports no
--    replica, so node 1's vote fails and its write is undone; A gets the
--    lock only once node 3 is free, on nodes 2 and 3. The failover takes
--    nothing A needs: no overlap, no lost update.
local devcluster = require "redlock.devcluster"
local rcluster = require "helpers.rcluster"
local cluster = require "helpers.cluster"
local proc = require "helpers.proc"
local resp = require "helpers.resp"
local store = require "helpers.fence_store"
local safety = require "helpers.safety"
local socket = require "socket"

local names = cluster.names("safety_cluster_failover")
-- With ttl 12 s, a full test run under load once saw the failover come only
-- after A had left, and the run without the option showed no overlap.
local TTL = 20000
local WORKERS = { "B", "C", "D" }
local JUNK_WRITES, JUNK_BYTES = 10, 8 * 1024 * 1024 -- 80 MB
local FILL = "redis.call('SET', KEYS[1], string.rep('x', tonumber(ARGV[1]))) return 1"

--- Wait until server j of c says it is a master and the cluster is ok
--- again (at most ms); true if it did.
local function await_promoted(c, j, ms)
  local deadline = proc.now_ms() + ms
  while proc.now_ms() < deadline do
    local role = rcluster.cli(c, j, "ROLE")
    local info = rcluster.cli(c, j, "CLUSTER", "INFO")
    if role:match("^master") and info:match("cluster_state:ok") then return true end
    proc.sleep_ms(50)
  end
  return false
end

describe("fault row 9 on a cluster node: the cluster promotes a replica that never got the key", function()
  local scl, sock, plain
  local runs = {}

  setup(function()
    scl = devcluster.start { n = 1 }
    plain = cluster.start(2)
    sock = assert(socket.connect("127.0.0.1", scl.ports[1]))
    sock:settimeout(10)
  end)
  teardown(function()
    safety.stop(runs, sock, scl)
    rcluster.stop_all()
    cluster.stop_all()
  end)

  --- The schedule above; returns A's and the workers' summaries, the
  -- checker's counts, and the times (µs) node 3 was freed and the master killed.
  local function scenario(with_option)
    resp.call(sock, "FLUSHALL")
    for i = 1, 2 do plain:cli(i, "FLUSHALL") end
    local c = rcluster.start(3, { replicas = 1 })
    local stopped
    local ok, a, others, h, times = pcall(function()
      local run = safety.new()
      runs[#runs + 1] = run
      local res = names("r")
      local m = rcluster.owner(c, res)
      local r = rcluster.replica(c, m)
      local urls = { c.url .. (with_option and "?replicas=1" or ""), plain.urls[1], plain.urls[2] }
      -- the replica hears nothing more, and the master's stream to it backs up
      assert(proc.kill(c.pids[r], "STOP"))
      stopped = c.pids[r]
      for k = 1, JUNK_WRITES do
        assert(select(2, rcluster.cli(c, m, "EVAL", FILL, 1, ("{%s}junk:%d"):format(res, k), JUNK_BYTES)))
      end
      assert.is_true(cluster.set_nx(plain, 2, res, "someone-else", 60000))
      local a = run:client("A", { mode = "plain", resource = res, ttl = TTL, hold = "validity", urls = urls,
        store_port = scl.ports[1] })
      local deadline = proc.now_ms() + 1000
      while not proc.read_file(a.ready) and proc.now_ms() < deadline do proc.sleep_ms(5) end
      local freed_us = proc.now_us() -- before the DEL: nobody can take node 3 earlier
      assert.are.equal(1, cluster.del(plain, 2, res))
      run:ready(a)
      local killed_us = proc.now_us()
      assert(proc.kill(c.pids[m], "KILL"))
      assert(proc.wait_gone(c.pids[m], 5000))
      assert(proc.kill(c.pids[r], "CONT"))
      stopped = nil
      assert.is_true(await_promoted(c, r, 20000), "the replica was not promoted")
      io.write(("\n    [row 9b] the replica was promoted %d ms after the kill\n"):format((proc.now_us() - killed_us) / 1000))
      -- what the promoted master has is what its replica had got: not A's key
      assert.are.equal("", rcluster.cli(c, r, "GET", res), "the promoted replica has A's key")
      local workers = {}
      for _, name in ipairs(WORKERS) do
        workers[#workers + 1] = run:client(name, { mode = "plain", resource = res, ttl = TTL, hold = 50, urls = urls,
          store_port = scl.ports[1] })
      end
      local ra, rest = run:result(a, 30000), {}
      for _, w in ipairs(workers) do rest[#rest + 1] = run:result(w, 30000) end
      return ra, rest, run:check(), { freed_us = freed_us, killed_us = killed_us }
    end)
    if stopped then proc.kill(stopped, "CONT") end
    rcluster.stop(c)
    if not ok then error(a, 0) end
    h.lost_updates = h.acquisitions - store.plain_value(sock)
    return a, others, h, times
  end

  it("without the option: the promoted replica lets a second holder in while A holds the lock", function()
    safety.failover_verdict("cluster_", false, scenario(false))
  end)

  it("with ?replicas=1: node 1's vote fails on WAIT, and nobody else gets in while A holds the lock", function()
    safety.failover_verdict("cluster_", true, scenario(true))
  end)
end)
