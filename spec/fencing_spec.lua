-- Fencing tokens (docs/design.md, "Fencing tokens"), against real redis-server
-- nodes that keep their data on disk (appendonly, appendfsync always) and are
-- SIGKILLed and restarted with it.
--
-- 1. A schedule of crashes on which the naive scheme (token = max of per-node
--    INCRs over the granting quorum) repeats a token, while ours (acquire
--    with INCR, then commit max(counter, T) on a quorum) stays strictly
--    increasing. The naive client is written here over raw RESP.
-- 2. A history check: client processes increment a value in a "fenced
--    store" (spec/helpers/fence_store.lua) by a read and a separate write,
--    while the spec pauses holders past their ttl and crashes nodes. With
--    fencing, no accepted update is lost and stale writes are refused;
--    without it, updates are lost.
-- 3. Large counters: tokens stay exact past 2^53 (lock.token an int64_t
--    cdata, lock.token_string its digits, REDLOCK_TOKEN from the host) up to
--    2^63 - 1, after which a grant is refused, clearly and without a key.
-- 4. Counters that are not positive integers: one failed vote per such
--    node, whose detail names the counter and what it holds.

local devcluster = require "redlock.devcluster"
local redlock = require "redlock"
local proc = require "helpers.proc"
local resp = require "helpers.resp"
local store = require "helpers.fence_store"
local cluster = require "helpers.cluster"
local socket = require "socket"

local names = cluster.names("fencing")
local ROOT = io.popen("pwd"):read("*l")
local BIN = os.getenv("REDLOCK_HOST") or (ROOT .. "/build/redlock")
if BIN:sub(1, 1) ~= "/" then BIN = ROOT .. "/" .. BIN end

math.randomseed(proc.getpid())

--- n nodes that keep their data: each is a one-node devcluster of its own
-- (its own directory, so their append-only files never mix), restarted on
-- the same port and directory after a crash.
local function disk_nodes(n)
  local nodes = { n = n, cls = {}, urls = {}, ports = {} }
  local ok, err = pcall(function()
    for i = 1, n do
      local c = devcluster.start { n = 1, args = { "--appendonly", "yes", "--appendfsync", "always" } }
      nodes.cls[i], nodes.urls[i], nodes.ports[i] = c, c.urls[1], c.ports[1]
    end
  end)
  function nodes:kill(i)
    local pid = self.cls[i].pids[1]
    assert(self.cls[i]:kill(1, "KILL"))
    assert(proc.wait_gone(pid, 10000), "node " .. i .. " survived SIGKILL")
  end
  function nodes:restart(i) self.cls[i]:restart(1) end -- waits until it answers PING
  function nodes:alive(i) return self.cls[i]:alive(1) end
  --- Restart every node found dead (after a test that failed half-way).
  function nodes:ensure_up()
    for i = 1, self.n do
      if not self:alive(i) then self:restart(i) end
    end
  end
  function nodes:cli(i, ...) return self.cls[i]:cli(1, ...) end
  function nodes:pids()
    local t = {}
    for i = 1, self.n do t[i] = self.cls[i].pids[1] end
    return t
  end
  function nodes:stop()
    for _, c in ipairs(self.cls) do c:stop() end
  end
  if not ok then
    nodes:stop()
    error(err, 2)
  end
  return nodes
end

--- One command on the node at port, on a fresh connection; nil if the node
-- cannot be reached (down).
local function node_call(port, ...)
  local s = socket.tcp()
  s:settimeout(2)
  if not s:connect("127.0.0.1", port) then
    s:close()
    return nil
  end
  local ok, r = pcall(resp.call, s, ...)
  s:close()
  if ok then return r end
  return nil
end

-- The naive scheme: SET NX PX and, if set, INCR the counter, atomically on
-- each node; the token is the max of the counters over the granting nodes.
local NAIVE_ACQUIRE = [[
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return redis.call('INCR', KEYS[2])
end
return 0
]]
local RELEASE = [[
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
]]

local function random_value()
  local t = {}
  for i = 1, 20 do t[i] = ("%02x"):format(math.random(0, 255)) end
  return table.concat(t)
end

--- A naive grant of resource on nodes: a lock { token, counters, unlock }
-- or nil, and the counters seen.
local function naive_lock(nodes, resource, ttl)
  local value = random_value()
  local counters = {}
  for i = 1, nodes.n do
    local r = node_call(nodes.ports[i], "EVAL", NAIVE_ACQUIRE, "2", resource, resource .. ":naive", value, ttl)
    local c = r and tonumber(r:match("^:(%d+)$"))
    if c and c > 0 then counters[#counters + 1] = c end
  end
  local function unlock()
    for i = 1, nodes.n do node_call(nodes.ports[i], "EVAL", RELEASE, "1", resource, value) end
  end
  if #counters < math.floor(nodes.n / 2) + 1 then
    unlock()
    return nil, counters
  end
  return { token = math.max(unpack(counters)), unlock = unlock }, counters
end

--- Value of key on node i as a number (nil if absent).
local function node_number(nodes, i, key)
  local out, ok = nodes:cli(i, "GET", key)
  assert(ok, out)
  return tonumber(out)
end

--- lock(...) with the fence option, raising with a readable message if the
-- client does not know the option (or anything else raises).
local function fenced(dlm, method, ...)
  local ok, a, b, c = pcall(dlm[method], dlm, ...)
  assert(ok, ("%s with fence = true raised: %s"):format(method, tostring(a)))
  return a, b, c
end

local ffi = require "ffi"

--- lock.token: an int64_t cdata >= 1, with lock.token_string its exact
-- decimal text. Returns the token.
local function assert_token(lock, what)
  assert.is_truthy(lock, what)
  local t = lock.token
  assert(ffi.istype("int64_t", t) and t >= 1,
    ("%s: lock.token should be an int64_t cdata >= 1, got %s (%s)"):format(what, tostring(t), type(t)))
  assert.are.equal(("%d"):format(t), lock.token_string, what)
  assert.are.equal(tostring(t):match("^(%d+)LL$"), lock.token_string, what)
  return t
end

--- Tokens (cdata or numbers) for a message.
local function show_tokens(list)
  local t = {}
  for k, v in ipairs(list) do t[k] = type(v) == "cdata" and ("%d"):format(v) or tostring(v) end
  return table.concat(t, " ")
end

--- a < b for decimal strings of positive integers (no leading zeros): by
-- length, then bytes (exact at any size, unlike tonumber past 2^53).
local function dec_less(a, b)
  return #a < #b or (#a == #b and a < b)
end

describe("fencing tokens", function()
  local nodes

  setup(function()
    nodes = disk_nodes(3)
  end)

  teardown(function()
    if nodes then nodes:stop() end
  end)

  -- Grant g happens while node DOWN[g] is down (SIGKILLed); it comes back
  -- with its data (and answers PING) before the next grant, and each lock is
  -- released before the next grant. With 3 nodes (quorum 2) the naive
  -- counters go:         node1 node2 node3   token
  --   grant 1 (3 down)     1     1     0       1
  --   grant 2 (1 down)     1     2     1       2
  --   grant 3 (2 down)     2     2     2       2   <- repeats grant 2's
  -- Ours commits max(counter, T) on the granting nodes: after grant 2 node3
  -- holds 2, so grant 3's INCR on node3 gives 3.
  local DOWN = { 3, 1, 2 }

  --- Run the schedule: grant(g, down) makes grant g (node down is down) and
  -- returns its token; counter is the key whose value on a restarted node
  -- must have survived its crash. Returns the tokens.
  local function schedule(counter, grant)
    nodes:ensure_up()
    local tokens = {}
    for g, d in ipairs(DOWN) do
      local before = node_number(nodes, d, counter)
      nodes:kill(d)
      local ok, err = pcall(grant, g, d)
      nodes:restart(d)
      if not ok then error(err, 0) end
      tokens[g] = err
      assert.are.equal(before, node_number(nodes, d, counter), "node " .. d .. " lost its data")
    end
    return tokens
  end

  it("the naive max of per-node INCRs repeats a token on a schedule of crashes", function()
    local res = names("naive")
    local tokens = schedule(res .. ":naive", function(g, d)
      local nl, counters = naive_lock(nodes, res, 10000)
      assert(nl, ("naive grant %d (node %d down) failed: counters %s"):format(g, d, table.concat(counters, ",")))
      nl.unlock()
      return nl.token
    end)
    print(("\n  naive tokens: %s"):format(table.concat(tokens, " ")))
    assert.are.same({ 1, 2, 2 }, tokens)
    assert.is_false(tokens[3] > tokens[2])
    for i = 1, nodes.n do
      assert.are.equal(2, node_number(nodes, i, res .. ":naive"))
    end
  end)

  it("ours stays strictly increasing on the same schedule", function()
    local res = names("ours")
    local tokens = schedule(res .. ":fence", function(g, d)
      -- A fresh client per grant: its connect to the down node is refused at
      -- once, and it has no stale connection to a restarted node.
      local dlm = redlock.new { servers = nodes.urls, ttl = 10000 }
      local lock, err, detail = fenced(dlm, "lock", res, { fence = true, wait = 5000 })
      assert(lock, ("grant %d (node %d down): %s %s"):format(g, d, tostring(err), cluster.show(detail)))
      local token = assert_token(lock, "grant " .. g)
      -- The counter is "<resource>:fence", never expires, and the commit
      -- left the token on the granting nodes.
      local top = 0
      for i = 1, nodes.n do
        if i ~= d then
          top = math.max(top, node_number(nodes, i, res .. ":fence") or 0)
          assert.are.equal("-1", (nodes:cli(i, "PTTL", res .. ":fence")))
        end
      end
      assert.are.equal(token, top)
      assert.is_true((lock:unlock()))
      for i = 1, nodes.n do
        if i ~= d then assert.are.equal("0", (nodes:cli(i, "EXISTS", res))) end
      end
      dlm:close()
      return token
    end)
    print(("\n  our tokens: %s"):format(show_tokens(tokens)))
    assert.is_true(tokens[2] > tokens[1], show_tokens(tokens))
    assert.is_true(tokens[3] > tokens[2], show_tokens(tokens))
  end)

  it("try_lock, with_lock, lock_many and exec --fence hand out increasing tokens; no fence, no token", function()
    local r, r2 = names("calls"), names("calls2")
    local dlm = redlock.new { servers = nodes.urls, ttl = 5000 }
    local tokens = {}

    local lock, err, detail = fenced(dlm, "try_lock", r, { fence = true })
    tokens[1] = assert_token(lock, "try_lock: " .. tostring(err) .. " " .. cluster.show(detail))
    assert.is_true((lock:unlock()))

    local ok, t = pcall(dlm.with_lock, dlm, r, { fence = true }, function(l) return assert_token(l, "with_lock") end)
    assert(ok, "with_lock with fence = true raised: " .. tostring(t))
    tokens[2] = t

    local locks
    locks, err, detail = fenced(dlm, "lock_many", { r, r2 }, { fence = true, wait = 3000 })
    assert(locks, "lock_many: " .. tostring(err) .. " " .. cluster.show(detail))
    tokens[3] = assert_token(locks[1], "lock_many[1]")
    assert_token(locks[2], "lock_many[2]")
    assert.is_true((locks:unlock()))

    lock = fenced(dlm, "lock", r, { fence = true })
    tokens[4] = assert_token(lock, "lock")
    assert.is_true((lock:unlock()))

    -- The host: REDLOCK_TOKEN in the child's environment.
    for k = 5, 6 do
      local out, rc = proc.sh(("env REDLOCK_SERVERS=%s %s exec --fence %s -- sh -c 'echo \"token=$REDLOCK_TOKEN\"'")
        :format(proc.quote(table.concat(nodes.urls, ",")), proc.quote(BIN), proc.quote(r)))
      assert.are.equal(0, rc, out)
      tokens[k] = tonumber(out:match("token=(%d+)"))
      assert(tokens[k], "no REDLOCK_TOKEN in: " .. out)
    end
    for k = 2, #tokens do
      assert(tokens[k] > tokens[k - 1], "not strictly increasing: " .. show_tokens(tokens))
    end

    -- Without fence: no token, and no counter key.
    local r3 = names("nofence")
    lock = assert(dlm:lock(r3, { wait = 3000 }))
    assert.is_nil(lock.token)
    assert.is_nil(lock.token_string)
    assert.is_true((lock:unlock()))
    for i = 1, nodes.n do
      assert.are.equal("0", (nodes:cli(i, "EXISTS", r3 .. ":fence")))
    end
    dlm:close()
  end)

  -- Past 2^53 (issue: Redis' Lua made INCR's result a double): tokens stay
  -- exact up to the counter's end, 2^63 - 1, where a grant is refused.
  describe("at large counters", function()
    --- SET the counter of resource to value on every node.
    local function set_counters(resource, value)
      for i = 1, nodes.n do
        assert.are.equal("OK", (nodes:cli(i, "SET", resource .. ":fence", value)))
      end
    end

    --- The counter of resource on every node, as the nodes hold it (strings).
    local function counters(resource)
      local t = {}
      for i = 1, nodes.n do t[i] = (nodes:cli(i, "GET", resource .. ":fence")) end
      return t
    end

    it("eight grants from 9007199254740990 are strictly increasing and distinct", function()
      nodes:ensure_up()
      local r = names("big")
      set_counters(r, "9007199254740990")
      local dlm = redlock.new { servers = nodes.urls, ttl = 5000 }
      local tokens, texts, seen = {}, {}, {}
      for k = 1, 8 do
        local lock, err, detail = dlm:lock(r, { fence = true, wait = 5000 })
        assert(lock, ("grant %d: %s %s"):format(k, tostring(err), cluster.show(detail)))
        tokens[k], texts[k] = assert_token(lock, "grant " .. k), lock.token_string
        assert.is_true((lock:unlock()))
      end
      dlm:close()
      print(("\n  tokens from 9007199254740990: %s"):format(table.concat(texts, " ")))
      assert.is_true(dec_less("9007199254740990", texts[1]), texts[1])
      for k = 1, #texts do
        assert.is_nil(seen[texts[k]], "token repeated: " .. table.concat(texts, " "))
        seen[texts[k]] = true
        if k > 1 then
          assert(dec_less(texts[k - 1], texts[k]), "not strictly increasing: " .. table.concat(texts, " "))
          assert(tokens[k] > tokens[k - 1], "tokens not strictly increasing as int64: " .. table.concat(texts, " "))
        end
      end
      -- the last commit left the last token on a quorum, exactly
      local on = 0
      for _, c in ipairs(counters(r)) do
        if c == texts[8] then on = on + 1 end
      end
      assert.is_true(on >= 2, table.concat(counters(r), " "))
    end)

    it("two exec --fence runs at 1.7e18 get distinct tokens", function()
      nodes:ensure_up()
      local r = names("exec")
      set_counters(r, "1700000000000000000")
      local texts = {}
      for k = 1, 2 do
        local out, rc = proc.sh(("env REDLOCK_SERVERS=%s %s exec --fence %s -- sh -c 'echo \"token=$REDLOCK_TOKEN\"'")
          :format(proc.quote(table.concat(nodes.urls, ",")), proc.quote(BIN), proc.quote(r)))
        assert.are.equal(0, rc, out)
        texts[k] = out:match("token=(%d+)")
        assert(texts[k], "no REDLOCK_TOKEN in: " .. out)
      end
      print(("\n  exec tokens from 1700000000000000000: %s %s"):format(texts[1], texts[2]))
      assert.is_true(dec_less("1700000000000000000", texts[1]), texts[1])
      assert(dec_less(texts[1], texts[2]), "not distinct and increasing: " .. texts[1] .. " " .. texts[2])
    end)

    it("at 2^63 - 2 one grant gets 9223372036854775807; the next is refused, leaving no key", function()
      nodes:ensure_up()
      local r = names("end")
      set_counters(r, "9223372036854775806")
      local dlm = redlock.new { servers = nodes.urls, ttl = 5000 }
      local lock, err, detail = dlm:try_lock(r, { fence = true })
      assert(lock, ("grant: %s %s"):format(tostring(err), cluster.show(detail)))
      assert_token(lock, "the last grant")
      assert.are.equal("9223372036854775807", lock.token_string)
      assert.is_true(lock.token == 9223372036854775807LL)
      assert.is_true((lock:unlock()))

      for _, how in ipairs { "try_lock", "lock" } do
        local opts = { fence = true }
        if how == "lock" then opts.wait = 300 end
        lock, err, detail = dlm[how](dlm, r, opts)
        assert.is_nil(lock, how)
        assert.are.equal("unavailable", err, cluster.show(detail))
        local refused = 0
        for i = 1, nodes.n do
          -- two refusals decide the round; the third node may still be answering
          if detail[i].state ~= "pending" then
            assert.are.equal("error", detail[i].state, cluster.show(detail))
            assert.are.equal("fence counter is at its end: " .. r .. ":fence holds 9223372036854775807",
              detail[i].error)
            refused = refused + 1
          end
        end
        assert.is_true(refused >= 2, cluster.show(detail))
        for i = 1, nodes.n do
          assert.are.equal("0", (nodes:cli(i, "EXISTS", r)), "node " .. i .. " kept the lock's key")
          assert.are.equal("9223372036854775807", (nodes:cli(i, "GET", r .. ":fence")))
        end
      end
      -- a plain lock on the resource is not affected
      lock = assert(dlm:try_lock(r))
      assert.is_true((lock:unlock()))
      dlm:close()
      -- redlock exec --fence, which waits as long as it takes, gives up at
      -- once (69): no attempt can succeed (before: it tried forever)
      local out, rc = proc.sh(("timeout 60 env REDLOCK_SERVERS=%s %s exec --fence %s -- true")
        :format(proc.quote(table.concat(nodes.urls, ",")), proc.quote(BIN), proc.quote(r)))
      assert.are.equal(69, rc, out)
      assert.matches("fence counter is at its end", out, 1, true)
    end)
  end)

  -- A counter that grants never made (issue: "unexpected reply (type 3)"):
  -- each node holding one is a failed vote whose detail names the key and
  -- what it holds; nothing is written there.
  describe("counters that are not positive integers", function()
    local serial = 0
    --- A short resource name, so that the whole message fits the detail.
    local function short_name()
      serial = serial + 1
      return ("fb%d:%d"):format(proc.getpid() % 100000, serial)
    end

    --- Wait (at most 5 s) until no node holds key; true if none does.
    local function gone_everywhere(key)
      local t0 = proc.now_ms()
      repeat
        local held = false
        for i = 1, nodes.n do
          if (nodes:cli(i, "EXISTS", key)) ~= "0" then held = true end
        end
        if not held then return true end
        proc.sleep_ms(20)
      until proc.now_ms() - t0 > 5000
      return false
    end

    local CASES = {
      { "zero", { "SET", "0" }, 'holds "0"' },
      { "negative", { "SET", "-5" }, 'holds "-5"' },
      { "leading zero", { "SET", "007" }, 'holds "007"' },
      { "text", { "SET", "abc" }, 'holds "abc"' },
      { "a float", { "SET", "1.5" }, 'holds "1.5"' },
      { "past 2^63 - 1", { "SET", "9223372036854775808" }, 'holds "9223372036854775808"' },
      { "twenty digits", { "SET", "99999999999999999999" }, 'holds "99999999999999999999"' },
      { "a long text", { "SET", ("x"):rep(40) }, 'holds "' .. ("x"):rep(21) .. '..."' },
      { "a list", { "RPUSH", "1" }, "is a list" },
      { "a hash", { "HSET", "f", "1" }, "is a hash" },
    }

    for _, case in ipairs(CASES) do
      it(("%s on two nodes of 3: two failed votes naming it, no lock, no key left"):format(case[1]), function()
        nodes:ensure_up()
        local r = short_name()
        local counter = r .. ":fence"
        local command, args = case[2][1], { unpack(case[2], 2) }
        for i = 1, 2 do nodes:cli(i, command, counter, unpack(args)) end
        local dlm = redlock.new { servers = nodes.urls, ttl = 5000 }
        local lock, err, detail = dlm:try_lock(r, { fence = true })
        assert.is_nil(lock)
        assert.are.equal("unavailable", err, cluster.show(detail))
        for i = 1, 2 do
          assert.are.equal("error", detail[i].state, cluster.show(detail))
          assert.are.equal("fence counter is not a positive integer: " .. counter .. " " .. case[3],
            detail[i].error)
        end
        -- node 3 grants, or is still answering when two failures decided the round
        assert.is_truthy(detail[3].state == "ok" or detail[3].state == "pending", cluster.show(detail))
        assert.is_true(gone_everywhere(r), "a node kept the lock's key")
        for i = 1, 2 do
          assert.are.equal(command == "SET" and "string" or (command == "RPUSH" and "list" or "hash"),
            (nodes:cli(i, "TYPE", counter)), "node " .. i .. "'s counter was changed")
        end
        if command == "SET" then
          for i = 1, 2 do assert.are.equal(args[1], (nodes:cli(i, "GET", counter))) end
        end

        -- One such node of 3 does not stop a grant: its vote fails, the
        -- others grant and commit.
        nodes:cli(2, "DEL", counter)
        lock, err, detail = dlm:lock(r, { fence = true, wait = 3000 })
        assert(lock, tostring(err) .. " " .. cluster.show(detail))
        assert_token(lock, case[1])
        assert.is_true((lock:unlock()))
        dlm:close()
      end)
    end
  end)

  describe("a fenced store under paused holders and crashing nodes", function()
    local WORKERS, TTL, RUN_MS = 6, 300, 6000
    local scl, sock
    local spawned, dirs = {}, {}

    setup(function()
      scl = devcluster.start { n = 1 }
      sock = assert(socket.connect("127.0.0.1", scl.ports[1]))
      sock:settimeout(10)
    end)

    teardown(function()
      for _, pid in ipairs(spawned) do proc.stop(pid) end
      for _, d in ipairs(dirs) do proc.rmdir(d) end
      if sock then sock:close() end
      if scl then scl:stop() end
    end)

    --- Run WORKERS clients in mode ("fenced" or "plain") for RUN_MS while
    -- pausing holders and crashing nodes; return the summed client counts,
    -- the chaos counts and the per-worker lines.
    local function run(mode)
      nodes:ensure_up()
      resp.call(sock, "FLUSHALL")
      local dir = proc.tmpdir()
      dirs[#dirs + 1] = dir
      local stopfile = dir .. "/stop"
      local resource = names(mode)
      local workers, is_worker = {}, {}
      for k = 1, WORKERS do
        local out = ("%s/w%d.out"):format(dir, k)
        local argv = { "luajit", "spec/helpers/fence_worker.lua", mode, stopfile, resource,
          tostring(scl.ports[1]), tostring(TTL) }
        for _, u in ipairs(nodes.urls) do argv[#argv + 1] = u end
        local pid = proc.spawn_luajit(argv, out)
        spawned[#spawned + 1] = pid
        workers[k] = { pid = pid, out = out }
        is_worker[pid] = true
      end

      -- Chaos: pause a holder (the last reader the store saw, or now and then
      -- any client) for 500-800 ms, past its 300 ms ttl, at most two at once;
      -- crash one node at a time and restart it with its data.
      local chaos = { pauses = 0, targeted = 0, kills = 0 }
      local paused, npaused = {}, 0
      local down, restart_at
      local t0 = proc.now_ms()
      local next_pause, next_kill = t0 + 300, t0 + 800
      local now = t0
      while now < t0 + RUN_MS do
        for pid, t in pairs(paused) do
          if now >= t then
            proc.kill(pid, "CONT")
            paused[pid], npaused = nil, npaused - 1
          end
        end
        if now >= next_pause and npaused < 2 then
          local pid = store.reader(sock, mode == "plain")
          local targeted = pid and is_worker[pid] and not paused[pid] and math.random() < 0.8
          if not targeted then pid = workers[math.random(WORKERS)].pid end
          if not paused[pid] then
            proc.kill(pid, "STOP")
            paused[pid], npaused = now + math.random(500, 800), npaused + 1
            chaos.pauses = chaos.pauses + 1
            if targeted then chaos.targeted = chaos.targeted + 1 end
          end
          next_pause = now + math.random(150, 350)
        end
        if down and now >= restart_at then
          nodes:restart(down)
          down, next_kill = nil, proc.now_ms() + math.random(600, 1200)
        elseif not down and now >= next_kill then
          down = math.random(nodes.n)
          nodes:kill(down)
          chaos.kills = chaos.kills + 1
          restart_at = proc.now_ms() + math.random(300, 700)
        end
        -- A worker only exits once told to: one that did has failed.
        local quit = false
        for _, w in ipairs(workers) do
          if not paused[w.pid] and not proc.alive(w.pid) then quit = true end
        end
        if quit then break end
        proc.sleep_ms(5)
        now = proc.now_ms()
      end
      for pid in pairs(paused) do proc.kill(pid, "CONT") end
      if down then nodes:restart(down) end
      proc.write_file(stopfile, "stop\n")

      local sum = { increments = 0, refused_reads = 0, refused_writes = 0, lock_failed = 0, errors = 0 }
      local lines = {}
      for k, w in ipairs(workers) do
        assert(proc.wait_gone(w.pid, 30000), "worker " .. k .. " did not stop")
        local out = proc.read_file(w.out) or ""
        local line = out:match("(increments=%d+[^\n]*)")
        assert(line, ("worker %d (%s) printed no summary:\n%s"):format(k, mode, out))
        lines[#lines + 1] = line
        for key in pairs(sum) do
          sum[key] = sum[key] + tonumber(line:match(key .. "=(%d+)"))
        end
        assert.is_nil(line:match("no token"), line)
      end
      -- Tidy: no worker left (zombies do not count), all nodes up.
      assert.are.equal(0, #proc.live_with_arg(stopfile))
      for i = 1, nodes.n do assert.is_true(nodes:alive(i)) end
      return sum, chaos, lines
    end

    it("with fencing: no accepted increment is lost, and stale writes are refused", function()
      local sum, chaos, lines = run("fenced")
      local st = store.stats(sock)
      print(("\n  fenced: store value %d, accepted increments %d (store counted %d), refused writes %d"
        .. " (store %d), refused reads %d (store %d), lock failures %d; %d pauses (%d of the last reader),"
        .. " %d node crashes\n    %s")
        :format(st.value, sum.increments, st.accepted, sum.refused_writes, st.refused_writes,
          sum.refused_reads, st.refused_reads, sum.lock_failed, chaos.pauses, chaos.targeted, chaos.kills,
          table.concat(lines, "\n    ")))
      assert.is_true(sum.increments >= 10, "too little progress to mean anything")
      assert.are.equal(sum.increments, st.value)
      assert.are.equal(st.accepted, st.value)
      assert.are.equal(sum.refused_writes, st.refused_writes)
      assert.is_true(st.refused_writes >= 1, "no stale write was refused: the pauses never hit a holder")
    end)

    it("without fencing, under the same pauses and crashes, updates are lost", function()
      local sum, chaos, lines = run("plain")
      local value = store.plain_value(sock)
      print(("\n  plain: store value %d, increments the clients made %d, lost %d; lock failures %d;"
        .. " %d pauses (%d of the last reader), %d node crashes\n    %s")
        :format(value, sum.increments, sum.increments - value, sum.lock_failed, chaos.pauses,
          chaos.targeted, chaos.kills, table.concat(lines, "\n    ")))
      assert.is_true(sum.increments >= 10, "too little progress to mean anything")
      assert.is_true(value < sum.increments, "no update was lost")
    end)
  end)

  it("leaves no node, process or directory behind", function()
    local pids, dirs = nodes:pids(), {}
    for i = 1, nodes.n do dirs[i] = nodes.cls[i].dir end
    nodes:stop()
    for i = 1, nodes.n do
      assert.is_false(proc.alive(pids[i]), "node " .. i)
      assert.is_nil(io.open(dirs[i] .. "/", "rb"), dirs[i])
    end
  end)
end)
