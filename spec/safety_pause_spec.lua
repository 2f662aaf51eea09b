-- Fault row 7 (docs/SAFETY.md): a holder is paused (SIGSTOP) past its
-- validity, then continued.
--
-- Three nodes, ttl 1000 ms. A takes the lock, reads the store's value and is
-- stopped before it writes value + 1; it stays stopped for PAUSE_MS. B starts
-- trying once A is stopped, gets the lock when A's keys expire, and makes its
-- update. Then A is continued.
--
-- 1. Without fencing: two holders at once, and A's late write loses B's update.
-- 2. With fencing: the store refuses A's stale write (B's token is higher).
-- 3. With keep-alive (dlm:with_lock): the pause stops A's keeper too, so the
--    lock runs out all the same. Once continued, A learns it lost the lock
--    (lock:lost() is true, lock:check() raises, and with_lock raises after
--    the release instead of returning); the spec measures how soon.
-- 4. With `redlock exec`: the host process is stopped, not the command it
--    runs (a host stalled by its machine, say). Once continued, the host finds
--    the lock lost and sends the command SIGTERM; the spec measures how soon.
--
-- Keep-alive learns of the loss only when it can run again: it can shorten
-- how long a stale holder goes on, never prevent the overlap. Fencing is what
-- keeps the resource safe.
local cluster = require "helpers.cluster"
local proc = require "helpers.proc"
local store = require "helpers.fence_store"
local safety = require "helpers.safety"

local names = cluster.names("safety_pause")
local BIN = os.getenv("REDLOCK_HOST") or (proc.build .. "/redlock")
if BIN:sub(1, 1) ~= "/" then BIN = proc.root .. "/" .. BIN end
local TTL, PAUSE_MS = 1000, 2500

describe("fault row 7: a holder paused past its validity", function()
  local scene = safety.scene { n = 3 }
  local cl, scl, sock

  setup(function() cl, scl, sock = scene:start() end)
  teardown(function() scene:stop() end)

  --- A: mode, hold; stop A once it holds (and has read), start B, continue A
  -- after PAUSE_MS. Returns checker counts, A, B, and the stop/cont times (us).
  local function scenario(mode, hold)
    local run = scene:run()
    local res = names(mode)
    local a = run:client("A", { mode = mode, resource = res, ttl = TTL, hold = hold, urls = cl.urls,
      store_port = mode ~= "kept" and scl.ports[1] or nil })
    run:ready(a)
    assert(proc.kill(a.pid, "STOP"))
    local stopped_us = proc.now_us()
    local b = run:client("B", { mode = mode == "kept" and "plain" or mode, resource = res, ttl = TTL, hold = 50,
      urls = cl.urls, store_port = mode ~= "kept" and scl.ports[1] or nil })
    local rb = run:result(b, 20000) -- B finishes while A is stopped
    proc.sleep_ms(PAUSE_MS - (proc.now_us() - stopped_us) / 1000)
    local cont_us = proc.now_us()
    assert(proc.kill(a.pid, "CONT"))
    local ra = run:result(a)
    return run:check(), ra, rb, stopped_us, cont_us
  end

  it("without fencing: B holds while A is stopped, and A's late write loses B's update", function()
    local h, a, b, stopped_us, cont_us = scenario("plain", 100)
    local value = store.plain_value(sock)
    safety.report(7, { { "variant", "plain" }, { "ttl_ms", TTL }, { "pause_ms", math.floor((cont_us - stopped_us) / 1000) },
      { "overlaps", h.overlaps }, { "increments", 2 }, { "store_value", value }, { "lost_updates", 2 - value } })
    assert.are.equal(0, h.malformed + h.unfinished)
    -- the pause hit the holder: B got the lock while A was stopped in its section
    assert.is_true(stopped_us < b.enter_us and b.exit_us < cont_us, b.line)
    assert.are.equal(1, h.overlaps, table.concat(h.examples, "; "))
    assert.are.equal("ok", a.write)
    assert.are.equal("ok", b.write)
    assert.are.equal(1, value)
  end)

  it("with fencing: the store refuses the stale write and loses no update", function()
    local h, a, b, stopped_us, cont_us = scenario("fenced", 100)
    local st = store.stats(sock)
    safety.report(7, { { "variant", "fenced" }, { "ttl_ms", TTL }, { "pause_ms", math.floor((cont_us - stopped_us) / 1000) },
      { "overlaps", h.overlaps }, { "token_a", a.token }, { "token_b", b.token }, { "a_write", a.write },
      { "store_value", st.value }, { "accepted", st.accepted }, { "refused_writes", st.refused_writes },
      { "lost_updates", st.accepted - st.value } })
    assert.is_true(stopped_us < b.enter_us and b.exit_us < cont_us, b.line)
    assert.are.equal(1, h.overlaps, table.concat(h.examples, "; "))
    assert.is_true(b.token > a.token, a.line .. " / " .. b.line)
    assert.are.equal("stale", a.write)
    assert.are.equal("ok", b.write)
    assert.are.same({ 1, 1, 1 }, { st.value, st.accepted, st.refused_writes })
  end)

  it("with keep-alive (with_lock): once continued, A learns it lost the lock", function()
    local h, a, b, stopped_us, cont_us = scenario("kept", 20000)
    safety.report(7, { { "variant", "with_lock" }, { "ttl_ms", TTL }, { "pause_ms", math.floor((cont_us - stopped_us) / 1000) },
      { "overlaps", h.overlaps }, { "learned_after_ms", a.learned_after_ms },
      { "learned_after_cont_ms", a.lost and math.floor(a.learned_at_ms - cont_us / 1000) or "never" } })
    assert.are.equal(1, a.lost, a.line)
    assert.are.equal("true", a.check_raised)
    assert.are.equal("true", a.with_lock_raised, a.line) -- and with_lock said so, not fn's results
    assert.is_true(stopped_us < b.enter_us and b.exit_us < cont_us, b.line)
    -- it learns once it runs again, not before, and soon: within one ttl of
    -- being continued (its keeper's next turn, or its own check of the
    -- validity, comes at once), not at the end of its 20 s hold
    assert.is_true((a.learned_at_ms + 1) * 1000 >= cont_us, a.line) -- learned_at_ms is whole ms
    assert.is_true(a.learned_at_ms * 1000 - cont_us <= TTL * 1000,
      ("learned %d ms after it was continued (ttl %d): %s"):format(a.learned_at_ms - cont_us / 1000, TTL, a.line))
    assert.are.equal(1, h.overlaps, table.concat(h.examples, "; "))
  end)

  -- (its validity ran out while the host was stopped: SIGKILL at once, no
  -- SIGTERM, whose handler would run beside the next holder)
  it("with redlock exec: once the host is continued, the command gets SIGKILL at once", function()
    local run = scene:run()
    local res = names("exec")
    local marks = run.dir .. "/marks"
    local child = ([[trap 'echo TERM $(date +%%s%%3N) >> %s; exit 0' TERM
echo start >> %s
i=0; while [ $i -lt 3000 ]; do sleep 0.01; i=$((i+1)); done
echo end >> %s]]):format(marks, marks, marks)
    local out = run.dir .. "/exec.out"
    local host = proc.spawn({ BIN, "exec", "--ttl", tostring(TTL), "--grace", "200", res, "--", "sh", "-c", child },
      { out = out, env = { REDLOCK_SERVERS = table.concat(cl.urls, ",") } })
    run.pids[#run.pids + 1] = host
    local deadline = proc.now_ms() + 20000
    while not (proc.read_file(marks) or ""):find("start") do
      assert(proc.alive(host) and proc.now_ms() < deadline, "exec never ran the command: " .. (proc.read_file(out) or ""))
      proc.sleep_ms(5)
    end
    assert(proc.kill(host, "STOP"))
    local stopped_wall = proc.wall_ms()
    -- when the lock's keys are gone from every node: no extension comes now
    proc.sleep_ms(50)
    local ttls = {}
    for i = 1, cl.n do ttls[i] = cluster.pttl(cl, i, res) end
    local keys_gone_wall = proc.wall_ms() + math.max(unpack(ttls))
    local b = run:client("B", { mode = "plain", resource = res, ttl = TTL, hold = 50, urls = cl.urls })
    local rb = run:result(b, 20000)
    proc.sleep_ms(PAUSE_MS - (proc.wall_ms() - stopped_wall))
    local cont_wall = proc.wall_ms()
    assert(proc.kill(host, "CONT"))
    assert(proc.wait_gone(host, 10000), "exec did not exit")
    local gone_wall = proc.wall_ms()
    local text = proc.read_file(out) or ""
    local seen = proc.read_file(marks) or ""
    safety.report(7, { { "variant", "exec" }, { "ttl_ms", TTL }, { "pause_ms", cont_wall - stopped_wall },
      { "killed_after_ms", gone_wall - keys_gone_wall }, { "killed_after_cont_ms", gone_wall - cont_wall } })
    assert.is_true(rb.acquired == 1, rb.line)
    assert.is_truthy(text:find("lost; stopped sh", 1, true), text)
    assert.is_truthy(text:find("SIGKILL (no validity left)", 1, true), text)
    assert.is_nil(seen:find("TERM"), "the command got SIGTERM after its lock ran out: " .. text)
    assert.is_nil(seen:find("end"), "the command ran to its end")
    -- and soon after: within 2 ttls of being continued (its next extension
    -- fails or finds the validity gone; then SIGKILL)
    assert.is_true(gone_wall - cont_wall <= 2 * TTL,
      ("gone %d ms after the host was continued (ttl %d)"):format(gone_wall - cont_wall, TTL))
    assert.is_true(keys_gone_wall < cont_wall, "the lock had not run out during the pause")
  end)

  it("leaves no node, process or directory behind", function()
    scene:assert_gone()
  end)
end)
