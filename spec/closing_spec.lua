-- Closing a client and leaving the process while locks are held or wanted:
-- close() during lock()'s retries (from the policy or from another coroutine)
-- ends that call with an error instead of using a freed client; close()
-- releases every lock still held through the client; a kept lock survives the
-- collection of the prefix string it was configured with; a plain LuaJIT
-- process that exits (os.exit, an uncaught error) releases what it keeps.
--
-- Anything that crashed before runs in a child luajit process, so a
-- segmentation fault fails one test instead of killing busted.

local redlock = require "redlock"
local cluster = require "helpers.cluster"
local proc = require "helpers.proc"

local q = proc.quote
local res = cluster.names("closing") -- res(tag): a resource name no other run uses

local LONG_TTL = 60000
-- "Long before its ttl": generous for a loaded machine, far below LONG_TTL.
local SOON_MS = 10000
-- close() returns once every node answered its release or timed out; a node
-- slow enough to time out (a loaded machine) still applies it a little later.
local SETTLE_MS = 2000

-- Run Lua source in a child luajit with this spec's module paths; the
-- arguments are arg[1..]. Return its output (stderr merged) and exit status.
local function child(dir, source, args)
  local script = dir .. "/child.lua"
  proc.write_file(script, source)
  local words = {}
  for i, a in ipairs(args or {}) do words[i] = q(a) end
  return proc.sh(("env LUA_PATH=%s LUA_CPATH=%s luajit %s %s"):format(
    q("spec/?.lua;" .. package.path), q(package.cpath), q(script), table.concat(words, " ")))
end

-- Prelude of every child: servers from arg[2..], the resource in arg[1].
local PRELUDE = [[
local redlock = require "redlock"
local r = arg[1]
local urls = {}
for i = 2, #arg do urls[#urls + 1] = arg[i] end
]]

-- Child source after PRELUDE: close_when(dlm, seen) arms a finalizer (a
-- cdata's, re-armed each time the collector runs it, the collector made
-- eager) that runs dlm:close() the first time seen(traceback) says it runs
-- where wanted; closed_in() is then the innermost redlock file:line it ran
-- at. stop_closing() ends the re-arming of the last close_when.
local CLOSE_WHEN = [[
local ffi = require "ffi"
collectgarbage("setpause", 10)
collectgarbage("setstepmul", 1000)
local closed_at, armed
local function close_when(dlm, seen)
  local mine = {}
  armed = mine
  local function arm()
    ffi.gc(ffi.new("int[1]"), function()
      if closed_at or armed ~= mine then return end
      local where = debug.traceback("", 2)
      if seen(where) then
        closed_at = where:match("redlock/(%w+%.lua:%d+)")
        dlm:close()
      else
        arm()
      end
    end)
  end
  arm()
end
local function closed_in() return closed_at end
local function stop_closing() armed = nil end
]]

describe("closing a client", function()
  local cl, dir

  lazy_setup(function()
    cl = cluster.start(3)
    dir = proc.tmpdir()
  end)
  lazy_teardown(function()
    if cl then cl:stop() end
    proc.rmdir(dir)
  end)

  describe("while lock() retries", function()
    -- Before: rl_sleep and the next attempt ran on the freed client (rc 139).
    it("ends lock() with an error when the retry policy closes the client", function()
      local r = res("policy")
      local out, rc = child(dir, PRELUDE .. [[
local holder = redlock.new { servers = urls }
local held = assert(holder:lock(r, { ttl = 30000 }))
local dlm = redlock.new { servers = urls }
local ok, msg = pcall(dlm.lock, dlm, r, { retry = function(n)
  if n == 1 then dlm:close() end
  return 10
end })
print("lock:", ok, msg)
ok, msg = pcall(dlm.lock_many, dlm, { r, r .. ":2" }, { retry = function(n)
  return 10
end })
print("lock_many after close:", ok, msg)
local dlm2 = redlock.new { servers = urls }
ok, msg = pcall(dlm2.lock_many, dlm2, { r, r .. ":2" }, { retry = function(n)
  if n == 1 then dlm2:close() end
  return 10
end })
print("lock_many:", ok, msg)
assert(held:unlock())
os.exit(0)
]], { r, unpack(cl.urls) })
      assert.are.equal(0, rc, out)
      assert.matches("lock:%s+false%s+[^\n]*'lock' on a closed client", out)
      assert.matches("lock_many after close:%s+false%s+[^\n]*'lock_many' on a closed client", out)
      assert.matches("lock_many:%s+false%s+[^\n]*'lock_many' on a closed client", out)
    end)

    -- Before: the resumed coroutine slept and acquired on the freed client.
    it("ends lock() with an error when another coroutine closes the client while the policy yields", function()
      local r = res("coroutine")
      local out, rc = child(dir, PRELUDE .. [[
local holder = redlock.new { servers = urls }
local held = assert(holder:lock(r, { ttl = 30000 }))
local dlm = redlock.new { servers = urls }
local co = coroutine.create(function()
  return dlm:lock(r, { retry = function() coroutine.yield("waiting"); return 10 end })
end)
print("first:", coroutine.resume(co))
dlm:close()
print("resumed:", coroutine.resume(co))
assert(held:unlock())
os.exit(0)
]], { r, unpack(cl.urls) })
      assert.are.equal(0, rc, out)
      assert.matches("first:%s+true%s+waiting", out)
      assert.matches("resumed:%s+false%s+[^\n]*'lock' on a closed client", out)
    end)
  end)

  -- A finalizer (here a cdata's, re-armed until it runs inside the batch
  -- of lock_many) may run dlm:close() while a call on the same client is
  -- still on the stack. Before: that call went on with the freed client
  -- (rc 139 in rl_wait). Now close() leaves the memory to the collector.
  it("ends lock_many with an error when a finalizer closes the client during its batch", function()
    local r = res("finalizer")
    local out, rc = child(dir, PRELUDE .. CLOSE_WHEN .. [[
local names = {}
for i = 1, 2000 do names[i] = r .. ":" .. i end
local dlm = redlock.new { servers = urls }
close_when(dlm, function(where) return where:find("redlock/batch.lua", 1, true) end) -- in its batch
local ok, locks, err = pcall(dlm.lock_many, dlm, names)
collectgarbage("setpause", 200)
print("closed in:", closed_in())
print("lock_many:", ok, ok and tostring(err) or locks)
os.exit(0)
]], { r, unpack(cl.urls) })
    assert.are.equal(0, rc, out)
    assert.matches("closed in:%s+%w+%.lua:%d+", out)
    assert.matches("lock_many:%s+false%s+[^\n]*this client was closed", out)
  end)

  -- The same close() once lock()'s round came back, while the lock object
  -- was being made. Before: lock() returned the lock, and keep-alive
  -- started a new thread for it on the closed client, extending it for as
  -- long as the object lived. Now lock() raises and the key runs out.
  it("ends lock() with an error, not a kept lock, when a finalizer closes the client as it makes the lock", function()
    local r = res("made")
    local out, rc = child(dir, PRELUDE .. CLOSE_WHEN .. [[
for _ = 1, 3000 do
  local dlm = redlock.new { servers = urls }
  close_when(dlm, function(where) return where:match("redlock/(%w+%.lua)") == "lock.lua" end) -- making the lock
  local ok, lk, err = pcall(dlm.lock, dlm, r, { ttl = 1500, keepalive = true })
  stop_closing() -- this round's finalizers stop here
  if closed_in() then
    print("closed in:", closed_in(), "lock:", ok, ok and tostring(lk) or lk)
    KEPT = lk -- a lock handed back lives on (a keeper would extend it)
    break
  end
  if ok and lk then assert(lk:unlock()) end
  dlm:close()
end
collectgarbage("setpause", 200)
local probe = redlock.new { servers = urls }
local taken = probe:lock(r, { ttl = 1000, wait = 5000 })
print("taken after:", taken and "yes" or "no")
os.exit(0)
]], { r, unpack(cl.urls) })
    assert.are.equal(0, rc, out)
    assert.matches("closed in:%s+lock%.lua:%d+%s+lock:%s+false%s+[^\n]*'lock' on a closed client", out)
    assert.matches("taken after:%s+yes", out)
  end)

  -- A finalizer (a scoped-lock guard) that unlocks one lock while the same
  -- process is in the middle of taking another. Before: the calls shared
  -- one result buffer, and the unlock's result overwrote the lock's being
  -- read (in 2,000 rounds: 202 locks with another lock's value, 37 with no
  -- validity, and their keys left after close()).
  it("keeps each call's result its own when a finalizer unlocks a lock during another call", function()
    local r = res("guard")
    local out, rc = child(dir, PRELUDE .. [[
local ffi = require "ffi"
jit.off()
local dlm = redlock.new { servers = urls }
collectgarbage("setpause", 10)
collectgarbage("setstepmul", 1000)
local wrong, fired = 0, 0
for i = 1, 600 do
  local victim = assert(dlm:lock(r .. ":victim:" .. i))
  local guard = ffi.gc(ffi.new("int[1]"), function()
    fired = fired + 1
    assert(victim:unlock())
  end)
  guard = nil -- luacheck: ignore 311
  local lk = assert(dlm:lock(r .. ":" .. i))
  if not (lk.validity > 0 and lk:valid() and lk:unlock()) then wrong = wrong + 1 end
end
collectgarbage("setpause", 200)
collectgarbage()
dlm:close()
local probe, left = redlock.new { servers = urls }, 0
for i = 1, 600 do
  for _, name in ipairs { r .. ":victim:" .. i, r .. ":" .. i } do
    local lk = probe:try_lock(name, { ttl = 1000 })
    if lk then lk:unlock() else left = left + 1 end
  end
end
print("guards run:", fired, "locks wrong:", wrong, "left:", left)
os.exit(0)
]], { r, unpack(cl.urls) })
    assert.are.equal(0, rc, out)
    local fired, wrong, left = out:match("guards run:%s+(%d+)%s+locks wrong:%s+(%d+)%s+left:%s+(%d+)")
    assert(fired, out)
    assert.is_true(tonumber(fired) >= 590, out)
    assert.are.equal("0", wrong, out)
    assert.are.equal("0", left, out)
  end)

  describe("with locks held", function()
    -- Before: close() left both keys for their ttl.
    it("releases every lock still held through the client, kept or not", function()
      local dlm = redlock.new { servers = cl.urls }
      local plain = assert(dlm:lock(res("plain"), { ttl = LONG_TTL }))
      local kept = assert(dlm:lock(res("kept"), { ttl = LONG_TTL, keepalive = true }))
      local group = assert(dlm:lock_many({ res("g1"), res("g2") }, { ttl = LONG_TTL }))
      local done = assert(dlm:lock(res("done"), { ttl = LONG_TTL }))
      assert(done:unlock())
      local other = redlock.new { servers = cl.urls }
      local foreign = assert(other:lock(res("foreign"), { ttl = LONG_TTL }))
      dlm:close()
      for _, lk in ipairs { plain, kept, group[1], group[2] } do
        assert(cluster.await_value(cl, lk.resource, nil, SETTLE_MS))
        local ok, err = lk:unlock()
        assert.is_nil(ok)
        assert.are.equal("invalid", err)
        assert.is_false(lk:valid())
      end
      -- another client's lock is untouched
      assert(cluster.await_value(cl, foreign.resource, foreign.value, 0))
      assert(foreign:unlock())
      other:close()
      dlm:close() -- twice is fine
    end)

    -- Before: with_lock raised "'unlock' on a closed client" and the key stayed.
    it("releases the lock of a with_lock whose function closes the client", function()
      local dlm = redlock.new { servers = cl.urls }
      local r = res("with_lock")
      local a, b = dlm:with_lock(r, { ttl = LONG_TTL }, function(lk)
        assert(cluster.await_value(cl, r, lk.value, 0))
        dlm:close()
        return "done", 2
      end)
      assert.are.equal("done", a)
      assert.are.equal(2, b)
      assert(cluster.await_value(cl, r, nil, SETTLE_MS))
    end)

    -- Before: the client listed its locks in a weak table, so a lock object
    -- collected before close() was forgotten and its key stood for its ttl.
    it("releases locks whose objects were collected before it", function()
      local dlm = redlock.new { servers = cl.urls }
      local names = { res("gc1"), res("gc2"), res("gc3") }
      local objects = setmetatable({}, { __mode = "v" })
      -- in a function of its own, not a do block: LuaJIT leaves a block's
      -- dead locals in their stack slots, where the collector still sees them
      local function take()
        local lk = assert(dlm:lock(names[1], { ttl = LONG_TTL }))
        local group = assert(dlm:lock_many({ names[2], names[3] }, { ttl = LONG_TTL }))
        assert(cluster.await_value(cl, names[1], lk.value, SETTLE_MS))
        assert(cluster.await_value(cl, names[3], group[2].value, SETTLE_MS))
        objects[1], objects[2], objects[3] = lk, group[1], group[2]
      end
      take()
      collectgarbage()
      collectgarbage()
      assert.is_nil(next(objects), "the lock objects were not collected: the test would not show anything")
      dlm:close()
      for _, r in ipairs(names) do assert(cluster.await_value(cl, r, nil, SETTLE_MS)) end
    end)

    -- Before: close() began one release per lock and dropped those the core
    -- refused once 65,536 operations were in flight: 70,000 locks left 4,464
    -- keys for their ttl, and those locks answered unlock() with "released".
    it("releases more locks than a client can have operations in flight", function()
      local own = cluster.start(3)
      finally(function() own:stop() end)
      local dlm = redlock.new { servers = own.urls, node_timeout = 5000, prefix = res("many") }
      local per_batch, batches = 23334, 3 -- 70,002 locks, above the 65,536 operations in flight
      for b = 1, batches do
        local names = {}
        for i = 1, per_batch do names[i] = ("%d:%d"):format(b, i) end
        assert(dlm:lock_many(names, { ttl = LONG_TTL }))
      end
      local function keys(want)
        return cluster.await_all(own, function(i)
          local n = cluster.dbsize(own, i)
          return n == want, n .. " keys"
        end, SETTLE_MS, nil, want > 0 and dlm or nil)
      end
      assert(keys(per_batch * batches)) -- granted at quorum: the last node may still be taking its SETs
      dlm:close()
      assert(keys(0))
    end)

    -- Before: with the default 50 ms node timeout, close() gave up on a
    -- batch of 10,000 releases once their node timeout passed, while every
    -- node was still working through them, and closed the sockets: a node
    -- that found its client gone dropped the releases it had not read yet,
    -- and thousands of keys stayed on each node for their ttl. Now close()
    -- lets nodes that still answer finish first. (The releases are begun
    -- through the C API, all at once: lock_many and close() keep a window of
    -- them in flight, which a node answers within the node timeout.)
    it("lets nodes answer a batch larger than they answer within the node timeout before it closes", function()
      local own = cluster.start(3)
      finally(function() own:stop() end)
      local dlm = redlock.new { servers = own.urls, node_timeout = 50, prefix = res("batch") }
      local names = {}
      for i = 1, 10000 do names[i] = tostring(i) end
      local locks = assert(dlm:lock_many(names, { ttl = LONG_TTL }))
      local held = #locks
      local C = require("redlock.cdefs").lib
      local forget = require("redlock.held").forget
      for i = 1, held do
        local lk = locks[i]
        assert(C.rl_begin_release(dlm.client, lk.resource, #lk.resource, lk.value) >= 0)
        lk.released = true
        forget(lk) -- close() has none of them to release itself: only the client's own wait is left
      end
      dlm:close()
      local empty, left = cluster.await_all(own, function(i)
        local n = cluster.dbsize(own, i)
        return n == 0, n .. " keys"
      end, SETTLE_MS)
      assert(empty, ("%s after close() (%d locks held)"):format(tostring(left), held))
    end)

    it("drops locks that were collected from its list without releasing them twice", function()
      local dlm = redlock.new { servers = cl.urls }
      local r = res("collected")
      do
        local lk = assert(dlm:lock(r, { ttl = 2000 }))
        assert(lk:unlock())
      end
      collectgarbage()
      collectgarbage()
      local other = redlock.new { servers = cl.urls }
      local theirs = assert(other:lock(r, { ttl = LONG_TTL }))
      dlm:close()
      assert(cluster.await_value(cl, r, theirs.value, 0))
      assert(theirs:unlock())
      other:close()
    end)
  end)
end)

describe("a kept lock of a client whose prefix was built at run time", function()
  local cl

  lazy_setup(function() cl = cluster.start(3) end)
  lazy_teardown(function() if cl then cl:stop() end end)

  -- Before: the keeper was started from options pointing into the collected
  -- prefix string; its extensions named another key, the lock was reported
  -- lost and unlock() said "not held".
  it("stays held across several ttls after the prefix string is collected", function()
    local tag = tostring(proc.getpid())
    local dlm = redlock.new { servers = cl.urls, prefix = "pfx:" .. tag .. ":" .. ("x"):rep(3) .. ":" }
    for _ = 1, 3 do collectgarbage() end
    local function junk(n) -- n strings alive at once, garbage on return
      local t = {}
      for i = 1, n do t[i] = ("junk %d %s"):format(i, ("y"):rep(i % 64)) end
      return #t
    end
    junk(20000)
    for _ = 1, 3 do collectgarbage() end
    for i = 1, 20000 do local _ = ("more junk %d %s"):format(i, ("z"):rep(i % 40)) end

    local r = res("prefixed")
    local lock = assert(dlm:lock(r, { ttl = 500, keepalive = true }))
    for i = 1, 20000 do local _ = ("late junk %d %s"):format(i, ("w"):rep(i % 40)) end
    proc.sleep_ms(1700) -- more than three ttls
    assert.is_false(lock:lost())
    assert.is_true(lock:valid())
    -- built only now: an equal string alive earlier would have kept the old one
    local key = ("pfx:%s:xxx:"):format(tag) .. r
    -- A quorum holds it under the prefixed name: on a loaded machine one
    -- node's extension may come after its key ran out there, and a kept lock
    -- needs a quorum only.
    local holding = 0
    for i = 1, 3 do
      if cluster.get(cl, i, key) == lock.value then holding = holding + 1 end
    end
    assert.is_true(holding >= 2, ("%d of 3 nodes hold %s"):format(holding, key))
    assert(cluster.await_value(cl, r, nil, 0)) -- nothing without the prefix
    assert.is_true(lock:unlock())
    assert(cluster.await_value(cl, key, nil, 1000))
    dlm:close()
  end)
end)

describe("closing a client with a node that sends a reply that does not end", function()
  local faults = require "helpers.faults"
  local cl, drip

  lazy_setup(function()
    cl = cluster.start(2)
    drip = faults.fakeserver("drip") -- $60000, then a byte every 10 ms
  end)
  lazy_teardown(function()
    if drip then drip:stop() end
    if cl then cl:stop() end
  end)

  -- Before: the node "still answered" (bytes kept coming), so close() waited
  -- the reconnect cap plus the connect timeout for it: 2 s, and 4 s when
  -- keep-alive had been used (its thread's client waited as long first).
  for _, keepalive in ipairs { false, true } do
    it(("returns well within 2 s%s, the lock released by the other nodes"):format(
      keepalive and " after keep-alive" or ""), function()
      for run = 1, 3 do
        local dlm = redlock.new { servers = { drip.url, cl.urls[1], cl.urls[2] } }
        local r = res("drip" .. run)
        local lk = assert(dlm:try_lock(r, { ttl = LONG_TTL, keepalive = keepalive }))
        proc.sleep_ms(100)
        assert(lk:unlock())
        local t0 = proc.now_ms()
        dlm:close()
        local took = proc.now_ms() - t0
        assert.is_true(took < 1800, ("run %d: close() took %d ms"):format(run, took))
        assert(cluster.await_value(cl, r, nil, 0))
      end
    end)
  end
end)

describe("a plain LuaJIT process that exits holding a kept lock", function()
  local cl, dir

  lazy_setup(function()
    cl = cluster.start(3)
    dir = proc.tmpdir()
  end)
  lazy_teardown(function()
    if cl then cl:stop() end
    proc.rmdir(dir)
  end)

  -- Run body (after the prelude, with `dlm` a client), expect exit status rc,
  -- then the key of r (and of r:1 .. r:more) gone from every node long before
  -- its ttl.
  local function exits(tag, body, rc, more)
    local r = res(tag)
    local started = proc.now_ms()
    local out, got = child(dir, PRELUDE .. "local dlm = redlock.new { servers = urls }\n" .. body, { r, unpack(cl.urls) })
    assert.are.equal(rc, got, out)
    assert.matches("holding " .. r, out, 1, true)
    local gone, why = cluster.await_value(cl, r, nil, SOON_MS)
    assert(gone, why)
    for i = 1, more or 0 do
      gone, why = cluster.await_value(cl, r .. ":" .. i, nil, SOON_MS)
      assert(gone, r .. ":" .. i .. ": " .. tostring(why))
    end
    assert.is_true(proc.now_ms() - started < LONG_TTL / 2)
    return out
  end

  -- Before: each of these left the key for its full ttl.
  it("releases it on os.exit(), and those of every other client", function()
    exits("exit", [[
local lock = assert(dlm:lock(r, { ttl = 60000, keepalive = true }))
local other = redlock.new { servers = urls }
local second = assert(other:lock(r .. ":1", { ttl = 60000, keepalive = true }))
print("holding " .. r)
os.exit(3)
]], 3, 1)
  end)

  it("releases it on os.exit() inside with_lock", function()
    exits("exit-with-lock", [[
dlm:with_lock(r, { ttl = 60000 }, function()
  print("holding " .. r)
  io.stdout:flush()
  os.exit(4)
end)
]], 4)
  end)

  it("releases it on os.exit(code, true), which closes the Lua state first", function()
    exits("exit-close", [[
local lock = assert(dlm:lock(r, { ttl = 60000, keepalive = true }))
print("holding " .. r)
io.stdout:flush()
os.exit(5, true)
]], 5)
  end)

  -- Each child forks right after a client started its keep-alive thread
  -- (which holds the keeper's mutex while it connects), with another keeper
  -- busy extending short locks. Before: closing the Lua state ran the
  -- keeper's finalizer, which waited for that mutex in the child forever
  -- (one child in a few hung).
  -- The release on the way out (rl_keeper_release_all) waits as long as
  -- the nodes go on deciding releases, its bound counting only once they
  -- stop. Before, the bound was a fixed time from the start: a group of
  -- 65,536 kept names left 6,000 to 29,000 of them on every node (script
  -- end, os.exit, an error, SIGTERM under `redlock run`), the nodes
  -- answering all along. Here 20,000 names and a bound of 200 ms, which
  -- the releases alone outlast.
  it("releases a large kept group whole, however long that takes while the nodes decide", function()
    local r = res("group")
    local dlm = redlock.new { servers = cl.urls, ttl = 60000 }
    local names = {}
    for i = 1, 20000 do names[i] = r .. ":" .. i end
    assert(dlm:lock_many(names, { keepalive = true }))
    local released = require("redlock.cdefs").lib.rl_keeper_release_all(200)
    local left = {}
    for i = 1, 3 do
      left[i] = tonumber((cl:cli(i, "EVAL", "return #redis.call('KEYS', ARGV[1])", "0", r .. ":*")))
    end
    dlm:close()
    assert.are.equal(20000, released)
    assert.are.same({ 0, 0, 0 }, left)
  end)

  it("lets a forked child leave by os.exit(code, true) at once, releasing nothing of the parent's", function()
    local r = res("fork")
    local out, got = child(dir, PRELUDE .. [=[
local ffi = require "ffi"
local now = require("redlock.cdefs").lib.rl_now_ms
ffi.cdef[[ int fork(void); int waitpid(int pid, int *status, int options);
           int kill(int pid, int sig); int poll(void *fds, unsigned long nfds, int timeout); ]]
local WNOHANG, SIGKILL = 1, 9
local dlm = redlock.new { servers = urls }
local lock = assert(dlm:lock(r, { ttl = 1000, keepalive = true }))
local busy = {}
for i = 1, 20 do busy[i] = assert(dlm:lock(r .. ":" .. i, { ttl = 300, keepalive = true })) end
local status = ffi.new("int[1]")
for n = 1, 30 do
  local fresh = redlock.new { servers = urls }
  local kept = assert(fresh:lock(r .. ":fresh", { ttl = 1000, keepalive = true }))
  io.stdout:flush()
  local pid = ffi.C.fork()
  if pid == 0 then os.exit(0, true) end
  local give_up, ended = now() + 5000, 0
  while ended == 0 and now() < give_up do
    ended = ffi.C.waitpid(pid, status, WNOHANG)
    if ended == 0 then ffi.C.poll(nil, 0, 5) end
  end
  if ended ~= pid then
    ffi.C.kill(pid, SIGKILL)
    ffi.C.waitpid(pid, status, 0)
    print("child " .. n .. " still running after 5 s")
    os.exit(1)
  end
  if status[0] ~= 0 then print("child " .. n .. " ended with status " .. status[0]); os.exit(1) end
  assert(kept:unlock())
  fresh:close()
end
print("children done")
ffi.C.poll(nil, 0, 1500) -- longer than the lock's ttl: only its keeper kept it
assert(lock:valid(), "lock lost")
assert(not redlock.new({ servers = urls }):try_lock(r, { ttl = 1000 }), "lock free")
print("still held")
assert(lock:unlock())
]=], { r, unpack(cl.urls) })
    assert.are.equal(0, got, out)
    assert.matches("children done", out, 1, true)
    assert.matches("still held", out, 1, true)
  end)

  -- Several locks, so that no finalizer order can release them all by chance.
  it("releases them on an uncaught error", function()
    local out = exits("error", [[
local locks = {}
for i = 1, 10 do locks[i] = assert(dlm:lock(r .. ":" .. i, { ttl = 60000, keepalive = true })) end
locks[0] = assert(dlm:lock(r, { ttl = 60000, keepalive = true }))
print("holding " .. r)
io.stdout:flush()
error("job failed")
]], 1, 10)
    assert.matches("job failed", out, 1, true)
  end)

end)
