-- What the engine counts, seen through dlm:stats() and redlock.metrics()
-- against real redis-server nodes: a scripted run whose counts are known
-- (N acquires, M refused as busy, node 3 stopped with SIGSTOP for the first
-- K of them), the exposition checked by promtool (beside another
-- exposition's families), the number of series over 10,000 resources, the
-- keeper thread's counts, counting turned off, and the holder's label.

local redlock = require "redlock"
local cluster = require "helpers.cluster"
local prometheus = require "helpers.prometheus"
local proc = require "helpers.proc"

local res = cluster.names("metrics")

local function sum(t)
  local n = 0
  for _, v in pairs(t) do n = n + v end
  return n
end

local function series(text)
  local n = 0
  for line in text:gmatch("[^\n]+") do
    if line:sub(1, 1) ~= "#" then n = n + 1 end
  end
  return n
end

describe("metrics", function()
  local cl
  setup(function() cl = cluster.start(3) end)
  teardown(function() cluster.stop_all() end)

  it("counts a scripted run exactly: acquires, busy, a stalled node's timeouts on that node", function()
    local N, M, K = 8, 3, 4
    -- node_timeout 100 ms: the stall (K rounds, then their tails' timeouts)
    -- lasts about 200 ms, under the 500 ms stall watchdog
    local dlm = redlock.new { servers = cl.urls, node_timeout = 100 }
    local holder = redlock.new { servers = cl.urls }
    local busy = {}
    for i = 1, M do
      busy[i] = res("busy")
      assert(holder:try_lock(busy[i], { ttl = 60000 }))
    end
    cluster.drive(dlm) -- connected and set up before the run; counted below
    local t0 = proc.now_ms()
    repeat dlm.client:sleep(10) until dlm:stats().tails_running == 0 or proc.now_ms() - t0 > 5000
    local before = dlm:stats() -- every node has answered the drive's lock and unlock
    -- stalled: ok, busy, ok, busy
    local plan = { "ok", "busy", "ok", "busy", "ok", "ok", "ok", "busy" }
    local b = 0
    local function attempt(kind)
      local r
      if kind == "busy" then b = b + 1; r = busy[b] else r = res("free") end
      local lk, err = dlm:try_lock(r, { ttl = 60000 })
      if kind == "ok" then assert.is_truthy(lk, err) else assert.equals("busy", err) end
    end
    assert(cl:kill(3, "STOP"))
    local ok, why = pcall(function()
      for i = 1, K do attempt(plan[i]) end
      dlm.client:sleep(200) -- the tails and cleanups reach their node timeout
    end)
    assert(cl:kill(3, "CONT"))
    assert(ok, why)
    -- node 3 catches up: it answers what it owes (the K SETs and the busy
    -- ones' cleanups), and votes again once heard
    t0 = proc.now_ms()
    local function caught_up()
      local n = dlm:stats().nodes[3]
      return n.reply_ms.count - before.nodes[3].reply_ms.count >= K + 2 and not n.suspect
    end
    repeat dlm.client:sleep(20) until caught_up() or proc.now_ms() - t0 > 5000
    for i = K + 1, N do attempt(plan[i]) end
    dlm.client:sleep(200) -- every tail over
    local s = dlm:stats()

    local acq = s.operations.acquire
    assert.equals(N - M + before.operations.acquire.ok, acq.ok)
    assert.equals(M, acq.busy)
    local all = 0
    for _, kind in pairs(s.operations) do all = all + sum(kind) end
    assert.equals(N + before.operations.acquire.ok + before.operations.release.ok, all) -- nothing twice
    assert.equals(N + before.decision_ms.acquire.count, s.decision_ms.acquire.count)
    assert.equals(K, s.nodes[3].timeouts - before.nodes[3].timeouts)
    assert.equals(0, s.nodes[1].timeouts + s.nodes[2].timeouts)
    for i = 1, 3 do
      -- every round counts every node's vote once
      assert.equals(N, sum(s.nodes[i].votes) - sum(before.nodes[i].votes))
    end
    assert.is_true(s.nodes[3].votes.pending - before.nodes[3].votes.pending >= K)
    assert.is_true(s.nodes[3].step_checks >= 1)
    assert.equals(0, s.nodes[3].resets) -- caught up, never reset
    assert.equals(M, s.cleanups)
    -- the exposition says the same
    local text = redlock.metrics(dlm)
    assert.matches('\nredlock_operations_total{kind="acquire",outcome="busy"} ' .. M .. "\n", text, 1, true)
    assert.matches('\nredlock_node_timeouts_total{node="' .. cl.urls[3]:gsub("%p", "%%%0") .. '"} ' .. K .. "\n", text)
    dlm:close()
    holder:close()
  end)

  it("passes promtool check metrics, alone and beside another exposition", function()
    if not prometheus.installed("promtool") then
      pending("promtool is not installed (scripts/deps installs prometheus)")
      return
    end
    local dlm = redlock.new { servers = cl.urls }
    local lk = assert(dlm:lock(res("p"), { ttl = 5000, fence = true }))
    lk:unlock()
    local text = redlock.metrics(dlm)
    local ok, out = prometheus.check(text)
    assert(ok, out)
    local other = table.concat({
      "# HELP nginx_http_requests_total Number of HTTP requests",
      "# TYPE nginx_http_requests_total counter",
      'nginx_http_requests_total{host="x",status="200"} 5',
      "# HELP nginx_metric_errors_total Number of nginx-lua-prometheus errors",
      "# TYPE nginx_metric_errors_total counter",
      "nginx_metric_errors_total 0", "" }, "\n")
    ok, out = prometheus.check(other .. text)
    assert(ok, out)
    -- a family shown twice is refused: the check above can fail
    ok = prometheus.check(text .. text)
    assert.is_false(ok)
    -- the names the issue asks for
    for line in text:gmatch("# TYPE ([^\n]+)") do
      local name, kind = line:match("^(%S+) (%S+)$")
      assert.equals("redlock_", name:sub(1, 8))
      if kind == "counter" then assert.equals("_total", name:sub(-6)) end
      if name:find("seconds") then assert.equals("histogram", kind) end
    end
    assert.matches('redlock_operations_total{kind="commit",outcome="ok"} 1', text, 1, true)
    dlm:close()
  end)

  -- Before: a tab in a node's name (a user %09 in its URL) split the
  -- sample's key, and bytes that are not UTF-8 (a unix socket's path) went
  -- out as they were: promtool refused both expositions.
  it("writes any node name as a valid label value: tabs, bytes that are not UTF-8", function()
    if not prometheus.installed("promtool") then
      pending("promtool is not installed (scripts/deps installs prometheus)")
      return
    end
    local dlm = redlock.new { servers = { "redis://us%09er:pw@127.0.0.1:1", "unix:///tmp/r\255l.sock",
                                          "redis://127.0.0.1:2" } }
    local text = redlock.metrics(dlm)
    dlm:close()
    local ok, out = prometheus.check(text)
    assert(ok, out .. "\n" .. text)
    assert.matches('redlock_node_up{node="redis://us\ter@127.0.0.1:1"} 0', text, 1, true)
    assert.matches('redlock_node_up{node="unix:///tmp/r\239\191\189l.sock"} 0', text, 1, true)
  end)

  it("adds no series for 10,000 distinct resources", function()
    local dlm = redlock.new { servers = cl.urls }
    cluster.drive(dlm)
    local before = series(redlock.metrics(dlm))
    for i = 1, 10000 do
      local lk = dlm:try_lock(res("many" .. i), { ttl = 5000 })
      if lk then lk:unlock() end
    end
    local text = redlock.metrics(dlm)
    assert.equals(before, series(text))
    assert.is_nil(text:find("many", 1, true))
    assert.is_true(dlm:stats().operations.acquire.ok >= 10000)
    dlm:close()
  end)

  it("adds the keeper thread's extensions, not as the client's operations", function()
    local dlm = redlock.new { servers = cl.urls }
    local lk = assert(dlm:lock(res("kept"), { ttl = 300, keepalive = true }))
    proc.sleep_ms(450) -- extended about every 100 ms by the keeper
    local s = dlm:stats()
    assert.is_true(s.keepalive.extensions.ok >= 2, s.keepalive.extensions.ok)
    assert.equals(1, s.keepalive.kept)
    assert.equals(0, sum(s.operations.extend))
    -- the client's connection and the keeper's own, summed
    assert.equals(2, s.nodes[1].connects)
    lk:unlock()
    dlm:close()
  end)

  it("sums clients of engines of their own, and takes a client given twice once", function()
    local ok = 'redlock_operations_total{kind="acquire",outcome="ok"} '
    local a, b = redlock.new { servers = cl.urls }, redlock.new { servers = cl.urls }
    assert(a:try_lock(res("two:a"))):unlock()
    assert(b:try_lock(res("two:b"))):unlock()
    assert.matches(ok .. "2\n", redlock.metrics(a, b), 1, true)
    assert.matches(ok .. "1\n", redlock.metrics(a, a), 1, true)
    a:close()
    b:close()
  end)

  -- Before: a reply that came while the program was away between its calls
  -- (an unlock's tail, read at the next call) was timed when it was read:
  -- 600 ms pauses gave healthy nodes 600 and 1200 ms of reply time.
  it("does not time replies that waited unread while the program was away, and times the rest", function()
    local dlm = redlock.new { servers = cl.urls }
    local r = res("away")
    for _ = 1, 4 do
      assert(dlm:lock(r, { ttl = 5000 }):unlock())
      proc.sleep_ms(600) -- nobody reads the sockets
    end
    for i, n in ipairs(dlm:stats().nodes) do
      local h = n.reply_ms
      assert.equals(h.count, h.buckets[10].count, ("node %d: a reply timed over %d ms"):format(i, h.buckets[10].le_ms))
    end
    -- Back to back, every reply is timed (but the last tails, maybe not read
    -- yet). A scheduler that takes the CPU from this process between two
    -- calls makes it away too, and the replies that came meanwhile untimed
    -- (3 of 40 beside two CPU hogs): one run of five with every node's
    -- replies timed shows the rule is right; a wrong one fails all five.
    local fewest
    for _ = 1, 5 do
      local before = {}
      for i, n in ipairs(dlm:stats().nodes) do before[i] = n.reply_ms.count end
      for _ = 1, 20 do assert(dlm:lock(r, { ttl = 5000 }):unlock()) end
      fewest = math.huge
      for i, n in ipairs(dlm:stats().nodes) do fewest = math.min(fewest, n.reply_ms.count - before[i]) end
      if fewest >= 38 then break end
    end
    assert.is_true(fewest >= 38, ("replies timed of 40 on the node with fewest: %d"):format(fewest))
    dlm:close()
  end)

  it("counts nothing with stats = false", function()
    local dlm = redlock.new { servers = cl.urls, stats = false }
    cluster.drive(dlm)
    local s = dlm:stats()
    assert.equals(0, s.operations.acquire.ok)
    assert.equals(0, s.nodes[1].connects)
    dlm:close()
  end)

  it("carries a label in the lock value, and refuses a bad one naming the option", function()
    local dlm = redlock.new { servers = cl.urls, label = "job-7" }
    local lk = assert(dlm:try_lock(res("label")))
    assert.equals("job-7/", lk.value:sub(1, 6))
    assert.equals(40, #lk.value)
    assert.matches("^[0-9a-f]+$", lk.value:sub(7))
    lk:unlock()
    dlm:close()
    for _, bad in ipairs { "", "a/b", "has space", ("x"):rep(16), 7 } do
      local ok, err = pcall(redlock.new, { servers = cl.urls, label = bad })
      assert.is_false(ok)
      assert.matches("bad argument #1 to 'new' (label must be 1 to 15 printable characters without '/' or space",
        err, 1, true)
    end
  end)
end)
