-- `redlock status` over a Redis Cluster node (docs/cluster.md): one node,
-- one vote, read at the master serving RESOURCE's hash slot, with the
-- companion keys named after the key's base as the engine names them. A
-- real 3-master cluster (spec/helpers/rcluster.lua) beside two plain nodes;
-- the locks are taken with the Lua library, then read by the real binary.

local redlock = require "redlock"
local rcluster = require "helpers.rcluster"
local cluster = require "helpers.cluster"
local proc = require "helpers.proc"

local q = proc.quote
local ROOT = proc.root
local BIN = os.getenv("REDLOCK_HOST") or (ROOT .. "/build/redlock")
if BIN:sub(1, 1) ~= "/" then BIN = ROOT .. "/" .. BIN end

local res = cluster.names("status-cluster")

--- s with Lua pattern characters escaped.
local function lit(s) return (s:gsub("%p", "%%%0")) end

describe("redlock status on a cluster node", function()
  local c, plain, servers

  lazy_setup(function()
    c = rcluster.start(3)
    plain = cluster.start(2)
    servers = { c.url, plain.urls[1], plain.urls[2] }
  end)
  lazy_teardown(function()
    rcluster.stop_all()
    cluster.stop_all()
  end)

  local function status(list, args)
    local start = proc.now_ms()
    local out, rc = proc.sh(("%s status --servers %s %s 2>&1"):format(q(BIN), q(table.concat(list, ",")), args or ""))
    return out, rc, proc.now_ms() - start
  end

  --- A client over servers whose locks need every node's vote (quorum 3):
  --- the cluster's first vote waits for its map, and must not come late.
  local function client(label)
    return redlock.new { servers = servers, label = label, quorum = 3 }
  end

  --- A resource whose slot master j of c serves.
  local function name_on(j, tag)
    for n = 1, 1000 do
      local name = res(tag .. n)
      if rcluster.owner(c, name) == j then return name end
    end
    error("no name on master " .. j)
  end

  -- Before: exit 64, "status reads plain nodes only".
  it("shows the holder, label and fencing token of a lock on every master of the cluster, MOVED followed", function()
    local dlm = client("st-fence")
    finally(function() dlm:close() end)
    for j = 1, c.n do -- master 1 is the first seed; the others are met by a MOVED
      local name = name_on(j, "fenced")
      assert(dlm:lock(name, { fence = true, ttl = 5000 })):unlock() -- a token taken before: the holder's is 2
      local lock = assert(dlm:lock(name, { fence = true, ttl = 10000 }))
      assert.equals(2, lock.token)
      -- the engine's names on a cluster node: the counter after the key's base
      assert.equals("2", (rcluster.cli(c, j, "GET", "{" .. name .. "}:fence")))
      local out, rc = status(servers, q(name))
      lock:unlock()
      assert.equals(0, rc, out)
      assert.matches(("1  %s%%s+held%%s+%s%%.%%.%%.%%s+pttl %%d+ ms  label st%%-fence  fence 2"):format(lit(c.url),
        lit(lock.value:sub(1, 12))), out)
      assert.matches("held: value " .. lit(lock.value:sub(1, 12)) .. "%.%.%. on 3 of 3 nodes %(quorum 2%)", out)
      assert.matches("holder 'st%-fence', fencing token 2, quorum held for %d+ ms more", out)
    end
  end)

  -- A cluster set to unknown-endpoint names no host in MOVED ("MOVED 123
  -- :port": the server that replied). Before: the node an error, "MOVED
  -- 15495 :port" not followed.
  it("follows a MOVED that names no host (cluster-preferred-endpoint-type unknown-endpoint)", function()
    local function endpoint(kind)
      for j = 1, c.n do rcluster.cli(c, j, "CONFIG", "SET", "cluster-preferred-endpoint-type", kind) end
    end
    local dlm = client("st-noend")
    endpoint("unknown-endpoint")
    finally(function() -- one finally a test: busted keeps the last one given
      dlm:close()
      endpoint("ip")
    end)
    local name = name_on(3, "noendpoint")
    local moved = rcluster.cli(c, 1, "GET", name)
    assert.matches("^MOVED %d+ :" .. c.ports[3] .. "$", moved)
    local lock = assert(dlm:lock(name, { ttl = 10000 }))
    local out, rc = status(servers, q(name))
    lock:unlock()
    assert.equals(0, rc, out)
    assert.matches("held: value " .. lit(lock.value:sub(1, 12)) .. "%.%.%. on 3 of 3 nodes", out)
  end)

  it("shows a semaphore's slots with --limit, named after the key's base", function()
    local name = name_on(2, "sem")
    local dlm = client("st-sem")
    finally(function() dlm:close() end)
    -- each taker draws its own order of the slots: take all three, then give
    -- back slot 2 (the hint below looks at slot 1)
    local by_slot = {}
    for _ = 1, 3 do
      local lk = assert(dlm:lock(name, { limit = 3, ttl = 10000 }))
      by_slot[lk.slot] = lk
    end
    local freed = 2
    by_slot[freed]:unlock()
    by_slot[freed] = nil
    assert.not_equals("", (rcluster.cli(c, 2, "GET", "redlock:slot:1:{" .. name .. "}")))
    local out, rc = status(servers, "--limit 3 " .. q(name))
    local hint = status(servers, q(name))
    for _, lk in pairs(by_slot) do lk:unlock() end
    assert.equals(0, rc, out)
    assert.matches("semaphore '" .. lit(name) .. "' of 3 slots on 3 nodes, quorum 2", out)
    for slot = 1, 3 do
      if slot == freed then
        assert.matches("slot " .. slot .. "%s+free", out)
      else
        assert.matches("slot " .. slot .. "%s+st%-sem/%x+%.%.%. on 3 of 3 nodes  label st%-sem", out)
      end
    end
    assert.matches("2 of 3 slots held by a quorum", out, 1, true)
    assert.not_matches("did not answer", out, 1, true)
    -- without --limit, its slot 1 held (on every node) says it is a semaphore
    assert.matches("looks like a semaphore (its slot 1 is held)", hint, 1, true)
  end)

  it("shows the shared holders of a resource held shared", function()
    local name = name_on(3, "shared")
    local dlm = client("st-read")
    finally(function() dlm:close() end)
    local a = assert(dlm:lock(name, { shared = true, ttl = 10000 }))
    local b = assert(dlm:lock(name, { shared = true, ttl = 10000 }))
    local out, rc = status(servers, q(name))
    a:unlock()
    b:unlock()
    assert.equals(0, rc, out)
    assert.matches("1  " .. lit(c.url) .. "%s+read%s+2 shared holders, pttl %d+ ms", out)
    assert.matches("  " .. lit(a.value:sub(1, 12)) .. "%.%.%.  on 3 nodes", out)
    assert.matches("  " .. lit(b.value:sub(1, 12)) .. "%.%.%.  on 3 nodes", out)
    assert.matches("held shared: 2 holders on a quorum; the mark on 3 of 3 nodes (quorum 2)", out, 1, true)
  end)

  it("follows an ASK to the master a migrating slot's keys went to", function()
    local name = name_on(1, "ask")
    local dlm = client("st-ask")
    finally(function() dlm:close() end)
    local lock = assert(dlm:lock(name, { fence = true, ttl = 10000 }))
    local slot = rcluster.slot(c, name)
    local id1, id2 = rcluster.id(c, 1), rcluster.id(c, 2)
    assert(select(2, rcluster.cli(c, 2, "CLUSTER", "SETSLOT", slot, "IMPORTING", id1)))
    assert(select(2, rcluster.cli(c, 1, "CLUSTER", "SETSLOT", slot, "MIGRATING", id2)))
    -- the lock's key and its counter moved; master 1 answers ASK for them
    assert(select(2, rcluster.cli(c, 1, "MIGRATE", "127.0.0.1", c.ports[2], "", 0, 5000, "KEYS", name,
      "{" .. name .. "}:fence")))
    local out, rc = status(servers, q(name))
    for j = 1, c.n do rcluster.cli(c, j, "CLUSTER", "SETSLOT", slot, "NODE", id2) end
    lock:unlock()
    assert.equals(0, rc, out)
    assert.matches(("1  %s%%s+held%%s+%s%%.%%.%%.%%s+pttl %%d+ ms  label st%%-ask  fence 1"):format(lit(c.url),
      lit(lock.value:sub(1, 12))), out)
    assert.matches("on 3 of 3 nodes", out, 1, true)
  end)

  it("counts one master reached through two nodes once (run_id)", function()
    -- the same cluster again, through another seed: both reach master 2,
    -- node 1 by a MOVED from its first seed, node 2 directly
    local name = name_on(2, "twice")
    local again = "redis-cluster://127.0.0.1:" .. c.ports[2]
    local list = { c.url, again, plain.urls[1] }
    local out, rc = status(list, q(name))
    assert.equals(1, rc, out) -- free
    assert.matches("1  " .. lit(c.url) .. "%s+free", out)
    assert.matches("2  " .. lit(again) .. "%s+error  same server as node 1 %(run_id %x+%.%.%.%)", out)
    -- without RESOURCE a cluster node is its first seed that answers: here
    -- master 1, named again as a plain node (another spelling of its
    -- address: the same one is refused as a usage error)
    list[2] = "redis://127.1:" .. c.ports[1]
    out, rc = status(list)
    assert.equals(0, rc, out)
    assert.matches("1  " .. lit(c.url) .. "%s+up%s+%d+%.%d ms", out)
    assert.matches("2  redis://127%.1:%d+%s+error  same server as node 1", out)
    assert.matches("up: 2 of 3 nodes answer (quorum 2)", out, 1, true)
  end)

  it("gives a cluster whose seeds are all dead as not answering, and the next seed a try", function()
    local dead = { "redis-cluster://127.0.0.1:1+127.0.0.1:2", plain.urls[1], plain.urls[2] }
    local name = res("dead")
    local dlm = redlock.new { servers = dead, label = "st-dead" }
    finally(function() dlm:close() end)
    local lock = assert(dlm:lock(name, { ttl = 10000 }))
    local out, rc = status(dead, q(name))
    assert.equals(0, rc, out)
    assert.matches("1  redis%-cluster://127%.0%.0%.1:1%+127%.0%.0%.1:2%s+error  no seed answers; seed 127%.0%.0%.1:2: "
      .. "connect: ", out)
    assert.matches("held: value " .. lit(lock.value:sub(1, 12)) .. "%.%.%. on 2 of 3 nodes", out)
    out, rc = status(dead)
    assert.equals(0, rc, out)
    assert.matches("1  redis%-cluster://%S+%s+error  no seed answers", out)
    assert.matches("up: 2 of 3 nodes answer (quorum 2)", out, 1, true)
    -- a dead seed first, a live one after it: the live one is asked
    local list = { "redis-cluster://127.0.0.1:1+127.0.0.1:" .. c.ports[1], plain.urls[1], plain.urls[2] }
    out, rc = status(list)
    assert.equals(0, rc, out)
    assert.matches("up: 3 of 3 nodes answer (quorum 2)", out, 1, true)
    lock:unlock()
  end)

  -- Before: a stopped first seed (its connection taken, nothing answered)
  -- used up the probe's whole 500 ms, and the next seed was never asked.
  it("asks the next seed when the first one is stopped", function()
    local list = { ("redis-cluster://127.0.0.1:%d+127.0.0.1:%d"):format(c.ports[1], c.ports[2]), plain.urls[1],
                   plain.urls[2] }
    assert(proc.kill(c.pids[1], "STOP"))
    local out, rc = status(list)
    assert(proc.kill(c.pids[1], "CONT"))
    assert.equals(0, rc, out)
    assert.matches("up: 3 of 3 nodes answer (quorum 2)", out, 1, true)
  end)

  -- Before: a redis-cluster:// URL of a server without cluster support was
  -- read as a cluster node (its fence counter looked for under the key's
  -- base), though the engine refuses its vote.
  it("gives a redis-cluster:// URL of a plain server as an error, as the engine does", function()
    local port = plain.urls[1]:match(":(%d+)$")
    local list = { "redis-cluster://127.0.0.1:" .. port, plain.urls[2], c.url }
    local out, rc = status(list, q(res("plain")))
    assert.matches("error  seed 127%.0%.0%.1:" .. port .. ": not a cluster node %(cluster support disabled%)", out)
    assert.equals(1, rc, out)
    out = status(list)
    assert.matches("up: 2 of 3 nodes answer (quorum 2)", out, 1, true)
  end)

  it("reads a rediss-cluster:// node over TLS, MOVED followed to a TLS master", function()
    local tls = require "helpers.tls"
    local pki = tls.make()
    local t = rcluster.start(3, { tls = pki })
    local list = { t.url, plain.urls[1], plain.urls[2] }
    -- quorum 3: no lock without the TLS cluster's vote (its first one
    -- waits for the map and the handshakes)
    local dlm = redlock.new { servers = list, label = "st-tls", tls = { cafile = pki.ca }, quorum = 3 }
    finally(function()
      dlm:close()
      rcluster.stop(t)
    end)
    local name
    for n = 1, 1000 do
      name = res("tls" .. n)
      if rcluster.owner(t, name) ~= 1 then break end
    end
    local lock = assert(dlm:lock(name, { fence = true, ttl = 10000 }))
    local out, rc = status(list, "--cacert " .. q(pki.ca) .. " " .. q(name))
    lock:unlock()
    assert.equals(0, rc, out)
    assert.matches(("1  %s%%s+held%%s+%s%%.%%.%%.%%s+pttl %%d+ ms  label st%%-tls  fence 1"):format(lit(t.url),
      lit(lock.value:sub(1, 12))), out)
    assert.matches("on 3 of 3 nodes", out, 1, true)
  end)

  it("gives a MOVED to a master that does not answer as an error within the probe's 500 ms", function()
    local name = name_on(2, "stopped")
    local dlm = client("st-stop")
    finally(function() dlm:close() end)
    local lock = assert(dlm:lock(name, { ttl = 10000 }))
    assert(proc.kill(c.pids[2], "STOP"))
    local out, rc, took = status(servers, q(name))
    proc.kill(c.pids[2], "CONT")
    lock:unlock()
    assert.equals(0, rc, out)
    assert.matches("1  " .. lit(c.url) .. "%s+error  MOVED to 127%.0%.0%.1:" .. c.ports[2]
      .. ": .*no answer within 500 ms", out)
    assert.matches("on 2 of 3 nodes", out, 1, true)
    assert.is_true(took < 2000, "status took " .. took .. " ms")
  end)
end)
