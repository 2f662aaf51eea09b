-- Fault row 8 (docs/SAFETY.md): nodes that keep their data (appendonly yes,
-- appendfsync always) are SIGKILLed and restarted at random, a minority at a
-- time, while client processes take turns on a fenced store.
--
-- Five nodes, each a one-node devcluster of its own (its own directory and
-- append-only file), restarted on the same port with its data. WORKERS
-- processes (spec/helpers/fence_worker.lua, fenced mode, ttl TTL) lock the
-- resource with fence = true and increment the store's value by a read and a
-- separate write, for RUN_MS. Meanwhile one or two nodes at a time are
-- SIGKILLed and restarted 150-500 ms later.
--
-- The checker: in the order the grants were made, tokens strictly increase
-- (none repeats, none goes back); the fenced store loses no update; no two
-- holders overlap unless one of them ran past its validity (late), and the
-- store refuses nothing unless some holder ran late. The spec asserts the
-- crashes hit nodes that held the lock's key and that they came back with
-- their data.
local devcluster = require "redlock.devcluster"
local cluster = require "helpers.cluster"
local proc = require "helpers.proc"
local store = require "helpers.fence_store"
local history = require "helpers.history"
local safety = require "helpers.safety"
local socket = require "socket"

local names = cluster.names("safety_persist")
local N, WORKERS, TTL, RUN_MS = 5, 5, 1000, 12000

math.randomseed(proc.getpid())

--- The grants ("grant <t_us> <token> <pid>" lines) in the order they were
-- made, and how many tokens did not exceed the one before, how many
-- repeated an earlier one, and up to 5 examples.
local function token_order(text)
  local list = {}
  for t, token, pid in text:gmatch("grant (%d+) (%d+) (%d+)") do
    list[#list + 1] = { t = tonumber(t), token = tonumber(token), pid = pid }
  end
  table.sort(list, function(a, b) return a.t < b.t end)
  local out_of_order, seen, repeated, examples = 0, {}, 0, {}
  for k, g in ipairs(list) do
    if seen[g.token] then repeated = repeated + 1 end
    seen[g.token] = true
    if k > 1 and g.token <= list[k - 1].token then
      out_of_order = out_of_order + 1
      if #examples < 5 then examples[#examples + 1] = ("%d then %d"):format(list[k - 1].token, g.token) end
    end
  end
  return list, out_of_order, repeated, examples
end

describe("fault row 8: persistent nodes crashing at random under a fenced run", function()
  it("the token checker counts tokens that go back or repeat", function()
    local list, back, repeated = token_order("grant 30 5 1\ngrant 10 3 1\ngrant 20 4 2\ngrant 40 9 2\n")
    assert.are.same({ 4, 0, 0 }, { #list, back, repeated })
    list, back, repeated = token_order("grant 10 3 1\ngrant 20 5 2\ngrant 30 4 1\ngrant 40 5 3\ngrant 50 6 1\n")
    assert.are.same({ 5, 1, 1 }, { #list, back, repeated })
  end)

  local cls, urls = {}, {}
  local scl, sock, dir
  local spawned = {}

  setup(function()
    for i = 1, N do
      cls[i] = devcluster.start { n = 1, args = { "--appendonly", "yes", "--appendfsync", "always" } }
      urls[i] = cls[i].urls[1]
    end
    scl = devcluster.start { n = 1 }
    sock = assert(socket.connect("127.0.0.1", scl.ports[1]))
    sock:settimeout(10)
    dir = proc.tmpdir()
  end)

  teardown(function()
    for _, pid in ipairs(spawned) do proc.stop(pid) end
    if sock then sock:close() end
    if scl then scl:stop() end
    for _, c in ipairs(cls) do c:stop() end
    proc.rmdir(dir)
  end)

  local function number(i, key)
    local out, ok = cls[i]:cli(1, "GET", key)
    assert(ok, out)
    return tonumber(out)
  end

  it("tokens strictly increase in grant order, and the fenced store loses no update", function()
    local resource = names("r")
    local stopfile, grants, log = dir .. "/stop", dir .. "/grants", dir .. "/history.log"
    local workers = {}
    for k = 1, WORKERS do
      local out = ("%s/w%d.out"):format(dir, k)
      local argv = { "luajit", "spec/helpers/fence_worker.lua", "fenced", stopfile, resource,
        tostring(scl.ports[1]), tostring(TTL) }
      for _, u in ipairs(urls) do argv[#argv + 1] = u end
      local pid = proc.spawn(argv, { out = out, env = { LUA_PATH = package.path, LUA_CPATH = package.cpath,
        FENCE_GRANTS = grants, FENCE_LOG = log } })
      spawned[#spawned + 1] = pid
      workers[k] = { pid = pid, out = out }
    end

    -- Chaos: SIGKILL one or two nodes (a minority) at a time, restart them
    -- 150-500 ms later with their data; 100-400 ms between crashes.
    local chaos = { kills = 0, hit_holder = 0, kept_data = 0 }
    local down, before = {}, {}
    local restart_at
    local t0 = proc.now_ms()
    local next_kill = t0 + 500
    while proc.now_ms() < t0 + RUN_MS do
      local now = proc.now_ms()
      if #down > 0 and now >= restart_at then
        for _, i in ipairs(down) do
          cls[i]:restart(1)
          local after = number(i, resource .. ":fence") or 0
          assert(after >= before[i], ("node %d lost its data: counter %d before the crash, %d after")
            :format(i, before[i], after))
          if before[i] > 0 then chaos.kept_data = chaos.kept_data + 1 end
        end
        down, next_kill = {}, proc.now_ms() + math.random(100, 400)
      elseif #down == 0 and now >= next_kill then
        local first = math.random(N)
        down = { first }
        if math.random() < 0.5 then down[2] = (first + math.random(N - 1) - 1) % N + 1 end
        for _, i in ipairs(down) do
          local held = (cls[i]:cli(1, "EXISTS", resource)) == "1"
          before[i] = number(i, resource .. ":fence") or 0
          local pid = cls[i].pids[1]
          assert(cls[i]:kill(1, "KILL"))
          assert(proc.wait_gone(pid, 10000), "node " .. i .. " survived SIGKILL")
          chaos.kills = chaos.kills + 1
          if held then chaos.hit_holder = chaos.hit_holder + 1 end
        end
        restart_at = proc.now_ms() + math.random(150, 500)
      end
      for k, w in ipairs(workers) do
        assert(proc.alive(w.pid), ("worker %d quit early: %s"):format(k, proc.read_file(w.out) or ""))
      end
      proc.sleep_ms(5)
    end
    for _, i in ipairs(down) do cls[i]:restart(1) end
    proc.write_file(stopfile, "stop\n")

    local sum = { increments = 0, refused_reads = 0, refused_writes = 0, lock_failed = 0, late = 0, errors = 0 }
    local lines = {}
    for k, w in ipairs(workers) do
      assert(proc.wait_gone(w.pid, 30000), "worker " .. k .. " did not stop")
      local line = (proc.read_file(w.out) or ""):match("(increments=%d+[^\n]*)")
      assert(line, ("worker %d printed no summary:\n%s"):format(k, proc.read_file(w.out) or ""))
      lines[#lines + 1] = line
      for key in pairs(sum) do sum[key] = sum[key] + tonumber(line:match(key .. "=(%d+)")) end
    end

    local list, out_of_order, repeated, examples = token_order(proc.read_file(grants) or "")
    local h = history.check(log)
    local st = store.stats(sock)
    safety.report(8, { { "nodes", N }, { "workers", WORKERS }, { "ttl_ms", TTL }, { "run_ms", RUN_MS },
      { "crashes", chaos.kills }, { "crashes_of_key_holders", chaos.hit_holder }, { "restarts_with_data", chaos.kept_data },
      { "grants", #list }, { "out_of_order_tokens", out_of_order }, { "repeated_tokens", repeated },
      { "increments", sum.increments }, { "store_value", st.value }, { "lost_updates", sum.increments - st.value },
      { "refused", st.refused_reads + st.refused_writes }, { "overlaps", h.overlaps }, { "late", sum.late } })
    print("    " .. table.concat(lines, "\n    "))

    assert.are.equal(0, sum.errors, table.concat(lines, "\n"))
    assert.is_true(#list >= 20, "too few grants to mean anything: " .. #list)
    assert.are.equal(#list, h.acquisitions)
    -- the crashes hit holders, and nodes came back with their data
    assert.is_true(chaos.kills >= 5, "too few crashes: " .. chaos.kills)
    assert.is_true(chaos.hit_holder >= 1, "no crash hit a node holding the lock's key")
    assert.is_true(chaos.kept_data >= 1, "no restarted node had a counter to keep")
    assert.are.equal(0, out_of_order, table.concat(examples, "; "))
    assert.are.equal(0, repeated)
    assert.are.equal(sum.increments, st.value)
    assert.are.equal(st.accepted, st.value)
    if sum.late == 0 then
      assert.are.equal(0, h.overlaps, table.concat(h.examples, "; "))
      assert.are.equal(0, st.refused_reads + st.refused_writes)
    end
    assert.are.equal(0, #proc.live_with_arg(stopfile))
  end)

  it("leaves no node, process or directory behind", function()
    local pids, dirs = { scl.pids[1] }, { scl.dir, dir }
    for i = 1, N do pids[#pids + 1], dirs[#dirs + 1] = cls[i].pids[1], cls[i].dir end
    for _, pid in ipairs(spawned) do assert.is_false(proc.alive(pid)) end
    sock:close()
    sock = nil
    scl:stop()
    for _, c in ipairs(cls) do c:stop() end
    proc.rmdir(dir)
    for i, pid in ipairs(pids) do assert.is_false(proc.alive(pid), "node " .. i) end
    for _, d in ipairs(dirs) do assert.is_false(proc.exists(d), d) end
  end)
end)
