-- A hash slot migrating under load (docs/cluster.md): 4 locking processes
-- read-modify-write a shared counter under one lock on 3 cluster nodes while
-- the lock's slot moves between masters of every cluster, by hand as
-- redis-cli --cluster reshard does it (SETSLOT IMPORTING/MIGRATING,
-- MIGRATE, SETSLOT NODE), twice. The history must hold no overlap and no
-- lost update, and the workers must have met (and followed) MOVED and ASK.

local rcluster = require "helpers.rcluster"
local cluster = require "helpers.cluster"
local history = require "helpers.history"
local proc = require "helpers.proc"

local res = cluster.names("migration")

--- Move slot from master a to master b of cluster c, keys and all; hold
--- the slot in its migrating state for hold_ms first (where ASK is met).
local function migrate(c, slot, a, b, hold_ms)
  local ida, idb = rcluster.id(c, a), rcluster.id(c, b)
  assert(select(2, rcluster.cli(c, b, "CLUSTER", "SETSLOT", slot, "IMPORTING", ida)))
  assert(select(2, rcluster.cli(c, a, "CLUSTER", "SETSLOT", slot, "MIGRATING", idb)))
  proc.sleep_ms(hold_ms)
  for _ = 1, 20 do
    local keys = rcluster.cli(c, a, "CLUSTER", "GETKEYSINSLOT", slot, 100)
    if keys == "" then break end
    local args = { "MIGRATE", "127.0.0.1", c.ports[b], "", 0, 5000, "KEYS" }
    for k in keys:gmatch("[^\n]+") do args[#args + 1] = k end
    rcluster.cli(c, a, unpack(args))
  end
  for j = 1, c.n do rcluster.cli(c, j, "CLUSTER", "SETSLOT", slot, "NODE", idb) end
end

--- Errors of kind word (e.g. "TRYAGAIN") master j has answered (INFO errorstats).
local function errors_of(c, j, word)
  return tonumber(rcluster.cli(c, j, "INFO", "errorstats"):match("errorstat_" .. word .. ":count=(%d+)")) or 0
end

describe("a slot migrating under 4 locking processes", function()
  teardown(function()
    rcluster.stop_all()
    cluster.stop_all()
  end)

  it("keeps mutual exclusion and loses no update; MOVED and ASK are met and followed", function()
    local cs = {}
    for i = 1, 3 do cs[i] = rcluster.start(3) end
    local cnode = cluster.start(1) -- the shared counter
    local dir = proc.tmpdir()
    local logfile, stopfile = dir .. "/history", dir .. "/stop"
    local resource = res("r")
    local pids = {}
    local ok, err = pcall(function()
      for w = 1, 4 do
        local argv = { "luajit", "spec/helpers/rmw_worker.lua", logfile, stopfile, resource,
                       tostring(cnode.ports[1]), cs[1].url, cs[2].url, cs[3].url }
        pids[w] = proc.spawn_luajit(argv, dir .. "/w" .. w .. ".out")
      end
      proc.sleep_ms(500)
      for round = 1, 2 do
        for i = 1, 3 do
          local c = cs[i]
          local slot = rcluster.slot(c, resource)
          local from = rcluster.slot_owner(c, slot)
          migrate(c, slot, from, from % c.n + 1, 300)
        end
        proc.sleep_ms(400 * round)
      end
      proc.write_file(stopfile, "stop\n")
      for w = 1, 4 do assert(proc.wait_gone(pids[w], 20000), "worker " .. w .. " did not stop") end
      local acquired, moved, ask, outs = 0, 0, 0, {}
      for w = 1, 4 do
        local s = proc.read_file(dir .. "/w" .. w .. ".out") or ""
        outs[w] = s
        local a, m, k = s:match("acquired=(%d+) failed=%d+ moved=(%d+) ask=(%d+)")
        assert(a, "worker " .. w .. " said: " .. s)
        acquired, moved, ask = acquired + tonumber(a), moved + tonumber(m), ask + tonumber(k)
      end
      local h = history.check(logfile)
      local counter = tonumber((cnode:cli(1, "GET", "counter")))
      local msg = ("history=%d overlaps=%d unfinished=%d counter=%s lost_updates=%d moved=%d ask=%d\n%s")
        :format(h.acquisitions, h.overlaps, h.unfinished, tostring(counter), h.acquisitions - (counter or 0),
          moved, ask, table.concat(outs))
      print("    [migration] " .. msg:gsub("\n.*", ""))
      assert.equal(0, h.overlaps, msg)
      assert.equal(0, h.unfinished, msg)
      assert.equal(acquired, h.acquisitions, msg)
      assert.equal(h.acquisitions, counter, msg)
      assert.is_true(h.acquisitions > 50, msg)
      assert.is_true(moved > 0, msg)
      assert.is_true(ask > 0, msg)
      -- every cluster's lock key now lives where the slot went, and only there
      for i = 1, 3 do
        local c = cs[i]
        local owner = rcluster.owner(c, resource)
        for j = 1, c.n do
          if j ~= owner then assert.are.equal("0", rcluster.cli(c, j, "CLUSTER", "COUNTKEYSINSLOT",
            rcluster.slot(c, resource))) end
        end
      end
    end)
    proc.write_file(stopfile, "stop\n")
    for _, pid in ipairs(pids) do proc.stop(pid) end
    proc.rmdir(dir)
    assert(ok, err)
  end)

  -- A semaphore's acquire names every slot's key. While its slot migrates
  -- with some of those keys on each side, Redis answers TRYAGAIN; the engine
  -- sends the script again after a pause, so the acquire goes through once
  -- the migration ends within the node timeout (before: a failed vote).
  it("sends a semaphore's acquire again after TRYAGAIN until its slot's migration ends", function()
    local c = rcluster.start(3)
    local resource = res("tryagain")
    local dir = proc.tmpdir()
    local pid
    local ok, err = pcall(function()
      local redlock = require "redlock"
      local dlm = redlock.new { servers = { c.url }, ttl = 10000 }
      local first = assert(dlm:try_lock(resource, { limit = 2 })) -- one slot's key exists, the other's not
      local slot = rcluster.slot(c, resource)
      local from = rcluster.slot_owner(c, slot)
      local to = from % c.n + 1
      assert(select(2, rcluster.cli(c, to, "CLUSTER", "SETSLOT", slot, "IMPORTING", rcluster.id(c, from))))
      assert(select(2, rcluster.cli(c, from, "CLUSTER", "SETSLOT", slot, "MIGRATING", rcluster.id(c, to))))
      local before = errors_of(c, from, "TRYAGAIN")
      pid = proc.spawn_luajit({ "luajit", "spec/helpers/sem_once.lua", resource, "2", "5000", c.url },
        dir .. "/out")
      local deadline = proc.now_ms() + 10000
      while errors_of(c, from, "TRYAGAIN") == before do
        assert(proc.now_ms() < deadline, "the acquire never met TRYAGAIN")
        proc.sleep_ms(10)
      end
      -- the migration ends: the keys move, then the slot's new owner learns
      -- it first, its old one next, the other master last (as redis-cli's
      -- reshard does: in between, a command is never sent back and forth)
      local keys = rcluster.cli(c, from, "CLUSTER", "GETKEYSINSLOT", slot, 100)
      local args = { "MIGRATE", "127.0.0.1", c.ports[to], "", 0, 5000, "KEYS" }
      for k in keys:gmatch("[^\n]+") do args[#args + 1] = k end
      assert(select(2, rcluster.cli(c, from, unpack(args))))
      local order = { to, from }
      for j = 1, c.n do if j ~= to and j ~= from then order[#order + 1] = j end end
      for _, j in ipairs(order) do rcluster.cli(c, j, "CLUSTER", "SETSLOT", slot, "NODE", rcluster.id(c, to)) end
      assert(proc.wait_gone(pid, 15000), "the acquire did not end")
      local out = proc.read_file(dir .. "/out") or ""
      local got, tryagain = out:match("slot=(%S+) tryagain=(%d+)")
      assert.are.equal(tostring(3 - first.slot), got, out) -- the slot the first holder left free
      assert.is_true(tonumber(tryagain) >= 1, out)
      assert.is_true(first:unlock())
    end)
    if pid then proc.stop(pid) end
    proc.rmdir(dir)
    rcluster.stop(c)
    assert(ok, err)
  end)

  -- Redis 7 ends the sharded subscriptions to a slot its master gives up
  -- (it pushes a sunsubscribe). Before, the engine ignored that push and
  -- went on counting on a subscription the slot's master no longer had:
  -- once the slot had moved away and back, a waiter heard no release and
  -- slept out its retry delay (2.7 s of a 5 s poll). Now it asks for the
  -- map and subscribes again where the slot is.
  it("a waiter whose slot moved away and back subscribes again and is woken by the release", function()
    local c = rcluster.start(3)
    local ok, err = pcall(function()
      local redlock = require "redlock"
      local lib = require("redlock.cdefs").lib
      local holder = redlock.new { servers = { c.url } }
      local waiter = redlock.new { servers = { c.url } }
      local name = res("moved-back")
      local channel = "redlock:released:{" .. name .. "}"
      local slot = rcluster.slot(c, name)
      local home = rcluster.slot_owner(c, slot)
      local function subscribers()
        return tonumber(rcluster.cli(c, home, "PUBSUB", "SHARDNUMSUB", channel):match("\n(%d+)$"))
      end
      local function await_subscribed(what)
        local deadline = proc.now_ms() + 5000
        while subscribers() ~= 1 do
          assert(proc.now_ms() < deadline, what)
          lib.rl_sleep(waiter.client, 20) -- the waiter's loop runs meanwhile
        end
      end
      local held = assert(holder:lock(name, { ttl = 30000 }))
      assert.is_nil((waiter:try_lock(name))) -- (the waiter learns the map)
      assert.equal(0, lib.rl_watch(waiter.client, name, #name))
      await_subscribed("the waiter never subscribed")
      migrate(c, slot, home, home % c.n + 1, 0)
      migrate(c, slot, home % c.n + 1, home, 0)
      await_subscribed("the waiter did not subscribe again once its slot was back")
      local heard = lib.rl_heard(waiter.client, name, #name)
      local before = proc.now_ms()
      assert.is_true(held:unlock())
      assert.equal(1, lib.rl_sleep_until(waiter.client, name, #name, heard, 3000))
      assert.is_true(proc.now_ms() - before < 2000)
      lib.rl_unwatch(waiter.client, name, #name)
      holder:close()
      waiter:close()
    end)
    rcluster.stop(c)
    assert(ok, err)
  end)

  -- Redis 7 names a redirection's target as cluster-preferred-endpoint-type
  -- says: "unknown-endpoint" names no host ("MOVED 3999 :6381": the node
  -- that replied), "hostname" the hostname the master announces (the map
  -- names its address too). A slot moved between masters, by hand, 4
  -- times: the first lock after each move is granted by the cluster's vote
  -- (its only node). Before: every move lost the vote under unknown-endpoint
  -- (a shard at host "" that never connects), the first move to each master
  -- under hostname (a second shard for it, its name still being looked up).
  for _, mode in ipairs({ "unknown-endpoint", "hostname" }) do
    it("follows MOVED with cluster-preferred-endpoint-type " .. mode .. ": the first lock after each move is granted", function()
      local c = rcluster.start(3, { config = { "--cluster-preferred-endpoint-type", mode,
        "--cluster-announce-hostname", "localhost" } })
      local ok, err = pcall(function()
        local redlock = require "redlock"
        local dlm = redlock.new { servers = { { cluster = c.seeds } }, ttl = 2000, node_timeout = 200 }
        local resource = res("endpoint-" .. mode)
        assert(dlm:try_lock(resource)):unlock()
        local slot = rcluster.slot(c, resource)
        for move = 1, 4 do
          local from = rcluster.slot_owner(c, slot)
          local to = from % c.n + 1
          assert(select(2, rcluster.cli(c, to, "CLUSTER", "SETSLOT", slot, "IMPORTING", rcluster.id(c, from))))
          assert(select(2, rcluster.cli(c, from, "CLUSTER", "SETSLOT", slot, "MIGRATING", rcluster.id(c, to))))
          for _, j in ipairs({ to, from }) do
            assert(select(2, rcluster.cli(c, j, "CLUSTER", "SETSLOT", slot, "NODE", rcluster.id(c, to))))
          end
          local named = mode == "hostname" and "localhost" or ""
          assert.are.equal(("MOVED %d %s:%d"):format(slot, named, c.ports[to]), (rcluster.cli(c, from, "GET", resource)))
          local lock, why, detail = dlm:try_lock(resource)
          assert.is_truthy(lock, ("move %d: %s %s"):format(move, tostring(why), cluster.show(detail)))
          assert.is_true(lock:unlock())
        end
        assert.is_true(dlm:stats().nodes[1].moved >= 4)
        dlm:close()
      end)
      rcluster.stop(c)
      assert(ok, err)
    end)
  end

  -- Seeds named by host name: the second seed is a shard whose name is
  -- looked up when it first connects. A command for it waits for the
  -- lookup (within the node timeout) rather than failing at once.
  it("a seed named by host name serves its slots from the first lock", function()
    local c = rcluster.start(3, { config = { "--cluster-announce-hostname", "localhost" } })
    local ok, err = pcall(function()
      local redlock = require "redlock"
      local seeds = { "redis://localhost:" .. c.ports[1], "redis://localhost:" .. c.ports[2] }
      local dlm = redlock.new { servers = { { cluster = seeds } }, ttl = 2000, node_timeout = 200 }
      local n, name = 0
      repeat n = n + 1; name = res("named-seed" .. n) until rcluster.owner(c, name) == 2
      local lock, why, detail = dlm:try_lock(name)
      assert.is_truthy(lock, tostring(why) .. " " .. cluster.show(detail))
      assert.is_true(lock:unlock())
      dlm:close()
    end)
    rcluster.stop(c)
    assert(ok, err)
  end)
end)
