-- nginx: what a worker's calls meet when its hub cannot serve them. A
-- worker that exits after a reload serves the requests still waiting for a
-- lock from one set of connections, as it did before (the hub stays while
-- they wait on a watched channel). And a call whose hub cannot start (every
-- pending timer taken) fails like a round no node answered: nil,
-- "unavailable", the reason in every node's error; it does not raise.

local nginx = require "helpers.nginx"
local cluster = require "helpers.cluster"
local proc = require "helpers.proc"
local redlock = require "redlock"

local res = cluster.names("nginx_exiting")

--- Connections node i of cl has accepted so far.
local function accepted(cl, i)
  return tonumber(cl:cli(i, "INFO", "stats"):match("total_connections_received:(%d+)"))
end

describe("an nginx worker's hub", function()
  local cl, srv

  lazy_setup(function() cl = cluster.start(3) end)
  after_each(function()
    if srv then srv:stop() end
    srv = nil
  end)
  teardown(function()
    nginx.stop_all()
    cluster.stop_all()
  end)

  local function start(extra)
    return nginx.start_tree {
      workers = 1,
      http = "lua_shared_dict spec 1m;" .. (extra and extra.http or ""),
      init = ([[
        redlock = require "redlock"
        DLM = redlock.new { servers = %s, ttl = 5000 }
      ]]):format(nginx.lua_list(cl.urls)),
      locations = {
        -- wait for r (up to 8 s), hold it a moment, answer
        [[location = /wait {
            content_by_lua_block {
              ngx.shared.spec:incr("waiting", 1, 0)
              local lk, err = DLM:lock(ngx.var.arg_r, { wait = 8000 })
              if not lk then ngx.say("fail ", tostring(err)) return end
              ngx.sleep(0.01)
              lk:unlock()
              ngx.say("ok")
            }
          }]],
        [[location = /try {
            content_by_lua_block {
              local lk, err, detail = DLM:try_lock(ngx.var.arg_r)
              if lk then lk:unlock() ngx.say("ok") return end
              ngx.say(tostring(err), " ", tostring(detail[1].error))
            }
          }]],
        [[location = /waiting { content_by_lua_block { ngx.say(ngx.shared.spec:get("waiting") or 0) } }]],
        [[location = /idle { content_by_lua_block { require("redlock.nginx.hub").idle_ms = 100 ngx.say("ok") } }]],
        -- take every pending timer left (each ends in 30 s)
        [[location = /fill {
            content_by_lua_block {
              local n = 0
              while ngx.timer.at(30, function() end) do n = n + 1 end
              ngx.say(n)
            }
          }]],
      },
    }
  end

  -- Before: the exiting worker's hub stopped as soon as nothing was in
  -- flight, so each attempt of each waiting request started a hub of its
  -- own, connected to every node, and stopped again: node 1 accepted 192
  -- connections in the 2 s after a reload with 20 requests waiting (3 in the
  -- 2 s before). nginx also warned of ngx.sleep(0) in their fallback sleeps.
  it("serves the requests waiting in an exiting worker from one set of connections", function()
    srv = start()
    local r = res("reload")
    local holder = redlock.new { servers = cl.urls }
    local lk = assert(holder:lock(r, { ttl = 10000 }))
    local dir = proc.tmpdir()
    local pids = {}
    for i = 1, 10 do
      pids[i] = proc.spawn({ "curl", "-s", "-m", "20", ("http://127.0.0.1:%d/wait?r=%s"):format(srv.port, r) },
        { out = dir .. "/" .. i })
    end
    local ok, err = pcall(function()
      -- every request has begun its wait (and the first attempt, busy, is long decided)
      local deadline = proc.now_ms() + 10000
      repeat
        local _, body = srv:get("/waiting")
        if tonumber(body) == 10 then break end
        proc.sleep_ms(20)
      until proc.now_ms() > deadline
      proc.sleep_ms(200)
      local before = accepted(cl, 1)
      assert(os.execute("kill -HUP " .. srv.pid) == 0)
      proc.sleep_ms(1500)
      local during = accepted(cl, 1) - before
      assert(lk:unlock())
      print(("    [exiting] node 1 accepted %d connections in the 1.5 s after the reload"):format(during))
      -- the new worker's hub and subscriber, a reconnect or two: a few, not
      -- one per attempt of each of the 10 waiters
      assert.is_true(during <= 8, ("node 1 accepted %d connections after the reload"):format(during))
      -- the old worker serves its waiters to the end
      for i = 1, 10 do
        assert.is_true(proc.wait_gone(pids[i], 15000), "request " .. i .. " did not end")
        assert.are.equal("ok\n", proc.read_file(dir .. "/" .. i))
      end
      assert.is_nil(srv:error_log():find("ngx.sleep(0) called without delayed events patch", 1, true),
        srv:error_log())
    end)
    holder:close()
    for _, pid in ipairs(pids) do proc.stop(pid) end
    proc.rmdir(dir)
    assert(ok, err)
  end)

  -- Before: the call raised "redlock: cannot start the hub's ngx.timer: too
  -- many pending timers", and the request answered 500.
  it("fails a call whose hub cannot start as unavailable, with the reason", function()
    srv = start { http = "lua_max_pending_timers 64;" }
    local r = res("notimer")
    assert.are.equal("ok\n", select(2, srv:get("/idle")))
    assert.are.equal("ok\n", select(2, srv:get("/try?r=" .. r)))
    -- the hub stops once idle (100 ms without a call); then no timer is left
    local body
    local deadline = proc.now_ms() + 5000
    repeat
      proc.sleep_ms(200)
      srv:get("/fill")
      local status
      status, body = srv:get("/try?r=" .. r)
      assert.are.equal(200, status, body)
    until body ~= "ok\n" or proc.now_ms() > deadline
    assert.matches("^unavailable cannot start the hub's ngx.timer: too many pending timers", body)
  end)
end)
