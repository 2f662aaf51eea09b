-- Keep-alive against real nodes: a kept lock outlives its ttl while Lua is
-- busy; a kept lock that is dropped without unlock() is released, not kept
-- forever; an error after the acquire does not leave the lock behind; a
-- manual extend sets the ttl the keeper goes on with; an unlock that finds
-- our value gone makes the lock lost; check() raises for a released lock; a
-- tampered lock raises instead of answering with another call's result.

local redlock = require "redlock"
local cluster = require "helpers.cluster"
local proc = require "helpers.proc"

local res = cluster.names("keepalive") -- res(tag): a resource name no other run uses

-- lock:check() raises, with message (after the caller's position).
local function check_raises(lock, message)
  local ok, err = pcall(function() lock:check() end)
  assert.is_false(ok)
  assert.are.equal(message, (tostring(err):gsub("^[^:]+:%d+: ", "")))
end

-- The smallest PTTL of key over the nodes (-2 where a node lacks it).
local function min_pttl(cl, key)
  local m
  for i = 1, cl.n do
    local p = cluster.pttl(cl, i, key)
    if m == nil or p < m then m = p end
  end
  return m
end

describe("keep-alive", function()
  local cl, dlm

  lazy_setup(function() cl = cluster.start(3) end)
  lazy_teardown(function() if cl then cl:stop() end end)
  before_each(function() dlm = redlock.new { servers = cl.urls, ttl = 1000 } end)
  after_each(function() dlm:close() end)

  it("keeps a lock past several ttls while Lua is busy elsewhere", function()
    local r = res("busy")
    local lock = assert(dlm:lock(r, { ttl = 300, keepalive = true }))
    os.execute("sleep 1") -- a blocking call: no Lua code runs for 3 ttls
    assert.is_true(lock:valid())
    assert.is_false(lock:lost())
    assert(cluster.await_value(cl, r, lock.value, 10))
    assert(lock:unlock())
    assert(cluster.await_value(cl, r, nil, 1000))
  end)

  -- Before: the keeper extended a collected lock for the life of the process
  -- (key still held 2.5 s later with a 1000 ms ttl).
  it("releases a kept lock whose object is collected without unlock()", function()
    local r = res("dropped")
    do
      local lock = assert(dlm:lock(r, { ttl = 30000, keepalive = true }))
      assert(cluster.await_value(cl, r, lock.value, 1000))
    end
    collectgarbage()
    collectgarbage()
    -- released by the keeper thread, long before the 30 s ttl
    local gone, why = cluster.await_value(cl, r, nil, 5000)
    assert(gone, why)
    local other = assert(dlm:try_lock(r))
    assert(other:unlock())
  end)

  it("does not touch a collected lock that was unlocked, nor a client closed first", function()
    local r = res("unlocked")
    do
      local lock = assert(dlm:lock(r, { keepalive = true }))
      assert(lock:unlock())
    end
    local other = assert(dlm:lock(r, { ttl = 30000, keepalive = true }))
    collectgarbage()
    collectgarbage()
    proc.sleep_ms(100)
    assert(cluster.await_value(cl, r, other.value, 10)) -- the new holder's key is intact
    assert(other:unlock())

    local closing = redlock.new { servers = cl.urls }
    do assert(closing:lock(res("closed"), { ttl = 2000, keepalive = true })) end
    closing:close()
    collectgarbage()  -- the lock's finalizer runs after its keeper is gone: no crash
    collectgarbage()
  end)

  -- Calls of SET (the acquire command) handled by the nodes so far.
  local function sets() return cluster.calls(cl, "set") end

  -- Before: keep() raised after the acquire had succeeded, and the key
  -- stayed on every node for its ttl.
  it("releases the lock when keep-alive cannot take it after the acquire, then raises", function()
    -- The keeper starts on first use of keep-alive and dials with the
    -- client's options: spoilt here, it cannot start, once the lock is held.
    dlm.options.quorum = 99
    local r = res("refused")
    local before = sets()
    assert.has_error(function()
      dlm:lock(r, { ttl = 30000, keepalive = true })
    end)
    assert.is_true(sets() > before, "no acquire was sent")
    assert(cluster.await_value(cl, r, nil, 10))
    assert.has_error(function()
      dlm:try_lock(r, { ttl = 30000, keepalive = true })
    end)
    assert(cluster.await_value(cl, r, nil, 10))
    assert.has_error(function()
      dlm:lock_many({ r, r .. ":2" }, { ttl = 30000, keepalive = true })
    end)
    assert(cluster.await_value(cl, r, nil, 10))
    assert(cluster.await_value(cl, r .. ":2", nil, 10))
  end)

  -- Before: a margin keep-alive could not take was found out only after the
  -- acquire.
  it("refuses a margin keep-alive could not take before acquiring anything", function()
    local r = res("margin")
    local before = sets()
    assert.has_error(function()
      dlm:lock(r, { ttl = 30000, keepalive = true, margin = 2 ^ 40 })
    end)
    assert.has_error(function()
      dlm:try_lock(r, { ttl = 30000, keepalive = true, margin = 2 ^ 40 })
    end)
    assert.has_error(function()
      dlm:lock_many({ r, r .. ":2" }, { ttl = 30000, keepalive = true, margin = 2 ^ 40 })
    end)
    assert.equal(before, sets(), "an acquire was sent")
    assert(cluster.await_value(cl, r, nil, 10))
    assert(cluster.await_value(cl, r .. ":2", nil, 10))
  end)

  -- Before: the keeper extended every ttl/3 whatever the margin, so a lock
  -- kept with a margin above two thirds of its ttl turned lost before its
  -- first extension (ttl 3000, margin 2500: lost after ~470 ms).
  it("extends a lock kept with a large margin before the margin is reached", function()
    local r = res("large_margin")
    -- validity less margin: ~2.7 s; extended every (ttl - margin) / 3 = 1 s
    local lock = assert(dlm:lock(r, { ttl = 30000, keepalive = true, margin = 27000 }))
    proc.sleep_ms(4000)
    assert.is_false(lock:lost())
    assert.is_true(lock:valid())
    local pttl = min_pttl(cl, r)
    assert.is_true(pttl > 27000, "PTTL after the keeper's extensions: " .. pttl)
    assert(lock:unlock())
  end)

  -- Before: extend(1000) on a lock kept with a 2500 ms margin returned true,
  -- and the lock was lost at once: the keeper stopped extending it.
  it("refuses an extend to a ttl not above the margin, and keeps the lock", function()
    local r = res("extend_margin")
    local lock = assert(dlm:lock(r, { ttl = 30000, keepalive = true, margin = 2500 }))
    assert.has_error(function() lock:extend(2500) end,
      "bad argument #1 to 'extend' (ttl must leave a validity above the lock's keep-alive margin (2500 ms), got 2500)")
    -- nor one whose validity would not be above it (2530 would: 2530 - 27.3 ms)
    assert.has_error(function() lock:extend(2520) end,
      "bad argument #1 to 'extend' (ttl must leave a validity above the lock's keep-alive margin (2500 ms), got 2520)")
    assert.is_false(lock:lost())
    assert(lock:extend(20000))
    assert.is_false(lock:lost())
    assert(lock:unlock())
  end)

  -- Before: keep-alive found our value gone from a quorum and lost() said
  -- so, but remaining() still counted the last extension's validity (about
  -- 3.9 s of a 6 s ttl): redlock exec gave its command the grace period
  -- beside the next holder.
  it("leaves no validity to a kept lock whose value is gone from a quorum", function()
    local r = res("taken")
    local lock = assert(dlm:lock(r, { ttl = 6000, keepalive = true }))
    for i = 1, 2 do cl:cli(i, "SET", r, "someone-else", "PX", "6000") end
    local deadline = proc.now_ms() + 5000 -- an extension every 2 s finds it
    while not lock:lost() and proc.now_ms() < deadline do proc.sleep_ms(20) end
    assert.is_true(lock:lost())
    assert.is_true(lock:remaining() <= 0, "remaining() " .. lock:remaining())
    assert.is_false(lock:valid())
    local ok, err, detail = lock:extend()
    assert.is_nil(ok)
    assert.are.equal("expired", err)
    assert.are.equal("the lock was lost: keep-alive found it gone or could not extend it in time", detail.message)
  end)

  -- Before: extend() on a lock keep-alive had found lost extended it on the
  -- nodes and returned true, while lost() stayed true, check() raised and
  -- the keeper never extended it again.
  it("refuses to extend a kept lock once it is lost, and sends nothing", function()
    local r = res("lost_extend")
    local lock = assert(dlm:lock(r, { ttl = 3000, keepalive = true, margin = 1500 }))
    cl:kill(2, "STOP")
    cl:kill(3, "STOP")
    local ok, err = pcall(function()
      local deadline = proc.now_ms() + 5000
      while not lock:lost() and proc.now_ms() < deadline do proc.sleep_ms(20) end
      assert.is_true(lock:lost())
    end)
    cl:kill(2, "CONT")
    cl:kill(3, "CONT")
    assert(ok, err)
    local pexpires = cluster.calls(cl, "pexpire") + cluster.calls(cl, "evalsha")
    local done, why = lock:extend()
    assert.is_nil(done)
    assert.are.equal("expired", why)
    assert.is_true(lock:lost())
    assert.are.equal(pexpires, cluster.calls(cl, "pexpire") + cluster.calls(cl, "evalsha"))
  end)

  -- Before: the keeper had let go of the lock before the release was sent,
  -- and "not held" marked nothing: lost() false, valid() true, check()
  -- passing and remaining() about 1400 while another client held the lock.
  it("turns a kept lock lost when its unlock finds our value gone", function()
    local r = res("unlock_gone")
    local lock = assert(dlm:lock(r, { ttl = 3000, keepalive = true }))
    for i = 1, cl.n do cluster.del(cl, i, r) end
    local dlm2 = redlock.new { servers = cl.urls }
    local other = assert(dlm2:lock(r, { ttl = 10000 }))
    local ok, err = lock:unlock()
    assert.is_nil(ok)
    assert.are.equal("not held", err)
    assert.is_true(lock:lost())
    assert.is_false(lock:valid())
    assert.is_true(lock:remaining() <= 0, "remaining() " .. lock:remaining())
    check_raises(lock, ("lost: the lock on '%s' is no longer held"):format(r))
    assert(cluster.await_value(cl, r, other.value, 10)) -- the other holder's key is intact
    assert(other:unlock())
    dlm2:close()
  end)

  -- Before: after an unlock that failed (two nodes stopped), the lock stayed
  -- valid and check() passed, though its release ran on those nodes as soon
  -- as they resumed and another client could take the lock at once (for
  -- ever without keep-alive; until its next extension with it).
  -- A lock on r whose unlock failed with nodes 2 and 3 stopped (they run
  -- again when it returns, the release queued for them with it).
  local function unlock_failed(r, keepalive)
    local lock = assert(dlm:lock(r, { ttl = 3000, keepalive = keepalive }))
    assert(cl:kill(2, "STOP"))
    assert(cl:kill(3, "STOP"))
    local ok, err = lock:unlock()
    assert(cl:kill(2, "CONT"))
    assert(cl:kill(3, "CONT"))
    assert.is_nil(ok)
    assert.are.equal("unavailable", err)
    return lock
  end

  for _, keepalive in ipairs { false, true } do
    it(("makes a lock lost at once when its unlock fails (keepalive = %s)"):format(tostring(keepalive)), function()
      local r = res("unlock_failed")
      local lock = unlock_failed(r, keepalive)
      assert.is_true(lock:lost())
      assert.is_false(lock:valid())
      assert.is_true(lock:remaining() <= 0)
      local checked, why = pcall(lock.check, lock)
      assert.is_false(checked)
      assert.matches("is no longer held (an unlock of it failed: its release may have run on the nodes)", why, 1, true)
      assert(cluster.await_all(cl, function(i) return not cluster.exists(cl, i, r), "still there" end, 10000, nil, dlm))
      local other = assert(dlm:try_lock(r)) -- the release ran on the nodes that resumed
      assert(other:unlock())
      assert.is_true(lock:lost()) -- and stays lost
    end)
  end

  -- Before: an unlock after one that failed (two nodes stopped) said "not
  -- held" with the words of a lost lock, though the value that was gone
  -- was that first unlock's doing, its release run once the nodes resumed.
  it("says so when an unlock finds our value gone after an unlock that failed", function()
    local r = res("unlock_again")
    local lock = unlock_failed(r, true)
    assert(cluster.await_all(cl, function(i) return not cluster.exists(cl, i, r), "still there" end, 10000, nil, dlm))
    -- (before: extend said keep-alive had found it lost)
    local extended, why, extend_detail = lock:extend()
    assert.is_nil(extended)
    assert.are.equal("expired", why)
    assert.matches("an unlock of it failed", extend_detail.message, 1, true)
    local ok, err, detail = lock:unlock()
    assert.is_nil(ok)
    assert.are.equal("not held", err)
    assert.matches("an earlier unlock of this lock failed", detail.message, 1, true)
    -- a group's lock says the same (before: no message)
    local rs = { res("group_again_a"), res("group_again_b") }
    local group = assert(dlm:lock_many(rs, { ttl = 3000 }))
    assert(cl:kill(2, "STOP"))
    assert(cl:kill(3, "STOP"))
    local gok = group:unlock()
    assert(cl:kill(2, "CONT"))
    assert(cl:kill(3, "CONT"))
    assert.is_nil(gok)
    for _, name in ipairs(rs) do
      assert(cluster.await_all(cl, function(i) return not cluster.exists(cl, i, name), "still there" end, 10000, nil,
        dlm))
    end
    local gagain, gerr, gdetail = group:unlock()
    assert.is_nil(gagain)
    assert.are.equal("not held", gerr)
    assert.matches("an earlier unlock of this lock failed", gdetail.message, 1, true)
    -- a first unlock that finds it gone says nothing of the kind
    local other = assert(dlm:lock(r, { ttl = 3000 }))
    for i = 1, cl.n do cluster.del(cl, i, r) end
    ok, err, detail = other:unlock()
    assert.is_nil(ok)
    assert.are.equal("not held", err)
    assert.is_nil(detail.message)
  end)

  -- Before: the keeper went on extending with the ttl it was first handed.
  it("goes on with the ttl of a manual extend", function()
    local r = res("extend")
    local lock = assert(dlm:lock(r, { ttl = 600, keepalive = true }))
    assert(lock:extend(30000))
    assert.is_true(lock:remaining() > 20000)
    proc.sleep_ms(1000) -- several of the old ttl's extension periods
    local pttl = min_pttl(cl, r)
    assert.is_true(pttl > 20000, "PTTL after the keeper's extensions: " .. pttl)
    assert.is_true(lock:remaining() > 20000)
    assert(lock:unlock())
  end)

  -- Before: the keeper went on with the longer ttl it had; a node the
  -- failed extend had not reached could run it after the keeper's next
  -- extension (on the keeper's connections) and keep the key the shorter
  -- ttl only, while the lock counted the longer.
  it("goes on with the shorter ttl of a manual extend that failed", function()
    local r = res("failed_shorter")
    local lock = assert(dlm:lock(r, { ttl = 6000, keepalive = true }))
    assert(cl:kill(2, "STOP"))
    assert(cl:kill(3, "STOP"))
    local ok, err = pcall(function()
      local done, why = lock:extend(3000)
      assert.is_nil(done)
      assert.are_not.equal("not held", why)
    end)
    assert(cl:kill(2, "CONT"))
    assert(cl:kill(3, "CONT"))
    assert(ok, err)
    assert.are.equal(3000, lock.ttl)
    proc.sleep_ms(1500) -- the keeper's extensions, every third of the ttl
    assert.is_true(lock:valid())
    local pttl = min_pttl(cl, r)
    assert.is_true(pttl > 0 and pttl <= 3000, "PTTL after the keeper's extensions: " .. pttl)
    assert(lock:unlock())
  end)
end)

-- Before: valid() said false, but lost() said false too and check()
-- returned the lock, though check() is the guard before a commit.
describe("check() on a lock that was released", function()
  local cl, dlm

  lazy_setup(function() cl = cluster.start(3) end)
  lazy_teardown(function() if cl then cl:stop() end end)
  before_each(function() dlm = redlock.new { servers = cl.urls, ttl = 5000 } end)
  after_each(function() dlm:close() end)

  it("raises once unlock() released it", function()
    local r = res("released")
    local lock = assert(dlm:lock(r, { keepalive = true }))
    assert(lock:unlock())
    assert.is_false(lock:valid())
    assert.is_false(lock:lost())
    check_raises(lock, ("unlocked: the lock on '%s' was released"):format(r))
  end)

  it("raises for a lock that leaked out of with_lock", function()
    local r = res("leaked")
    local leaked = dlm:with_lock(r, nil, function(lock) return lock end)
    check_raises(leaked, ("unlocked: the lock on '%s' was released"):format(r))
  end)

  it("raises for a lock its client's close() released", function()
    local r = res("closed")
    local closing = redlock.new { servers = cl.urls }
    local lock = assert(closing:lock(r, { keepalive = true }))
    closing:close()
    check_raises(lock, ("unlocked: the lock on '%s' was released when its client was closed"):format(r))
  end)
end)

-- with_lock's release is nobody's to try again: when it fails, keep-alive
-- must not go on holding the lock (before, it did until the lock object
-- happened to be collected), and the keeper releases it.
describe("with_lock whose release fails", function()
  local faults = require "helpers.faults"
  local cl

  lazy_setup(function() cl = cluster.start(3) end)
  lazy_teardown(function()
    faults.stop_all()
    if cl then cl:stop() end
  end)

  it("hands the lock to the keeper, which releases it once the nodes answer", function()
    local px = { faults.proxy(cl.ports[2]), faults.proxy(cl.ports[3]) }
    local dlm = redlock.new { servers = { cl.urls[1], px[1].url, px[2].url }, ttl = 3000 }
    local r = res("wlfail")
    collectgarbage("stop") -- the lock object stays: only the keeper may let go of it
    local saved
    local out = dlm:with_lock(r, nil, function(lock)
      saved = lock
      px[1]:set("blackhole")
      px[2]:set("blackhole")
      return "done"
    end)
    assert.are.equal("done", out)
    px[1]:set("pass")
    px[2]:set("pass")
    -- the keeper's release reaches nodes 2 and 3 (before, keep-alive went on
    -- extending them for as long as the object lived)
    local ok = cluster.await_all(cl, function(i) return cluster.get(cl, i, r) == nil end, 6000)
    collectgarbage("restart")
    assert.is_true(ok, "keep-alive went on holding the lock with_lock could not release")
    assert.is_nil(saved.kept)
    dlm:close()
  end)
end)

describe("a lock whose value was tampered with", function()
  local cl, dlm

  lazy_setup(function()
    cl = cluster.start(3)
    dlm = redlock.new { servers = cl.urls, ttl = 5000 }
  end)
  lazy_teardown(function()
    if dlm then dlm:close() end
    if cl then cl:stop() end
  end)

  -- Before: the core refused the call, and unlock()/extend() built
  -- nil, "ok", <detail> from the previous call's result.
  it("raises on extend() and unlock() instead of answering with another call's result", function()
    local good = assert(dlm:lock(res("good")))
    assert(good:extend(5000)) -- the scratch result now holds an "ok"
    local lock = assert(dlm:lock(res("tampered")))
    local value = lock.value
    lock.value = "short"
    assert.has_error(function() lock:extend(5000) end, "redlock: value must be 40 characters")
    assert.has_error(function() lock:unlock() end, "redlock: value must be 40 characters")
    lock.value = value
    assert(lock:unlock())
    assert(good:unlock())
  end)
end)
