-- Fault row 9 (docs/SAFETY.md): a master fails over to a replica that
-- never got the lock's key.
--
-- Three nodes, each a master with one replica (spec/helpers/replicated.lua),
-- ttl 3000 ms. Node 1's replica is cut off from its master (a partition of
-- the replication link; the master still counts it as connected). Node 3
-- holds another value under the key while A starts, so A's quorum must
-- include node 1; after 1 s the spec deletes it. A holds the lock until its
-- validity has all but run out. While A holds it, master 1 is SIGKILLed
-- and its replica is promoted in its place (same port). Then B, C and D
-- contend for the lock (50 ms each), all writing a shared counter.
--
-- 1. Without the option: A got nodes 1 and 2 at once; node 1's key never
--    reached its replica, so the promoted node 1 is empty, and B makes a
--    majority with it and node 3 while A still holds node 2 and believes it
--    holds the lock. The checker counts the overlaps and lost updates.
-- 2. With ?replicas=1 on every node (rl_options.replicas per node): node 1's
--    WAIT reports 0 replicas, so node 1's vote fails ("0 of 1 replicas
--    acknowledged ...") and its write is undone; A gets the lock only once
--    node 3 is free, on nodes 2 and 3, whose replicas have it. The failover
--    of node 1 then takes nothing A needs: no overlap, no lost update.
local devcluster = require "redlock.devcluster"
local redlock = require "redlock"
local cluster = require "helpers.cluster"
local proc = require "helpers.proc"
local resp = require "helpers.resp"
local store = require "helpers.fence_store"
local safety = require "helpers.safety"
local replicated = require "helpers.replicated"
local socket = require "socket"

local names = cluster.names("safety_failover")
local TTL = 3000
local WORKERS = { "B", "C", "D" }

describe("fault row 9: a master fails over to a replica that never got the key", function()
  local scl, sock
  local runs = {}

  setup(function()
    scl = devcluster.start { n = 1 }
    sock = assert(socket.connect("127.0.0.1", scl.ports[1]))
    sock:settimeout(10)
  end)
  teardown(function() safety.stop(runs, sock, scl) end)

  --- node 1 alone, with the option: a lock there fails on WAIT and is undone
  local function wait_refuses(rs, url)
    local dlm = redlock.new { servers = { url }, ttl = TTL, node_timeout = 600 } -- WAIT 250 ms: answered inside it
    local res = names("probe")
    local lock, err, detail = dlm:try_lock(res)
    dlm:close()
    assert.is_nil(lock)
    assert.are.equal("unavailable", err)
    assert.are.equal("0 of 1 replicas acknowledged the write within 250 ms", detail[1].error, cluster.show(detail))
    assert.is_true(cluster.await_all(rs.masters, function(i) return i ~= 1 or not cluster.exists(rs.masters, 1, res) end,
      2000), "the refused write was released on master 1")
  end

  --- The schedule above; returns the checker's counts, A's and the workers'
  -- summaries, and the times (µs) node 3 was freed and master 1 was killed.
  local function scenario(with_option)
    resp.call(sock, "FLUSHALL")
    local rs = replicated.start(3)
    local ok, a, others, h, times = pcall(function()
      local run = safety.new()
      runs[#runs + 1] = run
      local urls = {}
      for i, u in ipairs(rs.urls) do urls[i] = with_option and (u .. "?replicas=1") or u end
      local res = names("r")
      rs:cut(1)
      if with_option then wait_refuses(rs, urls[1]) end
      assert.is_true(cluster.set_nx(rs.masters, 3, res, "someone-else", 60000))
      local a = run:client("A", { mode = "plain", resource = res, ttl = TTL, hold = "validity", urls = urls,
        store_port = scl.ports[1] })
      local deadline = proc.now_ms() + 1000
      while not proc.read_file(a.ready) and proc.now_ms() < deadline do proc.sleep_ms(5) end
      local freed_us = proc.now_us() -- before the DEL: nobody can take node 3 earlier
      assert.are.equal(1, cluster.del(rs.masters, 3, res))
      run:ready(a)
      local killed_us = rs:failover(1)
      -- what the promoted node has is what its replica had got: not A's key
      assert.is_false(cluster.exists(rs.replicas, 1, res), "the promoted replica has A's key")
      local workers = {}
      for _, name in ipairs(WORKERS) do
        workers[#workers + 1] = run:client(name, { mode = "plain", resource = res, ttl = TTL, hold = 50, urls = urls,
          store_port = scl.ports[1] })
      end
      local ra, rest = run:result(a), {}
      for _, w in ipairs(workers) do rest[#rest + 1] = run:result(w) end
      return ra, rest, run:check(), { freed_us = freed_us, killed_us = killed_us }
    end)
    rs:stop()
    if not ok then error(a, 0) end
    h.lost_updates = h.acquisitions - store.plain_value(sock)
    return a, others, h, times
  end

  it("without the option: the promoted replica lets a second holder in while A holds the lock", function()
    safety.failover_verdict("", false, scenario(false))
  end)

  it("with replicas = 1: node 1's vote fails on WAIT, and nobody else gets in while A holds the lock", function()
    safety.failover_verdict("", true, scenario(true))
  end)

  it("leaves no process or directory behind", function()
    local dirs = { scl.dir }
    for _, run in ipairs(runs) do dirs[#dirs + 1] = run.dir end
    local pid = scl.pids[1]
    safety.stop(runs, sock, scl)
    sock = nil
    assert.is_false(proc.alive(pid))
    for _, d in ipairs(dirs) do assert.is_false(proc.exists(d), d) end
  end)
end)
