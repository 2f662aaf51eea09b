-- Wake-ups, one table of scenarios run on both transports: the libev client
-- of plain LuaJIT (a waiter in a process of its own) and the hub inside
-- nginx (a waiting request). Both drive the same engine: subscriptions,
-- the parsing and counting of messages and the reconnect backoff are
-- decided in C (core/src/substream.c), and the transports only move bytes.
-- So each scenario is written once, and shows that it does not differ by
-- transport.
--
-- In every scenario a waiter polls only every POLL_MS (20 s), and the
-- release comes within a few seconds of its first attempt: a waiter that
-- has its lock within WOKEN_MS of the release was woken by the message,
-- not by its poll.
--   - a release heard wakes the waiter within about a round trip;
--   - its subscriber connections killed (CLIENT KILL TYPE pubsub on every
--     node), they are made again, and the release still wakes it;
--   - messages on its channels that are not a release's are ignored: no
--     attempt is made on them, the connection stays, and the release that
--     follows wakes it;
--   - a message longer than the cap (64 KB plus the longest channel name)
--     drops that node's subscriber connection; it comes back, and the
--     release wakes the waiter.

local redlock = require "redlock"
local cluster = require "helpers.cluster"
local nginx = require "helpers.nginx"
local proc = require "helpers.proc"

local res = cluster.names("wakeups_table")
local lua_list = nginx.lua_list

local POLL_MS = 20000
local WOKEN_MS = 1500

-- The waiter, the same code in both transports: lock r with a policy that
-- polls every poll_ms; "<ok or err> <clock when it returned> <policy calls>".
local WAITER = [[
  function wait_for(dlm, r, poll_ms)
    local redlock, sproc = require "redlock", require "helpers.proc"
    local n, fixed = 0, redlock.retry.fixed(poll_ms, 100)
    local lk, err = dlm:lock(r, { wait = 3 * poll_ms, retry = function(...) n = n + 1; return fixed(...) end })
    local at = sproc.now_ms()
    if lk then lk:unlock() end
    return ("%s %.1f %d"):format(lk and "ok" or tostring(err), at, n)
  end
]]

describe("wake-ups, on both transports", function()
  local cl, srv

  lazy_setup(function()
    cl = cluster.start(3)
    srv = nginx.start_tree {
      workers = 1,
      init = WAITER .. ([[
        redlock = require "redlock"
        DLM = redlock.new { servers = %s }
      ]]):format(lua_list(cl.urls)),
      locations = { nginx.PING, [[
        location = /wait {
          content_by_lua_block { ngx.say(wait_for(DLM, ngx.var.arg_r, tonumber(ngx.var.arg_poll))) }
        }]] },
    }
  end)
  teardown(function()
    nginx.stop_all()
    cluster.stop_all()
  end)

  local function log()
    return srv and ("\nnginx error log:\n" .. srv:error_log():sub(-3000)) or ""
  end

  -- Run code (a Lua chunk that writes its answer with say) in a process of
  -- its own; a function that waits for it and returns what it said.
  local function background(code)
    local dir = proc.tmpdir()
    local pid = proc.spawn_luajit({ "luajit", "-e",
      ("local function say(s) require('helpers.proc').write_file(%q, s) end\n"):format(dir .. "/said") .. code },
      dir .. "/out")
    return function()
      local said = proc.wait_file(dir .. "/said", 3 * POLL_MS + 10000)
      local out = proc.read_file(dir .. "/out") or ""
      proc.stop(pid)
      proc.rmdir(dir)
      return said or ("nothing said: " .. out)
    end
  end

  -- The transports: wait(r) starts a waiter of r, and returns a function
  -- that waits for it to end and returns what it said.
  local transports = {
    { name = "plain LuaJIT", wait = function(r)
      return background(WAITER .. ([[
        local dlm = require("redlock").new { servers = %s }
        say(wait_for(dlm, %q, %d))
      ]]):format(lua_list(cl.urls), r, POLL_MS))
    end },
    { name = "inside nginx", wait = function(r)
      return background(([[
        local s, b = require("helpers.nginx").request(%d, %q, { timeout_ms = %d })
        say(s == 200 and b or ("status " .. tostring(s) .. ": " .. tostring(b)))
      ]]):format(srv.port, ("/wait?r=%s&poll=%d"):format(r, POLL_MS), 3 * POLL_MS + 5000))
    end },
  }

  local function numsub(node, channel)
    return tonumber(cl:cli(node, "PUBSUB", "NUMSUB", channel):match("(%d+)%s*$"))
  end

  -- The ids of node's pubsub connections, as one string.
  local function pubsub_ids(node)
    local ids = {}
    for id in cl:cli(node, "CLIENT", "LIST", "TYPE", "pubsub"):gmatch("id=(%d+)") do ids[#ids + 1] = id end
    table.sort(ids)
    return table.concat(ids, ",")
  end

  -- Until every node has a subscriber on r's channel whose connection is
  -- not one of before[node] (nil: any), and the waiter is in r's queue
  -- there (it has made its first attempt and sleeps).
  local function await_waiter(r, before)
    assert(cluster.await_all(cl, function(node)
      local ids, subs = pubsub_ids(node), numsub(node, "redlock:released:" .. r)
      local queued = tonumber(cl:cli(node, "LLEN", "redlock:queue:" .. r):match("(%d+)"))
      if before and ids == before[node] then return false, "still connection " .. ids end
      return subs == 1 and queued == 1, ("subscribers %s, queued %s"):format(tostring(subs), tostring(queued))
    end, 10000), "the waiter did not subscribe and queue" .. log())
  end

  -- Every node's pubsub connections now.
  local function all_ids()
    local t = {}
    for node = 1, #cl.urls do t[node] = pubsub_ids(node) end
    return t
  end

  -- Publish with spec/helpers/publisher.lua on node 1 (it waits for a
  -- subscriber of a channel matching pattern); returns the messages
  -- published and how many subscribers they reached.
  local function publish(mode, ms, pattern)
    local dir = proc.tmpdir()
    local pid = proc.spawn_luajit({ "luajit", "spec/helpers/publisher.lua", tostring(cl.ports[1]), mode,
                                    tostring(ms), pattern }, dir .. "/out")
    local gone = proc.wait_gone(pid, 20000)
    local out = proc.read_file(dir .. "/out") or ""
    proc.stop(pid)
    proc.rmdir(dir)
    assert(gone, "the publisher did not end: " .. out)
    local published, received = out:match("published=(%d+) received=(%d+)")
    assert(published, "the publisher said: " .. out)
    return tonumber(published), tonumber(received)
  end

  -- The scenarios: name, and what happens while the waiter sleeps, before
  -- the release (given r; it returns a note for the figures).
  local scenarios = {
    { "a release heard wakes the waiter within about a round trip", function() return "" end },
    { "subscriber connections killed: the waiter wakes after they are made again", function(r)
      local before = all_ids()
      for node = 1, #cl.urls do
        assert.matches("^%d+", (cl:cli(node, "CLIENT", "KILL", "TYPE", "pubsub")))
      end
      await_waiter(r, before) -- subscribed again, on new connections everywhere
      return ""
    end },
    { "messages that are not a release's are ignored, and the release still wakes the waiter", function(r)
      local before, sets = all_ids(), cluster.calls(cl, "set", 1)
      local published, received = publish("garbage", 1000, "redlock:*:" .. r)
      assert.is_true(received > 100, "the garbage did not reach the waiter: " .. received)
      -- no attempt on any of them, and the connections are kept
      proc.sleep_ms(200)
      assert.equal(0, cluster.calls(cl, "set", 1) - sets)
      assert.same(before, all_ids())
      return ("%d garbage messages published, %d received"):format(published, received)
    end },
    { "a frame over the cap drops the subscriber connection; it comes back and the waiter wakes", function(r)
      local before = pubsub_ids(1)
      local _, received = publish("big:200000", 0, "redlock:released:" .. r)
      assert.equal(1, received)
      await_waiter(r, { before }) -- node 1's connection was dropped, and made again
      return ""
    end },
  }

  for _, t in ipairs(transports) do
    describe(t.name, function()
      for _, sc in ipairs(scenarios) do
        local title, meanwhile = sc[1], sc[2]
        it(title, function()
          local r = res("table")
          local holder = redlock.new { servers = cl.urls }
          local ok, err = pcall(function()
            local held = assert(holder:lock(r, { ttl = 3 * POLL_MS }))
            assert(cluster.await_value(cl, r, held.value, 5000, nil, holder))
            local started = proc.now_ms()
            local finish = t.wait(r)
            await_waiter(r)
            local note = meanwhile(r)
            local released = proc.now_ms()
            assert.is_true(released - started < POLL_MS / 2, "too slow to stage: the poll would come first")
            assert.is_true(held:unlock())
            local said = finish()
            local word, at, asked = said:match("^(%S+) ([%d.]+) (%d+)")
            assert(word, "the waiter said: " .. said .. log())
            local after = tonumber(at) - released
            print(("    [%s] %s: woken %.1f ms after the release %s"):format(t.name, title:match("^[^:,]+"), after, note))
            assert.equal("ok", word)
            assert.equal(1, tonumber(asked)) -- one delay asked for, and cut short
            assert.is_true(after < WOKEN_MS, ("acquired %.0f ms after the release: by its poll?"):format(after))
          end)
          holder:close()
          assert(ok, tostring(err) .. log())
        end)
      end
    end)
  end
end)
