-- Fault row 6 (docs/SAFETY.md): one node's clock runs fast, far beyond the
-- drift Redlock allows for (drift_factor 0.01: 42 ms of a 4000 ms ttl).
--
-- Three nodes; node 3's redis-server runs under rl-fastclock.so (spec/tools/
-- fastclock.c, an LD_PRELOAD shim; libfaketime cannot start in a redis-server
-- linked with jemalloc) with its wall clock at RATE times real time, so a key
-- set there with PX ttl expires after ttl/RATE ms.
--
-- A holds the lock on nodes 2 and 3 (node 1 has another value under the key
-- while A acquires; it is deleted afterwards) and uses it until its validity
-- has all but run out, reading the store's value at the start and writing
-- value + 1 at the end. B starts trying at once: once A's key has expired
-- early on node 3, B gets nodes 1 and 3, a majority, while A holds.
--
-- 1. Without fencing: two holders at once (the checker's overlap), and A's
--    late write loses B's update.
-- 2. With fencing: the same overlap in time, but B's token is higher (its
--    INCR on node 3 came after A's commit there), so the fenced store refuses
--    A's stale write and loses no update.
local cluster = require "helpers.cluster"
local proc = require "helpers.proc"
local store = require "helpers.fence_store"
local safety = require "helpers.safety"

local names = cluster.names("safety_clock")
local SHIM = os.getenv("REDLOCK_FASTCLOCK") or (proc.build .. "/spec/tools/rl-fastclock.so")
local TTL, RATE = 4000, 4

describe("fault row 6: a node whose clock runs fast", function()
  local scene = safety.scene { n = 3, wrap = { [3] = { "env", "LD_PRELOAD=" .. SHIM, "RL_FASTCLOCK_RATE=" .. RATE } } }
  local cl, scl, sock

  setup(function()
    assert(io.open(SHIM, "rb"), SHIM .. " is missing: build the tests first (cmake --build build)"):close()
    cl, scl, sock = scene:start()
  end)

  teardown(function() scene:stop() end)

  it("node 3 expires keys RATE times early; the others do not", function()
    local key = names("probe")
    local t0 = proc.now_ms()
    assert.is_true(cluster.set_nx(cl, 2, key, "x", 2000))
    assert.is_true(cluster.set_nx(cl, 3, key, "x", 2000))
    proc.sleep_ms(300)
    local fast = cluster.pttl(cl, 3, key)
    local normal = cluster.pttl(cl, 2, key)
    local spent = proc.now_ms() - t0
    -- node 3's key lived at least 300 ms of real time: RATE times that on its clock
    assert.is_true(2000 - fast >= 300 * (RATE - 1), ("node 3 PTTL %d after more than 300 ms"):format(fast))
    -- node 2's key lived at most the time spent here, on its own clock too
    assert.is_true(2000 - normal <= spent + 20, ("node 2 PTTL %d after %d ms"):format(normal, spent))
  end)

  local function scenario(mode)
    local run = scene:run()
    local res = names(mode)
    assert.is_true(cluster.set_nx(cl, 1, res, "someone-else", 60000))
    local a = run:client("A", { mode = mode, resource = res, ttl = TTL, hold = "validity", urls = cl.urls,
      store_port = scl.ports[1] })
    run:ready(a)
    local held_us = proc.now_us()
    assert.are.equal("someone-else", cluster.get(cl, 1, res))
    assert.is_true(cluster.exists(cl, 2, res) and cluster.exists(cl, 3, res), "A holds nodes 2 and 3")
    cluster.del(cl, 1, res)
    local b = run:client("B", { mode = mode, resource = res, ttl = TTL, hold = 50, urls = cl.urls,
      store_port = scl.ports[1] })
    local ra, rb = run:result(a), run:result(b)
    return run:check(), ra, rb, held_us
  end

  it("without fencing: B gets the lock while A holds it, and an update is lost", function()
    local h, a, b = scenario("plain")
    local value = store.plain_value(sock)
    local increments = (a.write == "ok" and 1 or 0) + (b.write == "ok" and 1 or 0)
    safety.report(6, { { "variant", "plain" }, { "rate", RATE }, { "ttl_ms", TTL }, { "overlaps", h.overlaps },
      { "b_entered_after_a_ms", math.floor((b.enter_us - a.enter_us) / 1000) },
      { "increments", increments }, { "store_value", value }, { "lost_updates", increments - value } })
    assert.are.equal(0, h.malformed + h.unfinished)
    assert.are.equal(2, h.acquisitions)
    -- the fault hit the holder: its key expired early on node 3, so B got in
    -- long before A's validity ran out
    assert.is_true(b.enter_us < a.exit_us, b.line)
    assert.are.equal(1, h.overlaps, table.concat(h.examples, "; "))
    assert.are.equal(2, increments)
    assert.are.equal(1, value)
  end)

  it("with fencing: the same overlap, but the store refuses A's stale write and loses no update", function()
    local h, a, b = scenario("fenced")
    local st = store.stats(sock)
    safety.report(6, { { "variant", "fenced" }, { "rate", RATE }, { "ttl_ms", TTL }, { "overlaps", h.overlaps },
      { "token_a", a.token }, { "token_b", b.token }, { "a_write", a.write }, { "b_write", b.write },
      { "store_value", st.value }, { "accepted", st.accepted }, { "refused_writes", st.refused_writes },
      { "lost_updates", st.accepted - st.value } })
    assert.are.equal(0, h.malformed + h.unfinished)
    assert.are.equal(1, h.overlaps, table.concat(h.examples, "; "))
    assert.is_true(b.token > a.token, a.line .. " / " .. b.line)
    assert.are.equal("ok", b.write)
    assert.are.equal("stale", a.write)
    assert.are.equal(1, st.refused_writes)
    assert.are.equal(1, st.accepted)
    assert.are.equal(st.accepted, st.value)
  end)

  it("leaves no node, process or directory behind", function()
    scene:assert_gone()
  end)
end)
