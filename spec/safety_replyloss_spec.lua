-- Fault scenario, row 4 (docs/SAFETY.md): replies lost after the command
-- was applied. Fault proxies sit in front of nodes 1-3; in "drop" mode they
-- forward every command and discard every reply, so an acquire's SETs are
-- applied on those nodes while its replies never come back: the acquire
-- fails (2 votes of 5), and its cleanup (the release sent to every node,
-- the timed-out ones included) must remove the keys. Had it not, the keys
-- would stand on a majority for their whole ttl (30 s here) and block every
-- client; instead the lock must be granted again within a few seconds of
-- the replies flowing again. Worker processes contend as a history
-- (helpers/scenario.lua); each drop window begins inside a critical
-- section (the holder flips the proxies), so it is certain to hit a holder,
-- whose own release then loses its replies too.

local cluster = require "helpers.cluster"
local faults = require "helpers.faults"
local scenario = require "helpers.scenario"
local proc = require "helpers.proc"

local WORKERS = 5
local NODE_TIMEOUT = 100
local TTL = 30000          -- a stale key would block the resource this long
local WINDOWS = { 1000, 300, 600, 150 } -- drop windows, ms
local RECOVER_MS = 5000    -- granted again within this after a window; far below TTL

local res = cluster.names("safety_replyloss")

local function ms(us) return math.floor(us / 1000 + 0.5) end

describe("safety: lost replies on acquire, as a history", function()
  local cl, px, servers

  lazy_setup(function()
    cl = cluster.start(5)
    px, servers = {}, {}
    for i = 1, 5 do
      if i <= 3 then
        px[i] = faults.proxy(cl.ports[i])
        servers[i] = px[i].url
      else
        servers[i] = cl.urls[i]
      end
    end
  end)
  teardown(function()
    scenario.stop_all()
    faults.stop_all()
    cluster.stop_all()
  end)
  after_each(function()
    for i = 1, 3 do if not px[i].stopped then px[i]:set("pass") end end
  end)

  local function drop_actions()
    local t = {}
    for i = 1, 3 do t[i] = "write " .. px[i].control .. " drop" end
    return t
  end

  local function pass()
    for i = 1, 3 do px[i]:set("pass") end
  end

  it("row 4: a failed acquire's cleanup removes the keys its lost replies left: granted again long before the ttl", function()
    local resource = res("drop")
    local run = scenario.start {
      servers = servers, workers = WORKERS, ttl = TTL, node_timeout = NODE_TIMEOUT, resource = resource,
    }
    run:await_acquisitions(20)
    local windows = {}
    for _, len in ipairs(WINDOWS) do
      local t_fault, t_done = run:inject(drop_actions(), 50)
      -- from here on (the proxies read their control file every 2 ms) no reply comes back
      local w = { fault = t_fault, on = t_done + 10000, samples = {} }
      -- meanwhile, look at the key on node 1 (behind a dropping proxy): when
      -- present, and when (see below)
      local until_ms = proc.now_ms() + len
      repeat
        local t0 = proc.now_us()
        local v = cluster.get(cl, 1, resource)
        w.samples[#w.samples + 1] = { t0 = t0, t1 = proc.now_us(), present = v ~= nil }
        run:check_alive()
        proc.sleep_ms(math.max(0, math.min(10, until_ms - proc.now_ms())))
      until proc.now_ms() >= until_ms
      w.off = proc.now_us()
      local done = run:acquisitions()
      pass()
      windows[#windows + 1] = w
      -- granted again soon (measured exactly from the history below); if
      -- not, say what holds the resource
      local deadline = proc.now_ms() + RECOVER_MS
      while run:acquisitions() <= done and proc.now_ms() < deadline do run:sleep(20) end
      if run:acquisitions() <= done then
        local keys = {}
        for i = 1, 5 do
          keys[i] = ("node %d: %s (pttl %s)"):format(i, tostring(cluster.get(cl, i, resource)),
            tostring(cluster.pttl(cl, i, resource)))
        end
        error(("window %d: nothing granted within %d ms after the replies flowed again; %s")
          :format(#windows, RECOVER_MS, table.concat(keys, "; ")))
      end
    end
    run:sleep(1000)
    local r = run:finish()
    local info = r:info()

    local failed, granted, lost_all, holders, max_recover = 0, 0, 0, 0, 0
    local unlock_failed, applied = 0, 0
    for _, w in ipairs(windows) do
      -- SETs applied on node 1 whose replies were lost: the key seen there
      -- after the holder at fault had released (its unlock returned, so its
      -- DEL had gone through) while no critical section was entered from
      -- then until 2 node timeouts after the look (an attempt whose SET was
      -- there is decided by then). With the replies flowing, a SET that
      -- lands on node 1 is the next holder's, or an attempt that lost and
      -- was followed by a grant within milliseconds: none of those counts.
      local released
      for _, iv in ipairs(r.intervals) do
        if iv.enter <= w.fault and iv.exit > w.fault then
          for _, u in ipairs(r.unlocks) do
            if u.start >= iv.exit and (released == nil or u.start < released.start) then released = u end
          end
        end
      end
      if released then
        local freed = released.start + released.ms * 1000
        for _, smp in ipairs(w.samples) do
          if smp.present and smp.t0 > freed
              and r:entered_in(freed, smp.t1 + 2 * NODE_TIMEOUT * 1000) == 0 then
            applied = applied + 1
          end
        end
      end
      local during = r:attempts_in(w.on, w.off)
      -- granted while every reply from nodes 1-3 was being dropped: started
      -- and answered inside the window (one still under way when the
      -- proxies went back to pass may legitimately get its replies)
      for _, a in ipairs(during) do
        if a.outcome == "ok" and a.start + a.ms * 1000 < w.off then granted = granted + 1 end
      end
      failed = failed + #during - scenario.count(during, "ok")
      for _, a in ipairs(during) do
        if a.states and a.states:sub(1, 3) == "TTT" then lost_all = lost_all + 1 end
      end
      for _, u in ipairs(r:unlocks_in(w.fault, w.off)) do
        if u.outcome ~= "ok" then unlock_failed = unlock_failed + 1 end
      end
      holders = holders + r:spanning(w.fault)
      local first = r:first_enter_after(w.off)
      w.recover = first and ms(first - w.off)
      max_recover = math.max(max_recover, w.recover or math.huge)
    end
    local recovers = {}
    for i, w in ipairs(windows) do recovers[i] = tostring(w.recover) end
    scenario.report(4, {
      { "windows", #windows }, { "failed_during_drop", failed }, { "replies_lost_on_3", lost_all },
      { "lost_sets_seen_node1", applied }, { "ok_during_drop", granted }, { "holder_unlocks_lost", unlock_failed },
      { "holders_at_fault", holders }, { "recover_ms", table.concat(recovers, ",") },
      { "max_recover_ms", max_recover }, { "ttl_ms", TTL },
      { "acquisitions", r.acquisitions }, { "overlaps", r.overlaps }, { "lost", r.lost_updates },
    })
    assert.equal(0, r.overlaps, info)
    assert.equal(0, r.lost_updates, info)
    assert.equal(0, r.unfinished, info)
    assert.equal(0, r.malformed, info)
    -- every window began under a holder, and acquires ran into it: their
    -- SETs were applied on node 1 and their replies lost on nodes 1-3
    assert.equal(#windows, holders, info)
    assert.is_true(lost_all > 0, info)
    assert.is_true(failed > 0, info)
    assert.is_true(applied > 0, "no key of an attempt that lost its replies was seen on node 1\n" .. info)
    -- the holder's own release lost its replies on nodes 1-3: 2 of 5, it failed
    assert.is_true(unlock_failed >= #windows, ("%d failed unlocks in %d windows\n%s"):format(unlock_failed, #windows, info))
    -- a lost reply is a failed vote, never a grant
    assert.equal(0, granted, info)
    -- the keys those SETs left were removed: granted again long before the ttl
    for i, w in ipairs(windows) do
      assert.is_truthy(w.recover, ("no acquisition after window %d\n%s"):format(i, info))
      assert.is_true(w.recover <= RECOVER_MS,
        ("window %d: granted again only %d ms after the replies flowed again"):format(i, w.recover))
    end
    -- and nothing blocks the resource once the workers have closed: no key on
    -- a majority. (A minority node can keep a last release's key until its
    -- ttl: a tail still waiting behind that node's connection setup when the
    -- client closed is not sent; it blocks no one.)
    local deadline, holding = proc.now_ms() + 2000
    repeat
      holding = {}
      for i = 1, cl.n do
        local v = cluster.get(cl, i, resource)
        if v ~= nil then holding[#holding + 1] = ("node %d: %s"):format(i, v) end
      end
      if #holding * 2 < cl.n then break end
      proc.sleep_ms(20)
    until proc.now_ms() > deadline
    assert.is_true(#holding * 2 < cl.n, table.concat(holding, "; "))
    if #holding > 0 then print("row 4: left on a minority after close: " .. table.concat(holding, "; ")) end
  end)

  -- The same drop under a deliberately broken lock: a single-node lock on
  -- node 1 that falls over to node 4 when node 1 does not answer.
  it("the checker sees the overlaps of a lock that fails over to another node when replies are lost", function()
    local run = scenario.start {
      servers = servers, workers = WORKERS, ttl = TTL, node_timeout = NODE_TIMEOUT,
      resource = res("failover"), mode = "failover:1,4",
    }
    run:await_acquisitions(20)
    run:inject(drop_actions(), 300)
    scenario.assert_overlaps(run, 500, pass)
  end)

  it("leaves no node, process or directory behind", function()
    scenario.assert_gone(cl, px)
  end)
end)
