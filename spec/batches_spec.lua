-- Large batches that fail leave nothing behind: the cleanup after a failed
-- acquire reaches every node the SET reached, however large the batch, and
-- gets there while the client sits idle afterwards (nobody drives it).
--
-- Before: a node that timed out in three rounds in a row was reset, which is
-- what every node does while it works through a large batch. The reset threw
-- away the queued cleanups while the SETs already sent still ran: 10,000
-- names left thousands of keys with their full ttl on every node.

local ffi = require "ffi"
local redlock = require "redlock"
local cluster = require "helpers.cluster"
local proc = require "helpers.proc"

local faults = require "helpers.faults"

local C = require("redlock.cdefs").lib

-- Wait until no node of cl holds any key (the client is not driven meanwhile).
local function await_empty(cl, ms)
  return cluster.await_all(cl, function(i)
    local n = tonumber(cluster.dbsize(cl, i))
    return n == 0, ("%s keys"):format(tostring(n))
  end, ms)
end

-- Begin n acquires at once through the C API and collect them all; returns
-- how many were granted and how many failed.
local function c_batch(dlm, n, tag)
  local client, r = dlm.client, ffi.new("rl_result")
  for i = 1, n do
    local name = ("%s:%d:%d"):format(tag, proc.getpid(), i)
    assert(C.rl_begin_acquire(client, name, #name, 60000) >= 0)
  end
  local collected, granted = 0, 0
  while collected < n do
    C.rl_run(client, 1000)
    while C.rl_collect(client, r) == 1 do
      collected = collected + 1
      if r.status == C.RL_STATUS_OK then granted = granted + 1 end
    end
  end
  return granted, n - granted
end

describe("a large batch that fails", function()
  local cl

  -- A fresh cluster: the check is "no key at all" on every node.
  before_each(function() cl = cluster.start(3) end)
  after_each(function() if cl then cl:stop() end end)

  describe("on nodes whose replies come late (SETs applied at once, replies 200 ms later)", function()
    local px, servers

    before_each(function()
      px, servers = {}, {}
      for i = 1, 3 do
        px[i] = faults.proxy(cl.ports[i])
        servers[i] = px[i].url
      end
    end)
    after_each(function() for i = 1, 3 do px[i]:stop() end end)

    -- Before: every round timed out, so every node was reset after three,
    -- and the cleanups queued behind were thrown away: keys stayed for 60 s.
    it("lock_many of 2,000 names leaves no key behind while the client idles", function()
      local dlm = redlock.new { servers = servers, node_timeout = 50 }
      assert(dlm:lock(("warm:%d"):format(proc.getpid()))):unlock() -- connected, scripts loaded
      for i = 1, 3 do px[i]:set("delay 200") end
      local names = {}
      for i = 1, 2000 do names[i] = ("batch:%d:%d"):format(proc.getpid(), i) end
      local locks, err = dlm:lock_many(names, { ttl = 60000, retry = function() return nil end })
      assert.is_nil(locks)
      assert.equal("unavailable", err)
      local ok, why = await_empty(cl, 10000)
      assert(ok, why)
      dlm:close()
    end)

    it("2,000 acquires begun at once through the C API leave no key behind", function()
      local dlm = redlock.new { servers = servers, node_timeout = 50 }
      assert(dlm:lock(("warm:%d"):format(proc.getpid()))):unlock()
      for i = 1, 3 do px[i]:set("delay 200") end
      local granted, failed = c_batch(dlm, 2000, "cbatch")
      assert.equal(0, granted)
      assert.equal(2000, failed)
      local ok, why = await_empty(cl, 10000)
      assert(ok, why)
      dlm:close()
    end)
  end)

  -- 1 ms rounds: SETs still on their way when their rounds end, and a first
  -- release that times out before its NOSCRIPT comes back (before: the
  -- scripts were then never loaded on that node, and every later cleanup
  -- there was a NOSCRIPT nobody answered).
  it("20,000 acquires with 1 ms rounds leave no key behind", function()
    local dlm = redlock.new { servers = cl.urls, node_timeout = 1 }
    local granted, failed = c_batch(dlm, 20000, "fast")
    assert.is_true(failed > 0, "1 ms rounds: some acquires must have failed")
    if granted > 0 then return pending("granted " .. granted .. " of 20,000 in 1 ms rounds") end
    local ok, why = await_empty(cl, 10000)
    assert(ok, why)
    dlm:close()
  end)
end)
