-- Votes that wait for replicas (`replicas = N`, a node URL's ?replicas=N;
-- docs/lua-api.md#nodes-with-replicas), on nodes that are each a master
-- with one replica (spec/helpers/replicated.lua): every write that grants
-- or prolongs a hold is followed by WAIT on its node (counted in the
-- masters' INFO commandstats), releases are not; a node whose replica gets
-- nothing fails its votes with the count in the detail, its write undone,
-- an extension and a keep-alive renewal included; and the nginx hub does
-- the same, the engine being one for both transports.
local redlock = require "redlock"
local cluster = require "helpers.cluster"
local nginx = require "helpers.nginx"
local proc = require "helpers.proc"
local replicated = require "helpers.replicated"

local names = cluster.names("replicas")
-- WAIT's timeout is half the stall watchdog's 500 ms (250 ms), less than
-- half the node timeout. Redis times a blocked WAIT out on its cron tick
-- (hz 10: 100 ms), so the answer of a node whose replica is silent comes
-- at 250-350 ms: well inside the node timeout.
local NODE_TIMEOUT = 600
local SHORT = "0 of 1 replicas acknowledged the write within 250 ms"
local COMMANDS = { "wait", "set", "eval", "evalsha" }

--- Calls of each of COMMANDS the masters have handled so far, summed.
local function counts(rs)
  local t = {}
  for _, c in ipairs(COMMANDS) do t[c] = cluster.calls(rs.masters, c) end
  return t
end

--- Wait until the masters' counts stay the same over 100 ms (the tail of
-- a round decided at quorum, a release's last node, has arrived), at most 3 s.
local function settle(rs)
  local last, same, deadline = counts(rs), 0, proc.now_ms() + 3000
  while same < 4 and proc.now_ms() < deadline do
    proc.sleep_ms(25)
    local now = counts(rs)
    local equal = true
    for _, c in ipairs(COMMANDS) do equal = equal and now[c] == last[c] end
    same, last = equal and same + 1 or 0, now
  end
end

--- Wait until the masters have run at least n more of cmd than in before,
-- and as many more WAITs as of the commands in waited (default: cmd; or a
-- function of the differences that says when they are complete): a round
-- is decided at quorum, so the last node's commands may still be on their
-- way. The differences.
local function await_waited(rs, before, cmd, n, waited)
  local deadline = proc.now_ms() + 3000
  while true do
    local now, d = counts(rs), {}
    for _, c in ipairs(COMMANDS) do d[c] = now[c] - before[c] end
    local complete
    if type(waited) == "function" then
      complete = waited(d)
    else
      local sum = 0
      for _, c in ipairs(waited or { cmd }) do sum = sum + d[c] end
      complete = d.wait == sum
    end
    if (d[cmd] >= n and complete) or proc.now_ms() > deadline then return d end
    proc.sleep_ms(10)
  end
end

--- Three nodes with a replica each, and a client waiting for one replica.
local function replicated_scene()
  local rs = replicated.start(3)
  return rs, redlock.new { servers = rs.urls, ttl = 3000, node_timeout = NODE_TIMEOUT, replicas = 1 }
end

local function stop_scene(rs, dlm)
  if dlm then dlm:close() end
  if rs then rs:stop() end
end

--- nginx with one worker and a client DLM like replicated_scene's, serving
-- location; run check(srv), then stop nginx whatever happened.
local function in_nginx(rs, location, check)
  local srv = nginx.start_tree { workers = 1,
    init = ([[
      redlock = require "redlock"
      DLM = redlock.new { servers = %s, ttl = 3000, node_timeout = %d, replicas = 1 }
    ]]):format(nginx.lua_list(rs.urls), NODE_TIMEOUT),
    locations = { location } }
  local ok, err = pcall(check, srv)
  srv:stop()
  assert(ok, err)
end

describe("replicas: misuse", function()
  it("raises at the call site for a bad replicas option or URL query", function()
    for _, bad in ipairs { -1, 65, 1.5, "1", true } do
      local ok, err = pcall(redlock.new, { servers = { "redis://127.0.0.1:1" }, replicas = bad })
      assert.is_false(ok)
      assert.matches("bad argument #1 to 'new' %(replicas must be a whole number from 0 to 64", err)
    end
    local ok, err = pcall(redlock.new, { servers = { "redis://127.0.0.1:1?replicas=x" } })
    assert.is_false(ok)
    assert.matches("replicas must be a number from 0 to 64", err, 1, true)
    ok, err = pcall(redlock.new, { servers = { "redis://127.0.0.1:1?replicas=1&replicas=1" } })
    assert.is_false(ok)
    assert.matches("the query may say replicas=N, each once", err, 1, true)
    -- a cluster node says it on its entry, for every shard; not in a seed's URL
    ok, err = pcall(redlock.new, { servers = { { cluster = { "redis://127.0.0.1:1" }, replicas = -1 } } })
    assert.is_false(ok)
    assert.matches("servers[1].replicas must be a whole number from 0 to 64, got -1", err, 1, true)
    ok, err = pcall(redlock.new, { servers = { { cluster = { "redis://127.0.0.1:1?replicas=1" } } } })
    assert.is_false(ok)
    assert.matches("servers[1].cluster[1] must be a redis:// or rediss:// URL (no '+', '?' or space)", err, 1, true)
    local dlm = redlock.new { servers = { { cluster = { "redis://127.0.0.1:1", "redis://127.0.0.1:2" }, replicas = 2 } } }
    assert.matches("?replicas=2", dlm.names[1], 1, true)
    dlm:close()
  end)
end)

describe("replicas: nodes whose replicas keep up", function()
  local rs, dlm
  setup(function() rs, dlm = replicated_scene() end)
  teardown(function() stop_scene(rs, dlm) end)

  it("waits after every acquire and extension, and never after a release", function()
    settle(rs)
    local c0 = counts(rs)
    local r = names("plain")
    local lock = assert(dlm:lock(r, { ttl = 30000 })) -- counting may take longer than 3 s on a loaded machine
    -- a new client: a node whose connection was still being set up gets its SET in the tail,
    -- which a plain LuaJIT client serves only inside its next call (docs/errors.md): drive it
    assert.is_true(cluster.await_value(rs.masters, r, lock.value, 2000, nil, dlm))
    local d = await_waited(rs, c0, "set", 3)
    assert.is_true(d.set >= 3)
    assert.are.equal(d.set, d.wait) -- a WAIT behind every SET
    settle(rs) -- the driving's releases
    local c1 = counts(rs)
    assert.is_truthy(lock:extend())
    d = await_waited(rs, c1, "evalsha", 3)
    assert.are.equal(d.evalsha, d.wait)
    local c2 = counts(rs)
    assert.is_true(lock:unlock())
    assert.is_true(cluster.await_value(rs.masters, r, nil, 2000))
    proc.sleep_ms(50)
    d = await_waited(rs, c2, "evalsha", 3, function() return true end)
    assert.is_true(d.evalsha >= 3)
    assert.are.equal(0, d.wait) -- the release sent no WAIT

    -- a fenced lock (its grant and its commit), a shared hold, a semaphore's slot: scripts sent whole
    for _, opts in ipairs { { fence = true }, { shared = true }, { limit = 2 } } do
      settle(rs) -- the last release's tail
      local c = counts(rs)
      local l = assert(dlm:lock(names("kind"), opts))
      if opts.limit then
        -- a slot won at quorum sends a node whose vote was not in yet a cleanup of the other
        -- slots (an EVAL without WAIT): count the WAITs alone
        d = await_waited(rs, c, "wait", 3, { "wait" })
        assert.are.equal(3, d.wait)
      else
        d = await_waited(rs, c, "eval", opts.fence and 6 or 3)
        assert.is_true(d.eval >= 3)
        assert.are.equal(d.eval, d.wait)
      end
      assert.is_true(l:unlock())
    end
  end)

  it("waits in a waiter's acquire, and in keep-alive's renewals", function()
    local r = names("queued")
    local other = redlock.new { servers = rs.urls, ttl = 3000, node_timeout = NODE_TIMEOUT, replicas = 1 }
    settle(rs)
    local c0 = counts(rs)
    assert(dlm:lock(r, { ttl = 500 })) -- left to expire
    local lock, err = other:lock(r, { wait = 5000 })
    assert.is_truthy(lock, err)
    -- released before counting (a release sends no WAIT, and is no EVAL): counting takes seconds
    -- on a loaded machine, longer than the lock's ttl
    assert.is_true(lock:unlock())
    -- the holder's SETs, the waiter's: SET, then the script that queues it (EVAL), each with its
    -- WAIT (commandstats counts the SETs inside scripts too: count the WAITs against the EVALs)
    settle(rs)
    local d = await_waited(rs, c0, "eval", 3, function(x) return x.wait >= x.eval + 3 end)
    assert.is_true(d.eval >= 3, d.eval)
    local plain_sets = d.wait - d.eval -- the holder's 3, and the waiter's first try's
    assert.is_true(plain_sets >= 3 and plain_sets <= 6, plain_sets)
    other:close()

    settle(rs)
    local c1 = counts(rs)
    local kept = names("kept")
    local renewed = dlm:with_lock(kept, { ttl = 600 }, function(l)
      proc.sleep_ms(1000) -- keep-alive extends every ~200 ms meanwhile
      assert.is_false(l:lost())
      return await_waited(rs, c1, "evalsha", 9, function() return true end).evalsha
    end)
    assert.is_true(renewed >= 9) -- at least three renewals, on each node
    -- While the lock is kept the counts never stand still (a renewal on every node every ~200 ms,
    -- its WAIT counted once it returns, the 12 INFOs of a count taken one after the other):
    -- compare them once it is released, the release being an EVALSHA on each node without WAIT.
    assert.is_true(cluster.await_value(rs.masters, kept, nil, 2000))
    d = await_waited(rs, c1, "evalsha", renewed + 3, function(x) return x.wait == x.set + x.evalsha - 3 end)
    assert.are.equal(d.set + d.evalsha - 3, d.wait)
  end)

  it("lets one node's URL say ?replicas=0: no WAIT there", function()
    local urls = { rs.urls[1] .. "?replicas=0", rs.urls[2], rs.urls[3] }
    local d = redlock.new { servers = urls, ttl = 3000, node_timeout = NODE_TIMEOUT, replicas = 1 }
    local function per_node(cmd)
      local t = {}
      for i = 1, 3 do t[i] = cluster.calls(rs.masters, cmd, i) end
      return t
    end
    local w0, s0 = per_node("wait"), per_node("set")
    local r = names("override")
    local lock = assert(d:lock(r))
    -- a new client: the tail of a call decided at quorum waits for its next call (docs/errors.md)
    assert.is_true(cluster.await_value(rs.masters, r, lock.value, 2000, nil, d))
    assert.is_true(cluster.await_all(rs.masters, function(i)
      local sets, waited = per_node("set")[i] - s0[i], per_node("wait")[i] - w0[i]
      return sets >= 1 and waited == (i == 1 and 0 or sets), ("%d SET, %d WAIT"):format(sets, waited)
    end, 3000))
    assert.is_true(lock:unlock())
    d:close()
  end)

  it("waits inside nginx too (the hub runs the same engine)", function()
    in_nginx(rs, [[
      location = /lock {
        content_by_lua_block {
          local lock, err = DLM:try_lock(ngx.var.arg_r)
          if not lock then ngx.say("fail ", err) return end
          ngx.say(lock:unlock() and "ok" or "unlock failed")
        }
      }]], function(srv)
      local c0 = counts(rs)
      local status, body = srv:get("/lock?r=" .. names("nginx"))
      assert.are.equal(200, status)
      assert.are.equal("ok\n", body)
      local d = await_waited(rs, c0, "set", 3)
      assert.is_true(d.set >= 3)
      assert.are.equal(d.set, d.wait)
    end)
  end)
end)

describe("replicas: nodes whose replicas get nothing", function()
  local rs, dlm
  setup(function() rs, dlm = replicated_scene() end)
  teardown(function() stop_scene(rs, dlm) end)

  it("fails their votes with the count, undoes the writes, and stops extensions and keep-alive", function()
    local before = {}
    for i = 1, 3 do before[i] = cluster.calls(rs.masters, "wait", i) end
    local held = assert(dlm:lock(names("held"), { ttl = 10000 }))
    local kept = assert(dlm:lock(names("kept"), { ttl = 900, keepalive = true }))
    -- the acquires' tails first (their WAITs on every node): a WAIT cut off from its replica
    -- holds up what follows it on that connection, past the node timeout of the round below
    assert.is_true(cluster.await_all(rs.masters, function(i)
      return cluster.calls(rs.masters, "wait", i) - before[i] >= 2
    end, 3000))
    rs:cut(1)
    rs:cut(2)

    local r = names("refused")
    local lock, err, detail = dlm:try_lock(r)
    assert.is_nil(lock)
    assert.are.equal("unavailable", err)
    assert.are.equal(SHORT, detail[1].error, cluster.show(detail))
    assert.are.equal(SHORT, detail[2].error, cluster.show(detail))
    -- the SETs did land on the masters; they are released like any failed vote's
    assert.is_true(cluster.await_value(rs.masters, r, nil, 2000, nil, dlm))

    local ok, xerr, xdetail = held:extend()
    assert.is_nil(ok)
    assert.are.equal("unavailable", xerr)
    assert.are.equal(SHORT, xdetail[1].error, cluster.show(xdetail))

    -- keep-alive's renewals wait too: the lock is lost within its ttl
    local deadline = proc.now_ms() + 3000
    while not kept:lost() and proc.now_ms() < deadline do proc.sleep_ms(20) end
    assert.is_true(kept:lost())
  end)

  it("fails them inside nginx too", function()
    in_nginx(rs, [[
      location = /lock {
        content_by_lua_block {
          local lock, err, d = DLM:try_lock(ngx.var.arg_r)
          if lock then ngx.say("ok") return end
          ngx.say("fail ", err, " | ", d[1].error, " | ", d[2].error)
        }
      }]], function(srv)
      local status, body = srv:get("/lock?r=" .. names("nginx"))
      assert.are.equal(200, status)
      assert.are.equal("fail unavailable | " .. SHORT .. " | " .. SHORT .. "\n", body)
    end)
  end)
end)
