-- Rounds that decide at quorum: unlock() and extend() return as soon as a
-- quorum answered, with the nodes that had not answered yet "pending" in
-- the detail. The rest of the round (its tail) goes on without the caller:
-- late replies still pair with their commands, a late NOSCRIPT still gets
-- its EVAL, a failed acquire's cleanup still reaches a late node, keep-alive
-- and lock_many are decided by the nodes that answer, and close() with a
-- tail outstanding is fine. The libev transport is pull-style: a tail is
-- driven by the next call into the client.
--
-- Node 1 is made late by SIGSTOP or by the fault proxy delaying its replies.
-- A SIGSTOP lasts a few hundred ms at most, under the client's 500 ms stall
-- watchdog, so node 1's connection is never reset: what gets node 1 its
-- commands' effects is the tail, not a reconnect.

local redlock = require "redlock"
local cluster = require "helpers.cluster"
local faults = require "helpers.faults"
local proc = require "helpers.proc"

-- Well over a local round, well under the 500 ms stall watchdog.
local NODE_TIMEOUT = 200
-- The proxy holds node 1's replies this long: under NODE_TIMEOUT, and far
-- longer than the other four nodes take to answer.
local DELAY = "delay 60"
local AWAIT_MS = 5000 -- generous: a loaded machine is slow, never wrong

local res = cluster.names("tails") -- res(tag): a resource name no other run uses

-- Texts of errors that only a reply paired with the wrong command causes.
local CROSSED = { "out of step", "reply to no command", "protocol error", "unexpected reply" }

local function crossed(text)
  text = tostring(text)
  for _, c in ipairs(CROSSED) do
    if text:find(c, 1, true) then return c end
  end
  return nil
end

local function states(detail)
  local t = {}
  for i = 1, #detail do t[i] = detail[i].state end
  return t
end

-- A success decided without node 1: node 1 "pending", a quorum of the
-- others "ok" (another of them may be "pending" too: the round ends at the
-- quorum's last vote, and a fourth reply may not have been read by then).
local function decided_without_1(ok, err, detail)
  assert.is_nil(err, tostring(err) .. " " .. cluster.show(detail))
  assert.is_true(ok)
  assert.is_table(detail, "no detail with the success")
  local got = states(detail)
  assert.equal("pending", got[1], cluster.show(detail))
  local oks = 0
  for i = 2, #got do
    assert.is_truthy(got[i] == "ok" or got[i] == "pending", cluster.show(detail))
    if got[i] == "ok" then oks = oks + 1 end
  end
  assert.equal(oks, detail.ok, cluster.show(detail))
  assert.is_true(oks >= detail.quorum, cluster.show(detail))
end

-- Run rounds that cannot be decided without node i (two other nodes hold the
-- resource by hand) until one gets node i's vote: node i's connection pairs
-- replies with their commands again, and everything sent to node i before
-- has been done there. Drives dlm meanwhile. A vote lost to a crossed reply
-- fails at once; anything else (node i still catching up) is tried again.
local function needs_node(dlm, cl, i)
  local others = {}
  for j = 1, cl.n do
    if j ~= i and #others < 2 then others[#others + 1] = j end
  end
  local deadline, last = proc.now_ms() + AWAIT_MS
  repeat
    local r = res("needs" .. i)
    for _, j in ipairs(others) do assert.is_true(cluster.set_nx(cl, j, r, "other", 30000)) end
    local lock, err, detail = dlm:try_lock(r)
    if detail and detail[i] then
      assert.is_nil(crossed(detail[i].error), cluster.show(detail))
    end
    if lock then
      local ok, uerr, udetail = lock:unlock()
      assert.is_true(ok, tostring(uerr) .. " " .. cluster.show(udetail))
      if udetail then assert.equal("ok", udetail[i].state, cluster.show(udetail)) end
      for _, j in ipairs(others) do cluster.del(cl, j, r) end
      return true
    end
    last = tostring(err) .. " " .. cluster.show(detail)
    for _, j in ipairs(others) do cluster.del(cl, j, r) end
    proc.sleep_ms(20)
  until proc.now_ms() > deadline
  error(("node %d never voted in a round that needs it; last: %s"):format(i, last), 2)
end

describe("rounds decide at quorum", function()
  local cl, dlm, px
  local stopped = {}

  local function stall(i)
    assert(cl:kill(i, "STOP"))
    stopped[i] = true
  end

  local function resume(i)
    assert(cl:kill(i, "CONT"))
    stopped[i] = nil
  end

  -- A client on the cluster, node 1 behind the fault proxy if proxied; it
  -- starts with every node voting.
  local function client(proxied)
    local urls = {}
    for i = 1, cl.n do urls[i] = cl.urls[i] end
    if proxied then
      px = faults.proxy(cl.ports[1])
      urls[1] = px.url
    end
    dlm = redlock.new { servers = urls, ttl = 10000, node_timeout = NODE_TIMEOUT }
    for i = 1, cl.n do needs_node(dlm, cl, i) end
    return dlm
  end

  lazy_setup(function() cl = cluster.start(5) end)
  lazy_teardown(function() if cl then cl:stop() end end)
  after_each(function()
    for i in pairs(stopped) do cl:kill(i, "CONT") end
    stopped = {}
    if dlm then dlm:close() end
    if px then px:stop() end
    dlm, px = nil, nil
    cluster.flush(cl)
  end)
  teardown(function()
    faults.stop_all()
    cluster.stop_all()
  end)

  it("unlock returns at quorum with a stalled node pending; the release reaches it once it resumes", function()
    client()
    local r = res("stalled")
    stall(1)
    local lock = assert(dlm:try_lock(r, { ttl = 30000 }))
    decided_without_1(lock:unlock())
    resume(1)
    assert(cluster.await_value(cl, r, nil, AWAIT_MS, nil, dlm))
    needs_node(dlm, cl, 1)
    assert.is_nil(cluster.get(cl, 1, r))
  end)

  it("unlock returns at quorum with a node's replies delayed; the late reply pairs with its command", function()
    client(true)
    px:set(DELAY)
    local r = res("delayed")
    local lock = assert(dlm:try_lock(r, { ttl = 30000 }))
    decided_without_1(lock:unlock())
    assert(cluster.await_value(cl, r, nil, AWAIT_MS, nil, dlm))
    -- still delayed: the next rounds that need node 1 get its vote
    needs_node(dlm, cl, 1)
    needs_node(dlm, cl, 1)
    assert.is_nil(cluster.get(cl, 1, r))
  end)

  it("re-sends the release as EVAL when a late node answers NOSCRIPT after the decision", function()
    client(true)
    px:set(DELAY)
    local r = res("noscript")
    local lock = assert(dlm:try_lock(r, { ttl = 30000 }))
    assert(cluster.await_value(cl, r, lock.value, AWAIT_MS)) -- the SET reached node 1 too
    local out, ok = cl:cli(1, "SCRIPT", "FLUSH")
    assert(ok and out == "OK", out)
    decided_without_1(lock:unlock())
    -- only the EVAL sent after the late NOSCRIPT removes it from node 1
    -- before its 30 s ttl
    local gone, why = cluster.await_value(cl, r, nil, AWAIT_MS, nil, dlm)
    assert(gone, why)
    needs_node(dlm, cl, 1)
    assert.is_nil(cluster.get(cl, 1, r))
  end)

  it("extend returns at quorum with a stalled node pending, and recomputes the validity", function()
    client()
    local r = res("extend")
    local lock = assert(dlm:try_lock(r, { ttl = 5000 }))
    local before = lock:remaining()
    assert.is_true(before > 0 and before <= 5000, tostring(before))
    stall(1)
    local ok, err, detail = lock:extend(20000)
    resume(1)
    decided_without_1(ok, err, detail)
    -- 20000 less the drift allowance (1% + 2 ms) and the round's time
    assert.is_true(lock.validity > 15000 and lock.validity <= 20000, tostring(lock.validity))
    assert.is_true(lock.validity > before, ("validity %s, %s left before"):format(lock.validity, before))
    local left = lock:remaining()
    assert.is_true(left > before and left > 15000, ("%s left, %s before"):format(left, before))
    -- the extension reached node 1 too (PTTL far above the 5 s it had)
    assert(cluster.await_all(cl, function(i)
      local p = cluster.pttl(cl, i, r)
      return p > 10000, "pttl " .. p
    end, AWAIT_MS, nil, dlm))
    needs_node(dlm, cl, 1)
    assert.is_true((lock:unlock()))
    assert(cluster.await_value(cl, r, nil, AWAIT_MS, nil, dlm))
  end)

  -- Extending at quorum, a stalled node costs keep-alive nothing. (Waiting
  -- for it instead, each extension took the 200 ms node timeout; with a
  -- 400 ms ttl the validity such a round leaves ends before the next
  -- extension is due, and the locks were lost.)
  it("keeps 100 locks alive with a node stalled for several extension periods", function()
    client()
    local locks = {}
    for k = 1, 100 do
      locks[k] = assert(dlm:lock(res("kept" .. k), { ttl = 400, keepalive = true }))
    end
    local function none_lost(when)
      for k, lock in ipairs(locks) do
        assert.is_false(lock:lost(), ("lock %d lost %s"):format(k, when))
        assert.is_true(lock:valid(), ("lock %d not valid %s"):format(k, when))
      end
    end
    -- two stalls of about two extension periods (ttl / 3) each, each short
    -- of the stall watchdog, with a moment between for node 1 to catch up
    for n = 1, 2 do
      stall(1)
      proc.sleep_ms(280)
      none_lost("with node 1 stalled (stall " .. n .. ")")
      resume(1)
      proc.sleep_ms(50)
    end
    proc.sleep_ms(300)
    none_lost("after node 1 resumed")
    for k, lock in ipairs(locks) do
      local ok, err, detail = lock:unlock()
      assert.is_true(ok, ("lock %d: %s %s"):format(k, tostring(err), cluster.show(detail)))
    end
    for k = 1, #locks, 10 do
      assert(cluster.await_value(cl, locks[k].resource, nil, AWAIT_MS, nil, dlm))
    end
  end)

  it("closes a client while a release's tail is still outstanding", function()
    local dir = proc.tmpdir()
    local r = res("close")
    local script = dir .. "/child.lua"
    proc.write_file(script, ([[
      local redlock = require "redlock"
      local proc = require "helpers.proc"
      local node1, r = tonumber(arg[1]), arg[2]
      local urls = {}
      for i = 3, #arg do urls[#urls + 1] = arg[i] end
      local dlm = redlock.new { servers = urls, node_timeout = %d }
      local warm = assert(dlm:try_lock(r .. ":warm"))  -- every connection up
      assert(warm:unlock())
      assert(proc.kill(node1, "STOP"))
      local lock = assert(dlm:try_lock(r, { ttl = 30000 }))
      local ok, err, detail = lock:unlock()
      io.write("unlock ", tostring(ok), " ", tostring(err), " ", tostring(detail and detail[1].state), "\n")
      dlm:close()
      io.write("closed\n")
      assert(proc.kill(node1, "CONT"))
      -- the process goes on: a new client works, collection and exit are clean
      local again = redlock.new { servers = urls, node_timeout = %d }
      local l2 = assert(again:try_lock(r .. ":after"))
      assert(l2:unlock())
      dlm, again, lock, warm, l2 = nil, nil, nil, nil, nil
      collectgarbage()
      collectgarbage()
      io.write("done\n")
    ]]):format(NODE_TIMEOUT, NODE_TIMEOUT))
    local argv = { "luajit", script, tostring(cl.pids[1]), r }
    for i = 1, cl.n do argv[#argv + 1] = cl.urls[i] end
    for i = 1, #argv do argv[i] = proc.quote(argv[i]) end
    stopped[1] = true -- the child stops node 1; after_each continues it whatever happens
    local out, rc = proc.sh(("LUA_PATH=%s LUA_CPATH=%s timeout 60 %s"):format(
      proc.quote(package.path), proc.quote(package.cpath), table.concat(argv, " ")))
    cl:kill(1, "CONT")
    stopped[1] = nil
    proc.rmdir(dir)
    assert.equal(0, rc, out)
    assert.equal("unlock true nil pending\nclosed\ndone\n", out)
    -- the release was on its way to node 1 before the close: it is done there
    assert(cluster.await_value(cl, r, nil, AWAIT_MS))
  end)

  it("lock_many decides at quorum with a stalled node, and the group unlocks", function()
    client()
    local names = {}
    for k = 1, 10 do names[k] = res("many" .. k) end
    stall(1)
    local locks, err, detail = dlm:lock_many(names, { ttl = 30000 })
    assert.is_nil(err, tostring(err) .. " " .. cluster.show(detail))
    assert.equal(10, #locks)
    for k = 1, 10 do
      assert.equal(names[k], locks[k].resource)
      assert.is_true(locks[k].votes >= 3 and locks[k].votes <= 4, tostring(locks[k].votes))
    end
    local ok, uerr, udetail = locks:unlock()
    resume(1)
    assert.is_nil(uerr, tostring(uerr) .. " " .. cluster.show(udetail))
    assert.is_true(ok)
    for k = 1, 10 do
      assert(cluster.await_value(cl, names[k], nil, AWAIT_MS, nil, dlm))
    end
    needs_node(dlm, cl, 1)
  end)

  it("cleans up a failed acquire on a node that answers after the decision", function()
    client()
    local r = res("busy")
    for i = 2, 4 do assert.is_true(cluster.set_nx(cl, i, r, "other", 30000)) end
    stall(1)
    local lock, err, detail = dlm:try_lock(r, { ttl = 30000 })
    assert.is_nil(lock)
    assert.equal("busy", err, cluster.show(detail))
    assert.equal("pending", detail[1].state, cluster.show(detail))
    resume(1)
    -- node 1 has done everything it was sent (our SET, then the cleanup)
    -- once it votes in a later round on the same connection
    needs_node(dlm, cl, 1)
    assert.is_nil(cluster.get(cl, 1, r))
    assert(cluster.await_value(cl, r, nil, AWAIT_MS, { [2] = true, [3] = true, [4] = true }, dlm))
    for i = 2, 4 do assert.equal("other", cluster.get(cl, i, r)) end
  end)
end)
