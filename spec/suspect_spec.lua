-- A node that stops answering (SIGSTOP on its redis-server) costs no more
-- than a dead one: once it is suspect, it is sent nothing but a probe (and
-- the release of a value its SET may have carried there), on every
-- transport (the libev client, the keeper's client, the nginx hub).
-- Counted on the node itself: after SIGCONT it runs everything that waited
-- in its socket, and INFO commandstats says what we had sent. Then it votes
-- again. The release it was owed (a lock taken before it stopped) went
-- behind what waited in its socket, so it runs then even if the client is
-- gone. Slow nodes keep their vote: see the far-node row of the
-- benchmark and spec/batches_spec.lua (a node busy with a large batch).

local redlock = require "redlock"
local cluster = require "helpers.cluster"
local nginx = require "helpers.nginx"
local faults = require "helpers.faults"
local proc = require "helpers.proc"
local C = require("redlock.cdefs").lib

local NODE_TIMEOUT = 50
local CYCLES = 1000
local REJOIN_MS = 3000 -- generous: a loaded machine may not schedule the node at once

local res = cluster.names("suspect")

-- Calls of each command node i has run since its stats were reset.
local function calls(cl, i)
  local out, ok = cl:cli(i, "INFO", "commandstats")
  assert(ok, out)
  local t = setmetatable({}, { __index = function() return 0 end })
  for name, n in out:gmatch("cmdstat_([%w_|]+):calls=(%d+)") do t[name] = tonumber(n) end
  return t
end

-- The most probes a node stopped for ms may have been sent: the step check
-- that made it suspect, then one after 250 ms, 500 ms more, and then one a
-- second at most (stall_reset 500 ms, reconnect_max 1000 ms, the defaults).
local function max_probes(ms)
  return 2 + math.ceil(ms / 250)
end

local function detail_error(detail, i)
  return detail and detail[i] and detail[i].error or ""
end

-- Lock and unlock until node 1's vote says "not answering"; the number of
-- cycles that took (bounded: it must come within a few node timeouts).
local function cycles_until_suspect(dlm)
  local t0 = proc.now_ms()
  for k = 1, 100000 do
    local lock, err, detail = dlm:try_lock(res("until"), { ttl = 10000 })
    assert(lock, tostring(err) .. " " .. cluster.show(detail))
    local _
    _, _, detail = lock:unlock()
    if detail_error(detail, 1):match("^not answering for %d+ ms") then return k end
    assert(proc.now_ms() - t0 < 10000, "node 1 never became suspect: " .. cluster.show(detail))
  end
end

-- n cycles of try_lock(resource, opts) and unlock, node 1 suspect in each
-- (its vote lost at once); each(lock) looks at every lock.
local function cycles_while_suspect(dlm, n, resource, opts, each)
  for k = 1, n do
    local lock, err, detail = dlm:try_lock(resource, opts)
    assert(lock, tostring(err) .. " " .. cluster.show(detail))
    if each then each(lock) end
    local ok
    ok, err, detail = lock:unlock()
    assert(ok, err)
    assert.matches("^not answering for %d+ ms %(suspect", detail_error(detail, 1), 1, false, "cycle " .. k)
  end
end

describe("a node that stops answering", function()
  local cl, dlm, stopped

  lazy_setup(function() cl = cluster.start(5) end)
  lazy_teardown(function() if cl then cl:stop() end end)
  before_each(function()
    dlm = redlock.new { servers = cl.urls, ttl = 10000, node_timeout = NODE_TIMEOUT }
    assert(dlm:try_lock(res("warm"))):unlock()
    cl:cli(1, "CONFIG", "RESETSTAT")
  end)
  after_each(function()
    if stopped then cl:kill(1, "CONT") end
    stopped = nil
    dlm:close()
    cluster.flush(cl)
  end)

  local function stop()
    cl:kill(1, "STOP")
    stopped = true
  end

  it("is sent nothing but probes, and gets its release once it runs again", function()
    local held = assert(dlm:lock(res("held"), { ttl = 60000 })) -- on node 1 before it stops
    local t0 = proc.now_ms()
    stop()
    local before = cycles_until_suspect(dlm)
    -- counted, and shown to a scraper
    local st = dlm:stats().nodes[1]
    assert.is_true(st.suspect)
    assert.equal(1, st.suspected)
    assert.matches('\nredlock_node_suspect{node="[^"]+"} 1\n', redlock.metrics(dlm))
    cycles_while_suspect(dlm, CYCLES, res("cycle"), { ttl = 10000 })
    assert(held:unlock()) -- node 1 may hold it: its release goes behind what waits there
    cl:kill(1, "CONT")
    stopped = nil
    -- Node 1 runs what waited in its socket; nothing of the 1000 cycles is there.
    local n = calls(cl, 1)
    assert.is_true(n.set <= before + 2, ("%d SETs for %d cycles before it was suspect"):format(n.set, before))
    assert.is_true(n.evalsha <= before + 1, ("%d EVALSHAs for %d cycles"):format(n.evalsha, before))
    assert.is_true(n.echo >= 1 and n.echo <= max_probes(proc.now_ms() - t0), ("%d probes"):format(n.echo))
    assert.is_true(n.eval <= 2, ("%d releases"):format(n.eval)) -- the held lock's (below)
    -- It votes again as soon as the client hears from it.
    local back = proc.now_ms()
    local voted, detail
    repeat
      local lock, _, d = dlm:try_lock(res("back"), { ttl = 10000 })
      if lock then _, _, d = lock:unlock() end
      detail = d
      voted = d and d[1].state == "ok"
      if not voted then proc.sleep_ms(10) end
    until voted or proc.now_ms() - back > REJOIN_MS
    assert(voted, "node 1 does not vote again: " .. cluster.show(detail))
    -- The release it was owed went out (once), and none for the cycles' locks.
    assert(cluster.await_all(cl, function(i)
      return i ~= 1 or cluster.dbsize(cl, 1) == 0, "keys left: " .. tostring(cluster.dbsize(cl, 1))
    end, REJOIN_MS, nil, dlm))
    local evals = calls(cl, 1).eval -- the held lock's, and perhaps the release of a cycle begun just before
    assert.is_true(evals >= 1 and evals <= 2, ("%d releases kept"):format(evals))
  end)

  -- Before: the release was kept in the client until node 1 answered, and
  -- a client closed before that dropped it: the key stayed its whole ttl.
  -- (Few commands wait in node 1's socket here: a node that runs again
  -- finds its client gone once it answers the first of them, and drops
  -- whatever it had not read by then.)
  it("gets its release even when the client is closed before it runs again", function()
    local held = assert(dlm:lock(res("closed"), { ttl = 60000 })) -- on node 1 before it stops
    assert.equal(held.value, cluster.get(cl, 1, held.resource))
    stop()
    local t0 = proc.now_ms()
    local detail
    repeat -- a few cycles, the client idle in between: node 1 falls silent
      C.rl_sleep(dlm.client, 20)
      local lock = assert(dlm:try_lock(res("idle"), { ttl = 10000 }))
      detail = select(3, lock:unlock())
      assert(proc.now_ms() - t0 < 10000, "node 1 never became suspect: " .. cluster.show(detail))
    until detail_error(detail, 1):match("^not answering")
    local ok, _
    ok, _, detail = held:unlock()
    assert(ok)
    assert.matches("^not answering for %d+ ms %(suspect", detail_error(detail, 1))
    dlm:close()
    cl:kill(1, "CONT")
    stopped = nil
    dlm = redlock.new { servers = cl.urls } -- for after_each; not used
    assert(cluster.await_all(cl, function(i)
      local v = i == 1 and cluster.get(cl, 1, held.resource)
      return not v, "key left on node 1: " .. tostring(v)
    end, REJOIN_MS))
  end)

  it("is skipped by a semaphore's slots too, and gets the release of a slot it holds once it runs again", function()
    local r = res("sem")
    local held = assert(dlm:lock(r, { limit = 2, ttl = 60000 })) -- its slot on node 1 before it stops
    local key = ("redlock:slot:%d:%s"):format(held.slot, r)
    assert.equal(held.value, cluster.get(cl, 1, key))
    stop()
    cycles_until_suspect(dlm)
    cycles_while_suspect(dlm, 50, r, { limit = 2, ttl = 10000 }, function(lock)
      assert.are_not.equal(held.slot, lock.slot)
    end)
    assert(held:unlock()) -- node 1 holds the slot: its release goes behind what waits there
    cl:kill(1, "CONT")
    stopped = nil
    local back = proc.now_ms()
    local voted
    repeat
      local lock = dlm:try_lock(res("back"), { ttl = 10000 })
      local detail
      if lock then detail = select(3, lock:unlock()) end
      voted = detail and detail[1].state == "ok"
      if not voted then proc.sleep_ms(10) end
    until voted or proc.now_ms() - back > REJOIN_MS
    assert(voted, "node 1 does not vote again")
    assert(cluster.await_all(cl, function(i)
      local v = cluster.get(cl, i, key)
      return v == nil, "slot key left: " .. tostring(v)
    end, REJOIN_MS, nil, dlm))
  end)

  it("keeps its one connection, quiet, while it stays stopped", function()
    -- node 1 behind a proxy that only forwards, so its connections can be counted
    local px = faults.proxy(cl.ports[1])
    local servers = { px.url, cl.urls[2], cl.urls[3], cl.urls[4], cl.urls[5] }
    local other = redlock.new { servers = servers, ttl = 10000, node_timeout = NODE_TIMEOUT }
    local ok, err = pcall(function()
      assert(other:try_lock(res("warm"))):unlock()
      local accepted, stopped_at = px:accepts(), proc.now_ms()
      stop()
      cycles_until_suspect(other)
      local t0 = proc.now_ms()
      while proc.now_ms() - t0 < 2000 do -- four stall_reset periods, and past the 1 s reconnect cap
        local lock = other:try_lock(res("quiet"), { ttl = 10000 })
        if lock then lock:unlock() end
        proc.sleep_ms(5)
      end
      assert.equal(accepted, px:accepts(), "the client reconnected to the stopped node")
      cl:kill(1, "CONT")
      stopped = nil
      local probes = calls(cl, 1).echo
      assert.is_true(probes <= max_probes(proc.now_ms() - stopped_at), probes .. " probes")
    end)
    other:close()
    px:stop()
    assert(ok, err)
  end)

  it("stops getting keep-alive extensions from the keeper", function()
    local lock = assert(dlm:lock(res("kept"), { ttl = 300, keepalive = true }))
    stop()
    proc.sleep_ms(2000) -- ~20 extensions due; the keeper's client finds node 1 silent
    assert.is_true(lock:valid(), "the lock is kept on the other four nodes")
    cl:kill(1, "CONT")
    stopped = nil
    local n = calls(cl, 1)
    -- extensions before it was suspect (about two node timeouts' worth), not 20
    assert.is_true(n.evalsha <= 4, ("%d extensions sent to the stopped node"):format(n.evalsha))
    assert(lock:unlock())
  end)
end)

describe("a node that stops answering, inside nginx", function()
  local cl, srv

  lazy_setup(function() cl = cluster.start(5) end)
  lazy_teardown(function()
    if srv then srv:stop() end
    if cl then cl:kill(1, "CONT"); cl:stop() end
  end)

  it("is sent nothing but probes by the worker's hub", function()
    srv = nginx.start_tree {
      workers = 1,
      init = ([[
        redlock = require "redlock"
        DLM = redlock.new { servers = %s, ttl = 10000, node_timeout = %d }
      ]]):format(nginx.lua_list(cl.urls), NODE_TIMEOUT),
      locations = { nginx.PING, [[
        location = /cycles {
          content_by_lua_block {
            local n, suspect, failed = tonumber(ngx.var.arg_n), 0, 0
            for k = 1, n do
              local lock, err, d = DLM:try_lock(ngx.var.arg_r .. k)
              if lock then _, err, d = lock:unlock() else failed = failed + 1 end
              if d and d[1].error and d[1].error:match("^not answering") then suspect = suspect + 1 end
            end
            ngx.say(suspect, " ", failed)
          }
        }]] },
    }
    local status, body = srv:get("/cycles?n=5&r=" .. res("warm"))
    assert.equal(200, status, body)
    cl:cli(1, "CONFIG", "RESETSTAT")
    local t0 = proc.now_ms()
    cl:kill(1, "STOP")
    local before = 0
    repeat -- until the hub's engine finds node 1 silent
      status, body = srv:get("/cycles?n=10&r=" .. res("until"))
      assert.equal(200, status, body)
      before = before + 10
      assert.is_true(before < 10000, "node 1 never became suspect")
    until body:match("^(%d+)") ~= "0"
    status, body = srv:get(("/cycles?n=%d&r=%s"):format(CYCLES, res("cycle")))
    assert.equal(200, status, body)
    assert.equal(CYCLES .. " 0", body:match("^(%d+ %d+)"), body)
    cl:kill(1, "CONT")
    local n = calls(cl, 1)
    assert.is_true(n.set <= before + 2, ("%d SETs for %d cycles before it was suspect"):format(n.set, before))
    assert.is_true(n.echo >= 1 and n.echo <= max_probes(proc.now_ms() - t0), ("%d probes"):format(n.echo))
  end)
end)
