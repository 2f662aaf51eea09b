-- with_lock against real nodes when the lock does not last the function:
-- a lock lost while the function ran (keep-alive could not extend it, its
-- validity ran out, another client took it) makes with_lock raise after the
-- release, naming the resource; a lock that lasted returns the function's
-- results as they were, also when a minority of nodes is down or the
-- release cannot reach a quorum while the lock is still valid (it then
-- expires on its own, and the section was exclusive).

local redlock = require "redlock"
local cluster = require "helpers.cluster"
local proc = require "helpers.proc"

local res = cluster.names("with_lock_lost") -- res(tag): a resource name no other run uses

-- with_lock's error, without the position in front ("file:line: ").
local function raised(dlm, resource, opts, fn)
  local ok, err = pcall(dlm.with_lock, dlm, resource, opts, fn)
  assert.is_false(ok, "with_lock returned instead of raising")
  return (tostring(err):gsub("^[^:]+:%d+: ", ""))
end

-- Before: with_lock returned fn's results in every case below that raises,
-- as if the section had been exclusive.
describe("with_lock whose lock is lost while the function runs", function()
  local cl, dlm, other

  lazy_setup(function() cl = cluster.start(3) end)
  lazy_teardown(function() if cl then cl:stop() end end)
  before_each(function()
    dlm = redlock.new { servers = cl.urls, ttl = 5000, node_timeout = 100 }
    other = redlock.new { servers = cl.urls }
  end)
  after_each(function()
    for i = 1, cl.n do cl:kill(i, "CONT") end
    dlm:close()
    other:close()
  end)

  it("raises when the function outlives a lock without keep-alive and another client takes it", function()
    local r = res("expired")
    local ran = false
    local err = raised(dlm, r, { ttl = 200, keepalive = false }, function()
      proc.sleep_ms(400)
      local theirs = assert(other:try_lock(r, { ttl = 5000 })) -- the resource is free: ours ran out
      ran = true
      return theirs
    end)
    assert.is_true(ran)
    assert.are.equal(("lock on '%s' was lost while the function ran: its validity ran out before the function returned")
      :format(r), err)
  end)

  -- Before: close() marked the lost lock released: lost() false, check()
  -- "unlocked", and with_lock returned the function's results.
  it("raises when the function closed its client after it found the lock lost", function()
    local r = res("closed")
    local seen
    local err = raised(dlm, r, { ttl = 200, keepalive = false }, function(lk)
      proc.sleep_ms(400)
      assert(other:try_lock(r, { ttl = 5000 }))
      dlm:close()
      seen = { lost = lk:lost(), valid = lk:valid(), check = select(2, pcall(lk.check, lk)) }
      return "done"
    end)
    assert.is_true(seen.lost)
    assert.is_false(seen.valid)
    assert.matches("lost: the lock on '" .. r .. "' was no longer held when its client was closed", seen.check, 1, true)
    assert.are.equal(("lock on '%s' was lost while the function ran: it was no longer held when its client was closed")
      :format(r), err)
  end)

  it("raises when keep-alive cannot extend the lock: a majority of nodes stopped for longer than the ttl", function()
    local r = res("stopped")
    local saw_lost = false
    local err = raised(dlm, r, { ttl = 400 }, function(lock)
      assert(cl:kill(2, "STOP"))
      assert(cl:kill(3, "STOP"))
      local deadline = proc.now_ms() + 3000
      while not lock:lost() and proc.now_ms() < deadline do proc.sleep_ms(10) end
      saw_lost = lock:lost()
      proc.sleep_ms(500) -- the keys on the stopped nodes run out meanwhile
      assert(cl:kill(2, "CONT"))
      assert(cl:kill(3, "CONT"))
      return "done"
    end)
    assert.is_true(saw_lost, "keep-alive never found the lock lost")
    assert.are.equal(("lock on '%s' was lost while the function ran: keep-alive could not extend it in time, "
      .. "or found it gone"):format(r), err)
    local theirs = assert(other:try_lock(r)) -- nothing of ours is left on a quorum
    assert(theirs:unlock())
  end)

  it("raises when the release finds our value gone from a quorum though validity was left", function()
    local r = res("taken")
    local err = raised(dlm, r, { ttl = 30000, keepalive = false }, function()
      for i = 1, cl.n do cluster.del(cl, i, r) end -- an operator (or a node's lost data) let go of it
      assert(other:try_lock(r, { ttl = 5000 }))  -- and someone else took it
      return "done"
    end)
    assert.are.equal(("lock on '%s' was lost while the function ran: the release found it held on no quorum "
      .. "(it had expired or been taken over)"):format(r), err)
  end)

  it("raises the function's own error, not the loss, when the function raised", function()
    local r = res("fn_error")
    local err = raised(dlm, r, { ttl = 200, keepalive = false }, function()
      proc.sleep_ms(400)
      error("boom", 0)
    end)
    assert.are.equal("boom", err)
  end)
end)

describe("with_lock whose lock lasts the function", function()
  local cl, dlm

  lazy_setup(function() cl = cluster.start(3) end)
  lazy_teardown(function() if cl then cl:stop() end end)
  before_each(function() dlm = redlock.new { servers = cl.urls, ttl = 5000, node_timeout = 100 } end)
  after_each(function()
    for i = 1, cl.n do cl:kill(i, "CONT") end
    dlm:close()
  end)

  it("returns the function's results unchanged, nils and all", function()
    local r = res("normal")
    local n, a, b, c = (function(...) return select("#", ...), ... end)(
      dlm:with_lock(r, nil, function(lock, x) return x, nil, lock.resource end, 7))
    assert.are.same({ 3, 7, nil, r }, { n, a, b, c })
    assert(cluster.await_value(cl, r, nil, 1000))
  end)

  it("returns the results of a function that kept its lock past several ttls", function()
    local r = res("kept")
    local out = dlm:with_lock(r, { ttl = 300 }, function()
      os.execute("sleep 1")
      return "done"
    end)
    assert.are.equal("done", out)
  end)

  it("returns the results when a minority of nodes is down at the release", function()
    local r = res("minority")
    local out = dlm:with_lock(r, nil, function()
      assert(cl:kill(3, "STOP"))
      return "done"
    end)
    assert(cl:kill(3, "CONT"))
    assert.are.equal("done", out)
  end)

  it("returns the results when the release reaches no quorum while the lock is still valid", function()
    local r = res("unreachable")
    local out = dlm:with_lock(r, { keepalive = false }, function()
      assert(cl:kill(2, "STOP"))
      assert(cl:kill(3, "STOP"))
      return "done"
    end)
    assert(cl:kill(2, "CONT"))
    assert(cl:kill(3, "CONT"))
    assert.are.equal("done", out)
  end)

  it("returns the results of a function that unlocked its lock itself", function()
    local r = res("unlocked")
    local out = dlm:with_lock(r, nil, function(lock)
      assert(lock:unlock())
      return "done"
    end)
    assert.are.equal("done", out)
  end)

  it("returns the results when the function's own unlock failed but ran on the nodes later", function()
    -- the unlock times out on 2 of 3 nodes (their links stalled), then runs
    -- there: with_lock's release finds the value gone, by the function's hand
    local faults = require "helpers.faults"
    local p1, p2 = faults.proxy(cl.ports[1]), faults.proxy(cl.ports[2])
    local via = redlock.new { servers = { p1.url, p2.url, cl.urls[3] }, ttl = 10000, node_timeout = 100 }
    local r = res("late-unlock")
    local ok, out = pcall(via.with_lock, via, r, nil, function(lock)
      p1:set("stall"); p2:set("stall")
      local unlocked = lock:unlock()
      p1:set("pass"); p2:set("pass")
      assert(cluster.await_value(cl, r, nil, 3000, nil, via))
      return unlocked == nil and "done"
    end)
    via:close(); p1:stop(); p2:stop()
    assert.is_true(ok, tostring(out))
    assert.are.equal("done", out)
  end)
end)
