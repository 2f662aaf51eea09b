-- The Redlock algorithm against real redis-server nodes: acquire, validity,
-- release, extend, expiry, busy, interop with hand-set keys, SCRIPT FLUSH,
-- releasing what we no longer hold, lock_many and with_lock.

local redlock = require "redlock"
local cluster = require "helpers.cluster"
local proc = require "helpers.proc"

local TTL = 10000
local DRIFT = 0.01
-- Loopback slack for "validity is close to ttl": a round takes ~1 ms here;
-- allow far more so a loaded CI machine does not fail the bound.
local SLACK_MS = 250

local res = cluster.names("core") -- res(tag): a resource name no other run uses

local function states(detail)
  local t = {}
  for i = 1, #detail do t[i] = detail[i].state end
  return t
end

local function count_state(detail, state)
  local c = 0
  for i = 1, #detail do if detail[i].state == state then c = c + 1 end end
  return c
end

describe("redlock against real nodes", function()
  teardown(function() cluster.stop_all() end)

  describe("a client", function()
    local cl

    lazy_setup(function() cl = cluster.start(3) end)
    lazy_teardown(function() if cl then cl:stop() end end)

    it("works on first use after idling longer than the connect timeout", function()
      -- connects start in new() and complete while nobody drives the loop;
      -- that must not read as "connect timed out" later
      local dlm = redlock.new { servers = cl.urls, connect_timeout = 300 }
      proc.sleep_ms(600)
      local lock, err, detail = dlm:try_lock(res("idle"))
      assert.is_nil(err, tostring(err) .. " " .. cluster.show(detail))
      assert(lock:unlock())
      dlm:close()
    end)

    it("names its nodes without passwords, in server order", function()
      local dlm = redlock.new { servers = { cl.urls[2], cl.urls[1] } }
      assert.same({ "redis://127.0.0.1:" .. cl.ports[2], "redis://127.0.0.1:" .. cl.ports[1] }, dlm:nodes())
      dlm:close()
    end)

    it("raises when used after close()", function()
      local dlm = redlock.new { servers = cl.urls }
      dlm:close()
      assert.has_error(function() dlm:try_lock(res("closed")) end)
      dlm:close() -- twice is fine
    end)
  end)

  for _, n in ipairs { 1, 3, 5 } do
    describe(("with %d node%s"):format(n, n == 1 and "" or "s"), function()
      local cl, dlm, other
      local quorum = math.floor(n / 2) + 1

      -- Every node (but those in skip) holds value under key r, within ms
      -- (default 1000; 0 = now): an operation decided at quorum may still be
      -- in flight to the other nodes when it returns.
      -- The client is kept busy meanwhile (see cluster.await_all).
      local function holds(r, value, ms, skip)
        local ok, why = cluster.await_value(cl, r, value, ms, skip, dlm)
        assert(ok, why)
      end

      local function pttl_above(r, min)
        assert(cluster.await_all(cl, function(i)
          local p = cluster.pttl(cl, i, r)
          return p > min, "pttl " .. p
        end, 1000, nil, dlm))
      end

      lazy_setup(function()
        cl = cluster.start(n)
        dlm = redlock.new { servers = cl.urls, ttl = TTL, node_timeout = 50, drift_factor = DRIFT }
        other = redlock.new { servers = cl.urls, ttl = TTL }
      end)

      lazy_teardown(function()
        if dlm then dlm:close() end
        if other then other:close() end
        if cl then cl:stop() end
      end)

      it("acquires a lock whose validity is in (0, ttl] and close to ttl", function()
        local r = res("acq")
        local lock, err, detail = dlm:try_lock(r, { ttl = TTL })
        assert.is_nil(err, tostring(err) .. " " .. cluster.show(detail))
        assert.is_table(lock)
        assert.equal(r, lock.resource)
        assert.matches("^%x+$", lock.value)
        assert.equal(40, #lock.value)
        assert.is_true(lock.validity > 0)
        assert.is_true(lock.validity <= TTL)
        -- validity = ttl - elapsed - (ttl*drift + 2): never more than that,
        -- and on loopback not much less.
        assert.is_true(lock.validity <= TTL - (TTL * DRIFT + 2))
        assert.is_true(lock.validity >= TTL - (TTL * DRIFT + 2) - SLACK_MS,
          "validity " .. lock.validity)
        assert.is_true(lock:valid())
        -- the lock was granted at quorum: at least a majority had voted for it
        assert.is_true(lock.votes >= math.floor(n / 2) + 1 and lock.votes <= n, "votes " .. tostring(lock.votes))
        local rem = lock:remaining()
        assert.is_true(rem > 0 and rem <= lock.validity)
        -- SET key value NX PX ttl on every node: the key is the resource name.
        holds(r, lock.value)
        for i = 1, n do
          local pttl = cluster.pttl(cl, i, r)
          assert.is_true(pttl > TTL - 1000 and pttl <= TTL, "pttl " .. pttl)
        end
        assert.is_true(lock:unlock())
      end)

      it("hands out a fresh random value on every acquisition", function()
        local seen = {}
        for _ = 1, 20 do
          local lock = assert(dlm:try_lock(res("val")))
          assert.is_nil(seen[lock.value])
          seen[lock.value] = true
          assert(lock:unlock())
        end
      end)

      it("releases: the key is gone on every node and the lock is no longer valid", function()
        local r = res("rel")
        local lock = assert(dlm:try_lock(r))
        assert.is_true(lock:unlock())
        holds(r, nil)
        assert.is_false(lock:valid())
        -- and someone else can take it at once
        local l2 = assert(other:try_lock(r))
        assert(l2:unlock())
      end)

      it("refuses a held resource with 'busy' and per-node detail", function()
        local r = res("busy")
        local lock = assert(dlm:try_lock(r))
        -- granted at quorum: a node whose connection was still being set up
        -- (a reconnect after a slow round) gets its SET only at dlm's next I/O;
        -- let it land before other contends, or other may take that node first
        holds(r, lock.value, 5000)
        local l2, err, detail = other:try_lock(r)
        assert.is_nil(l2)
        assert.equal("busy", err)
        assert.is_table(detail)
        assert.equal(quorum, detail.quorum)
        assert.is_true(detail.ok < quorum)
        assert.is_number(detail.elapsed)
        assert.equal(n, #detail)
        for i = 1, n do
          assert.equal("redis://127.0.0.1:" .. cl.ports[i], detail[i].server)
        end
        assert.is_true(count_state(detail, "taken") >= n - quorum + 1,
          table.concat(states(detail), ","))
        -- the holder's keys are untouched by the failed attempt
        holds(r, lock.value)
        assert(lock:unlock())
      end)

      it("extends: PTTL grows on every node and remaining() follows", function()
        local r = res("ext")
        local lock = assert(dlm:try_lock(r, { ttl = 1000 }))
        holds(r, lock.value)
        for i = 1, n do assert.is_true(cluster.pttl(cl, i, r) <= 1000) end
        local ok, err = lock:extend(20000)
        assert.is_nil(err)
        assert.is_true(ok)
        pttl_above(r, 15000)
        for i = 1, n do assert.is_true(cluster.pttl(cl, i, r) <= 20000) end
        holds(r, lock.value)
        assert.is_true(lock:remaining() > 15000)
        assert.is_true(lock:remaining() <= 20000 - (20000 * DRIFT + 2))
        assert.is_true(lock:valid())
        assert(lock:unlock())
      end)

      -- Before: lock.validity was the core's double, printed as 2965.9064170001.
      it("gives lock.validity in whole ms, after an extend too, and remaining() within it", function()
        for round = 1, 5 do
          local lock = assert(dlm:try_lock(res("whole" .. round), { ttl = 3000 }))
          assert.are.equal(math.floor(lock.validity), lock.validity)
          assert.is_true(lock.validity > 2000 and lock.validity <= 3000 - (3000 * DRIFT + 2), tostring(lock.validity))
          assert.is_true(lock:remaining() <= lock.validity)
          assert(lock:extend(5000))
          assert.are.equal(math.floor(lock.validity), lock.validity)
          assert.is_true(lock.validity > 4000 and lock.validity <= 5000 - (5000 * DRIFT + 2), tostring(lock.validity))
          assert.is_true(lock:remaining() <= lock.validity)
          assert(lock:unlock())
        end
      end)

      it("expires when not extended: keys vanish and another client gets the lock", function()
        local r = res("exp")
        local lock = assert(dlm:try_lock(r, { ttl = 300 }))
        assert.is_true(lock.validity <= 300)
        assert.is_nil(select(1, other:try_lock(r)))
        proc.sleep_ms(450)
        assert.is_false(lock:valid())
        assert.is_true(lock:remaining() <= 0)
        holds(r, nil, 0)
        local l2 = assert(other:try_lock(r))
        assert(l2:unlock())
      end)

      it("treats a lock set by hand on a majority (SET res other NX PX) as busy", function()
        local r = res("hand")
        for i = 1, quorum do assert.is_true(cluster.set_nx(cl, i, r, "other", 10000)) end
        local lock, err, detail = dlm:try_lock(r)
        assert.is_nil(lock)
        assert.equal("busy", err, cluster.show(detail))
        assert.is_true(count_state(detail, "taken") >= 1)
        -- nothing of ours left anywhere; the other holder's keys untouched
        assert(cluster.await_all(cl, function(i)
          local v = cluster.get(cl, i, r)
          if i <= quorum then return v == "other", v end
          return v == nil, v
        end))
        -- and what we lock, a plain SET NX cannot take (same keys both ways)
        local r2 = res("hand2")
        local mine = assert(dlm:try_lock(r2))
        holds(r2, mine.value)
        for i = 1, n do assert.is_false(cluster.set_nx(cl, i, r2, "intruder", 10000)) end
        assert(mine:unlock())
      end)

      it("still releases and extends after SCRIPT FLUSH on every node", function()
        local r = res("flush")
        local lock = assert(dlm:try_lock(r, { ttl = 2000 }))
        -- make sure the scripts were loaded once, then forget them
        assert(lock:extend(2000))
        for i = 1, n do assert.equal("OK", (cl:cli(i, "SCRIPT", "FLUSH"))) end
        local ok, err = lock:extend(30000)
        assert.is_nil(err)
        assert.is_true(ok)
        pttl_above(r, 20000)
        for i = 1, n do assert.equal("OK", (cl:cli(i, "SCRIPT", "FLUSH"))) end
        ok, err = lock:unlock()
        assert.is_nil(err)
        assert.is_true(ok)
        holds(r, nil)
      end)

      it("reports 'not held' when unlocking an expired lock", function()
        local r = res("expunlock")
        local lock = assert(dlm:try_lock(r, { ttl = 150 }))
        proc.sleep_ms(250)
        local ok, err, detail = lock:unlock()
        assert.is_nil(ok)
        assert.equal("not held", err)
        assert.is_table(detail)
      end)

      it("reports 'not held' and deletes nothing when the lock is now someone else's", function()
        local r = res("stolen")
        local lock = assert(dlm:try_lock(r, { ttl = 150 }))
        proc.sleep_ms(250)
        local theirs = assert(other:try_lock(r, { ttl = 10000 }))
        local ok, err = lock:unlock()
        assert.is_nil(ok)
        assert.equal("not held", err)
        proc.sleep_ms(100) -- give a wrong delete time to land
        holds(r, theirs.value, 0)
        -- extending it fails too ("expired": no validity left) and changes
        -- nothing of theirs
        ok, err = lock:extend(60000)
        assert.is_nil(ok)
        assert.is_truthy(err == "expired" or err == "not held", tostring(err))
        for i = 1, n do assert.is_true(cluster.pttl(cl, i, r) <= 10000) end
        assert(theirs:unlock())
      end)

      it("reports 'not held' when the keys were replaced by hand", function()
        local r = res("replaced")
        local lock = assert(dlm:try_lock(r, { ttl = 10000 }))
        holds(r, lock.value)
        for i = 1, n do cl:cli(i, "SET", r, "someone-else", "PX", "10000") end
        local ok, err = lock:unlock()
        assert.is_nil(ok)
        assert.equal("not held", err)
        proc.sleep_ms(100)
        holds(r, "someone-else", 0)
      end)

      it("keeps keys behind the prefix", function()
        local pdlm = redlock.new { servers = cl.urls, prefix = "app:" }
        local r = res("pfx")
        local lock = assert(pdlm:try_lock(r))
        holds("app:" .. r, lock.value)
        holds(r, nil, 0)
        assert.equal(r, lock.resource)
        assert(lock:unlock())
        holds("app:" .. r, nil)
        pdlm:close()
      end)

      it("lock_many takes all resources, or none of them", function()
        local rs = { res("m1"), res("m2"), res("m3") }
        local locks, err = dlm:lock_many(rs, { ttl = 5000 })
        assert.is_nil(err)
        for k, r in ipairs(rs) do
          assert.equal(r, locks[k].resource)
          holds(r, locks[k].value)
        end
        assert.is_true(locks:unlock())
        for _, r in ipairs(rs) do holds(r, nil) end
        -- one of them held elsewhere: nothing is kept
        local blocker = assert(other:try_lock(rs[2]))
        assert(cluster.await_value(cl, rs[2], blocker.value, 5000, nil, other))
        local none, err2 = dlm:lock_many(rs, { ttl = 5000, retry = function() return nil end })
        assert.is_nil(none)
        assert.equal("busy", err2)
        holds(rs[1], nil)
        holds(rs[2], blocker.value)
        holds(rs[3], nil)
        assert(blocker:unlock())
      end)

      it("with_lock runs fn holding the lock, returns its results and releases", function()
        local r = res("with")
        local seen
        local a, b = dlm:with_lock(r, {}, function(lock, x, y)
          seen = lock.value
          holds(r, lock.value)
          return x + y, "done"
        end, 2, 3)
        assert.equal(5, a)
        assert.equal("done", b)
        assert.is_string(seen)
        holds(r, nil)
      end)

      it("with_lock releases when fn raises, and re-raises", function()
        local r = res("withraise")
        assert.has_error(function()
          dlm:with_lock(r, {}, function() error("boom inside") end)
        end)
        local ok, e = pcall(dlm.with_lock, dlm, r, {}, function() error({ code = 7 }) end)
        assert.is_false(ok)
        assert.same({ code = 7 }, e)
        holds(r, nil)
      end)

      it("with_lock returns nil, err, detail when it cannot acquire", function()
        local r = res("withbusy")
        local blocker = assert(other:try_lock(r))
        local called = false
        local v, err, detail = dlm:with_lock(r, { retry = function() return nil end },
          function() called = true end)
        assert.is_nil(v)
        assert.equal("busy", err)
        assert.is_table(detail)
        assert.is_false(called)
        assert(blocker:unlock())
      end)

      if n > 1 then
        it("accepts a quorum raised to N and then needs every node", function()
          local strict = redlock.new { servers = cl.urls, quorum = n }
          local r = res("quorum")
          assert.is_true(cluster.set_nx(cl, n, r, "other", 10000))
          local lock, err, detail = strict:try_lock(r)
          assert.is_nil(lock)
          assert.equal("busy", err)
          assert.equal(n, detail.quorum)
          holds(r, nil, nil, { [n] = true })
          -- the default quorum would have granted it
          local l2 = assert(dlm:try_lock(r))
          assert(l2:unlock())
          strict:close()
        end)
      end
    end)
  end
end)
