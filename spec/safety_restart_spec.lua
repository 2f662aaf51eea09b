-- Fault row 5 (docs/SAFETY.md): a node without persistence restarts empty
-- while a lock is held.
--
-- Five nodes, no persistence, ttl 3000 ms. A holds the lock on nodes 1-3
-- only (4 and 5 have another value under the key while it acquires; it is
-- deleted afterwards) and uses it until its validity has all but run out.
-- Node 1 is SIGKILLed while A holds it.
--
-- 1. Node 1 restarts empty at once, and B starts: node 1 forgot A's key, so
--    B gets nodes 1, 4 and 5, a majority, while A still holds 2 and 3 and
--    believes it holds the lock. The history checker sees two holders at once.
-- 2. Node 1 stays down for ttl + 500 ms before restarting empty (what the
--    Redlock paper asks of a node that loses its data); B starts trying at
--    the crash. Every key node 1 had has expired by the time it is back, so B
--    gets the lock only after A has finished. No overlap.
-- 3. Fencing does not repair 1: the counters behind the tokens are forgotten
--    with the keys. Restarted at once, with fence = true and a fenced store:
--    B's majority is node 1, which came back empty, and nodes 4 and 5, which
--    A never had; none of them knew A's token, B's token repeats it,
--    and the store, which accepts a token equal to the highest, loses an
--    update.
local cluster = require "helpers.cluster"
local proc = require "helpers.proc"
local store = require "helpers.fence_store"
local safety = require "helpers.safety"

local names = cluster.names("safety_restart")
local TTL = 3000

describe("fault row 5: a node restarted empty while a lock is held", function()
  local scene = safety.scene { n = 5 }
  local cl, scl, sock

  setup(function() cl, scl, sock = scene:start() end)
  teardown(function() scene:stop() end)

  local function kill(i)
    local pid = cl.pids[i]
    assert(cl:kill(i, "KILL"))
    assert(proc.wait_gone(pid, 10000), "node " .. i .. " survived SIGKILL")
  end

  --- Run the schedule with node 1 down for down_ms; return the checker's
  -- counts, A's and B's summaries and when node 1 was killed (us).
  local function scenario(down_ms, mode)
    mode = mode or "plain"
    for i = 1, cl.n do
      if not cl:alive(i) then cl:restart(i) end
    end
    local run = scene:run()
    local res = names("r")
    for i = 4, 5 do assert.is_true(cluster.set_nx(cl, i, res, "someone-else", 60000)) end
    local a = run:client("A", { mode = mode, resource = res, ttl = TTL, hold = "validity", urls = cl.urls,
      store_port = scl.ports[1] })
    run:ready(a)
    for i = 1, 3 do assert.is_true(cluster.exists(cl, i, res), "A's key on node " .. i) end
    for i = 4, 5 do
      assert.are.equal("someone-else", cluster.get(cl, i, res))
      assert.are.equal(1, cluster.del(cl, i, res))
    end
    local killed_us = proc.now_us()
    kill(1)
    -- B: once node 1 is back (at once), or from the crash on (delayed: it
    -- keeps trying while node 1 is down and A holds 2 and 3)
    local function start_b()
      return run:client("B", { mode = mode, resource = res, ttl = TTL, hold = 50, urls = cl.urls,
        store_port = scl.ports[1] })
    end
    local b = down_ms > 0 and start_b()
    if down_ms > 0 then proc.sleep_ms(down_ms - (proc.now_us() - killed_us) / 1000) end
    cl:restart(1)
    local up_us = proc.now_us()
    b = b or start_b()
    local ra, rb = run:result(a), run:result(b)
    return run:check(), ra, rb, killed_us, up_us
  end

  it("restarted at once: B gets a majority while A holds the lock, and the checker sees the overlap", function()
    local h, a, b, killed_us, up_us = scenario(0)
    safety.report(5, { { "variant", "restart_at_once" }, { "overlaps", h.overlaps },
      { "acquisitions", h.acquisitions }, { "node_down_ms", math.floor((up_us - killed_us) / 1000) },
      { "b_entered_before_a_exit_ms", math.floor((a.exit_us - b.enter_us) / 1000) } })
    assert.are.equal(0, h.malformed + h.unfinished)
    assert.are.equal(2, h.acquisitions)
    -- the fault hit a holder: A held the lock when node 1 lost it
    assert.is_true(a.enter_us < killed_us and killed_us < a.exit_us, a.line)
    assert.are.equal(1, h.overlaps, table.concat(h.examples, "; "))
    assert.is_true(b.enter_us < a.exit_us, b.line)
  end)

  it("restarted after ttl + 500 ms: B gets the lock only after A has finished", function()
    local h, a, b, killed_us, up_us = scenario(TTL + 500)
    safety.report(5, { { "variant", "restart_after_ttl" }, { "overlaps", h.overlaps },
      { "acquisitions", h.acquisitions }, { "node_down_ms", math.floor((up_us - killed_us) / 1000) },
      { "b_entered_after_a_exit_ms", math.floor((b.enter_us - a.exit_us) / 1000) } })
    assert.are.equal(0, h.malformed + h.unfinished)
    assert.are.equal(2, h.acquisitions)
    assert.is_true(a.enter_us < killed_us and killed_us < a.exit_us, a.line)
    assert.is_true(up_us - killed_us >= (TTL + 500) * 1000)
    assert.are.equal(0, h.overlaps, table.concat(h.examples, "; "))
    assert.is_true(b.enter_us >= a.exit_us, b.line)
  end)

  it("restarted at once, with fencing: B's token repeats A's, and the fenced store loses an update", function()
    local h, a, b = scenario(0, "fenced")
    local st = store.stats(sock)
    safety.report(5, { { "variant", "restart_at_once_fenced" }, { "overlaps", h.overlaps },
      { "token_a", a.token }, { "token_b", b.token }, { "a_write", a.write }, { "b_write", b.write },
      { "store_value", st.value }, { "accepted", st.accepted }, { "lost_updates", st.accepted - st.value } })
    assert.are.equal(1, h.overlaps, table.concat(h.examples, "; "))
    assert.are.equal(a.token, b.token, a.line .. " / " .. b.line)
    assert.are.same({ "ok", "ok" }, { a.write, b.write })
    assert.are.same({ 2, 1 }, { st.accepted, st.value })
  end)

  it("leaves no node, process or directory behind", function()
    scene:assert_gone()
  end)
end)
