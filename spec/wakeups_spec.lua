-- What a waiter hears, and what it does about it (both transports: the
-- libev client of plain LuaJIT, and the hub's subscribers inside nginx).
--   - lock_many that gets some of its resources and not others gives the
--     ones it got back quietly: neither itself nor another waiter is woken
--     by that (before, it heard its own give-back and tried again at once,
--     thousands of times a second).
--   - Only a release's message wakes a waiter (a positive number on a
--     resource's channel, "1" on a wake channel), and wake-ups earn at most
--     a few extra attempts per 100 ms of a delay, whatever is published.
--   - A message larger than the cap (64 KB) ends the subscriber connection
--     instead of being buffered whole; it is opened again, and the waiter
--     still gets the lock.

local redlock = require "redlock"
local lib = require("redlock.cdefs").lib
local cluster = require "helpers.cluster"
local nginx = require "helpers.nginx"
local proc = require "helpers.proc"

local res = cluster.names("wakeups")
local lua_list = nginx.lua_list

-- Attempts a waiting lock() makes with retry.fixed(1000, 3), the policy
-- counting 3 (the first attempt, and the one after each of two delays):
-- plus the waiter's first queued attempt, and at most 4 on wake-ups in
-- each 100 ms of a delay (redlock/wait.lua's WAKE_ATTEMPTS, WAKE_WINDOW_MS:
-- windows from the delay's start, 10 in each delay of 1000 ms).
local COUNTED = 3
local QUIET_MAX = COUNTED + 1
local FLOOD_MAX = QUIET_MAX + 2 * (1000 / 100) * 4

-- A policy that counts how often it was asked: policy, and a function
-- returning the count.
local function counting(policy)
  local n = 0
  return function(...) n = n + 1; return policy(...) end, function() return n end
end

-- KB of peak resident memory (VmHWM) of process pid.
local function peak_kb(pid)
  local status = assert(proc.read_file("/proc/" .. pid .. "/status"))
  return tonumber(status:match("VmHWM:%s*(%d+)"))
end

describe("wake-ups", function()
  local cl

  lazy_setup(function() cl = cluster.start(3) end)
  teardown(function()
    nginx.stop_all()
    cluster.stop_all()
  end)

  -- Until every node has n subscribers on channel; drive: a function run
  -- meanwhile (a client's loop must run for its SUBSCRIBE to go out).
  local function await_numsub(channel, n, drive, ms)
    return cluster.await_all(cl, function(node)
      if drive then drive() end
      local numsub = tonumber(cl:cli(node, "PUBSUB", "NUMSUB", channel):match("(%d+)%s*$"))
      return numsub == n, "subscribers " .. tostring(numsub)
    end, ms or 5000)
  end

  -- The ids of node 1's pubsub connections, as one string.
  local function pubsub_ids()
    local ids = {}
    for id in cl:cli(1, "CLIENT", "LIST", "TYPE", "pubsub"):gmatch("id=(%d+)") do ids[#ids + 1] = id end
    table.sort(ids)
    return table.concat(ids, ",")
  end

  -- Start the publisher (spec/helpers/publisher.lua) on node 1; it waits
  -- for a subscriber of a channel matching pattern. Returns its pid and a
  -- function that waits for it to end and returns its counts.
  local function publisher(mode, ms, pattern)
    local dir = proc.tmpdir()
    local pid = proc.spawn_luajit({ "luajit", "spec/helpers/publisher.lua", tostring(cl.ports[1]), mode,
                                    tostring(ms), pattern }, dir .. "/out")
    return pid, function()
      local gone = proc.wait_gone(pid, 20000)
      local out = proc.read_file(dir .. "/out") or ""
      proc.stop(pid)
      proc.rmdir(dir)
      assert(gone, "the publisher did not end: " .. out)
      local published, received = out:match("published=(%d+) received=(%d+)")
      assert(published, "the publisher said: " .. out)
      return tonumber(published), tonumber(received)
    end
  end

  -- Wait (up to 10 s) until node 1's pubsub connections are not `before`
  -- any more and channel has a subscriber there again: the one that was
  -- sent a frame over the cap was dropped, and a new one subscribed.
  local function await_resubscribed(before, channel, drive)
    local deadline = proc.now_ms() + 10000
    while true do
      if drive then drive() end
      local ids = pubsub_ids()
      local numsub = tonumber(cl:cli(1, "PUBSUB", "NUMSUB", channel):match("(%d+)%s*$"))
      if ids ~= before and ids ~= "" and numsub == 1 then return end
      assert(proc.now_ms() < deadline, ("the subscriber kept its connection (ids %s, before %s)"):format(ids, before))
      proc.sleep_ms(10)
    end
  end

  describe("plain LuaJIT", function()
    it("gives back what lock_many got quietly: the 2 s wait costs the policy's attempts, not thousands", function()
      -- Before: 13,730 SETs, 7,493 EVALSHAs and 6,864 PUBLISHes on one node
      -- in the 2 s; with fence = true the counter rose by thousands.
      local a, b = res("many-a"), res("many-b")
      local other = redlock.new { servers = cl.urls }
      local dlm = redlock.new { servers = cl.urls }
      local listener = redlock.new { servers = cl.urls } -- another waiter of a
      local ok, err = pcall(function()
        assert(other:lock(b, { ttl = 10000 }))
        assert.equal(0, lib.rl_watch(listener.client, a, #a))
        assert(await_numsub("redlock:released:" .. a, 1, function() listener.client:sleep(1) end))
        for _, fence in ipairs { false, true } do
          local policy, asked = counting(redlock.retry.forever())
          local sets, publishes = cluster.calls(cl, "set", 1), cluster.calls(cl, "publish", 1)
          local counter = tonumber(cluster.get(cl, 1, a .. ":fence")) or 0
          local heard = lib.rl_heard(listener.client, a, #a)
          local cpu = os.clock()
          local locks, why = dlm:lock_many({ a, b }, { wait = 2000, retry = policy, fence = fence })
          cpu = os.clock() - cpu
          assert.is_nil(locks)
          assert.equal("busy", why)
          sets = cluster.calls(cl, "set", 1) - sets
          publishes = cluster.calls(cl, "publish", 1) - publishes
          counter = (tonumber(cluster.get(cl, 1, a .. ":fence")) or 0) - counter
          print(("    [lock_many] fence=%s: %d attempts, node 1: %d SETs, %d PUBLISHes, counter +%d, cpu %.2f s")
            :format(tostring(fence), asked() + 1, sets, publishes, counter, cpu))
          -- every attempt SETs both names (a granted, b refused) on the node
          assert.is_true(sets <= 2 * (asked() + 1), sets .. " SETs for " .. (asked() + 1) .. " attempts")
          assert.equal(0, publishes)
          if fence then
            assert.is_true(counter <= asked() + 1, "counter +" .. counter .. " for " .. (asked() + 1) .. " attempts")
          end
          -- nor was the other waiter of a woken by any of the give-backs
          listener.client:sleep(50)
          assert.equal(heard, lib.rl_heard(listener.client, a, #a))
        end
        -- an ordinary unlock still wakes a waiter
        local heard = lib.rl_heard(listener.client, a, #a)
        local lk = assert(other:lock(a))
        assert(cluster.await_value(cl, a, lk.value, 5000, nil, other))
        assert.is_true(lk:unlock())
        assert.equal(1, lib.rl_sleep_until(listener.client, a, #a, heard, 5000))
        lib.rl_unwatch(listener.client, a, #a)
      end)
      listener:close()
      dlm:close()
      other:close()
      assert(ok, err)
    end)

    it("hears only a release's messages, and wakes a bounded number of times per delay under a flood", function()
      -- Before: any message was a wake-up, and each earned an attempt: a
      -- waiter with retry.fixed(1000, 3) made 852 attempts in 2 s.
      local dlm = redlock.new { servers = cl.urls }
      local holder = redlock.new { servers = cl.urls }
      local ok, err = pcall(function()
        for _, mode in ipairs { "garbage", "lookalike" } do
          local r = res("flood-" .. mode)
          local held = assert(holder:lock(r, { ttl = 20000 }))
          assert(cluster.await_value(cl, r, held.value, 5000, nil, holder))
          local _, finish = publisher(mode, 3000, "redlock:*:" .. r)
          local policy, asked = counting(redlock.retry.fixed(1000, 3))
          local sets, heard = cluster.calls(cl, "set", 1), dlm.client:heard(nil, 0)
          local lk, why = dlm:lock(r, { retry = policy })
          sets = cluster.calls(cl, "set", 1) - sets
          heard = dlm.client:heard(nil, 0) - heard
          local published, received = finish()
          print(("    [flood] %s: %d published (%d received), %d heard, %d SETs on node 1 for %d counted attempts")
            :format(mode, published, received, heard, sets, asked()))
          assert.is_nil(lk)
          assert.equal("busy", why)
          assert.equal(COUNTED, asked())
          assert.is_true(received > 100, "the flood did not reach the waiter: " .. received)
          if mode == "garbage" then
            assert.equal(0, heard)
            assert.is_true(sets <= QUIET_MAX, sets .. " SETs")
          else
            assert.is_true(heard > 100, "heard " .. heard)
            assert.is_true(sets <= FLOOD_MAX, sets .. " SETs")
          end
          assert.is_true(held:unlock())
        end
      end)
      holder:close()
      dlm:close()
      assert(ok, err)
    end)

    it("drops a subscriber sent a 24 MB message without buffering it, and the waiter still gets the lock", function()
      -- Before: hiredis' reader buffered the whole message, then copied it.
      local r = res("big")
      local channel = "redlock:released:" .. r
      local holder = redlock.new { servers = cl.urls }
      local dir = proc.tmpdir()
      local code = ([[
        local proc, redlock = require "helpers.proc", require "redlock"
        local function peak() return tonumber(proc.read_file("/proc/self/status"):match("VmHWM:%%s*(%%d+)")) end
        local dlm = redlock.new { servers = %s }
        local before = peak()
        local lk, err = dlm:lock(%q, { wait = 30000, retry = redlock.retry.fixed(5000, 100) })
        local at = proc.now_ms()
        proc.write_file(%q, ("%%s %%.1f %%d %%d"):format(lk and "ok" or tostring(err), at, before, peak()))
      ]]):format(lua_list(cl.urls), r, dir .. "/result")
      local pid
      local ok, err = pcall(function()
        local held = assert(holder:lock(r, { ttl = 30000 }))
        assert(cluster.await_value(cl, r, held.value, 5000, nil, holder))
        pid = proc.spawn_luajit({ "luajit", "-e", code }, dir .. "/out")
        assert(await_numsub(channel, 1, nil, 10000), "the waiter did not subscribe")
        local before = pubsub_ids()
        local _, finish = publisher("big:24000000", 0, channel)
        local _, received = finish()
        assert.equal(1, received)
        await_resubscribed(before, channel)
        local released = proc.now_ms()
        assert.is_true(held:unlock())
        local text = proc.wait_file(dir .. "/result", 20000)
        local word, at, peak0, peak1 = text:match("^(%S+) ([%d.]+) (%d+) (%d+)$")
        assert(word, "the waiter said: " .. text .. " " .. tostring(proc.read_file(dir .. "/out")))
        local grew = tonumber(peak1) - tonumber(peak0)
        print(("    [24 MB] waiter's peak memory +%d KB; acquired %.0f ms after the release"):format(
          grew, tonumber(at) - released))
        assert.equal("ok", word)
        assert.is_true(grew < 8192, "peak memory grew by " .. grew .. " KB")
        -- woken (its subscriber is back), not by its poll every 5 s
        assert.is_true(tonumber(at) - released < 2500, ("acquired %.0f ms after the release"):format(tonumber(at) - released))
      end)
      if pid then proc.stop(pid) end
      holder:close()
      proc.rmdir(dir)
      assert(ok, err)
    end)

    it("still hears releases of a resource whose channel name is longer than the cap", function()
      local r = res("long")
      r = r .. ("x"):rep(65536 - #r) -- the longest key: its messages are frames of more than 64 KB
      local waiter = redlock.new { servers = cl.urls }
      local holder = redlock.new { servers = cl.urls }
      local ok, err = pcall(function()
        -- (the name is too long for redis-cli's arguments: nothing is looked at on the nodes by name)
        local lk = assert(holder:lock(r))
        assert.equal(0, lib.rl_watch(waiter.client, r, #r))
        local deadline = proc.now_ms() + 5000
        while waiter.client:listening() < 3 and proc.now_ms() < deadline do waiter.client:sleep(10) end
        waiter.client:sleep(200) -- its SUBSCRIBE confirmed
        local before = pubsub_ids()
        local heard = lib.rl_heard(waiter.client, r, #r)
        assert.is_true(lk:unlock())
        assert.equal(1, lib.rl_sleep_until(waiter.client, r, #r, heard, 5000))
        assert.equal(before, pubsub_ids()) -- the connection was kept
        lib.rl_unwatch(waiter.client, r, #r)
      end)
      waiter:close()
      holder:close()
      assert(ok, err)
    end)
  end)

  describe("inside nginx", function()
    local srv

    local function log()
      return srv and ("\nnginx error log:\n" .. srv:error_log():sub(-3000)) or ""
    end

    -- One worker with a client DLM per worker, and the locations:
    --   /many?a=&b=&fence=  lock_many{a, b} waiting 2 s: "<err> <policy calls>"
    --   /wait3?r=           lock(r) with retry.fixed(1000, 3): "<err> <policy calls>"
    --   /waitbig?r=         lock(r) waiting 30 s, polling every 5 s: "ok <ms when acquired>"
    lazy_setup(function()
      srv = nginx.start_tree {
        workers = 1,
        init = ([[
          redlock = require "redlock"
          sproc = require "helpers.proc"
          DLM = redlock.new { servers = %s }
          function counting(policy)
            local n = 0
            return function(...) n = n + 1; return policy(...) end, function() return n end
          end
        ]]):format(lua_list(cl.urls)),
        locations = { nginx.PING, [[
          location = /many {
            content_by_lua_block {
              local policy, asked = counting(redlock.retry.forever())
              local locks, err = DLM:lock_many({ ngx.var.arg_a, ngx.var.arg_b },
                { wait = 2000, retry = policy, fence = ngx.var.arg_fence == "1" })
              if locks then locks:unlock() end
              ngx.say(tostring(err), " ", asked())
            }
          }]], [[
          location = /wait3 {
            content_by_lua_block {
              local policy, asked = counting(redlock.retry.fixed(1000, 3))
              local lock, err = DLM:lock(ngx.var.arg_r, { retry = policy })
              if lock then lock:unlock() end
              ngx.say(tostring(err), " ", asked())
            }
          }]], [[
          location = /waitbig {
            content_by_lua_block {
              local lock, err = DLM:lock(ngx.var.arg_r, { wait = 30000, retry = redlock.retry.fixed(5000, 100) })
              if not lock then ngx.say("fail ", err) return end
              ngx.say(("ok %.1f"):format(sproc.now_ms()))
              lock:unlock()
            }
          }]] },
      }
    end)

    -- path requested in a process of its own; its pid and a function that
    -- waits for it and returns the status and the body.
    local function in_background(path)
      local dir = proc.tmpdir()
      local code = ([[local n = require "helpers.nginx"
        local s, b = n.request(%d, %q, { timeout_ms = 40000 })
        io.write(tostring(s), " ", tostring(b))]]):format(srv.port, path)
      local pid = proc.spawn_luajit({ "luajit", "-e", code }, dir .. "/out")
      return pid, function()
        local gone = proc.wait_gone(pid, 40000)
        local out = proc.read_file(dir .. "/out") or ""
        proc.stop(pid)
        proc.rmdir(dir)
        assert(gone, "the request did not end" .. log())
        local status, body = out:match("^(%S+) (.*)$")
        return tonumber(status), body or out
      end
    end

    it("gives back what lock_many got quietly: the 2 s wait costs the policy's attempts, not thousands", function()
      -- Before: one request made 15,652 SETs.
      local a, b = res("ngx-many-a"), res("ngx-many-b")
      local other = redlock.new { servers = cl.urls }
      local ok, err = pcall(function()
        assert(other:lock(b, { ttl = 20000 }))
        for _, fence in ipairs { "0", "1" } do
          local sets, publishes = cluster.calls(cl, "set", 1), cluster.calls(cl, "publish", 1)
          local counter = tonumber(cluster.get(cl, 1, a .. ":fence")) or 0
          local status, body = srv:get(("/many?a=%s&b=%s&fence=%s"):format(a, b, fence), { timeout_ms = 20000 })
          assert.equal(200, status, tostring(body) .. log())
          local why, asked = body:match("^(%S+) (%d+)")
          asked = tonumber(asked)
          sets = cluster.calls(cl, "set", 1) - sets
          publishes = cluster.calls(cl, "publish", 1) - publishes
          counter = (tonumber(cluster.get(cl, 1, a .. ":fence")) or 0) - counter
          print(("    [lock_many in nginx] fence=%s: %d attempts, node 1: %d SETs, %d PUBLISHes, counter +%d")
            :format(fence, asked + 1, sets, publishes, counter))
          assert.equal("busy", why, body)
          assert.is_true(sets <= 2 * (asked + 1), sets .. " SETs for " .. (asked + 1) .. " attempts")
          assert.equal(0, publishes)
          if fence == "1" then
            assert.is_true(counter <= asked + 1, "counter +" .. counter .. " for " .. (asked + 1) .. " attempts")
          end
        end
      end)
      other:close()
      assert(ok, tostring(err) .. log())
    end)

    it("hears only a release's messages, and wakes a bounded number of times per delay under a flood", function()
      local holder = redlock.new { servers = cl.urls }
      local ok, err = pcall(function()
        for _, mode in ipairs { "garbage", "lookalike" } do
          local r = res("ngx-flood-" .. mode)
          local held = assert(holder:lock(r, { ttl = 20000 }))
          assert(cluster.await_value(cl, r, held.value, 5000, nil, holder))
          local _, finish = publisher(mode, 3000, "redlock:*:" .. r)
          local sets = cluster.calls(cl, "set", 1)
          local status, body = srv:get("/wait3?r=" .. r, { timeout_ms = 20000 })
          sets = cluster.calls(cl, "set", 1) - sets
          local published, received = finish()
          print(("    [flood in nginx] %s: %d published (%d received), %d SETs on node 1; said %s")
            :format(mode, published, received, sets, tostring(body):gsub("\n", "")))
          assert.equal(200, status, tostring(body) .. log())
          assert.matches("^busy " .. COUNTED, body)
          assert.is_true(received > 100, "the flood did not reach the waiter: " .. received)
          assert.is_true(sets <= (mode == "garbage" and QUIET_MAX or FLOOD_MAX), sets .. " SETs" .. log())
          assert.is_true(held:unlock())
        end
      end)
      holder:close()
      assert(ok, tostring(err) .. log())
    end)

    it("drops a subscriber sent a 24 MB message without buffering it, and the waiter still gets the lock", function()
      -- Before: the worker's memory grew by tens of MB (the parser joined
      -- every read to what it held), and /ping took 532 ms meanwhile.
      local r = res("ngx-big")
      local channel = "redlock:released:" .. r
      local holder = redlock.new { servers = cl.urls }
      local worker = srv:worker_pids()[1]
      local finish_request
      local ok, err = pcall(function()
        local held = assert(holder:lock(r, { ttl = 30000 }))
        assert(cluster.await_value(cl, r, held.value, 5000, nil, holder))
        local _
        _, finish_request = in_background("/waitbig?r=" .. r)
        assert(await_numsub(channel, 1, nil, 10000), "the request did not subscribe" .. log())
        local peak0 = peak_kb(worker)
        local before = pubsub_ids()
        local _, finish = publisher("big:24000000", 0, channel)
        local _, received = finish()
        assert.equal(1, received)
        await_resubscribed(before, channel)
        local released = proc.now_ms()
        assert.is_true(held:unlock())
        local status, body = finish_request()
        finish_request = nil
        local grew = peak_kb(worker) - peak0
        local at = tonumber(tostring(body):match("^ok ([%d.]+)"))
        print(("    [24 MB in nginx] worker's peak memory +%d KB; acquired %s ms after the release"):format(
          grew, at and ("%.0f"):format(at - released) or "?"))
        assert.equal(200, status, tostring(body) .. log())
        assert(at, "the request said: " .. tostring(body) .. log())
        assert.is_true(grew < 8192, "peak memory grew by " .. grew .. " KB")
        assert.is_true(at - released < 2500, ("acquired %.0f ms after the release"):format(at - released))
        assert.equal(200, (srv:get("/ping")))
      end)
      if finish_request then pcall(finish_request) end
      holder:close()
      assert(ok, tostring(err) .. log())
    end)
  end)
end)
