-- Keep-alive, one table of scenarios run on both transports: a plain LuaJIT
-- process (its keeper's thread extends the lock while the process sleeps)
-- and a request inside nginx (the worker's hub extends it while the request
-- sleeps). The rules are the engine's on both (redlock.h, "Keep-alive"), so
-- each scenario is written once, with one expectation:
--   - the owner's extend overlapping one of keep-alive's (replies delayed
--     350 ms by a proxy): the shorter validity counts and the lock is
--     extended again at once, with the owner's ttl;
--   - an extension failing while 3 of 5 nodes are stopped is tried again
--     every min(ttl / 10, 100) ms after its node timeout, and the lock is
--     still held once they continue;
--   - the key deleted: the next extension finds it gone, lost() says so
--     and check() raises;
--   - 2 of 3 nodes killed: the lock turns lost once its validity less the
--     margin has passed, not before;
--   - a kept lock whose object is collected without unlock() is released
--     by keep-alive while the holder goes on running;
--   - the owner's extend in flight while the lock turned lost (2 of 3
--     nodes stopped): its success takes the lock back, and keep-alive
--     goes on extending it;
--   - an unlock that fails makes the lock lost at once (its release may
--     have run on some nodes) and keep-alive stops; an unlock tried again
--     releases it.

local cluster = require "helpers.cluster"
local faults = require "helpers.faults"
local nginx = require "helpers.nginx"
local proc = require "helpers.proc"

local res = cluster.names("keepalive_table")

-- A (list of strings and numbers, or a table of those and lists) as Lua source.
local function literal(v)
  if type(v) == "string" then return ("%q"):format(v) end
  if type(v) == "number" or type(v) == "boolean" then return tostring(v) end
  local parts = {}
  for k, x in pairs(v) do
    parts[#parts + 1] = (type(k) == "number" and "" or (k .. " = ")) .. literal(x)
  end
  return "{" .. table.concat(parts, ", ") .. "}"
end

-- The scenarios. setup(ctx) returns the holder's arguments A; holder is the
-- holder's code (a function(T, A), see helpers/keep_holder.lua); drive(ctx,
-- dir) runs in the spec while the holder does; check(result, ctx) judges
-- what the holder returned; teardown(ctx) always runs.
-- A scenario: the kept lock (n: a lock_many group of n names) whose
-- object the holder drops without unlock() is released by keep-alive while
-- the holder runs on.
local function dropped(what, tag, n)
  return {
    name = "releases " .. what .. " whose object was collected without unlock(), while the holder runs on",
    setup = function(ctx) return { urls = ctx.cl.urls, r = res(tag), n = n } end,
    holder = [[
      return function(T, A)
        local dlm = require("redlock").new { servers = A.urls }
        do
          local held
          if A.n then
            local names = {}
            for i = 1, A.n do names[i] = A.r .. ":" .. i end
            held = dlm:lock_many(names, { ttl = 30000, keepalive = true })
          else
            held = dlm:lock(A.r, { ttl = 30000, keepalive = true })
          end
          if not held then return "not held" end
          T.mark("held")
          T.await("seen")
        end
        collectgarbage()
        collectgarbage()
        T.mark("dropped")
        T.await("gone", 10000) -- alive until the spec saw the keys go: exiting releases too
        dlm:close()
        return "done"
      end]],
    drive = function(ctx, dir)
      local keys = n and { ctx.args.r .. ":1", ctx.args.r .. ":" .. n } or { ctx.args.r }
      assert(proc.wait_file(dir .. "/held", 10000))
      assert(cluster.await_all(ctx.cl, function(i) return cluster.pttl(ctx.cl, i, keys[#keys]) > 25000 end, 3000))
      proc.write_file(dir .. "/seen", "1")
      assert(proc.wait_file(dir .. "/dropped", 10000))
      local gone, why = true, nil
      for _, key in ipairs(keys) do
        if gone then gone, why = cluster.await_value(ctx.cl, key, nil, 5000) end -- well within the 30 s ttl
      end
      proc.write_file(dir .. "/gone", "1")
      assert(gone, why)
    end,
    check = function(out) assert.equal("done", out) end,
  }
end

local SCENARIOS = {
  {
    name = "extends again at once when the owner's extend overlaps one in flight (the shorter validity counts)",
    -- Every reply is held 350 ms: the owner's extend to 18 s (begun at
    -- 1325 ms) and keep-alive's own to 4.5 s (due at 1500 ms) are in flight
    -- together. Taking keep-alive's answer as the validity would leave the
    -- lock to lapse at about 6 s, lost.
    setup = function(ctx)
      ctx.pxs = {}
      local urls = {}
      for i = 1, ctx.cl.n do
        ctx.pxs[i] = faults.proxy(ctx.cl.ports[i], "delay 350")
        urls[i] = ctx.pxs[i].url
      end
      return { urls = urls, r = res("overlap") }
    end,
    holder = [[
      return function(T, A)
        local dlm = require("redlock").new { servers = A.urls, node_timeout = 2000 }
        local lock, err = dlm:lock(A.r, { ttl = 4500, keepalive = true })
        if not lock then return "not held " .. tostring(err) end
        local t0 = T.now()
        T.sleep(1325)
        local ok, eerr = lock:extend(18000)
        T.sleep(math.max(0, t0 + 6500 - T.now()))
        local out = ("extend=%s lost=%s remaining=%.0f"):format(tostring(ok or eerr), tostring(lock:lost()), lock:remaining())
        lock:unlock()
        dlm:close()
        return out
      end]],
    check = function(out)
      local extended, lost, left = out:match("^extend=(%a+) lost=(%a+) remaining=(%-?%d+)")
      assert.equal("true", extended, out)
      assert.equal("false", lost, out)
      assert.is_true(tonumber(left) > 6000, out)
    end,
    teardown = function(ctx) for _, px in ipairs(ctx.pxs or {}) do px:stop() end end,
  },
  {
    name = "tries a failed extension again until the stopped nodes continue, and keeps the lock",
    -- ttl 6000: extended every 2 s. Nodes 1-3 stopped from 1.5 s to 2.7 s:
    -- the extension due at 2 s fails at its node timeout (50 ms) and is
    -- tried again 100 ms later, again and again; node 4 counts the tries.
    setup = function(ctx) return { urls = ctx.cl.urls, r = res("retry") } end,
    holder = [[
      return function(T, A)
        local dlm = require("redlock").new { servers = A.urls }
        local lock = dlm:lock(A.r, { ttl = 6000, keepalive = true })
        if not lock then return "not held" end
        T.mark("held")
        local t0 = T.now()
        while not lock:lost() and T.now() - t0 < 7000 do T.sleep(20) end
        local out = ("lost=%s after=%.0f remaining=%.0f"):format(tostring(lock:lost()), T.now() - t0, lock:remaining())
        lock:unlock()
        dlm:close()
        return out
      end]],
    drive = function(ctx, dir)
      assert(proc.wait_file(dir .. "/held", 10000))
      local t0 = proc.now_ms()
      proc.sleep_ms(1500)
      local before = cluster.calls(ctx.cl, "evalsha", 4)
      ctx.stopped = {}
      for i = 1, 3 do assert(ctx.cl:kill(i, "STOP")); ctx.stopped[i] = true end
      proc.sleep_ms(math.max(0, t0 + 2700 - proc.now_ms()))
      ctx.tries = cluster.calls(ctx.cl, "evalsha", 4) - before
      for i = 1, 3 do ctx.cl:kill(i, "CONT"); ctx.stopped[i] = nil end
    end,
    check = function(out, ctx)
      local left = tonumber(out:match("^lost=false after=%d+ remaining=(%d+)"))
      assert(left, "lost, or no answer: " .. out)
      assert.is_true(left > 1000, out)
      -- one extension in 1.2 s without retries; 1 + 4 in the 700 ms after it at 100 ms each
      assert.is_true(ctx.tries >= 3, "extensions node 4 saw while nodes 1-3 were stopped: " .. ctx.tries)
      return ("%d extensions seen by node 4 while nodes 1-3 were stopped"):format(ctx.tries)
    end,
    teardown = function(ctx) for i in pairs(ctx.stopped or {}) do ctx.cl:kill(i, "CONT") end end,
  },
  {
    name = "turns a kept lock lost when an extension finds its key gone: lost() and check() say so",
    -- ttl 900: extended every 300 ms; the key deleted on every node
    setup = function(ctx) return { urls = ctx.cl.urls, r = res("gone") } end,
    holder = [[
      return function(T, A)
        local dlm = require("redlock").new { servers = A.urls }
        local lock = dlm:lock(A.r, { ttl = 900, keepalive = true })
        if not lock then return "not held" end
        local before = lock:lost()
        T.mark("held")
        T.await("deleted")
        local t0 = T.now()
        while not lock:lost() and T.now() - t0 < 3000 do T.sleep(10) end
        local ok, why = pcall(lock.check, lock)
        local out = ("before=%s lost=%s after=%.0f check=%s"):format(tostring(before), tostring(lock:lost()),
          T.now() - t0, ok and "ok" or tostring(why))
        lock:unlock()
        dlm:close()
        return out
      end]],
    drive = function(ctx, dir)
      assert(proc.wait_file(dir .. "/held", 10000))
      for i = 1, ctx.cl.n do cluster.del(ctx.cl, i, ctx.args.r) end
      proc.write_file(dir .. "/deleted", "1")
    end,
    check = function(out, ctx)
      local after = tonumber(out:match("^before=false lost=true after=(%d+) check="))
      assert(after, "never turned lost: " .. out)
      assert.is_true(after < 800, out) -- by the next extension's answer, before the ttl would say it
      assert.truthy(out:find(("check=lost: the lock on '%s' is no longer held"):format(ctx.args.r), 1, true), out)
    end,
  },
  {
    name = "turns a kept lock lost once its validity less the margin has passed with 2 of 3 nodes killed",
    -- ttl 1500, margin 300: extended every 400 ms, none of them can reach a
    -- quorum; lost at about 1.18 s after the acquire began (validity 1483
    -- less 300), tried until then
    setup = function(ctx)
      ctx.own = cluster.start(3)
      return { urls = ctx.own.urls, r = res("killed") }
    end,
    holder = [[
      return function(T, A)
        local dlm = require("redlock").new { servers = A.urls }
        local lock = dlm:lock(A.r, { ttl = 1500, margin = 300, keepalive = true })
        if not lock then return "not held" end
        local t0 = T.now()
        T.mark("held")
        while not lock:lost() and T.now() - t0 < 5000 do T.sleep(5) end
        local ok, why = pcall(lock.check, lock)
        local out = ("lost=%s after=%.0f remaining=%.0f check=%s"):format(tostring(lock:lost()),
          T.now() - t0, lock:remaining(), ok and "ok" or tostring(why))
        dlm:close()
        return out
      end]],
    drive = function(ctx, dir)
      assert(proc.wait_file(dir .. "/held", 10000))
      assert(ctx.own:kill(2, "KILL"))
      assert(ctx.own:kill(3, "KILL"))
    end,
    check = function(out, ctx)
      local after, remaining = out:match("^lost=true after=(%d+) remaining=(%-?%d+) check=")
      assert(after, "never turned lost: " .. out)
      after, remaining = tonumber(after), tonumber(remaining)
      -- at the margin (the holder looks every 5 ms, give or take a busy machine), not at the end of validity
      assert.is_true(remaining <= 300 and remaining > 50, out)
      assert.is_true(after >= 900 and after < 3000, out)
      assert.truthy(out:find(("check=lost: the lock on '%s' is no longer held"):format(ctx.args.r), 1, true), out)
    end,
    teardown = function(ctx) if ctx.own then ctx.own:stop() end end,
  },
  {
    name = "takes a lock back when the owner's extend, in flight as it turned lost, succeeds",
    -- ttl 2426, margin 1500: 900 ms from the acquire to the margin, an
    -- extension every 309 ms. Nodes 1 and 2 stopped from 150 ms to 950 ms:
    -- keep-alive's extension (at about 310 ms) cannot reach a quorum and
    -- the lock turns lost at about 900 ms, while the owner's extend begun
    -- at 650 ms is out (begun before the stopped nodes had been silent for
    -- the 500 ms that make a node suspect inside nginx, where both share
    -- the connections); it leaves validity to about 2700 ms.
    setup = function(ctx)
      ctx.own = cluster.start(3)
      return { urls = ctx.own.urls, r = res("takeback") }
    end,
    holder = [[
      return function(T, A)
        local dlm = require("redlock").new { servers = A.urls, node_timeout = 3000 }
        local t0 = T.now()
        local lock = dlm:lock(A.r, { ttl = 2426, margin = 1500, keepalive = true })
        if not lock then return "not held" end
        T.mark("held", ("%.3f"):format(t0))
        T.sleep(math.max(0, t0 + 650 - T.now()))
        local ok, err = lock:extend(2426)
        local out = ("extend=%s at=%.0f lost=%s check=%s"):format(tostring(ok or err), T.now() - t0,
          tostring(lock:lost()), pcall(lock.check, lock) and "ok" or "raised")
        T.sleep(math.max(0, t0 + 4000 - T.now())) -- past what that extension left: keep-alive's turn
        out = out .. (" later: lost=%s remaining=%.0f"):format(tostring(lock:lost()), lock:remaining())
        local released = lock:unlock()
        dlm:close()
        return out .. " unlock=" .. tostring(released)
      end]],
    drive = function(ctx, dir)
      assert(proc.wait_file(dir .. "/held", 10000))
      local t0 = tonumber(proc.read_file(dir .. "/held"))
      proc.sleep_ms(math.max(0, t0 + 150 - proc.now_ms()))
      ctx.stopped = {}
      for i = 1, 2 do assert(ctx.own:kill(i, "STOP")); ctx.stopped[i] = true end
      proc.sleep_ms(math.max(0, t0 + 950 - proc.now_ms()))
      for i = 1, 2 do ctx.own:kill(i, "CONT"); ctx.stopped[i] = nil end
    end,
    check = function(out)
      local at = tonumber(out:match("^extend=true at=(%d+) lost=false check=ok later: lost=false remaining=%d+ unlock=true$"))
      assert(at, out)
      assert.is_true(at >= 930, "the extend came back before the lock turned lost: " .. out)
      assert.is_true(tonumber(out:match("remaining=(%d+)")) > 1000, out)
    end,
    teardown = function(ctx)
      for i in pairs(ctx.stopped or {}) do ctx.own:kill(i, "CONT") end
      if ctx.own then ctx.own:stop() end
    end,
  },
  {
    name = "stops keeping a lock whose unlock failed: lost at once, and an unlock tried again releases it",
    -- Nodes 1 and 2 cut off (their proxies discard everything) for the
    -- unlock alone: it fails, and the lock is lost from then on (a release
    -- that waited in a node's buffers could run at any time); keep-alive
    -- stops, so two ttls later it is still lost, and unlocks tried again
    -- release it once the client's connections to those nodes are back (or
    -- find it "not held": node 3 dropped it at the first, a try may have
    -- reached one node but not the other, and the ttl may have run out).
    -- Before: keep-alive went on extending it, and it stayed valid.
    setup = function(ctx)
      ctx.own = cluster.start(3)
      ctx.pxs = {}
      local urls = { ctx.own.urls[1], ctx.own.urls[2], ctx.own.urls[3] }
      for i = 1, 2 do
        ctx.pxs[i] = faults.proxy(ctx.own.ports[i])
        urls[i] = ctx.pxs[i].url
      end
      return { urls = urls, r = res("unlockfail") }
    end,
    holder = [[
      return function(T, A)
        local dlm = require("redlock").new { servers = A.urls, node_timeout = 100 }
        local lock = dlm:lock(A.r, { ttl = 1500, keepalive = true })
        if not lock then return "not held" end
        T.mark("held")
        T.await("cut")
        local ok, err = lock:unlock()
        T.mark("failed")
        T.await("restored")
        T.sleep(3000)
        local out = ("unlock=%s lost=%s valid=%s remaining=%.0f"):format(tostring(ok or err), tostring(lock:lost()),
          tostring(lock:valid()), lock:remaining())
        local released, why
        for _ = 1, 20 do -- until the client's own connections to nodes 1 and 2 are back
          released, why = lock:unlock()
          if released or why == "not held" then break end
          T.sleep(100)
        end
        dlm:close()
        return out .. " again=" .. tostring(released or why)
      end]],
    drive = function(ctx, dir)
      assert(proc.wait_file(dir .. "/held", 10000))
      for i = 1, 2 do ctx.pxs[i]:set("blackhole") end
      proc.write_file(dir .. "/cut", "1")
      local failed = proc.wait_file(dir .. "/failed", 10000)
      for i = 1, 2 do ctx.pxs[i]:set("pass") end
      proc.write_file(dir .. "/restored", "1")
      assert(failed, "no failed unlock")
    end,
    check = function(out, ctx)
      local left, again = out:match("^unlock=unavailable lost=true valid=false remaining=(%-?%d+) again=(.*)$")
      assert(left, out)
      assert.is_true(tonumber(left) <= 0, out)
      assert.is_true(again == "true" or again == "not held", out)
      local gone, why = cluster.await_value(ctx.own, ctx.args.r, nil, 1000)
      assert(gone, why)
    end,
    teardown = function(ctx)
      for _, px in ipairs(ctx.pxs or {}) do px:stop() end
      if ctx.own then ctx.own:stop() end
    end,
  },
  {
    name = "leaves a lost lock lost when its unlock fails",
    -- ttl 3000, margin 1500, nodes 1 and 2 stopped: lost at about 1.45 s;
    -- the unlock then fails (unavailable)
    setup = function(ctx)
      ctx.own = cluster.start(3)
      return { urls = ctx.own.urls, r = res("lostunlock") }
    end,
    holder = [[
      return function(T, A)
        local dlm = require("redlock").new { servers = A.urls, node_timeout = 50 }
        local lock = dlm:lock(A.r, { ttl = 3000, margin = 1500, keepalive = true })
        if not lock then return "not held" end
        T.mark("held")
        T.await("stopped")
        local t0 = T.now()
        while not lock:lost() and T.now() - t0 < 5000 do T.sleep(10) end
        local before = lock:lost()
        local ok, err = lock:unlock()
        local out = ("before=%s unlock=%s lost=%s valid=%s check=%s"):format(tostring(before), tostring(ok or err),
          tostring(lock:lost()), tostring(lock:valid()), select(2, pcall(lock.check, lock)))
        T.mark("unlocked")
        dlm:close()
        return out
      end]],
    drive = function(ctx, dir)
      assert(proc.wait_file(dir .. "/held", 10000))
      ctx.stopped = {}
      for i = 1, 2 do assert(ctx.own:kill(i, "STOP")); ctx.stopped[i] = true end
      proc.write_file(dir .. "/stopped", "1")
      local unlocked = proc.wait_file(dir .. "/unlocked", 10000)
      for i = 1, 2 do ctx.own:kill(i, "CONT"); ctx.stopped[i] = nil end
      assert(unlocked, "no unlock")
    end,
    check = function(out, ctx)
      -- (lost before the unlock: check() does not blame the unlock)
      assert.equal(("before=true unlock=unavailable lost=true valid=false check=lost: the lock on '%s' is no longer held")
        :format(ctx.args.r), out)
    end,
    teardown = function(ctx)
      for i in pairs(ctx.stopped or {}) do ctx.own:kill(i, "CONT") end
      if ctx.own then ctx.own:stop() end
    end,
  },
  dropped("a kept lock", "dropped"),
  -- Before: the first lock_many of a fresh process or worker compiled a
  -- trace that kept the call's closures, and with them the group, alive:
  -- keep-alive extended its 200 locks for as long as the trace lived.
  dropped("the kept locks of a lock_many group", "droppedmany", 200),
}

-- The transports: start(ctx) once, then run(dir) starts one holder and
-- returns a function that waits for it to end.
local TRANSPORTS = {
  {
    name = "plain LuaJIT",
    start = function() end,
    run = function(_, dir)
      local code = ('require("helpers.keep_holder").run(%q, require("helpers.proc").sleep_ms)'):format(dir)
      local pid = proc.spawn_luajit({ "luajit", "-e", code }, dir .. "/log")
      return function()
        local gone = proc.wait_gone(pid, 30000)
        proc.stop(pid)
        return gone, proc.read_file(dir .. "/log")
      end
    end,
  },
  {
    name = "nginx",
    start = function(t)
      t.srv = nginx.start_tree {
        workers = 1,
        locations = { nginx.PING, [[
          location = /holder {
            content_by_lua_block {
              require("helpers.keep_holder").run(ngx.var.arg_dir, function(ms) ngx.sleep(ms / 1000) end)
              ngx.say("done")
            }
          }]] },
      }
    end,
    run = function(t, dir)
      local code = ([[local s, b = require("helpers.nginx").request(%d, %q, { timeout_ms = 30000 })
        io.write(tostring(s), " ", tostring(b))]]):format(t.srv.port, "/holder?dir=" .. dir)
      local pid = proc.spawn_luajit({ "luajit", "-e", code }, dir .. "/log")
      return function()
        local gone = proc.wait_gone(pid, 35000)
        proc.stop(pid)
        return gone, (proc.read_file(dir .. "/log") or "") .. "\nnginx error log:\n" .. t.srv:error_log():sub(-3000)
      end
    end,
  },
}

describe("keep-alive, the same on both transports:", function()
  local cl

  lazy_setup(function() cl = cluster.start(5) end)
  teardown(function()
    nginx.stop_all()
    faults.stop_all()
    cluster.stop_all()
  end)

  for _, transport in ipairs(TRANSPORTS) do
    describe(transport.name, function()
      lazy_setup(function() transport.start(transport) end)

      for _, sc in ipairs(SCENARIOS) do
        it(sc.name, function()
          local ctx = { cl = cl }
          local dir = proc.tmpdir()
          local ok, err = pcall(function()
            ctx.args = sc.setup(ctx)
            proc.write_file(dir .. "/args.lua", "return " .. literal(ctx.args))
            proc.write_file(dir .. "/scenario.lua", sc.holder)
            local finish = transport.run(transport, dir)
            local driven, why = true, nil
            if sc.drive then driven, why = pcall(sc.drive, ctx, dir) end
            local ended, log = finish()
            local out = proc.read_file(dir .. "/result") or ("no result; holder's output: " .. tostring(log))
            assert(driven, tostring(why) .. "\nholder: " .. out)
            assert(ended, "the holder did not end: " .. tostring(log))
            local note = sc.check(out, ctx)
            print(("    [%s] %s%s"):format(transport.name, out, note and ("; " .. note) or ""))
          end)
          if sc.teardown then sc.teardown(ctx) end
          proc.rmdir(dir)
          assert(ok, err)
        end)
      end
    end)
  end
end)
