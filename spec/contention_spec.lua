-- Mutual exclusion under contention: several OS processes hammer one
-- resource; a shared log of enter/exit events and a read-modify-write
-- counter are checked for overlaps and lost updates. Also: waiting for a
-- lock, retry policies, and the bound `wait` puts on them.

local redlock = require "redlock"
local cluster = require "helpers.cluster"
local history = require "helpers.history"
local proc = require "helpers.proc"

local WORKERS = 4
local RUN_MS = 4000

local res = cluster.names("contention") -- res(tag): a resource name no other run uses

-- Run WORKERS worker processes (spec/helpers/worker.lua) in mode against
-- urls for run_ms; return the checker's result and the workers' summaries.
local function hammer(mode, urls, run_ms)
  local dir = proc.tmpdir()
  local logfile, counter = dir .. "/history.log", dir .. "/counter"
  local resource = res("hammer")
  local pids = {}
  local ok, err = pcall(function()
    for w = 1, WORKERS do
      local argv = { "luajit", "spec/helpers/worker.lua", mode, logfile, counter, resource,
                     tostring(run_ms) }
      for _, u in ipairs(urls) do argv[#argv + 1] = u end
      pids[w] = proc.spawn_luajit(argv, dir .. "/worker" .. w .. ".out")
    end
    for w = 1, WORKERS do
      assert(proc.wait_gone(pids[w], run_ms + 20000), "worker " .. w .. " did not finish")
    end
  end)
  for _, pid in ipairs(pids) do proc.stop(pid) end
  local summaries = {}
  for w = 1, WORKERS do
    summaries[w] = proc.read_file(dir .. "/worker" .. w .. ".out") or ""
  end
  local result = history.check(logfile, { counter = counter })
  proc.rmdir(dir)
  if not ok then error(tostring(err) .. "\n" .. table.concat(summaries, "\n"), 0) end
  return result, summaries
end

describe("contention", function()
  local cl

  lazy_setup(function() cl = cluster.start(5) end)
  teardown(function() cluster.stop_all() end)

  describe("the history checker", function()
    it("counts overlaps, unfinished holders and lost updates in a made-up history", function()
      local r = history.check(table.concat({
        "enter 1 1 100", "exit 1 1 200",
        "enter 2 1 150", "exit 2 1 300",   -- overlaps 1/1
        "enter 3 1 300", "exit 3 1 400",   -- touches 2/1 at 300: no overlap
        "enter 4 1 500",                   -- never exits
        "exit 9 9 1",                      -- exit without enter
      }, "\n"), { text = true })
      assert.equal(3, r.acquisitions)
      assert.equal(1, r.overlaps)
      assert.equal(1, r.unfinished)
      assert.equal(1, r.malformed)
    end)

    it("finds the overlaps and lost updates of workers that skip the lock", function()
      local r, summaries = hammer("nolock", cl.urls, 600)
      assert.is_true(r.acquisitions > 50, table.concat(summaries, "\n"))
      assert.is_true(r.overlaps > 0)
      assert.is_true(r.lost_updates > 0)
    end)
  end)

  it("keeps mutual exclusion among " .. WORKERS .. " processes: no overlap, no lost update", function()
    local r, summaries = hammer("lock", cl.urls, RUN_MS)
    local info = table.concat(summaries, "") ..
      ("acquisitions=%d overlaps=%d lost=%d unfinished=%d malformed=%d %s")
      :format(r.acquisitions, r.overlaps, r.lost_updates, r.unfinished, r.malformed,
        table.concat(r.examples, "; "))
    assert.equal(0, r.overlaps, info)
    assert.equal(0, r.lost_updates, info)
    assert.equal(0, r.unfinished, info)
    assert.equal(0, r.malformed, info)
    assert.is_true(r.acquisitions > 50, info)
    for w = 1, WORKERS do
      local acquired, late = summaries[w]:match("acquired=(%d+) failed=%d+ late=(%d+)")
      assert.is_truthy(acquired, "worker " .. w .. " said: " .. summaries[w])
      assert.is_true(tonumber(acquired) > 0, "worker " .. w .. " never got the lock: " .. summaries[w])
      assert.equal("0", late, "a critical section outlived its validity: " .. summaries[w])
    end
  end)

  describe("waiting", function()
    local dlm, other

    lazy_setup(function()
      dlm = redlock.new { servers = cl.urls, ttl = 5000 }
      other = redlock.new { servers = cl.urls, ttl = 5000 }
    end)
    lazy_teardown(function()
      if dlm then dlm:close() end
      if other then other:close() end
    end)

    it("lock() gets the resource once another process releases it", function()
      local r = res("wait")
      local dir = proc.tmpdir()
      local ready = dir .. "/ready"
      local argv = { "luajit", "spec/helpers/holder.lua", r, "300", ready }
      for _, u in ipairs(cl.urls) do argv[#argv + 1] = u end
      local pid = proc.spawn_luajit(argv, dir .. "/out")
      local ok, e = pcall(function()
        local theirs = proc.wait_file(ready, 5000)
        local t0 = proc.now_ms()
        local lock, err = dlm:lock(r, { wait = 5000, retry = redlock.retry.fixed(20, 1000) })
        local ms = proc.now_ms() - t0
        assert.is_nil(err)
        assert.are_not.equal(theirs, lock.value)
        -- after the holder's release (about 300 ms), long before its 10 s ttl
        assert.is_true(ms > 100 and ms < 3000, ("got it after %.1f ms"):format(ms))
        assert.is_true(proc.wait_gone(pid, 5000))
        assert(lock:unlock())
      end)
      local out = proc.read_file(dir .. "/out")
      proc.stop(pid)
      proc.rmdir(dir)
      assert(ok, tostring(e) .. "\nholder said: " .. tostring(out))
    end)

    it("lock() waits out a holder whose lock expires", function()
      local r = res("expire")
      assert(other:try_lock(r, { ttl = 300 }))
      local t0 = proc.now_ms()
      local lock, err = dlm:lock(r, { wait = 3000, retry = redlock.retry.fixed(25, 1000) })
      local ms = proc.now_ms() - t0
      assert.is_nil(err)
      assert.is_true(ms >= 200, ("got it after %.1f ms, before the holder's ttl"):format(ms))
      assert.is_true(ms < 3000)
      assert(lock:unlock())
    end)

    it("try_lock makes exactly one attempt", function()
      local r = res("once")
      local holder = assert(other:try_lock(r))
      local calls = 0
      local lock, err = dlm:try_lock(r, { retry = function() calls = calls + 1; return 1 end })
      assert.is_nil(lock)
      assert.equal("busy", err)
      assert.equal(0, calls)
      assert(holder:unlock())
    end)

    it("calls a custom policy with the attempt number and the last error until it gives up", function()
      local r = res("policy")
      local holder = assert(other:try_lock(r))
      local attempts, lasts = {}, {}
      local lock, err = dlm:lock(r, {
        wait = 10000,
        retry = function(attempt, last)
          attempts[#attempts + 1] = attempt
          lasts[#lasts + 1] = last
          if attempt < 4 then return 5 end
          return nil
        end,
      })
      assert.is_nil(lock)
      assert.equal("busy", err)
      assert.same({ 1, 2, 3, 4 }, attempts)
      assert.equal(4, #lasts)
      assert(holder:unlock())
    end)

    it("bounds the total time by `wait` whatever the policy says", function()
      local r = res("bounded")
      local holder, herr, hd = other:try_lock(r, { ttl = 10000 })
      assert(holder, tostring(herr) .. " " .. cluster.show(hd))
      local t0 = proc.now_ms()
      local lock, err = dlm:lock(r, { wait = 300, retry = redlock.retry.forever(50, 100) })
      local ms = proc.now_ms() - t0
      assert.is_nil(lock)
      assert.is_truthy(err == "busy" or err == "timeout", tostring(err))
      assert.is_true(ms < 300 + 500, ("took %.1f ms for wait = 300"):format(ms))
      assert(holder:unlock())
    end)

    it("ships policies that return delays in range and give up after their attempts", function()
      -- `attempts` counts every attempt, the first included: the policy is
      -- asked after attempt k failed and gives up after the last one.
      local fixed = redlock.retry.fixed(30, 3)
      assert.equal(30, fixed(1))
      assert.equal(30, fixed(2))
      assert.is_nil(fixed(3))
      local jitter = redlock.retry.jitter(10, 20, 100)
      for a = 1, 99 do
        local d = jitter(a)
        assert.is_true(d >= 10 and d < 20, tostring(d))
      end
      assert.is_nil(jitter(100))
      local exp = redlock.retry.exponential { base = 10, cap = 200, attempts = 10 }
      for a = 1, 9 do
        local d = exp(a)
        assert.is_true(d >= 0 and d <= math.min(200, 10 * 2 ^ a), tostring(d))
      end
      assert.is_nil(exp(10))
      local forever = redlock.retry.forever(5, 7)
      for _, a in ipairs { 1, 100, 100000 } do
        local d = forever(a)
        assert.is_true(d >= 5 and d < 7, tostring(d))
      end
    end)

    it("lock_many waits for all resources together", function()
      local rs = { res("m1"), res("m2") }
      local holder = assert(other:try_lock(rs[2], { ttl = 300 }))
      local locks, err = dlm:lock_many(rs, { wait = 3000, retry = redlock.retry.fixed(25, 1000) })
      assert.is_nil(err)
      assert.equal(rs[1], locks[1].resource)
      assert.equal(rs[2], locks[2].resource)
      assert.is_false(holder:valid())
      assert.is_true(locks:unlock())
    end)
  end)
end)
