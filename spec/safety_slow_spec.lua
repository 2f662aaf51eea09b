-- Fault scenario, row 3 (docs/SAFETY.md): one node stalled (SIGSTOP) and
-- another cut off (a fault proxy in front of it, blackholing both ways)
-- while worker processes contend for one resource, as a history
-- (helpers/scenario.lua). The faults begin inside a critical section (the
-- holder stops the node and flips the proxy), so they are certain to hit a
-- holder.
--
-- What the design promises with 3 of 5 nodes healthy: every round decides
-- at quorum or as soon as quorum is impossible, so no attempt or release
-- waits longer than one node timeout for the two faulty nodes; a round that
-- reaches quorum among the healthy three does not wait for them at all.
-- The bounds below are that, loosely (a loaded machine deschedules workers).

local cluster = require "helpers.cluster"
local faults = require "helpers.faults"
local scenario = require "helpers.scenario"
local proc = require "helpers.proc"

local WORKERS = 5
local NODE_TIMEOUT = 100
local TTL = 2000
local FAULT_MS = 4000
-- No attempt or release waits more than one node timeout for the faulty
-- nodes. Asserted loosely: the 99th percentile within ROUND_BOUND, and every
-- one within MAX_BOUND (a loaded machine may deschedule a worker mid-call).
local ROUND_BOUND = 4 * NODE_TIMEOUT + 100
local MAX_BOUND = 10 * NODE_TIMEOUT

local res = cluster.names("safety_slow")

local function fmt(x) return ("%.1f"):format(x) end

describe("safety: a stalled node and a blackholed node, as a history", function()
  local cl, px, servers
  local stopped = false

  lazy_setup(function()
    cl = cluster.start(5)
    px = faults.proxy(cl.ports[2])
    servers = { cl.urls[1], px.url, cl.urls[3], cl.urls[4], cl.urls[5] }
  end)
  teardown(function()
    if stopped and cl and not cl.stopped then cl:kill(1, "CONT") end
    scenario.stop_all()
    faults.stop_all()
    cluster.stop_all()
  end)
  after_each(function()
    if stopped then
      cl:kill(1, "CONT")
      stopped = false
    end
    if not px.stopped then px:set("pass") end
  end)

  -- Start workers, let them contend, then from inside a critical section
  -- (held 100 ms more, or hold) stop node 1 and blackhole node 2.
  local function stall(opts)
    local run = scenario.start {
      servers = servers, workers = WORKERS, ttl = TTL, node_timeout = NODE_TIMEOUT,
      resource = res(opts and opts.tag or "slow"), mode = opts and opts.mode,
    }
    run:await_acquisitions(20)
    stopped = true
    local t_fault, t_faulty = run:inject({
      "signal STOP " .. cl.pids[1],
      "write " .. px.control .. " blackhole",
    }, opts and opts.hold or 100)
    -- the window starts once both faults are in place: the proxy reads its
    -- control file every 2 ms
    proc.sleep_ms(10)
    return run, t_fault, t_faulty + 10000
  end

  it("row 3: costs each attempt and release at most about one node timeout; no overlap, no lost update", function()
    local run, t_fault, t_faulty = stall()
    run:sleep(FAULT_MS)
    local t_heal = proc.now_us()
    cl:kill(1, "CONT")
    stopped = false
    px:set("pass")
    run:sleep(1500)
    local r = run:finish()
    local info = r:info()

    local during = r:attempts_in(t_faulty, t_heal)
    local granted = r:attempts_in(t_faulty, t_heal, "ok")
    local unlocks = r:unlocks_in(t_faulty, t_heal)
    local p99, max = scenario.percentile(during, 99), scenario.percentile(during, 100)
    local p50_ok = scenario.percentile(granted, 50)
    local unlock_max = scenario.percentile(unlocks, 100)
    scenario.report(3, {
      { "attempts_during_fault", #during }, { "ok_during_fault", #granted },
      { "p50_ok_ms", fmt(p50_ok) }, { "p99_ms", fmt(p99) }, { "max_ms", fmt(max) },
      { "unlock_max_ms", fmt(unlock_max) }, { "node_timeout_ms", NODE_TIMEOUT },
      { "saw_stalled_fail", scenario.saw_fail(during, 1) }, { "saw_blackholed_fail", scenario.saw_fail(during, 2) },
      { "holders_at_fault", r:spanning(t_fault) },
      { "acquisitions", r.acquisitions }, { "overlaps", r.overlaps }, { "lost", r.lost_updates },
    })
    assert.equal(0, r.overlaps, info)
    assert.equal(0, r.lost_updates, info)
    assert.equal(0, r.unfinished, info)
    assert.equal(0, r.malformed, info)
    -- the faults hit a holder, and the lock was granted while they lasted
    assert.equal(1, r:spanning(t_fault), info)
    assert.is_true(#granted > 0, scenario.outcomes(during) .. "\n" .. info)
    -- rounds saw both faulty nodes fail (time out, or reset by the stall watchdog)
    assert.is_true(scenario.saw_fail(during, 1) > 0, info)
    assert.is_true(scenario.saw_fail(during, 2) > 0, info)
    -- no attempt or release waited much more than one node timeout
    assert.is_true(p99 <= ROUND_BOUND, ("p99 of the attempts: %s ms (bound %d): %s")
      :format(fmt(p99), ROUND_BOUND, scenario.outcomes(during)))
    assert.is_true(max <= MAX_BOUND, ("an attempt took %s ms (bound %d)"):format(fmt(max), MAX_BOUND))
    local unlock_p99 = scenario.percentile(unlocks, 99)
    assert.is_true(unlock_p99 <= ROUND_BOUND, ("p99 of the releases: %s ms (bound %d)"):format(fmt(unlock_p99), ROUND_BOUND))
    assert.is_true(unlock_max <= MAX_BOUND, ("a release took %s ms (bound %d)"):format(fmt(unlock_max), MAX_BOUND))
    -- and a granted attempt typically did not wait for the faulty nodes at all
    assert.is_true(p50_ok < NODE_TIMEOUT, ("granted attempts took %s ms (median)"):format(fmt(p50_ok)))
  end)

  -- The same faults under a deliberately broken lock: a single-node lock on
  -- node 1 that falls over to node 3 when node 1 does not answer.
  it("the checker sees the overlaps of a lock that fails over to another node when its node stalls", function()
    local run = stall { mode = "failover:1,3", hold = 300, tag = "failover" }
    scenario.assert_overlaps(run, 500)
  end)

  it("leaves no node, process or directory behind", function()
    scenario.assert_gone(cl, { px })
  end)
end)
