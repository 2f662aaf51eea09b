-- Fault scenarios, rows 1 and 2 (docs/SAFETY.md): nodes crash (SIGKILL)
-- while worker processes contend for one resource. Each row is a history
-- (helpers/scenario.lua): 5 workers, a shared log of critical sections and
-- a read-modify-write counter; the crash begins inside a critical section
-- (the holder itself sends the signals), so it is certain to hit a holder.
--
-- Windows are counted by when an attempt started: an attempt that started
-- after the crashed nodes were seen dead had only the survivors to ask.
--
-- Nodes keep no data (no persistence): a restarted node is empty. Redlock
-- is safe with that only if a crashed node stays down for at least a ttl
-- (a "delayed restart"); every outage here lasts longer than the ttl.

local cluster = require "helpers.cluster"
local scenario = require "helpers.scenario"
local proc = require "helpers.proc"

local WORKERS = 5
local NODE_TIMEOUT = 100
local TTL = 2000
local OUTAGE_MS = 3000     -- longer than TTL: a delayed restart
local ROUND_BOUND = 10 * NODE_TIMEOUT -- a crashed node refuses at once; this is loose
local COMEBACK_MS = 5000   -- acquisitions resume within this after the restarts begin

local res = cluster.names("safety_crash")

local function ms(us) return math.floor(us / 1000 + 0.5) end

describe("safety: crashed nodes, as histories", function()
  local cl

  lazy_setup(function() cl = cluster.start(5) end)
  teardown(function()
    scenario.stop_all()
    cluster.stop_all()
  end)
  after_each(function()
    if cl.stopped then return end
    for i = 1, cl.n do
      if not cl:alive(i) then cl:restart(i) end
    end
  end)

  -- Start workers, let them contend, kill nodes `victims` from inside a
  -- critical section (held 100 ms more), wait until they are dead.
  -- Returns the run and the times: fault (signals sent), down (all dead).
  local function crash(victims, opts)
    local run = scenario.start {
      servers = cl.urls, workers = WORKERS, ttl = TTL, node_timeout = NODE_TIMEOUT,
      resource = res(opts and opts.tag or "crash"), mode = opts and opts.mode,
    }
    run:await_acquisitions(20)
    local actions, pids = {}, {}
    for _, i in ipairs(victims) do
      pids[#pids + 1] = cl.pids[i]
      actions[#actions + 1] = "signal KILL " .. cl.pids[i]
    end
    local t_fault = run:inject(actions, opts and opts.hold or 100)
    for _, pid in ipairs(pids) do
      assert(proc.wait_gone(pid, 5000), "node pid " .. pid .. " survived SIGKILL")
    end
    return run, t_fault, proc.now_us()
  end

  it("row 1: 2 of 5 nodes killed mid-run: no overlap, no lost update, acquisitions go on", function()
    local run, t_fault, t_down = crash({ 4, 5 })
    run:sleep(OUTAGE_MS)
    local t_up = proc.now_us()
    cl:restart(4)
    cl:restart(5)
    run:sleep(1000)
    local r = run:finish()
    local info = r:info()

    local during = r:attempts_in(t_down, t_up)
    local ok_during = scenario.count(during, "ok")
    scenario.report(1, {
      { "acquisitions", r.acquisitions }, { "during_outage", ok_during },
      { "attempts_during_outage", #during }, { "holders_at_crash", r:spanning(t_fault) },
      { "overlaps", r.overlaps }, { "lost", r.lost_updates },
    })
    assert.equal(0, r.overlaps, info)
    assert.equal(0, r.lost_updates, info)
    assert.equal(0, r.unfinished, info)
    assert.equal(0, r.malformed, info)
    -- the crash hit a holder, and the survivors kept granting the lock
    assert.equal(1, r:spanning(t_fault), info)
    assert.is_true(ok_during > 0, "no acquisition during the outage: " .. scenario.outcomes(during) .. "\n" .. info)
    assert.is_true(r:entered_in(t_down, t_up) > 0, info)
  end)

  it("row 2: 3 of 5 nodes killed: no acquisition while they are down, 'unavailable' at once, back after restart", function()
    -- (the holder stays inside 300 ms: long past the nodes' deaths, so no
    -- attempt can be granted by a node still dying)
    local run, t_fault, t_down = crash({ 3, 4, 5 }, { hold = 300 })
    run:sleep(OUTAGE_MS)
    local t_up = proc.now_us()
    for i = 3, 5 do cl:restart(i) end
    local t_restarted = proc.now_us()
    local before = run:acquisitions()
    local deadline = proc.now_ms() + COMEBACK_MS
    while run:acquisitions() <= before and proc.now_ms() < deadline do run:sleep(20) end
    run:sleep(1000)
    local r = run:finish()
    local info = r:info()

    local during = r:attempts_in(t_down, t_up)
    local unavailable = scenario.count(during, "unavailable")
    local max_ms = scenario.percentile(during, 100)
    local first = r:first_enter_after(t_up)
    local resumed_ms = first and ms(first - t_up)
    scenario.report(2, {
      { "attempts_during_outage", #during }, { "unavailable", unavailable },
      { "ok_during_outage", scenario.count(during, "ok") },
      { "max_attempt_ms", ("%.1f"):format(max_ms) }, { "holders_at_crash", r:spanning(t_fault) },
      { "restart_ms", ms(t_restarted - t_up) }, { "resumed_after_ms", resumed_ms or "never" },
      { "acquisitions", r.acquisitions }, { "overlaps", r.overlaps }, { "lost", r.lost_updates },
    })
    assert.equal(0, r.overlaps, info)
    assert.equal(0, r.lost_updates, info)
    assert.equal(0, r.unfinished, info)
    assert.equal(0, r.malformed, info)
    assert.equal(1, r:spanning(t_fault), info)
    -- while they were down: attempts, every one refused as unavailable,
    -- each within the bound, and nobody inside
    assert.is_true(#during > 0, info)
    assert.equal(#during, unavailable, scenario.outcomes(during))
    assert.equal(0, r:entered_in(t_down, t_up), info)
    assert.is_true(max_ms <= ROUND_BOUND, ("an attempt took %.1f ms (bound %d)"):format(max_ms, ROUND_BOUND))
    -- and granted again soon after the restarts began
    assert.is_truthy(resumed_ms, "no acquisition after the restart\n" .. info)
    assert.is_true(resumed_ms <= COMEBACK_MS, ("resumed %d ms after the restarts began"):format(resumed_ms))
  end)

  -- The same schedule with a deliberately broken lock: a single-node lock on
  -- node 5 that falls over to node 1 when node 5 fails. The history shows it.
  it("the checker sees the overlaps of a lock that fails over to another node when its node crashes", function()
    local run = crash({ 5 }, { mode = "failover:5,1", hold = 300, tag = "failover" })
    scenario.assert_overlaps(run, 500)
  end)

  it("leaves no node, process or directory behind", function()
    scenario.assert_gone(cl)
  end)
end)
