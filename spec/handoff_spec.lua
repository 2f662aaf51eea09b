-- Hand-off to waiters (libev transport): a release publishes on
-- "redlock:released:" .. key, and a waiter's sleep between attempts ends
-- when it hears one. Polling stays the fallback: subscriber connections
-- killed, or a holder that never publishes, cost a poll interval.

local redlock = require "redlock"
local cluster = require "helpers.cluster"
local proc = require "helpers.proc"

local res = cluster.names("handoff")

-- Run `workers` processes of spec/helpers/handoff_worker.lua on one resource
-- for run_ms (args: hold, pause, min, max, notify); during the run, call
-- meanwhile() every few ms if given. Return the log's events, sorted by time
-- ({ kind, pid, us }), and the workers' summaries.
local function contend(urls, workers, run_ms, hold, pause, min_ms, max_ms, notify, meanwhile)
  local dir = proc.tmpdir()
  local logfile = dir .. "/events.log"
  local resource = res("contend")
  local pids = {}
  local ok, err = pcall(function()
    for w = 1, workers do
      local argv = { "luajit", "spec/helpers/handoff_worker.lua", logfile, resource, tostring(run_ms),
                     tostring(hold), tostring(pause), tostring(min_ms), tostring(max_ms), notify and "on" or "off" }
      for _, u in ipairs(urls) do argv[#argv + 1] = u end
      pids[w] = proc.spawn_luajit(argv, dir .. "/worker" .. w .. ".out")
    end
    local until_ = proc.now_ms() + run_ms + 20000
    for w = 1, workers do
      while proc.alive(pids[w]) do
        assert(proc.now_ms() < until_, "worker " .. w .. " did not finish")
        if meanwhile then meanwhile() end
        proc.sleep_ms(20)
      end
    end
  end)
  for _, pid in ipairs(pids) do proc.stop(pid) end
  local summaries = {}
  for w = 1, workers do summaries[w] = proc.read_file(dir .. "/worker" .. w .. ".out") or "" end
  local events = {}
  for line in (proc.read_file(logfile) or ""):gmatch("[^\n]+") do
    local kind, pid, us = line:match("^(%a+) (%d+) (%d+)$")
    events[#events + 1] = { kind = kind, pid = tonumber(pid), us = tonumber(us) }
  end
  table.sort(events, function(a, b) return a.us < b.us end)
  proc.rmdir(dir)
  if not ok then error(tostring(err) .. "\n" .. table.concat(summaries, "\n"), 0) end
  return events, summaries
end

-- Hand-offs: for every acquisition right after another process's release,
-- the ms between them; sorted.
local function handoffs(events)
  local out = {}
  for i = 2, #events do
    local prev, e = events[i - 1], events[i]
    if e.kind == "acq" and prev.kind == "rel" and prev.pid ~= e.pid then
      out[#out + 1] = (e.us - prev.us) / 1000
    end
  end
  table.sort(out)
  return out
end

local function median(xs) return xs[math.floor((#xs + 1) / 2)] end

local function acquisitions_by_pid(events)
  local by, total = {}, 0
  for _, e in ipairs(events) do
    if e.kind == "acq" then by[e.pid] = (by[e.pid] or 0) + 1; total = total + 1 end
  end
  return by, total
end

describe("hand-off to waiters", function()
  local cl

  lazy_setup(function() cl = cluster.start(3) end)
  teardown(function() cluster.stop_all() end)

  -- Run fn(dir) while a redis-cli on each node listens on channel (what it
  -- hears in dir/subN); return pcall's ok, err, the listeners stopped.
  local function with_listeners(channel, fn)
    local dir = proc.tmpdir()
    local pids = {}
    for i = 1, 3 do
      pids[i] = proc.spawn({ "redis-cli", "-p", tostring(cl.ports[i]), "SUBSCRIBE", channel },
                           { out = dir .. "/sub" .. i })
    end
    local ok, err = pcall(function()
      for i = 1, 3 do proc.wait_file(dir .. "/sub" .. i) end
      fn(dir)
    end)
    for _, pid in ipairs(pids) do proc.stop(pid) end
    proc.rmdir(dir)
    return ok, err
  end

  it("publishes a release on redlock:released:<key> from every node it deletes from, saying who listened", function()
    local dlm = redlock.new { servers = cl.urls, prefix = "pfx:" }
    local r = res("publish")
    local lk
    local ok, err = with_listeners("redlock:released:pfx:" .. r, function(dir)
      lk = assert(dlm:lock(r))
      -- granted (and released) at quorum: a node still in its connection
      -- setup gets its commands at the client's next I/O, so keep it busy
      assert(cluster.await_value(cl, "pfx:" .. r, lk.value, 5000, nil, dlm))
      assert.is_true(lk:unlock())
      for i = 1, 3 do
        local deadline = proc.now_ms() + 3000
        while not (proc.read_file(dir .. "/sub" .. i) or ""):find("message") and proc.now_ms() < deadline do
          cluster.drive(dlm)
          proc.sleep_ms(10)
        end
        -- the message says how many listened: the one redis-cli
        assert.matches("message\nredlock:released:pfx:" .. r:gsub("%p", "%%%0") .. "\n1\n",
                       proc.read_file(dir .. "/sub" .. i))
      end
    end)
    dlm:close()
    assert(ok, err)
  end)

  -- Until every node counts the clients (redlock.new tables) as subscribers
  -- of channel, each of them having watched it: their loops run meanwhile.
  local function await_subscribers(channel, clients)
    assert(cluster.await_all(cl, function(node)
      for _, d in ipairs(clients) do d.client:sleep(1) end
      local numsub = tonumber(cl:cli(node, "PUBSUB", "NUMSUB", channel):match("(%d+)%s*$"))
      return numsub == #clients, "subscribers " .. tostring(numsub)
    end, 5000))
  end

  it("wakes the oldest queued waiter alone, first come first served, skipping one that is gone", function()
    local ffi = require "ffi"
    local lib = require("redlock.cdefs").lib
    local out = ffi.new("rl_result")
    local r = res("queue")
    local channel, queue = "redlock:released:" .. r, "redlock:queue:" .. r
    local holder = redlock.new { servers = cl.urls }
    local w = {}
    for i = 1, 3 do w[i] = redlock.new { servers = cl.urls } end
    local ok, err = pcall(function()
      local lk = assert(holder:lock(r))
      assert(cluster.await_value(cl, r, lk.value, 5000, nil, holder))
      -- each waiter watches (its two channels, in one SUBSCRIBE per node) ...
      for i = 1, 3 do assert.equal(0, lib.rl_watch(w[i].client, r, #r)) end
      await_subscribers(channel, w)
      -- ... then joins the queue by a refused attempt, in the order 1, 2, 3
      for i = 1, 3 do
        assert.equal(0, lib.rl_acquire_queued(w[i].client, r, #r, 10000, out))
        assert.equal(lib.RL_STATUS_BUSY, out.status)
      end
      local order
      assert(cluster.await_all(cl, function(node)
        for i = 1, 3 do w[i].client:sleep(1) end
        local ids = cl:cli(node, "LRANGE", queue, "0", "-1")
        local pttl = tonumber(cl:cli(node, "PTTL", queue):match("(%-?%d+)"))
        order = order or ids
        return ids == order and select(2, ids:gsub("%x+", "")) == 3 and pttl > 0 and pttl <= 60000,
          ("queue %q, pttl %s"):format(ids, tostring(pttl))
      end, 5000))
      local heard = {}
      for i = 1, 3 do heard[i] = lib.rl_heard(w[i].client, r, #r) end
      assert.is_true(lk:unlock())
      -- the oldest is woken, and told it is alone; the others hear nothing
      assert.equal(1, lib.rl_sleep_until(w[1].client, r, #r, heard[1], 5000))
      assert.equal(1, lib.rl_heard_listeners(w[1].client, r, #r))
      for i = 2, 3 do assert.equal(0, lib.rl_sleep_until(w[i].client, r, #r, heard[i], 200)) end
      assert.equal(0, lib.rl_acquire_queued(w[1].client, r, #r, 10000, out))
      assert.equal(lib.RL_STATUS_OK, out.status)
      local value = ffi.string(out.value)
      -- the next in line goes away: its wake channel has no listener, so
      -- the release passes it over and wakes the one after it
      w[2]:close()
      for i = 1, 3 do heard[i] = i ~= 2 and lib.rl_heard(w[i].client, r, #r) end
      assert(cluster.await_value(cl, r, value, 5000, nil, w[1]))
      assert.equal(0, lib.rl_release(w[1].client, r, #r, value, out))
      assert.equal(lib.RL_STATUS_OK, out.status)
      assert.equal(1, lib.rl_sleep_until(w[3].client, r, #r, heard[3], 5000))
      assert.equal(1, lib.rl_heard_listeners(w[3].client, r, #r))
      assert(cluster.await_all(cl, function(node)
        return cl:cli(node, "LLEN", queue):match("^%s*0") ~= nil, "queue not empty"
      end, 5000, nil, w[3]))
      for i = 1, 3 do if i ~= 2 then lib.rl_unwatch(w[i].client, r, #r) end end
    end)
    for i = 1, 3 do w[i]:close() end
    holder:close()
    assert(ok, err)
  end)

  -- Before: the nodes let whoever asked first take a lock just released,
  -- and a waiter of the releasing client, asking right behind the release,
  -- always did, ahead of the waiter the release woke (in nginx, one
  -- worker's requests kept a lock while another's timed out). Now the
  -- woken waiter has its turn over the releasing client until it asks,
  -- stops listening, the lock is taken again, or 100 ms go.
  describe("keeps a lock just released from the releasing client's waiters for the waiter it woke", function()
    local ffi = require "ffi"
    local lib = require("redlock.cdefs").lib
    local out = ffi.new("rl_result")

    -- a holder of r, and waiters queued behind it in the order given, each
    -- watching r; returns the holder's lock and the queue's ids in order
    local function queued_behind(r, holder, waiters)
      local lk = assert(holder:lock(r))
      assert(cluster.await_value(cl, r, lk.value, 5000, nil, holder))
      for _, w in ipairs(waiters) do assert.equal(0, lib.rl_watch(w.client, r, #r)) end
      await_subscribers("redlock:released:" .. r, waiters)
      for _, w in ipairs(waiters) do
        assert.equal(0, lib.rl_acquire_queued(w.client, r, #r, 10000, out))
        assert.equal(lib.RL_STATUS_BUSY, out.status)
      end
      local ids
      assert(cluster.await_all(cl, function(node)
        local got = {}
        for id in cl:cli(node, "LRANGE", "redlock:queue:" .. r, "0", "-1"):gmatch("%x+") do got[#got + 1] = id end
        ids = ids or got
        return #got == #waiters and table.concat(got, " ") == table.concat(ids, " "), table.concat(got, " ")
      end, 5000))
      return lk, ids
    end

    local function attempt(d, r)
      assert.equal(0, lib.rl_acquire_queued(d.client, r, #r, 10000, out))
      return out.status == lib.RL_STATUS_OK and ffi.string(out.value) or nil
    end

    -- d releases r (value) with a queued attempt of d right behind it, in
    -- the same write (as a release in nginx hands the lock to the worker's
    -- next request): whether that attempt took the lock
    local function release_then_attempt(d, r, value)
      local c = d.client
      local rel = lib.rl_begin_release(c, r, #r, value)
      local att = lib.rl_begin_acquire_queued(c, r, #r, 10000)
      assert.is_true(rel > 0 and att > 0)
      local took, left = nil, 2
      while left > 0 do
        lib.rl_run(c, 1000)
        while lib.rl_collect(c, out) > 0 do
          left = left - 1
          if tonumber(out.id) == att then
            took = out.status == lib.RL_STATUS_OK
          else
            assert.equal(lib.RL_STATUS_OK, out.status)
          end
        end
      end
      return took
    end

    -- waiter ids, each from the last place of node 1's queue after a refused attempt
    local function id_of(d, r)
      assert.is_nil(attempt(d, r))
      return cl:cli(1, "LRANGE", "redlock:queue:" .. r, "-1", "-1"):match("%x+")
    end

    local function turn(node, r)
      return (cl:cli(node, "GET", "redlock:turn:" .. r):gsub("%s+$", ""))
    end

    -- a turn of woken over by on every node, for a minute (the nodes' own
    -- turns last 100 ms: these checks must not race them)
    local function set_turn(r, woken, by)
      for node = 1, cl.n do cl:cli(node, "SET", "redlock:turn:" .. r, woken .. " " .. by, "PX", "60000") end
    end

    it("refuses the releasing client's waiter until the waiter woken asks", function()
      local r = res("turn")
      local holder = redlock.new { servers = cl.urls }
      local w1, w2 = redlock.new { servers = cl.urls }, redlock.new { servers = cl.urls }
      local ok, err = pcall(function()
        local lk, ids = queued_behind(r, holder, { w1, w2 })
        -- the lock is free on every node behind the release, but w1 has its turn over the holder
        assert.is_false(release_then_attempt(holder, r, lk.value))
        local holder_id = cl:cli(1, "LRANGE", "redlock:queue:" .. r, "-1", "-1"):match("%x+")
        for node = 1, cl.n do
          local t = turn(node, r)
          assert.is_true(t == "" or t == ids[1] .. " " .. holder_id, t) -- (gone once its 100 ms are over)
          local pttl = tonumber(cl:cli(node, "PTTL", "redlock:turn:" .. r):match("(%-?%d+)"))
          assert.is_true(pttl <= 100, tostring(pttl))
        end
        local value = attempt(w1, r)
        assert.is_truthy(value)
        for node = 1, cl.n do assert.is_false(cluster.exists(cl, node, "redlock:turn:" .. r)) end
        -- w1 releases: w2, next in every queue, has its turn over w1's client
        assert(cluster.await_value(cl, r, value, 5000, nil, w1))
        assert.is_false(release_then_attempt(w1, r, value))
        assert.is_truthy(attempt(w2, r))
        for _, w in ipairs { w1, w2 } do lib.rl_unwatch(w.client, r, #r) end
      end)
      for _, d in ipairs { holder, w1, w2 } do d:close() end
      assert(ok, err)
    end)

    it("ends a turn once the waiter woken stops listening, or the lock is taken again", function()
      local r = res("turnend")
      local holder, w1, w2 = redlock.new { servers = cl.urls }, redlock.new { servers = cl.urls },
        redlock.new { servers = cl.urls }
      local ok, err = pcall(function()
        for _, w in ipairs { w1, w2 } do assert.equal(0, lib.rl_watch(w.client, r, #r)) end
        await_subscribers("redlock:released:" .. r, { w1, w2 })
        local lk = assert(holder:lock(r))
        local ids = { id_of(w1, r), id_of(w2, r), id_of(holder, r) }
        assert(cluster.await_value(cl, r, lk.value, 5000, nil, holder))
        assert.is_true(lk:unlock())
        -- w1 listens: the holder is refused; w1 gives up: its turn is over
        set_turn(r, ids[1], ids[3])
        assert.is_nil(attempt(holder, r))
        lib.rl_unwatch(w1.client, r, #r)
        assert(cluster.await_all(cl, function(node)
          w1.client:sleep(1)
          local n = tonumber(cl:cli(node, "PUBSUB", "NUMSUB", "redlock:wake:" .. ids[1] .. ":" .. r):match("(%d+)%s*$"))
          return n == 0, "subscribers " .. tostring(n)
        end, 5000))
        local value = attempt(holder, r)
        assert.is_truthy(value)
        for node = 1, cl.n do assert.equal("", turn(node, r)) end
        -- w2 listens but is not the one to ask: a client older than turns
        -- took the lock instead (a plain SET NX ends no turn), and the
        -- holder, finding it taken, ends the turn
        assert(cluster.await_value(cl, r, value, 5000, nil, holder))
        assert.equal(0, lib.rl_release(holder.client, r, #r, value, out))
        set_turn(r, ids[2], ids[3])
        for node = 1, cl.n do cl:cli(node, "SET", r, "someone-else", "PX", "60000") end
        assert.is_nil(attempt(holder, r))
        for node = 1, cl.n do assert.equal("", turn(node, r)) end
        for node = 1, cl.n do cl:cli(node, "DEL", r) end
        assert.is_truthy(attempt(holder, r))
        lib.rl_unwatch(w2.client, r, #r)
      end)
      for _, d in ipairs { holder, w1, w2 } do d:close() end
      assert(ok, err)
    end)
  end)

  it("passes over at most 8 queued waiters that are gone, then tells every listener", function()
    local lib = require("redlock.cdefs").lib
    local r = res("gone9")
    local channel, queue = "redlock:released:" .. r, "redlock:queue:" .. r
    local holder = redlock.new { servers = cl.urls }
    local listener = redlock.new { servers = cl.urls, notify = true }
    local ok, err = pcall(function()
      local lk = assert(holder:lock(r))
      assert(cluster.await_value(cl, r, lk.value, 5000, nil, holder))
      assert.equal(0, lib.rl_watch(listener.client, r, #r))
      await_subscribers(channel, { listener })
      -- nine queued ids nobody listens for (waiters gone before the release)
      for node = 1, cl.n do
        for k = 1, 9 do cl:cli(node, "RPUSH", queue, ("%016x"):format(k)) end
      end
      local heard = lib.rl_heard(listener.client, r, #r)
      assert.is_true(lk:unlock())
      -- eight are dropped, the ninth stays; the release is told to every listener
      assert.equal(1, lib.rl_sleep_until(listener.client, r, #r, heard, 5000))
      assert(cluster.await_all(cl, function(node)
        local left = cl:cli(node, "LRANGE", queue, "0", "-1")
        return left:match("^%s*0000000000000009%s*$") ~= nil, ("queue %q"):format(left)
      end, 5000, nil, holder))
      lib.rl_unwatch(listener.client, r, #r)
      for node = 1, cl.n do cl:cli(node, "DEL", queue) end
    end)
    listener:close()
    holder:close()
    assert(ok, err)
  end)

  -- Anyone who may write to the nodes can fill a queue: with 2,000,000
  -- entries a waiter's script scanned it twice (LPOS refused, LREM granted),
  -- ~40-120 ms each, beyond the node timeout, so a free lock stayed
  -- "unavailable" to the waiter; and every refused attempt renewed the
  -- queue's minute. Now a queue longer than 1024 is left alone: not
  -- scanned, not joined, its expiry not renewed; the waiter goes by the
  -- broadcast and its polls.
  it("still locks for a waiter, promptly, with 2,000,000 entries pushed into the queue by others", function()
    local ffi = require "ffi"
    local lib = require("redlock.cdefs").lib
    local out = ffi.new("rl_result")
    local r = res("huge")
    local channel, queue = "redlock:released:" .. r, "redlock:queue:" .. r
    local N = 2000000
    local fill = "local t = {} for i = 1, 1000 do t[i] = i end "
      .. "for j = 1, tonumber(ARGV[1]) do redis.call('rpush', KEYS[1], unpack(t)) end return redis.call('llen', KEYS[1])"
    for node = 1, cl.n do
      for _ = 1, 10 do cl:cli(node, "EVAL", fill, "1", queue, tostring(N / 10000)) end
      assert.equal(tostring(N), cl:cli(node, "LLEN", queue))
      assert.equal("-1", cl:cli(node, "PTTL", queue))
    end
    local function queue_is(len)
      assert(cluster.await_all(cl, function(node)
        local n, pttl = cl:cli(node, "LLEN", queue), cl:cli(node, "PTTL", queue)
        -- never joined nor renewed (before: N + 1 entries, a minute to live)
        return n == tostring(len) and pttl == "-1", ("llen %s, pttl %s"):format(n, pttl)
      end, 5000))
    end
    local holder = redlock.new { servers = cl.urls }
    -- a node timeout below the scan's time, so that a scan shows (the
    -- lock waits up to 10 s: an attempt that times out by load is retried)
    local waiter = redlock.new { servers = cl.urls, node_timeout = 20 }
    local listener = redlock.new { servers = cl.urls }
    local ok, err = pcall(function()
      -- a lock's waiter: refused while the holder's 1.5 s run, then granted
      local lk = assert(holder:lock(r, { ttl = 1500 }))
      assert(cluster.await_value(cl, r, lk.value, 5000, nil, holder))
      local got, why, detail = waiter:lock(r, { wait = 10000 })
      assert.is_not_nil(got, tostring(why) .. " " .. cluster.show(detail))
      queue_is(N)
      assert.is_true(got:unlock()) -- its release drops 8 entries (nobody listens for them)
      queue_is(N - 8)
      -- a release still wakes a waiter (popping 8 of the entries, then the
      -- broadcast), and the woken waiter's attempt gets the lock
      lk = assert(holder:lock(r))
      assert(cluster.await_value(cl, r, lk.value, 5000, nil, holder))
      assert.equal(0, lib.rl_watch(listener.client, r, #r))
      await_subscribers(channel, { listener })
      assert.equal(0, lib.rl_acquire_queued(listener.client, r, #r, 10000, out))
      assert.equal(lib.RL_STATUS_BUSY, out.status)
      local heard = lib.rl_heard(listener.client, r, #r)
      assert.is_true(lk:unlock())
      assert.equal(1, lib.rl_sleep_until(listener.client, r, #r, heard, 5000))
      assert.equal(0, lib.rl_acquire_queued(listener.client, r, #r, 10000, out))
      assert.equal(lib.RL_STATUS_OK, out.status)
      local value = ffi.string(out.value)
      -- held on a quorum (a node slow under the 2,000,000 entries may have
      -- refused or timed out: the grant does not need it)
      local held = 0
      for node = 1, cl.n do if cluster.get(cl, node, r) == value then held = held + 1 end end
      assert.is_true(held >= out.quorum, ("held on %d nodes, quorum %d"):format(held, out.quorum))
      assert.equal(0, lib.rl_release(listener.client, r, #r, value, out))
      lib.rl_unwatch(listener.client, r, #r)
      queue_is(N - 24)
    end)
    for node = 1, cl.n do cl:cli(node, "UNLINK", queue) end
    listener:close()
    waiter:close()
    holder:close()
    assert(ok, err)
  end)

  it("takes at most 1024 waiters in a queue: a waiter that finds it full is not queued", function()
    local ffi = require "ffi"
    local lib = require("redlock.cdefs").lib
    local out = ffi.new("rl_result")
    local r = res("full")
    local queue = "redlock:queue:" .. r
    local holder = redlock.new { servers = cl.urls }
    local w = redlock.new { servers = cl.urls }
    local fill = "for i = 1, tonumber(ARGV[1]) do redis.call('rpush', KEYS[1], string.format('%016x', i)) end"
    local function attempt_then(len, pttl_ok)
      assert.equal(0, lib.rl_acquire_queued(w.client, r, #r, 10000, out))
      assert.equal(lib.RL_STATUS_BUSY, out.status)
      assert(cluster.await_all(cl, function(node)
        local n = cl:cli(node, "LLEN", queue)
        local pttl = tonumber((cl:cli(node, "PTTL", queue)))
        return n == tostring(len) and pttl_ok(pttl), ("llen %s, pttl %s"):format(n, pttl)
      end, 5000, nil, w))
    end
    local ok, err = pcall(function()
      local lk = assert(holder:lock(r))
      assert(cluster.await_value(cl, r, lk.value, 5000, nil, holder))
      for node = 1, cl.n do cl:cli(node, "EVAL", fill, "1", queue, "1024") end
      -- full: not joined, its expiry (none) not renewed
      attempt_then(1024, function(pttl) return pttl == -1 end)
      -- one place left: joined at the end, the queue lives a minute
      for node = 1, cl.n do cl:cli(node, "RPOP", queue) end
      attempt_then(1024, function(pttl) return pttl > 0 and pttl <= 60000 end)
      local id
      for node = 1, cl.n do
        local last = cl:cli(node, "LINDEX", queue, "-1")
        assert.matches("^%x+$", last)
        assert.are_not.equal(("%016x"):format(1024), last)
        id = id or last
        assert.equal(id, last)
      end
      -- in it, a refused attempt keeps its place (not a second entry)
      attempt_then(1024, function(pttl) return pttl > 0 and pttl <= 60000 end)
      assert.is_true(lk:unlock())
    end)
    for node = 1, cl.n do cl:cli(node, "DEL", queue) end
    w:close()
    holder:close()
    assert(ok, err)
  end)

  it("wakes nobody with a failed acquire's cleanup", function()
    -- A cleanup deletes a loser's key on a minority of nodes while the lock
    -- is held elsewhere (or by nobody, after a split vote): a waiter woken
    -- by it would only race for a lock it cannot get.
    local ffi = require "ffi"
    local lib = require("redlock.cdefs").lib
    local out = ffi.new("rl_result")
    local r = res("quietcleanup")
    local channel = "redlock:released:" .. r
    local waiter = redlock.new { servers = cl.urls }
    local loser = redlock.new { servers = cl.urls }
    local ok, err = pcall(function()
      for i = 2, 3 do assert.is_true(cluster.set_nx(cl, i, r, "held-elsewhere", 10000)) end
      assert.equal(0, lib.rl_watch(waiter.client, r, #r))
      await_subscribers(channel, { waiter })
      assert.equal(0, lib.rl_acquire_queued(waiter.client, r, #r, 10000, out))
      assert.equal(lib.RL_STATUS_BUSY, out.status)
      local heard = lib.rl_heard(waiter.client, r, #r)
      -- the loser gets node 1 only (once the waiter's own cleanup is there),
      -- and cleans it up
      assert(cluster.await_value(cl, r, nil, 5000, { [2] = true, [3] = true }, waiter))
      -- (decided at quorum, node 1 may not have answered yet: "pending";
      -- only a granted node 1 shows there was something to clean up)
      local lk, why, detail
      for _ = 1, 20 do
        lk, why, detail = loser:try_lock(r)
        assert.is_nil(lk)
        assert.equal("busy", why)
        if detail[1].state == "ok" then break end
        assert(cluster.await_value(cl, r, nil, 5000, { [2] = true, [3] = true }, loser))
      end
      assert.equal("ok", detail[1].state, "the loser's SET never was granted on node 1: nothing to clean up")
      assert(cluster.await_value(cl, r, nil, 5000, { [2] = true, [3] = true }, loser))
      assert.equal(0, lib.rl_sleep_until(waiter.client, r, #r, heard, 300))
      -- a release that deletes does wake it
      for i = 2, 3 do cluster.del(cl, i, r) end
      local holder = assert(loser:try_lock(r))
      assert(cluster.await_value(cl, r, holder.value, 5000, nil, loser))
      assert.is_true(holder:unlock())
      assert.equal(1, lib.rl_sleep_until(waiter.client, r, #r, heard, 5000))
      lib.rl_unwatch(waiter.client, r, #r)
    end)
    waiter:close()
    loser:close()
    assert(ok, err)
  end)

  -- Before: a lock with wait = 0 made its attempt, then the queued one "at
  -- once" too, and left its place in the nodes' queues for a minute.
  it("makes one attempt with wait = 0, and leaves no place in the nodes' queues", function()
    local holder = redlock.new { servers = cl.urls }
    local dlm = redlock.new { servers = cl.urls }
    local r = res("wait0")
    local lk = assert(holder:lock(r, { ttl = 10000 }))
    assert(cluster.await_value(cl, r, lk.value, 5000, nil, holder)) -- (its tail in too)
    local sets = cluster.calls(cl, "set")
    local got, err = dlm:lock(r, { wait = 0 })
    assert.is_nil(got)
    assert.are.equal("busy", err)
    assert.are.equal(3, cluster.calls(cl, "set") - sets) -- one attempt: a SET a node
    for i = 1, 3 do assert.is_false(cluster.exists(cl, i, "redlock:queue:" .. r)) end
    assert(lk:unlock())
    holder:close()
    dlm:close()
  end)

  it("a waiter on a key of another type is refused 'busy', as try_lock is, not 'unavailable'", function()
    local dlm = redlock.new { servers = cl.urls }
    local r = res("hash")
    for i = 1, 3 do cluster.call(cl, i, "HSET", r, "f", "v") end
    local got, err, detail = dlm:lock(r, { wait = 200, retry = redlock.retry.fixed(50, 4) })
    assert.is_nil(got)
    assert.are.equal("busy", err, cluster.show(detail))
    assert.are.equal("busy", select(2, dlm:try_lock(r)))
    for i = 1, 3 do cluster.del(cl, i, r) end
    dlm:close()
  end)

  it("does not publish when the release deleted nothing", function()
    local dlm = redlock.new { servers = cl.urls }
    local r = res("nopublish")
    local ch = "redlock:released:" .. r
    local dir = proc.tmpdir()
    local pid = proc.spawn({ "redis-cli", "-p", tostring(cl.ports[1]), "SUBSCRIBE", ch }, { out = dir .. "/sub" })
    local ok, err = pcall(function()
      proc.wait_file(dir .. "/sub")
      local lk = assert(dlm:lock(r))
      -- granted at quorum, a node still in its setup gets the SET at the next I/O
      assert(cluster.await_value(cl, r, lk.value, 5000, nil, dlm))
      for i = 1, 3 do cluster.del(cl, i, r) end
      assert.is_falsy(lk:unlock())           -- not held: nothing deleted
      cl:cli(1, "PUBLISH", ch, "marker")     -- everything before it has arrived
      local deadline = proc.now_ms() + 3000
      while not (proc.read_file(dir .. "/sub") or ""):find("marker") and proc.now_ms() < deadline do
        proc.sleep_ms(10)
      end
      local text = proc.read_file(dir .. "/sub")
      assert.matches("marker", text)
      assert.equal(1, select(2, text:gsub("message\n", "")))
    end)
    proc.stop(pid)
    proc.rmdir(dir)
    dlm:close()
    assert(ok, err)
  end)

  it("hands off far below the policy's minimum delay (median < 50 ms, minimum 200 ms)", function()
    -- two processes, each holding 30 ms and retrying 5 ms after its release:
    -- every acquisition but the first waits for the other's release
    local events, summaries = contend(cl.urls, 2, 3000, 30, 5, 200, 250, true)
    local h = handoffs(events)
    print(("hand-off with notifications: n=%d median=%.2f ms p90=%.2f ms max=%.2f ms (%s)"):format(
      #h, median(h) or -1, h[math.ceil(#h * 0.9)] or -1, h[#h] or -1, table.concat(summaries, " "):gsub("\n", "")))
    assert.is_true(#h >= 10, table.concat(summaries))
    assert.is_true(median(h) < 50, "median hand-off " .. tostring(median(h)) .. " ms")
  end)

  it("without notifications, hands off only when a poll happens to come (the contrast)", function()
    -- the same run: a waiter sleeps 200-250 ms, so the holder mostly takes
    -- the lock again after its 5 ms pause
    local events, summaries = contend(cl.urls, 2, 3000, 30, 5, 200, 250, false)
    local h = handoffs(events)
    local _, total = acquisitions_by_pid(events)
    print(("hand-off without notifications: n=%d median=%.2f ms of %d acquisitions"):format(#h, median(h) or -1, total))
    for _, s in ipairs(summaries) do assert.matches("errors=0:", s) end
    assert.is_true(total >= 20, "acquisitions: " .. total) -- the holder kept going
    assert.is_true(#h < 30, "hand-offs: " .. #h)
  end)

  it("still hands off, by polling, with the subscriber connections killed over and over", function()
    local kills = 0
    local events, summaries = contend(cl.urls, 2, 3000, 30, 5, 50, 100, true, function()
      for i = 1, 3 do
        local out = cl:cli(i, "CLIENT", "KILL", "TYPE", "pubsub")
        kills = kills + (tonumber(out) or 0)
      end
    end)
    local by, total = acquisitions_by_pid(events)
    local h = handoffs(events)
    print(("pubsub killed %d times: %d acquisitions, n=%d median hand-off %.2f ms"):format(
      kills, total, #h, median(h) or -1))
    assert.is_true(kills > 0)
    local n = 0
    for _, count in pairs(by) do n = n + 1; assert.is_true(count >= 5, table.concat(summaries)) end
    assert.equal(2, n)
    for _, s in ipairs(summaries) do assert.matches("errors=0:", s) end
  end)

  it("takes over from a foreign holder (never published) once its key expires", function()
    local dlm = redlock.new { servers = cl.urls }
    local r = res("foreign")
    -- every key is set after t0, so none expires before t0 + 400 (on a
    -- loaded machine the three redis-cli calls take a while)
    local t0 = proc.now_ms()
    for i = 1, 3 do assert.equal("OK", (cl:cli(i, "SET", r, "foreign", "PX", "400"))) end
    local lk, err = dlm:lock(r, { retry = redlock.retry.forever(50, 100), wait = 3000 })
    local took = proc.now_ms() - t0
    assert.is_truthy(lk, err)
    assert.is_true(took >= 390, "took " .. took .. " ms")
    assert.equal(3, dlm.client:listening())  -- it did wait listening
    assert.is_true(lk:unlock())
    dlm:close()
  end)

  it("works for an ACL user allowed no channels: releases, and waits by polling", function()
    local acl = cluster.start(3, { args = { "--user", "locker", "on", ">pw", "~*", "resetchannels", "+@all" } })
    local urls = {}
    for i = 1, 3 do urls[i] = "redis://locker:pw@127.0.0.1:" .. acl.ports[i] end
    local dlm = redlock.new { servers = urls }
    local r = res("acl")
    for i = 1, 3 do assert.equal("OK", (acl:cli(i, "SET", r, "foreign", "PX", "300"))) end
    local lk, err = dlm:lock(r, { retry = redlock.retry.forever(20, 40), wait = 3000 })
    assert.is_truthy(lk, err)
    assert.is_true(lk:unlock())
    dlm:close()
    acl:stop()
  end)

  -- workers processes that lock again as soon as they unlock (holding 1 ms,
  -- default-like policy) for run_ms: their acquisitions, each one's count
  -- (sorted), and the hand-offs to another process (ms, sorted), printed
  local function contend_again(label, workers, run_ms)
    local events, summaries = contend(cl.urls, workers, run_ms, 1, 0, 50, 250, true)
    local by, total = acquisitions_by_pid(events)
    local shares = {}
    for _, count in pairs(by) do shares[#shares + 1] = count end
    table.sort(shares)
    local h = handoffs(events)
    print(("%s: %d acquisitions, per process %s; hand-offs n=%d median %.2f ms"):format(
      label, total, table.concat(shares, " "), #h, median(h) or -1))
    for _, s in ipairs(summaries) do assert.matches("errors=0:", s) end
    assert.equal(workers, #shares, table.concat(summaries))
    return total, shares, h
  end

  it("is fair enough: 8 processes holding ~1 ms for ~5 s", function()
    local total, shares = contend_again("fairness", 8, 5000)
    for _, count in ipairs(shares) do assert.is_true(count >= 0.05 * total, table.concat(shares, " ")) end
  end)

  it("gives the waiter a release woke a head start over the releaser locking again at once", function()
    -- Two processes that lock again as soon as they unlock: without the head
    -- start the releaser wins nearly every time (the woken waiter sleeps
    -- 0-3 ms, then needs a round), and the other only gets the lock when a
    -- poll happens to fall in the gap.
    local total, shares, h = contend_again("head start", 2, 3000)
    assert.is_true(shares[1] >= 0.25 * total, table.concat(shares, " "))
    -- ~97% go to the waiter; without the head start about half did with
    -- the jitter scaled to the listeners (16% when every woken waiter slept
    -- 0-3 ms first)
    assert.is_true(#h >= 0.8 * total, #h .. " of " .. total)
  end)

  it("stops giving head starts nobody uses: a subscriber that never asks", function()
    -- A stopped waiter's process stays subscribed: every release is heard,
    -- and a client that locks again at once waited out the 8 ms head start
    -- each time (300 cycles: 2.6 s against 0.1 s). After a wasted one the
    -- next 1, 2, 4, ... up to 64 releases give none.
    local dlm = redlock.new { servers = cl.urls }
    local r = res("nobody-asks")
    local waited = 0
    local ok, err = with_listeners("redlock:released:" .. r, function()
      for _ = 1, 200 do
        local t0 = proc.now_ms()
        local lk = assert(dlm:lock(r, { ttl = 5000 }))
        -- a head start is waited out to its end: 8 ms at least
        if proc.now_ms() - t0 >= 8 then waited = waited + 1 end
        assert(lk:unlock())
      end
    end)
    dlm:close()
    assert(ok, err)
    -- the backoff makes about 9 of 200; a slow machine may take 8 ms on a
    -- few more for reasons of its own
    assert.is_true(waited <= 40, waited .. " of 200 lock calls waited a head start")
  end)

  it("keeps a semaphore's won wait subscribed a while, not a lock's, nor a failed wait's", function()
    -- rl_unwatch_won: a worker that takes a semaphore in a loop subscribes
    -- once, not around every call
    local retry = require "redlock.retry"
    local holder, waiter = redlock.new { servers = cl.urls }, redlock.new { servers = cl.urls }
    local function numsub(channel)
      return tonumber(cl:cli(1, "PUBSUB", "NUMSUB", channel):match("(%d+)$"))
    end
    -- drive the waiter's client for ms; the subscribers node 1 counts then
    local function after(ms, channel)
      waiter.client:sleep(ms)
      return numsub(channel)
    end
    -- the holder takes every permit (a semaphore's lock call always
    -- watches, and lingers too); its own linger is let run out
    local function hold_all(r, limit, ttl)
      local locks = {}
      for i = 1, limit or 1 do locks[i] = assert(holder:lock(r, { ttl = ttl, limit = limit })) end
      holder.client:sleep(600)
      return locks
    end
    for _, limit in ipairs { false, 2 } do
      limit = limit or nil
      local r = res(limit and "linger-sem" or "linger")
      local channel = "redlock:released:" .. r
      -- a won wait: the holder's locks lapse
      hold_all(r, limit, 900)
      assert.equal(0, numsub(channel))
      local lk = assert(waiter:lock(r, { limit = limit, retry = retry.fixed(50, 40) }))
      if not limit then
        assert.equal(0, after(20, channel)) -- a lock's: unsubscribed at once
        lk:unlock()
      else
        assert.equal(1, after(100, channel)) -- still subscribed
        assert.is_true(lk:unlock())
        -- a wait within the linger subscribes nothing new; after it, nothing is
        local again = assert(waiter:lock(r, { limit = limit }))
        assert.equal(1, numsub(channel))
        again:unlock()
        local n
        for _ = 1, 100 do
          n = after(20, channel)
          if n == 0 then break end
        end
        assert.equal(0, n) -- the linger (500 ms) ended
      end
      -- a failed wait: unsubscribed at once
      local held = hold_all(r, limit)
      assert.is_nil(waiter:lock(r, { limit = limit, retry = retry.fixed(20, 2) }))
      assert.equal(0, after(20, channel))
      for _, h in ipairs(held) do h:unlock() end
    end
    holder:close()
    waiter:close()
  end)

  it("stops listening when the retry policy raises, or an attempt finds no room, while waiting", function()
    -- Before: the policy's error, and until later an attempt's, left the
    -- resource watched (subscribed) for the client's life.
    local holder = redlock.new { servers = cl.urls }
    local r = res("raising")
    local lk = assert(holder:lock(r))
    local channel = "redlock:released:" .. r
    local dlm -- a client per case
    -- an attempt that finds no room: the policy fills every operation slot
    -- of the client with releases nobody collects, the slots of earlier
    -- attempts' tails too once those end (none freed for 200 ms, 4 node
    -- timeouts), so the next attempt waits for room in vain; it fails
    -- "unavailable" (each node's error: "too many operations"), and the
    -- policy gives up
    local function fill_slots(n)
      if n == 2 then
        local value, last = ("0"):rep(40), proc.now_ms()
        while proc.now_ms() - last < 200 do
          if dlm.client:begin_release("spec:fill", 9, value) >= 0 then last = proc.now_ms() else dlm.client:sleep(10) end
        end
      end
      return n < 3 and 5 or nil
    end
    for policy, says in pairs {
      [function(n) if n >= 2 then error("policy gave out") end return 5 end] = "policy gave out",
      [function(n) if n >= 2 then return "later" end return 5 end] = "bad retry policy: after attempt 2",
      [fill_slots] = "no operation slot free",
    } do
      dlm = redlock.new { servers = cl.urls }
      local ok, got, err, detail = pcall(dlm.lock, dlm, r, { retry = policy })
      if policy == fill_slots then
        assert.is_true(ok, tostring(got))
        assert.is_nil(got)
        assert.are.equal("unavailable", err)
        assert.matches(says, detail[1].error, 1, true)
      else
        assert.is_false(ok)
        assert.matches(says, got, 1, true)
      end
      -- the UNSUBSCRIBE goes out as the client's loop runs
      local numsub
      for _ = 1, 100 do
        dlm.client:sleep(10)
        numsub = tonumber(cl:cli(1, "PUBSUB", "NUMSUB", channel):match("(%d+)$"))
        if numsub == 0 then break end
      end
      assert.equal(0, numsub)
      dlm:close()
    end
    assert.is_true(lk:unlock())
    holder:close()
  end)

  it("lets go of a wait dropped in a yielding retry policy once it is collected: the next waiter gets the turn", function()
    -- Before: the libev transport took no notice of a wait's holder, so a
    -- coroutine dropped (never resumed) inside its policy left its client
    -- subscribed and queued for the client's life, and the release woke
    -- that dead wait instead of the waiter queued behind it, which got the
    -- lock only after its policy's delay (5 s here).
    local lua_list = require("helpers.nginx").lua_list
    local r = res("abandoned")
    local channel, queue = "redlock:released:" .. r, "redlock:queue:" .. r
    local function numsub(node, name)
      return tonumber(cl:cli(node, "PUBSUB", "NUMSUB", name):match("(%d+)%s*$"))
    end
    local function queued(node)
      local ids = {}
      for id in cl:cli(node, "LRANGE", queue, 0, -1):gmatch("%x+") do ids[#ids + 1] = id end
      return ids
    end
    local holder, a = redlock.new { servers = cl.urls }, redlock.new { servers = cl.urls }
    local dir = proc.tmpdir()
    local pid
    local ok, err = pcall(function()
      local held = assert(holder:lock(r, { ttl = 30000 }))
      assert(cluster.await_value(cl, r, held.value, 5000, nil, holder))
      -- a's wait: subscribed and queued, then its policy yields for good.
      -- In a function of its own, so that no dead slot of this frame still
      -- holds the coroutine when the collector looks (LuaJIT marks a
      -- frame's every slot)
      local function abandon_a_wait()
        local co = coroutine.create(function()
          return a:lock(r, { retry = function() coroutine.yield(); return 10 end })
        end)
        assert(coroutine.resume(co))
        assert.equal("suspended", coroutine.status(co))
      end
      abandon_a_wait()
      local id
      assert(cluster.await_all(cl, function(node)
        a.client:sleep(1)
        id = queued(node)[1]
        if id == nil then return false, "not queued" end
        local w, b = numsub(node, "redlock:wake:" .. id .. ":" .. r), numsub(node, channel)
        return w == 1 and b == 1, ("wake %d, released %d"):format(w, b)
      end, 5000))
      local wake = "redlock:wake:" .. id .. ":" .. r
      collectgarbage()
      collectgarbage()
      -- one more call on the client: it is no longer subscribed
      assert.is_nil((a:try_lock(r)))
      assert(cluster.await_all(cl, function(node)
        -- (a call again now and then: a collector that left the wait
        -- for later, as an incremental one may, gets its turn)
        collectgarbage()
        assert.is_nil((a:try_lock(r)))
        local w, b = numsub(node, wake), numsub(node, channel)
        return w == 0 and b == 0, ("wake %d, released %d"):format(w, b)
      end, 2000))
      -- b, in a process of its own, queues behind a's stale place
      local code = ([[
        local proc, redlock = require "helpers.proc", require "redlock"
        local dlm = redlock.new { servers = %s }
        local lk, err = dlm:lock(%q, { retry = redlock.retry.fixed(5000, 3) })
        proc.write_file(%q, ("%%s %%.1f"):format(lk and "ok" or tostring(err), proc.now_ms()))
      ]]):format(lua_list(cl.urls), r, dir .. "/result")
      pid = proc.spawn_luajit({ "luajit", "-e", code }, dir .. "/out")
      assert(cluster.await_all(cl, function(node)
        local ids = queued(node)
        return #ids == 2 and ids[1] == id and numsub(node, channel) == 1,
               ("queued %s, released %d"):format(table.concat(ids, ","), numsub(node, channel))
      end, 10000), "b did not queue behind a")
      local released = proc.now_ms()
      assert.is_true(held:unlock())
      local text = proc.wait_file(dir .. "/result", 10000)
      local word, at = text:match("^(%S+) ([%d.]+)$")
      assert.equal("ok", word, "b said: " .. text .. " " .. tostring(proc.read_file(dir .. "/out")))
      -- woken: well before its policy's delay
      local after = tonumber(at) - released
      assert.is_true(after < 2500, ("b acquired %.0f ms after the release"):format(after))
    end)
    if pid then proc.stop(pid) end
    holder:close()
    a:close()
    proc.rmdir(dir)
    assert(ok, err)
  end)
end)
