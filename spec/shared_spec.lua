-- Shared (read) holds: dlm:lock(resource, { shared = true }) and the same
-- option on try_lock, with_lock and lock_many. Readers hold together,
-- writers alone, on real nodes: the keys each node keeps, extend,
-- keep-alive and lost(), decisions at quorum and the cleanup of a refused
-- acquire, wake-ups both ways, lock_many, misuse, writer priority (6
-- readers in a tight loop and a writer), and a history of 6 processes
-- mixing both kinds under SIGSTOP pauses and a node crash.

local cluster = require "helpers.cluster"
local history = require "helpers.history"
local proc = require "helpers.proc"
local redlock = require "redlock"

local res = cluster.names("shared")

-- Start a shared_worker process (spec/helpers/shared_worker.lua); its pid.
local function worker(mode, dir, resource, ttl, run, urls, tag)
  local argv = { "luajit", "spec/helpers/shared_worker.lua", mode, dir, resource, tostring(ttl), tostring(run) }
  for _, u in ipairs(urls) do argv[#argv + 1] = u end
  return proc.spawn_luajit(argv, ("%s/%s.out"):format(dir, tag))
end

-- The overlaps in a run's logs: writer-with-anyone and reader-with-reader,
-- and the holds of each kind.
local function overlaps(dir)
  local readers = proc.read_file(dir .. "/readers.log") or ""
  local writers = proc.read_file(dir .. "/writers.log") or ""
  local r = history.check(readers, { text = true })
  local all = history.check(readers .. writers, { text = true })
  local w = history.check(writers, { text = true })
  return {
    writer = all.overlaps - r.overlaps,
    reader = r.overlaps,
    shared = r.acquisitions,
    exclusive = w.acquisitions,
    broken = all.unfinished + all.malformed,
    examples = table.concat(all.examples, "; "),
  }
end

describe("shared holds", function()
  local cl, a, b

  setup(function()
    cl = cluster.start(5)
    a = redlock.new { servers = cl.urls, ttl = 2000 }
    b = redlock.new { servers = cl.urls, ttl = 2000 }
  end)

  teardown(function()
    if a then a:close() end
    if b then b:close() end
    cluster.stop_all()
  end)

  local function readers_on(i, key)
    local out = cluster.call(cl, i, "ZCARD", "redlock:readers:" .. key)
    return tonumber(out)
  end

  it("holds readers together and writers alone, on every node's keys", function()
    local r = res("together")
    local r1 = assert(a:lock(r, { shared = true }))
    local r2 = assert(b:try_lock(r, { shared = true }))
    assert.is_true(r1.shared and r2.shared)
    assert.matches("^%x+s$", r1.value)
    assert.are.equal(40, #r1.value)
    -- the key holds the mark, and the readers' set both values, with their expiries in the node's time
    for i = 1, cl.n do
      assert.are.equal("redlock:shared", cluster.get(cl, i, r))
      assert.are.equal(2, readers_on(i, r))
      local pttl = cluster.pttl(cl, i, r)
      assert.is_true(pttl > 1000 and pttl <= 2000, tostring(pttl))
    end
    -- a writer is refused, ours and any other Redlock client's SET NX
    local w, err = b:try_lock(r)
    assert.is_nil(w)
    assert.are.equal("busy", err)
    assert.is_false(cluster.set_nx(cl, 1, r, "theirs", 5000))
    assert.is_true((r1:unlock()))
    assert.is_nil((b:try_lock(r)))
    assert.is_true((r2:unlock()))
    -- the last reader gone, nothing of them is left
    for i = 1, cl.n do
      assert.is_false(cluster.exists(cl, i, r))
      assert.is_false(cluster.exists(cl, i, "redlock:readers:" .. r))
    end
    -- a writer excludes readers
    w = assert(a:try_lock(r))
    assert.is_false(w.shared)
    local s, serr = b:try_lock(r, { shared = true })
    assert.is_nil(s)
    assert.are.equal("busy", serr)
    assert.is_true((w:unlock()))
    -- and so does another client's key on a quorum
    for i = 1, 3 do assert.is_true(cluster.set_nx(cl, i, r, "theirs", 5000)) end
    s, serr = b:try_lock(r, { shared = true })
    assert.is_nil(s)
    assert.are.equal("busy", serr)
    for i = 1, 3 do cluster.call(cl, i, "DEL", r) end
    -- a refused shared acquire was cleaned up on the nodes that granted it
    local deadline = proc.now_ms() + 2000
    local left
    repeat
      left = 0
      for i = 1, cl.n do left = left + readers_on(i, r) end
      if left > 0 then proc.sleep_ms(10) end
    until left == 0 or proc.now_ms() > deadline
    assert.are.equal(0, left)
  end)

  it("extends a shared hold, keeps it alive, and sees it lost once it is gone", function()
    local r = res("keep")
    local s = assert(a:lock(r, { shared = true, ttl = 500 }))
    assert.is_true((s:extend(3000)))
    assert.is_true(cluster.pttl(cl, 1, r) > 2000)
    -- a shorter extension shortens the key with it (it is the only reader)
    assert.is_true((s:extend(800)))
    assert.is_true(cluster.pttl(cl, 1, r) <= 800)
    assert.is_true((s:unlock()))
    local nope, err = s:extend()
    assert.is_nil(nope)
    assert.are.equal("invalid", err)

    local kept = assert(a:lock(r, { shared = true, ttl = 500, keepalive = true }))
    local other = assert(b:lock(r, { shared = true, ttl = 500 }))
    proc.sleep_ms(1500) -- three ttls
    assert.is_false(kept:lost())
    assert.is_true(kept:valid())
    assert.is_true(other:lost()) -- not kept: run out
    assert.are.equal(1, readers_on(1, r)) -- pruned of the expired one
    for i = 1, cl.n do cluster.call(cl, i, "DEL", "redlock:readers:" .. r) end
    local deadline = proc.now_ms() + 3000
    while not kept:lost() and proc.now_ms() < deadline do proc.sleep_ms(20) end
    assert.is_true(kept:lost())
    assert.has_error(function() kept:check() end)
  end)

  it("is decided at quorum with a node stopped, and with_lock holds shared", function()
    local r = res("quorum")
    local d = redlock.new { servers = cl.urls, ttl = 2000, node_timeout = 200 }
    proc.kill(cl.pids[5], "STOP")
    local ok, e = pcall(function()
      local shared, votes = d:with_lock(r, { shared = true }, function(lk)
        local other = assert(b:try_lock(r, { shared = true }))
        assert.is_true((other:unlock()))
        return lk.shared, lk.votes
      end)
      assert.is_true(shared, tostring(votes))
      assert.is_true(votes >= 3 and votes <= 4, tostring(votes))
    end)
    proc.kill(cl.pids[5], "CONT")
    d:close()
    assert(ok, e)
  end)

  it("wakes a waiting reader on a writer's release, and a waiting writer on the last reader's", function()
    local dir = proc.tmpdir()
    local ok, e = pcall(function()
      -- a writer (holder.lua: exclusive, 400 ms) and a reader polling every 4 s
      local r = res("wake-readers")
      local argv = { "luajit", "spec/helpers/holder.lua", r, "400", dir .. "/ready" }
      for _, u in ipairs(cl.urls) do argv[#argv + 1] = u end
      proc.spawn_luajit(argv, dir .. "/holder.out")
      proc.wait_file(dir .. "/ready", 5000)
      local t0 = proc.now_ms()
      local s = assert(a:lock(r, { shared = true, wait = 10000, retry = redlock.retry.fixed(4000, 5) }))
      local waited = proc.now_ms() - t0
      assert.is_true(waited < 3000, ("the reader got in after %d ms: it was not woken"):format(waited))
      assert.is_true((s:unlock()))

      -- two readers (300 ms and 900 ms) and a writer polling every 4 s
      r = res("wake-writer")
      local p1 = worker("hold", dir, r, 5000, 300, cl.urls, "r1")
      local p2 = worker("hold", dir, r, 5000, 900, cl.urls, "r2")
      proc.wait_file(("%s/held-%d"):format(dir, p1), 5000)
      proc.wait_file(("%s/held-%d"):format(dir, p2), 5000)
      local w = assert(b:lock(r, { wait = 10000, retry = redlock.retry.fixed(4000, 5) }))
      local got_us = proc.now_us()
      assert.is_true((w:unlock()))
      local h = overlaps(dir)
      assert.are.equal(2, h.shared)
      local last_exit = 0
      for t in (proc.read_file(dir .. "/readers.log") or ""):gmatch("exit %d+ %d+ (%d+)") do
        last_exit = math.max(last_exit, tonumber(t))
      end
      assert.is_true(got_us > last_exit, "the writer got in before the last reader left")
      assert.is_true(got_us - last_exit < 3000000,
        ("the writer got in %d ms after the last reader left: it was not woken"):format((got_us - last_exit) / 1000))
    end)
    proc.rmdir(dir)
    assert(ok, e)
  end)

  it("takes lock_many shared: together with readers, refused by a writer, all or nothing", function()
    local g1 = assert(a:lock_many({ res("m1"), res("m2") }, { shared = true }))
    local names = { g1[1].resource, g1[2].resource }
    local g2 = assert(b:lock_many({ names[2], names[1] }, { shared = true }))
    assert.is_true(g1[1].shared and g2[2].shared)
    local w, err = b:try_lock(names[1])
    assert.is_nil(w)
    assert.are.equal("busy", err)
    assert.is_true((g1:unlock()))
    assert.is_true((g2:unlock()))
    local third = res("m3")
    w = assert(a:lock(third))
    local g3
    g3, err = b:lock_many({ names[1], third }, { shared = true, wait = 0 })
    assert.is_nil(g3)
    assert.are.equal("busy", err)
    -- what it got of names[1] it gave back
    local deadline = proc.now_ms() + 2000
    while proc.now_ms() < deadline and cluster.exists(cl, 1, names[1]) do proc.sleep_ms(10) end
    assert.is_false(cluster.exists(cl, 1, names[1]))
    assert.is_true((w:unlock()))
  end)

  it("adopts a shared hold by its value", function()
    local r = res("adopt")
    local s = assert(a:lock(r, { shared = true }))
    local t = assert(b:adopt(r, s.value, { ttl = 4000 }))
    assert.is_true(t.shared)
    assert.is_true(cluster.pttl(cl, 1, r) > 2000)
    assert.is_true((t:unlock()))
    assert.are.equal("not held", select(2, s:unlock()))
    assert.is_false(cluster.exists(cl, 1, r))
  end)

  it("refuses misuse at the call site", function()
    local r = res("misuse")
    local function raises(pattern, f)
      local ok, e = pcall(f)
      assert.is_false(ok)
      assert.matches(pattern, tostring(e))
      assert.matches("shared_spec.lua:%d+:", tostring(e))
    end
    raises("bad argument #2 to 'lock' %(shared must be a boolean, got 1%)", function()
      local _ = a:lock(r, { shared = 1 })
    end)
    raises("bad argument #2 to 'try_lock' %(fence and shared exclude each other: a shared hold has no fencing token%)",
      function() local _ = a:try_lock(r, { shared = true, fence = true }) end)
    raises("bad argument #2 to 'lock_many' %(shared must be a boolean", function()
      local _ = a:lock_many({ r }, { shared = "yes" })
    end)
    raises("bad argument #2 to 'with_lock' %(fence and shared exclude each other", function()
      local _ = a:with_lock(r, { shared = true, fence = true }, function() end)
    end)
    raises("bad argument #2 to 'adopt' %(value must be a lock value", function()
      local _ = a:adopt(r, "t" .. ("0"):rep(39))
    end)
    assert.is_false(cluster.exists(cl, 1, r))
  end)

  it("gives a waiting writer priority: 6 readers in a tight loop, the writer in within two ttls", function()
    local TTL = 1000
    local dir = proc.tmpdir()
    local r = res("priority")
    local pids = {}
    local ok, e = pcall(function()
      for i = 1, 6 do pids[i] = worker("reader", dir, r, TTL, 30000, cl.urls, "reader" .. i) end
      -- the readers are in, and overlap
      local deadline = proc.now_ms() + 10000
      repeat
        proc.sleep_ms(50)
        local h = overlaps(dir)
      until (h.shared >= 30 and h.reader > 0) or proc.now_ms() > deadline
      local before = overlaps(dir)
      assert.is_true(before.shared >= 30, "the readers did not get going")
      -- (a node timeout that a loaded machine does not turn into failed votes)
      local writer = redlock.new { servers = cl.urls, node_timeout = 500 }
      local t0 = proc.now_ms()
      local w, err = writer:lock(r, { ttl = TTL, wait = 20000 })
      local waited = proc.now_ms() - t0
      assert.is_not_nil(w, tostring(err))
      local log = history.open(dir .. "/writers.log")
      log:enter()
      proc.sleep_ms(50)
      log:exit()
      log:close()
      local unlocked, uerr, udetail = w:unlock()
      local states = {}
      for i = 1, #udetail do states[i] = udetail[i].state .. (udetail[i].error and ("(" .. udetail[i].error .. ")") or "") end
      assert.is_true(unlocked, tostring(uerr) .. ": " .. table.concat(states, ", "))
      writer:close()
      local after_us = proc.now_us()
      -- readers go on after the writer
      deadline = proc.now_ms() + 10000
      local progressed
      repeat
        proc.sleep_ms(50)
        progressed = 0
        for t in (proc.read_file(dir .. "/readers.log") or ""):gmatch("enter %d+ %d+ (%d+)") do
          if tonumber(t) > after_us then progressed = progressed + 1 end
        end
      until progressed >= 6 or proc.now_ms() > deadline
      proc.write_file(dir .. "/stop", "stop")
      for i = 1, 6 do
        assert(proc.wait_gone(pids[i], 15000), ("reader %d did not stop (the writer waited %d ms)"):format(i, waited))
      end
      local h = overlaps(dir)
      print(("shared priority: writer waited %d ms (ttl %d) among 6 readers; %d shared holds, %d after the writer")
        :format(waited, TTL, h.shared, progressed))
      assert.is_true(waited < 2 * TTL, ("the writer waited %d ms (ttl %d)"):format(waited, TTL))
      assert.is_true(progressed >= 6, "the readers made no progress after the writer")
      assert.are.equal(0, h.writer, h.examples)
      assert.is_true(h.reader > 0)
      assert.are.equal(0, h.broken)
    end)
    for _, pid in ipairs(pids) do proc.stop(pid) end
    local outs = {}
    for i = 1, 6 do outs[i] = proc.read_file(("%s/reader%d.out"):format(dir, i)) or "" end
    proc.rmdir(dir)
    assert(ok, tostring(e) .. "\n" .. table.concat(outs))
  end)

  it("keeps writers alone in a history of 6 processes mixing both, under SIGSTOP pauses and a node crash", function()
    local TTL, RUN_MS = 3000, 9000
    local dir = proc.tmpdir()
    local r = res("history")
    local pids = {}
    local crashed = false
    local ok, e = pcall(function()
      for i = 1, 6 do pids[i] = worker("mix", dir, r, TTL, RUN_MS, cl.urls, "mix" .. i) end
      local t0 = proc.now_ms()
      local down_at, pauses = nil, 0
      math.randomseed(proc.getpid())
      while proc.now_ms() - t0 < RUN_MS - 1000 do
        local since = proc.now_ms() - t0
        if not down_at and since > 2000 then
          cl:kill(2, "KILL") -- a crash, restarted after more than a ttl (a delayed restart)
          down_at, crashed = proc.now_ms(), true
        elseif down_at and crashed and proc.now_ms() - down_at > TTL + 500 then
          cl:restart(2)
          crashed = false
        end
        -- a random worker stopped for 100-700 ms: shorter than the validity
        local victim = pids[math.random(#pids)]
        proc.kill(victim, "STOP")
        proc.sleep_ms(math.random(100, 700))
        proc.kill(victim, "CONT")
        pauses = pauses + 1
        proc.sleep_ms(math.random(50, 200))
      end
      if crashed then cl:restart(2); crashed = false end
      for i = 1, 6 do assert(proc.wait_gone(pids[i], RUN_MS + 30000), "worker " .. i .. " did not finish") end
      local summary = {}
      local late = 0
      for i = 1, 6 do
        summary[i] = proc.read_file(("%s/mix%d.out"):format(dir, i)) or ""
        late = late + tonumber(summary[i]:match("late=(%d+)") or "1")
      end
      local h = overlaps(dir)
      local info = ("shared=%d exclusive=%d writer_overlaps=%d reader_overlaps=%d pauses=%d late=%d %s\n%s")
        :format(h.shared, h.exclusive, h.writer, h.reader, pauses, late, h.examples, table.concat(summary))
      print("shared history: " .. info)
      assert.are.equal(0, late, info) -- no holder ran past its validity ...
      assert.are.equal(0, h.writer, info) -- ... so no writer overlapped anyone
      assert.is_true(h.reader > 0, info) -- and readers did share
      assert.is_true(h.exclusive > 10 and h.shared > 10, info)
      assert.are.equal(0, h.broken, info)
    end)
    for _, pid in ipairs(pids) do
      proc.kill(pid, "CONT")
      proc.stop(pid)
    end
    if crashed or not cl:alive(2) then cl:restart(2) end
    proc.rmdir(dir)
    assert(ok, e)
  end)
end)
