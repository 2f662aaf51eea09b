-- Votes that wait for replicas on a cluster node (docs/cluster.md,
-- docs/lua-api.md#nodes-with-replicas): one cluster of 3 masters with a
-- replica each (spec/helpers/rcluster.lua). A write that grants or
-- prolongs a hold is followed by WAIT on the shard that serves its slot,
-- and on no other; a write that MOVED or ASK sends to another master gets
-- its own WAIT there, and that WAIT decides the vote: with that master's
-- replica stopped, the vote fails with the count, though the master that
-- redirected it has a replica in sync.
local redlock = require "redlock"
local rcluster = require "helpers.rcluster"
local cluster = require "helpers.cluster"
local proc = require "helpers.proc"

local names = cluster.names("creplicas")
local NODE_TIMEOUT = 600
local SHORT = "0 of 1 replicas acknowledged the write within 250 ms"

describe("replicas on a cluster node", function()
  local c

  lazy_setup(function() c = rcluster.start(3, { replicas = 1 }) end)
  lazy_teardown(function() rcluster.stop_all() end)

  local function client()
    return redlock.new { servers = { { cluster = c.seeds, replicas = 1 } }, ttl = 3000, node_timeout = NODE_TIMEOUT }
  end

  --- WAIT calls on each master of c.
  local function waits()
    local t = {}
    for j = 1, c.n do t[j] = rcluster.calls(c, j, "wait") end
    return t
  end

  --- Wait until master j has run n more WAITs than in before (at most 3 s).
  local function await_waits(before, j, n)
    local deadline = proc.now_ms() + 3000
    while rcluster.calls(c, j, "wait") - before[j] < n and proc.now_ms() < deadline do proc.sleep_ms(10) end
    return rcluster.calls(c, j, "wait") - before[j]
  end

  --- Give slot (with no keys in it) from master a to master b, everywhere,
  --- the way a resharding does: b importing when it takes the slot, so it
  --- bumps its config epoch. (SETSLOT NODE alone leaves the epochs as they
  --- were: a heartbeat a sent before its SETSLOT could hand the slot back to
  --- a on some nodes, and a write bounce between MOVEDs.)
  local function give_slot(slot, a, b)
    local ida, idb = rcluster.id(c, a), rcluster.id(c, b)
    assert(select(2, rcluster.cli(c, b, "CLUSTER", "SETSLOT", slot, "IMPORTING", ida)))
    assert(select(2, rcluster.cli(c, a, "CLUSTER", "SETSLOT", slot, "MIGRATING", idb)))
    assert(select(2, rcluster.cli(c, b, "CLUSTER", "SETSLOT", slot, "NODE", idb)))
    assert(select(2, rcluster.cli(c, a, "CLUSTER", "SETSLOT", slot, "NODE", idb)))
    for j = 1, #c.ports do
      if j ~= a and j ~= b then rcluster.cli(c, j, "CLUSTER", "SETSLOT", slot, "NODE", idb) end
    end
  end

  local function moved_and_ask(dlm)
    local n = dlm:stats().nodes[1]
    return n.moved, n.ask
  end

  it("waits on the master serving the slot only, after acquires and extensions, never after a release", function()
    local dlm = client()
    local name = names("served")
    dlm:lock(names("warm")):unlock() -- the map
    local owner = rcluster.owner(c, name)
    local before = waits()
    local lock, err, detail = dlm:lock(name)
    assert.is_truthy(lock, tostring(err) .. " " .. cluster.show(detail))
    assert.are.equal(1, await_waits(before, owner, 1))
    assert.is_truthy(lock:extend())
    assert.are.equal(2, await_waits(before, owner, 2))
    assert.is_truthy(lock:unlock())
    proc.sleep_ms(100)
    local after = waits()
    for j = 1, c.n do assert.are.equal(j == owner and 2 or 0, after[j] - before[j], "master " .. j) end
    dlm:close()
  end)

  it("sends a write that MOVED redirects with a WAIT of its own, and that WAIT decides the vote", function()
    local dlm = client()
    local name = names("moved")
    dlm:lock(name):unlock() -- the map names the slot's first master
    local slot = rcluster.slot(c, name)
    local from = rcluster.owner(c, name)
    local to = from % c.n + 1
    give_slot(slot, from, to)
    local before, moved0 = waits(), moved_and_ask(dlm)

    local lock, err, detail = dlm:lock(name)
    assert.is_truthy(lock, tostring(err) .. " " .. cluster.show(detail))
    assert.is_true(moved_and_ask(dlm) > moved0)
    assert.are.equal(1, await_waits(before, to, 1))
    assert.is_truthy(lock:unlock())

    -- the new master's replica stopped: its WAIT answers 0, and fails the vote;
    -- the WAIT left behind the MOVED on the first master (its replica in sync) is not heeded
    local other = names("moved2")
    local i = 0
    while rcluster.owner(c, other) ~= from do i = i + 1; other = names("moved2-" .. i) end
    dlm:lock(other):unlock()
    give_slot(rcluster.slot(c, other), from, to)
    local replica = rcluster.replica(c, to)
    proc.kill(c.pids[replica], "STOP")
    local ok, perr = pcall(function()
      local moved1 = moved_and_ask(dlm)
      local l2, err2, detail2 = dlm:try_lock(other)
      assert.is_nil(l2)
      assert.are.equal("unavailable", err2)
      assert.are.equal(SHORT, detail2[1].error, cluster.show(detail2))
      assert.is_true(moved_and_ask(dlm) > moved1)
    end)
    proc.kill(c.pids[replica], "CONT")
    dlm:close()
    assert(ok, perr)
  end)

  it("sends a write that ASK redirects, after ASKING, with a WAIT of its own on the importing master", function()
    local dlm = client()
    local name = names("ask")
    dlm:lock(name):unlock()
    local slot = rcluster.slot(c, name)
    local from = rcluster.owner(c, name)
    local to = from % c.n + 1
    assert(select(2, rcluster.cli(c, to, "CLUSTER", "SETSLOT", slot, "IMPORTING", rcluster.id(c, from))))
    assert(select(2, rcluster.cli(c, from, "CLUSTER", "SETSLOT", slot, "MIGRATING", rcluster.id(c, to))))
    local before = waits()
    local _, ask0 = moved_and_ask(dlm)
    local lock, err, detail = dlm:lock(name)
    local ok, perr = pcall(function()
      assert.is_truthy(lock, tostring(err) .. " " .. cluster.show(detail))
      local _, ask1 = moved_and_ask(dlm)
      assert.is_true(ask1 > ask0)
      -- (the WAIT left behind the ASK on the old master runs there too, and is not heeded)
      assert.are.equal(1, await_waits(before, to, 1))
    end)
    if lock then lock:unlock() end
    give_slot(slot, from, to)
    dlm:close()
    assert(ok, perr)
  end)
end)
