-- Semaphores: dlm:lock(resource, { limit = L }) and friends. At most L
-- holders at once, each holding one slot (an ordinary lock on the slot's
-- key) on a quorum: under a partition schedule that fools a count-based
-- semaphore, in a history of 8 processes with pauses and a node restarted
-- empty, with wake-ups on release and a share for every process.

local redlock = require "redlock"
local cluster = require "helpers.cluster"
local history = require "helpers.history"
local nginx = require "helpers.nginx"
local proc = require "helpers.proc"

local res = cluster.names("semaphore")

-- The slot's key of resource (empty prefix), as docs/design.md names it.
local function slot_key(k, resource) return ("redlock:slot:%d:%s"):format(k, resource) end

-- Run `workers` processes of spec/helpers/sem_worker.lua (their retry
-- delay retry_ms, default 200); meanwhile(pids) is called every 20 ms while
-- they run. Returns the checker's counts and the summaries (parsed) of the
-- workers.
local function run_workers(urls, resource, workers, limit, run_ms, hold, ttl, meanwhile, retry_ms)
  local dir = proc.tmpdir()
  local logfile = dir .. "/history.log"
  local pids = {}
  local ok, err = pcall(function()
    for w = 1, workers do
      local argv = { "luajit", "spec/helpers/sem_worker.lua", logfile, resource, tostring(limit), tostring(run_ms),
                     tostring(hold), tostring(ttl) }
      for _, u in ipairs(urls) do argv[#argv + 1] = u end
      pids[w] = proc.spawn(argv, { out = dir .. "/worker" .. w .. ".out", env = { LUA_PATH = package.path,
        LUA_CPATH = package.cpath, SEM_RETRY_MS = tostring(retry_ms or 200) } })
    end
    local until_ = proc.now_ms() + run_ms + 30000
    for w = 1, workers do
      while proc.alive(pids[w]) do
        assert(proc.now_ms() < until_, "worker " .. w .. " did not finish")
        if meanwhile then meanwhile(pids) end
        proc.sleep_ms(20)
      end
    end
  end)
  for _, pid in ipairs(pids) do proc.kill(pid, "CONT"); proc.stop(pid) end
  local summaries, texts = {}, {}
  for w = 1, workers do
    local text = proc.read_file(dir .. "/worker" .. w .. ".out") or ""
    texts[w] = text
    local s = {}
    for k, v in text:gmatch("(%w+)=(%d+)") do s[k] = tonumber(v) end
    summaries[w] = s
  end
  local h = history.check(logfile, { limit = limit })
  proc.rmdir(dir)
  if not ok then error(tostring(err) .. "\n" .. table.concat(texts, "\n"), 0) end
  return h, summaries, table.concat(texts, "")
end

describe("semaphore", function()
  local cl, dlm

  lazy_setup(function()
    cl = cluster.start(5)
    dlm = redlock.new { servers = cl.urls }
  end)
  lazy_teardown(function()
    if dlm then dlm:close() end
    cluster.stop_all()
  end)

  it("admits limit holders, each on a slot of its own, and refuses the next", function()
    local r = res("basic")
    local a = assert(dlm:lock(r, { limit = 2 }))
    local b = assert(dlm:lock(r, { limit = 2 }))
    assert.are.same({ 1, 2 }, { math.min(a.slot, b.slot), math.max(a.slot, b.slot) })
    for i = 1, 5 do
      assert.are.equal(a.value, cluster.get(cl, i, slot_key(a.slot, r)))
      assert.are.equal(b.value, cluster.get(cl, i, slot_key(b.slot, r)))
      assert.is_nil(cluster.get(cl, i, r)) -- the resource's own key is never written
    end
    local c, err, detail = dlm:try_lock(r, { limit = 2 })
    assert.is_nil(c)
    assert.are.equal("busy", err)
    assert.are.equal(0, detail.ok)
    -- the refused attempt left nothing behind
    for i = 1, 5 do assert.is_nil(cluster.get(cl, i, slot_key(3, r))) end
    -- a lock object like any other: extend, valid, check, unlock
    assert.is_true((a:extend(20000)))
    assert.is_true(cluster.pttl(cl, 1, slot_key(a.slot, r)) > 10000)
    assert.is_true(a:valid())
    assert.are.equal(a, a:check())
    local freed = a.slot
    assert.is_true((a:unlock()))
    -- decided at quorum: the last nodes may still be running the release
    assert(cluster.await_value(cl, slot_key(freed, r), nil, 2000, nil, dlm))
    local c2 = assert(dlm:try_lock(r, { limit = 2 }))
    assert.are.equal(freed, c2.slot)
    c2:unlock(); b:unlock()
  end)

  it("a waiting lock with nobody queued takes the first free slot in its own random order", function()
    -- not the lowest free slot: two waiters with nobody ahead would both aim
    -- at it and split its votes
    local r = res("drawn")
    local seen, kinds = {}, 0
    for _ = 1, 40 do
      local lk = assert(dlm:lock(r, { limit = 4 }))
      if not seen[lk.slot] then kinds = kinds + 1 end
      seen[lk.slot] = true
      assert.is_true((lk:unlock()))
      assert(cluster.await_value(cl, slot_key(lk.slot, r), nil, 2000, nil, dlm))
    end
    assert.is_true(kinds > 1, "every one of 40 locks took the same slot")
  end)

  it("wait = 0 makes one attempt: a free slot is taken, a full semaphore says busy", function()
    local r = res("nowait")
    local a = assert(dlm:lock(r, { limit = 2, wait = 0 }))
    assert.is_true(dlm:with_lock(r, { limit = 2, wait = 0 }, function(lk) return lk.slot ~= a.slot end))
    local b = assert(dlm:lock(r, { limit = 2, wait = 0 }))
    local c, err = dlm:lock(r, { limit = 2, wait = 0 })
    assert.is_nil(c)
    assert.are.equal("busy", err)
    a:unlock(); b:unlock()
  end)

  -- Before: the semaphore decided as soon as a refusal and the dead node's
  -- error left no quorum, and said unavailable (exit 69 for `redlock exec
  -- -n --limit`), where a plain lock waits for the node that may hold it
  -- too and says busy.
  it("a full semaphore says busy with a node down, as a held lock does", function()
    local three = cluster.start(3)
    local holder = redlock.new { servers = three.urls }
    local asker = redlock.new { servers = three.urls }
    local ok, err = pcall(function()
      local sem, plain = res("full-down"), res("held-down")
      assert(holder:lock(sem, { limit = 1, ttl = 60000 }))
      assert(holder:lock(plain, { ttl = 60000 }))
      assert(asker:try_lock(res("warm"))):unlock()
      three:kill(3, "KILL")
      for _ = 1, 10 do
        local _, why, detail = asker:try_lock(plain)
        assert.equal("busy", why, cluster.show(detail))
        _, why, detail = asker:try_lock(sem, { limit = 1 })
        assert.equal("busy", why, cluster.show(detail))
        _, why, detail = asker:lock(sem, { limit = 1, wait = 0 })
        assert.equal("busy", why, cluster.show(detail))
      end
    end)
    holder:close()
    asker:close()
    three:stop()
    assert(ok, err)
  end)

  it("limit 1 is a lock on slot 1's key; with_lock and keep-alive work on slots", function()
    local r = res("one")
    local a = assert(dlm:lock(r, { limit = 1 }))
    assert.are.equal(1, a.slot)
    assert.is_nil(dlm:try_lock(r, { limit = 1 }))
    a:unlock()
    local got = dlm:with_lock(r, { limit = 3, ttl = 300 }, function(lk)
      proc.sleep_ms(10)
      require("redlock.cdefs").lib.rl_sleep(dlm.client, 800) -- well past the ttl: kept alive
      assert.is_false(lk:lost())
      assert.are.equal(lk.value, cluster.get(cl, 1, slot_key(lk.slot, r)))
      return lk.slot
    end)
    assert.is_true(got >= 1 and got <= 3)
    for i = 1, 5 do assert.is_nil(cluster.get(cl, i, slot_key(got, r))) end
  end)

  it("close() releases the slots still held", function()
    local r = res("close")
    local d = redlock.new { servers = cl.urls }
    local a = assert(d:lock(r, { limit = 2 }))
    d:close()
    for i = 1, 5 do assert.is_nil(cluster.get(cl, i, slot_key(a.slot, r))) end
  end)

  it("goes with labels, adopt (given the slot) and the metrics' slot kind", function()
    local r = res("rest")
    local d = redlock.new { servers = cl.urls, label = "sem-a" }
    local other = redlock.new { servers = cl.urls }
    local before = d:stats().operations.slot.ok
    local a = assert(d:lock(r, { limit = 2, ttl = 5000 }))
    assert.matches("^sem%-a/%x+$", a.value)
    assert.are.equal(40, #a.value)
    assert.are.equal(a.value, cluster.get(cl, 1, slot_key(a.slot, r)))
    assert.are.equal(before + 1, d:stats().operations.slot.ok)
    assert.are.equal(0, d:stats().operations.acquire.ok) -- counted apart from a lock's acquire
    assert.matches('redlock_operations_total{kind="slot",outcome="ok"} 1', redlock.metrics(d), 1, true)
    -- a value alone does not say which slot it holds: without the slot, not held
    local none, err = other:adopt(r, a.value)
    assert.is_nil(none)
    assert.are.equal("not held", err)
    local b = assert(other:adopt(r, a.value, { slot = a.slot, ttl = 20000 }))
    assert.are.equal(a.slot, b.slot)
    assert.is_true(cluster.pttl(cl, 1, slot_key(a.slot, r)) > 10000)
    assert.is_true((b:unlock()))
    for i = 1, 5 do assert.is_nil(cluster.get(cl, i, slot_key(a.slot, r))) end
    assert.are.equal("not held", select(2, a:unlock()))
    assert.has_error(function() other:adopt(r, a.value, { slot = 0 }) end,
      "bad argument #3 to 'adopt' (slot must be a whole number from 1 to 1024, got 0)")
    d:close(); other:close()
  end)

  it("refuses a bad limit, and limit with fence, shared or lock_many, before anything is sent", function()
    local r = res("misuse")
    for _, bad in ipairs({ 0, -1, 1.5, "2", 1025, true }) do
      local ok, err = pcall(dlm.lock, dlm, r, { limit = bad })
      assert.is_false(ok)
      assert.matches("bad argument #2 to 'lock' %(limit must be a whole number from 1 to 1024, got", err)
    end
    assert.has_error(function() dlm:try_lock(r, { limit = 0 }) end,
      "bad argument #2 to 'try_lock' (limit must be a whole number from 1 to 1024, got 0)")
    assert.has_error(function() dlm:with_lock(r, { limit = 2.5 }, function() end) end,
      "bad argument #2 to 'with_lock' (limit must be a whole number from 1 to 1024, got 2.5)")
    assert.has_error(function() dlm:lock(r, { limit = 2, fence = true }) end,
      "bad argument #2 to 'lock' (fence cannot go with limit: a semaphore's slots carry no fencing token)")
    assert.has_error(function() dlm:try_lock(r, { limit = 2, shared = true }) end,
      "bad argument #2 to 'try_lock' (shared cannot go with limit: a semaphore's slots are exclusive holds)")
    assert.has_error(function() dlm:lock_many({ r }, { limit = 2 }) end,
      "bad argument #2 to 'lock_many' (limit cannot go with lock_many: take a semaphore with lock, try_lock or with_lock)")
    -- the slot keys an acquire names: at most 1 MiB (before: raised by the
    -- engine, not as a bad argument)
    local long = r .. ("k"):rep(1001 - #r)
    assert.has_error(function() dlm:try_lock(long, { limit = 1024 }) end,
      "bad argument #2 to 'try_lock' (limit 1024 with a key of 1001 bytes would name 1049600 bytes of slot keys "
        .. "in every acquire (at most 1048576): take a smaller limit or a shorter resource)")
    -- no key of r anywhere (other tests' tails may still be ending on the nodes)
    for i = 1, 5 do assert.are.equal("", (cl:cli(i, "KEYS", "*" .. r .. "*"))) end
  end)

  -- The partition of the issue: 5 nodes, limit 2; A reaches nodes 1-3, B
  -- nodes 3-5, C nodes 1, 2, 4 and 5. Each client's other nodes are URLs
  -- to a port where nothing listens.
  describe("the partition schedule (5 nodes, limit 2, three clients cut off from different minorities)", function()
    local reach = { A = { 1, 2, 3 }, B = { 3, 4, 5 }, C = { 1, 2, 4, 5 } }
    local dead = {}
    lazy_setup(function()
      for i = 1, 5 do dead[i] = "redis://127.0.0.1:" .. nginx.free_port() end
    end)

    local function urls_of(name)
      local urls = {}
      for i = 1, 5 do urls[i] = dead[i] end
      for _, i in ipairs(reach[name]) do urls[i] = cl.urls[i] end
      return urls
    end

    -- redis-semaphore 5.8's RedlockSemaphore, in small: per node a ZSET of
    -- holders scored by the client's clock; a node admits while it has
    -- fewer than limit; the semaphore is taken on a quorum of admissions.
    local COUNT_SCRIPT = "redis.call('zremrangebyscore', KEYS[1], '-inf', tonumber(ARGV[4]) - tonumber(ARGV[3])) "
      .. "if redis.call('zcard', KEYS[1]) < tonumber(ARGV[1]) then "
      .. "redis.call('zadd', KEYS[1], ARGV[4], ARGV[2]) redis.call('pexpire', KEYS[1], ARGV[3]) return 1 end return 0"
    local function count_acquire(key, name)
      local yes = 0
      for _, i in ipairs(reach[name]) do
        local out = cl:cli(i, "EVAL", COUNT_SCRIPT, "1", key, "2", name, "10000", tostring(proc.wall_ms()))
        if out:match("^1") then yes = yes + 1 end
      end
      return yes >= 3
    end

    it("the count-based scheme admits all three", function()
      local key = res("count")
      local admitted = 0
      for _, name in ipairs({ "A", "B", "C" }) do
        if count_acquire(key, name) then admitted = admitted + 1 end
      end
      assert.are.equal(3, admitted)
    end)

    it("ours admits at most 2, whatever order the slots are drawn in (20 runs)", function()
      local clients = {}
      for _, name in ipairs({ "A", "B", "C" }) do
        clients[name] = redlock.new { servers = urls_of(name), node_timeout = 200 }
      end
      local most, total = 0, 0
      for run = 1, 20 do
        local r = res("partition" .. run)
        local held = {}
        for _, name in ipairs({ "A", "B", "C" }) do
          local lk = clients[name]:try_lock(r, { limit = 2 })
          if lk then held[#held + 1] = lk end
        end
        if #held > most then most = #held end
        total = total + #held
        for _, lk in ipairs(held) do lk:unlock() end
      end
      for _, c in pairs(clients) do c:close() end
      assert.are.equal(2, most)      -- never 3; and 2 happens
      assert.is_true(total >= 20)    -- A, at least, always gets a slot (it comes first)
    end)
  end)

  it("redlock exec --limit runs COMMAND while fewer than L hold it; status --limit shows the slots", function()
    local bin = os.getenv("REDLOCK_HOST") or (proc.build .. "/redlock")
    local r = res("host")
    local dir = proc.tmpdir()
    local env = { REDLOCK_SERVERS = table.concat(cl.urls, ",") }
    local pids = {}
    for w = 1, 2 do
      pids[w] = proc.spawn({ bin, "exec", "--limit", "2", r, "--", "sh", "-c", "echo $REDLOCK_SLOT; sleep 3" },
        { env = env, out = dir .. "/h" .. w })
    end
    for w = 1, 2 do assert(proc.wait_file(dir .. "/h" .. w, 20000)) end
    local function host(cmd)
      return proc.sh(("REDLOCK_SERVERS=%s %s %s"):format(proc.quote(env.REDLOCK_SERVERS), proc.quote(bin), cmd))
    end
    local out, rc = host("exec -n --limit 2 " .. proc.quote(r) .. " -- echo third")
    assert.are.equal(1, rc, out)
    assert.matches("is held elsewhere", out)
    out, rc = host("status --limit 3 " .. proc.quote(r))
    assert.are.equal(0, rc, out)
    assert.matches("2 of 3 slots held by a quorum", out)
    assert.matches("slot 3 +free", out)
    -- a holder's HOST:PID (two holders that began together may each hold their slot on a quorum only)
    assert.matches("on [345] of 5 nodes  label [^%s]+:%d+", out)
    local slots = (proc.read_file(dir .. "/h1") .. proc.read_file(dir .. "/h2")):gsub("%s", "")
    assert.is_true(slots == "12" or slots == "21", slots)
    -- status without --limit finds the resource free, and says it looks like a semaphore
    out, rc = host("status " .. proc.quote(r))
    assert.are.equal(1, rc, out)
    assert.matches("looks like a semaphore %(its slot 1 is held%): redlock status %-%-limit L", out)
    -- a node that does not answer is asked once, not once per slot, and shown
    local function conns(i) return tonumber(cl:cli(i, "INFO", "stats"):match("total_connections_received:(%d+)")) end
    local before = conns(5)
    -- (a slot held on exactly 3 nodes, node 5 among them, has no quorum among the
    -- 4 that answer: count what the answering nodes hold; before, the spec
    -- expected 2 and failed when the two holders' nodes fell that way)
    local quorate = 0
    for s = 1, 2 do
      local on = 0
      for i = 1, 4 do
        if cluster.exists(cl, i, ("redlock:slot:%d:%s"):format(s, r)) then on = on + 1 end
      end
      if on >= 3 then quorate = quorate + 1 end
    end
    assert(proc.kill(cl.pids[5], "STOP"))
    out, rc = host("status --limit 8 " .. proc.quote(r))
    assert(proc.kill(cl.pids[5], "CONT"))
    assert.are.equal(0, rc, out) -- (4 of 5 nodes answer: a quorum to tell)
    assert.matches(quorate .. " of 8 slots held by a quorum", out, 1, true)
    assert.matches("nodes that did not answer:\n +5 +redis://[^\n]+", out)
    assert.is_nil(out:find("\t", 1, true), out) -- (print given a gsub's count too)
    assert.are.equal(before + 1 + 1, conns(5)) -- the status's one probe, and the INFO's own connection
    out, rc = host("exec --limit 2 --fence " .. proc.quote(r) .. " -- true")
    assert.are.equal(64, rc, out)
    assert.matches("%-%-limit and %-%-fence exclude each other", out)
    out, rc = host("exec --limit 2 --shared " .. proc.quote(r) .. " -- true")
    assert.are.equal(64, rc, out)
    assert.matches("%-%-limit and %-%-shared exclude each other", out)
    -- a limit out of range names the range a semaphore has, whichever end it misses
    for _, cmd in ipairs { "exec --limit 0 r -- true", "exec --limit 1025 r -- true", "status --limit 2000 r" } do
      out, rc = host(cmd)
      assert.are.equal(64, rc, out)
      assert.matches("%-%-limit expects an integer from 1 to 1024, got", out)
    end
    -- a limit whose slot keys an acquire cannot name is a usage error, not a traceback
    out, rc = host("exec --limit 100 " .. string.rep("b", 20000) .. " -- true")
    assert.are.equal(64, rc, out)
    assert.matches("%-%-limit 100 with a RESOURCE of 20000 bytes names %d+ bytes of slot keys", out)
    assert.is_nil(out:find("traceback", 1, true), out)
    for w = 1, 2 do assert.is_true(proc.wait_gone(pids[w], 20000)) end
    out, rc = host("exec -n --limit 2 " .. proc.quote(r) .. " -- echo third")
    assert.are.equal(0, rc, out)
    proc.rmdir(dir)
  end)

  it("a release wakes a waiter long before its policy's next attempt", function()
    local r = res("wake")
    local dir = proc.tmpdir()
    local script = dir .. "/holder.lua"
    proc.write_file(script, ([[
      local redlock = require "redlock"
      local proc = require "helpers.proc"
      local dlm = redlock.new { servers = { %s } }
      local lk = assert(dlm:lock(%q, { limit = 1 }))
      proc.write_file(%q, "held")
      proc.sleep_ms(300)
      lk:unlock()
      proc.write_file(%q, tostring(proc.now_ms()))
      dlm:close()
    ]]):format("'" .. table.concat(cl.urls, "','") .. "'", r, dir .. "/held", dir .. "/released"))
    local pid = proc.spawn_luajit({ "luajit", script }, dir .. "/out")
    assert(proc.wait_file(dir .. "/held", 20000), proc.read_file(dir .. "/out"))
    local t0 = proc.now_ms()
    -- the policy would try again only after 10 s
    local lk, err = dlm:lock(r, { limit = 1, retry = function(n) return n < 3 and 10000 or nil end })
    local waited = proc.now_ms() - t0
    assert(lk, err)
    local released = tonumber(proc.wait_file(dir .. "/released", 5000))
    assert.is_true(waited < 5000, "waited " .. waited .. " ms")
    assert.is_true(proc.now_ms() - released < 3000)
    lk:unlock()
    proc.wait_gone(pid, 10000)
    proc.rmdir(dir)
  end)

  -- Waiters are served in the order they began waiting, on every node: a
  -- freed slot is the turn of the first waiter in the nodes' queues, even
  -- while that waiter cannot take it yet (SIGSTOP), and a try_lock does not
  -- take it meanwhile; a waiter that died does not keep the turn. Before the
  -- turns, the try_lock got the slot that a stopped waiter was woken for.
  it("drops waiters that died from the head of the queue, 16 per attempt, until one that listens", function()
    local r = res("dead")
    local queue = "redlock:squeue:" .. r
    -- 20 waiters queued on every node whose wake channels nobody listens on (processes that died)
    for i = 1, cl.n do
      for k = 1, 20 do cluster.call(cl, i, "ZADD", queue, tostring(1000 + k), ("dead%02d"):format(k)) end
    end
    local function left()
      local n = {}
      for i = 1, cl.n do n[i] = tonumber(cluster.call(cl, i, "ZCARD", queue)) end
      return table.concat(n, " ")
    end
    -- the slot is free but kept for the queue's first: a try_lock is refused, and drops 16
    local lk, err = dlm:try_lock(r, { limit = 1 })
    assert.is_nil(lk)
    assert.are.equal("busy", err)
    assert(cluster.await_all(cl, function(i)
      local n = tonumber(cluster.call(cl, i, "ZCARD", queue))
      return n == 4, "queued: " .. left()
    end, 2000, nil, dlm))
    -- the next drops the other 4, and takes the slot
    lk = assert(dlm:try_lock(r, { limit = 1 }))
    assert.is_true(lk:unlock())
    assert(cluster.await_all(cl, function(i)
      return tonumber(cluster.call(cl, i, "ZCARD", queue)) == 0, "queued: " .. left()
    end, 2000, nil, dlm))
  end)

  -- A process (pid) that waits for a slot of semaphore r (limit 1) and
  -- attempts only on wake-ups within a spec's time; DIR/NAME.got is written
  -- once it holds the slot, which it releases once DIR/NAME.release exists.
  local function slot_waiter(dir, r, name, limit)
    local script = ("%s/%s.lua"):format(dir, name)
    proc.write_file(script, ([[
      local redlock = require "redlock"
      local proc = require "helpers.proc"
      local dlm = redlock.new { servers = { %s } }
      local lk = assert(dlm:lock(%q, { limit = ]] .. (limit or 1) .. [[, wait = 60000, retry = function() return 30000 end }))
      proc.write_file(%q, tostring(proc.now_ms()))
      assert(proc.wait_file(%q, 30000))
      assert(lk:unlock())
      dlm:close()
    ]]):format("'" .. table.concat(cl.urls, "','") .. "'", r, ("%s/%s.got"):format(dir, name),
      ("%s/%s.release"):format(dir, name)))
    return proc.spawn_luajit({ "luajit", script }, ("%s/%s.out"):format(dir, name))
  end

  -- The scene of the tests of turns: a holder of r's slot, then slot
  -- waiters w1 and w2 queued in that order on every node, w1 stopped
  -- (SIGSTOP), the slot freed. Returns w1, w2, out(name) (a waiter's
  -- output), waiter(name) (one more) and queued(n) (whether every node has
  -- n waiters queued, in one order, within 20 s).
  local function first_waiter_stopped(dir, r)
    local queue = "redlock:squeue:" .. r
    local function waiter(name) return slot_waiter(dir, r, name) end
    local function queued(n)
      local by = proc.now_ms() + 20000
      repeat
        local first, same = nil, true
        for i = 1, cl.n do
          local ids = cluster.call(cl, i, "ZRANGE", queue, "0", "-1")
          local count = select(2, ids:gsub("[^\n]+", ""))
          if ids == "<nil>" or ids == "" then count = 0 end
          if count ~= n then same = false end
          first = first or ids
          if ids ~= first then same = false end
        end
        if same then return true end
        proc.sleep_ms(20)
      until proc.now_ms() > by
      return false
    end
    local function out(name) return proc.read_file(("%s/%s.out"):format(dir, name)) or "" end
    local holder = assert(dlm:lock(r, { limit = 1 }))
    local w1 = waiter("w1")
    assert(queued(1), out("w1"))
    local w2 = waiter("w2")
    assert(queued(2), out("w2"))
    proc.kill(w1, "STOP")
    assert(holder:unlock())
    return w1, w2, out, waiter, queued
  end

  it("serves waiters in the order they began waiting; a try_lock cannot take a waiter's turn", function()
    local r, dir = res("turns"), proc.tmpdir()
    local w1, w2, out, waiter, queued = first_waiter_stopped(dir, r)
    local t0 = proc.now_ms()
    while proc.now_ms() - t0 < 500 do
      local lk, err = dlm:try_lock(r, { limit = 1 })
      assert.is_nil(lk, "a try_lock took the turn of a stopped waiter")
      assert.equal("busy", err)
      proc.sleep_ms(50)
    end
    assert.is_nil(proc.read_file(dir .. "/w2.got"), "w2 took the turn")
    proc.kill(w1, "CONT")
    assert(proc.wait_file(dir .. "/w1.got", 5000), out("w1"))
    assert.is_nil(proc.read_file(dir .. "/w2.got"), "w2 took the turn")
    proc.write_file(dir .. "/w1.release", "1")
    assert(proc.wait_file(dir .. "/w2.got", 5000), out("w2"))
    -- a waiter that died keeps no turn: its subscriptions are gone
    local w3 = waiter("w3")
    assert(queued(1), out("w3"))
    proc.kill(w3, "KILL")
    proc.wait_gone(w3, 5000)
    proc.write_file(dir .. "/w2.release", "1")
    assert.is_true(proc.wait_gone(w1, 10000) and proc.wait_gone(w2, 10000))
    local lk
    t0 = proc.now_ms()
    repeat
      lk = dlm:try_lock(r, { limit = 1 })
      if not lk then proc.sleep_ms(20) end
    until lk or proc.now_ms() - t0 > 5000
    assert(lk, "the slot stayed with a dead waiter")
    assert(lk:unlock())
    for _, pid in ipairs({ w1, w2, w3 }) do proc.stop(pid) end
    proc.rmdir(dir)
  end)

  -- A waiter whose turn came while it was stopped (or hung, or cut off
  -- with its connection open: it still listens) keeps the free slot for
  -- 1 s (RL_SEM_KEEP_MS) of the nodes' time at most; then a caller behind it
  -- drops it, and the waiter whose turn that makes is woken. Before, the
  -- slot stayed free, and every other caller was refused, for as long as
  -- the stopped waiter's connections lived.
  it("a stopped waiter keeps its turn for a second at most; the next is woken for it", function()
    local r, dir = res("stalled"), proc.tmpdir()
    local w1, w2, out = first_waiter_stopped(dir, r)
    -- its second counts from the turn: the release that woke it marked it
    -- kept, so the first caller behind it that asks a second later drops
    -- it, however long that caller's policy's delay (no try_lock needed)
    local first = cluster.call(cl, 1, "ZRANGE", "redlock:squeue:" .. r, "0", "0")
    assert.is_truthy(first:match("^%x+$"), first)
    assert(cluster.await_all(cl, function(i)
      return tonumber(cluster.call(cl, i, "HGET", "redlock:kept:" .. r, first)) ~= nil
    end, 5000, nil, dlm), "the release's turn did not mark the stopped waiter kept")
    -- callers keep asking (as waiters with a short policy would): the slot
    -- goes to w2 while w1 is still stopped, never to a try_lock
    local by = proc.now_ms() + 15000
    repeat
      local lk, err = dlm:try_lock(r, { limit = 1 })
      assert.is_nil(lk, "a try_lock took the turn of a waiter")
      assert.equal("busy", err)
      proc.sleep_ms(100)
    until proc.read_file(dir .. "/w2.got") or proc.now_ms() > by
    assert.is_not_nil(proc.read_file(dir .. "/w2.got"), "the slot stayed kept for the stopped waiter: " .. out("w2"))
    assert.is_nil(proc.read_file(dir .. "/w1.got"), "w1 got the slot while stopped")
    -- w1, continued, joins again at its place: the next turn is its
    proc.kill(w1, "CONT")
    proc.write_file(dir .. "/w2.release", "1")
    assert(proc.wait_file(dir .. "/w1.got", 10000), out("w1"))
    proc.write_file(dir .. "/w1.release", "1")
    assert.is_true(proc.wait_gone(w1, 10000) and proc.wait_gone(w2, 10000))
    for _, pid in ipairs({ w1, w2 }) do proc.stop(pid) end
    proc.rmdir(dir)
  end)

  -- With limit 2, releases of the other slot come often and the waiters
  -- behind take it at once: nobody asks while it is kept. The release that
  -- finds the stopped waiter's turn older than a second drops it.
  it("a stopped waiter is dropped by a release a second after its turn, with the other slot busy", function()
    local r, dir = res("stalled2"), proc.tmpdir()
    local queue = "redlock:squeue:" .. r
    local function queued_on_all(n)
      return cluster.await_all(cl, function(i)
        local ids = cluster.call(cl, i, "ZRANGE", queue, "0", "-1")
        local count = (ids == "" or ids == "<nil>") and 0 or select(2, ids:gsub("[^\n]+", ""))
        return count == n, ids
      end, 20000)
    end
    local h1 = assert(dlm:lock(r, { limit = 2 }))
    local h2 = assert(dlm:lock(r, { limit = 2 }))
    local s = slot_waiter(dir, r, "s", 2)
    assert(queued_on_all(1), proc.read_file(dir .. "/s.out"))
    local first = cluster.call(cl, 1, "ZRANGE", queue, "0", "0")
    local w = slot_waiter(dir, r, "w", 2)
    assert(queued_on_all(2), proc.read_file(dir .. "/w.out"))
    proc.kill(s, "STOP")
    assert(h1:unlock()) -- s's turn
    proc.sleep_ms(1300)
    assert(h2:unlock()) -- the other slot: w takes it, and s's turn is over
    assert(proc.wait_file(dir .. "/w.got", 10000), proc.read_file(dir .. "/w.out"))
    assert(cluster.await_all(cl, function(i)
      local ids = cluster.call(cl, i, "ZRANGE", queue, "0", "-1")
      return not ids:find(first, 1, true), ids
    end, 5000), "the stopped waiter kept its place and its slot")
    proc.kill(s, "CONT")
    proc.write_file(dir .. "/w.release", "1")
    assert(proc.wait_file(dir .. "/s.got", 10000), proc.read_file(dir .. "/s.out"))
    proc.write_file(dir .. "/s.release", "1")
    assert.is_true(proc.wait_gone(s, 10000) and proc.wait_gone(w, 10000))
    for _, pid in ipairs({ s, w }) do proc.stop(pid) end
    proc.rmdir(dir)
  end)

  -- Before: each stopped waiter reached was kept a full second from when it
  -- was reached, one after another: four of them kept the free slot idle
  -- over four seconds, and a live waiter behind them with a 4 s bound gave
  -- up, busy, with nobody holding the semaphore.
  it("a line of stopped waiters keeps a free slot idle about a second, not a second each", function()
    local r, dir = res("stopped_line"), proc.tmpdir()
    local queue = "redlock:squeue:" .. r
    local holder = assert(dlm:lock(r, { limit = 1 }))
    local stopped = {}
    for n = 1, 4 do
      stopped[n] = slot_waiter(dir, r, "s" .. n)
      assert(cluster.await_all(cl, function(i)
        return tonumber(cluster.call(cl, i, "ZCARD", queue)) == n, "queued"
      end, 20000), proc.read_file(("%s/s%d.out"):format(dir, n)))
    end
    for _, pid in ipairs(stopped) do proc.kill(pid, "STOP") end
    local t0 = proc.now_ms()
    assert(holder:unlock())
    local lk, err = dlm:lock(r, { limit = 1, wait = 4000 })
    local waited = proc.now_ms() - t0
    for _, pid in ipairs(stopped) do proc.kill(pid, "KILL") end
    for _, pid in ipairs(stopped) do proc.wait_gone(pid, 5000) end
    proc.rmdir(dir)
    assert(lk, ("%s after %.0f ms"):format(tostring(err), waited))
    assert(lk:unlock())
  end)

  it("a release wakes every waiter whose turn it is, the one woken before included", function()
    -- Before, only the waiter whose turn had just come (place F-1) was
    -- woken: one woken earlier whose attempt failed kept its free slot and
    -- waited for its policy's next attempt. Here w is woken by the first
    -- release and does not attempt; the second release (2 slots free) must
    -- wake it again, beside v.
    local ffi = require "ffi"
    local lib = require("redlock.cdefs").lib
    local out = ffi.new("rl_result")
    local r = res("rewake")
    local holder = redlock.new { servers = cl.urls }
    local a = assert(holder:lock(r, { limit = 2 }))
    local b = assert(holder:lock(r, { limit = 2 }))
    holder.client:sleep(600) -- its won waits' subscription lingers 500 ms
    local w, v = redlock.new { servers = cl.urls }, redlock.new { servers = cl.urls }
    local ok, err = pcall(function()
      local ticket = lib.rl_wall_ms()
      for i, c in ipairs { w, v } do -- w first in every node's queue, v second
        assert.equal(0, lib.rl_watch(c.client, r, #r))
        assert.equal(0, lib.rl_acquire_slot(c.client, r, #r, 2, 10000, ticket + i, out))
        assert.equal(lib.RL_STATUS_BUSY, out.status)
      end
      -- both subscribed on every node (their loops run meanwhile)
      assert(cluster.await_all(cl, function(node)
        w.client:sleep(1)
        v.client:sleep(1)
        local n = tonumber(cluster.call(cl, node, "PUBSUB", "NUMSUB", "redlock:released:" .. r):match("(%d+)%s*$"))
        return n == 2, "subscribers " .. tostring(n)
      end, 5000))
      -- heard by c from every node within ms, counting from seen
      local function hears_all(c, seen, ms)
        local by = proc.now_ms() + ms
        while (lib.rl_heard(c.client, r, #r) - seen) % 4294967296 < cl.n and proc.now_ms() < by do
          lib.rl_sleep_until(c.client, r, #r, lib.rl_heard(c.client, r, #r), 10)
        end
        return (lib.rl_heard(c.client, r, #r) - seen) % 4294967296
      end
      local w0, v0 = lib.rl_heard(w.client, r, #r), lib.rl_heard(v.client, r, #r)
      assert.is_true(a:unlock()) -- 1 slot free: w's turn
      assert.equal(cl.n, hears_all(w, w0, 5000))
      assert.equal(0, hears_all(v, v0, 200))
      local w1 = lib.rl_heard(w.client, r, #r)
      assert.is_true(b:unlock()) -- 2 slots free: w's and v's turn
      assert.equal(cl.n, hears_all(v, v0, 5000))
      assert.equal(cl.n, hears_all(w, w1, 5000)) -- before: 0
    end)
    w:close()
    v:close()
    holder:close()
    assert(ok, err)
  end)

  it("8 processes, limit 3: every process gets a share, never more than 3 hold", function()
    local h, s, text = run_workers(cl.urls, res("fair"), 8, 3, 3000, 5, 5000)
    assert.are.equal(0, h.malformed + h.unfinished)
    assert.are.equal(0, h.over_limit, text)
    assert.is_true(h.most <= 3)
    local total = 0
    for w = 1, 8 do total = total + (s[w].acquired or 0) end
    for w = 1, 8 do
      assert.is_true((s[w].acquired or 0) >= total / 8 / 5, "worker " .. w .. " starved: " .. text)
    end
  end)

  -- Before: a waiter had 4 attempts on wake-ups per delay of its policy
  -- (and slot). Attempts that fail in a burst (waiters undoing what they got
  -- while the nodes disagree, each undo waking the queue again) used them
  -- up within milliseconds, and with a 2 s retry delay every waiter then
  -- slept out its 2 s while the slots were free (waits of 2.0 s in 2 runs
  -- of 3 here, the median 65 ms). The wake-ups are now counted per 100 ms.
  it("9 processes, limit 3, a 2 s retry delay: no waiter sleeps out its delay while slots are free", function()
    local h, s, text = run_workers(cl.urls, res("burst"), 9, 3, 5000, 30, 5000, nil, 2000)
    assert.are.equal(0, h.malformed + h.unfinished)
    assert.are.equal(0, h.over_limit, text)
    local longest = 0
    for w = 1, 9 do longest = math.max(longest, s[w].longest or 0) end
    print(("    [burst] %d holds; the longest lock call %d ms (the retry delay: 2000 ms)"):format(h.entries or 0, longest))
    assert.is_true(longest < 1900, text)
  end)

  it("history check: 8 processes, limit 3, holders paused, a node killed and restarted empty after the ttl", function()
    local TTL = 2000
    local killed_at, restarted
    local paused = {}
    local t0 = proc.now_ms()
    local h, s, text = run_workers(cl.urls, res("history"), 8, 3, 6000, 20, TTL, function(pids)
      local t = proc.now_ms() - t0
      -- SIGSTOP a random worker for 50-400 ms (shorter than any validity)
      for pid, until_ in pairs(paused) do
        if proc.now_ms() >= until_ then proc.kill(pid, "CONT"); paused[pid] = nil end
      end
      if next(paused) == nil and math.random() < 0.3 then
        local pid = pids[math.random(#pids)]
        if proc.alive(pid) then
          proc.kill(pid, "STOP")
          paused[pid] = proc.now_ms() + math.random(50, 400)
        end
      end
      if not killed_at and t > 1000 then
        assert(cl:kill(2, "KILL"))
        killed_at = proc.now_ms()
      elseif killed_at and not restarted and proc.now_ms() - killed_at > TTL + 500 then
        cl:restart(2)
        restarted = true
      end
    end)
    if not restarted then cl:restart(2) end
    assert.is_true(restarted)
    local past, total = 0, 0
    for w = 1, 8 do past, total = past + (s[w].past or 0), total + (s[w].acquired or 0) end
    assert.are.equal(0, past, text)            -- no holder ran past its validity...
    assert.are.equal(0, h.over_limit, text)    -- ...so never more than 3 at once
    assert.is_true(h.most <= 3 and h.most >= 2)
    assert.is_true(total > 50, text)
    assert.are.equal(0, h.malformed + h.unfinished)
  end)
end)
