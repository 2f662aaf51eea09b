-- The waiters of one nginx worker. Every request of a worker shares its
-- hub, and so one place in the nodes' queues (the hub's waiter id): the
-- worker's requests that wait for one resource must take that place in the
-- order they began to wait, a request that ends its wait must pass it on,
-- and one killed while it waits must not hold up the others. Each test
-- runs its waiters as light threads of one request, starting each once the
-- one before is asleep (the sleeping hook says so: no timing is assumed),
-- and frees the resource only when all of them wait. Last, two workers
-- under wrk, every request waiting for a semaphore's slot: never more
-- holders than its limit, and every request served.

local nginx = require "helpers.nginx"
local cluster = require "helpers.cluster"
local proc = require "helpers.proc"

local K = 6

-- The location: /line?kind=lock|sem[&kill=i][&killwoken=1] takes the
-- resource (a lock, or both slots of a semaphore of limit 2), starts K
-- waiters one after the other, kills waiter `kill` once all sleep (or
-- wakes the first and kills it before it resumes), frees the resource, and
-- answers the order in which the waiters took it.
local LINE = [[
  location = /line {
    content_by_lua_block {
      local sem = ngx.var.arg_kind == "sem"
      local kill = tonumber(ngx.var.arg_kill)
      local r = "line:" .. ngx.var.arg_kind .. ":" .. ngx.now() .. ":" .. math.random(1e9)
      local opts = sem and { limit = 2, ttl = 10000, wait = 20000 } or { ttl = 10000, wait = 20000 }
      local held = {}
      for i = 1, sem and 2 or 1 do held[i] = assert(DLM:lock(r, opts)) end
      local asleep, order, threads = {}, {}, {}
      redlock.hooks { sleeping = function() asleep[coroutine.running()] = true end }
      local function await(co)
        local by = ngx.now() + 10
        while not asleep[co] do
          if ngx.now() > by then error("a waiter never slept") end
          ngx.sleep(0.001)
        end
      end
      for i = 1, ]] .. K .. [[ do
        threads[i] = ngx.thread.spawn(function()
          local lk, err = DLM:lock(r, opts)
          if not lk then order[#order + 1] = "fail:" .. tostring(err) return end
          order[#order + 1] = i
          ngx.sleep(0.005)
          lk:unlock()
        end)
        await(threads[i])
      end
      if kill then assert(ngx.thread.kill(threads[kill])) end
      if ngx.var.arg_killwoken then
        -- the first is woken (as a heard release would) and killed before it resumes
        DLM.client:pass_turn(r, #r, 0)
        assert(ngx.thread.kill(threads[1]))
        kill = 1
      end
      for _, lk in ipairs(held) do lk:unlock() end
      for i = 1, #threads do if i ~= kill then ngx.thread.wait(threads[i]) end end
      ngx.say(table.concat(order, ","))
    }
  }]]

describe("the waiters of one nginx worker", function()
  local cl, srv

  lazy_setup(function()
    cl = cluster.start(3)
    srv = nginx.start_tree {
      workers = 1,
      init = ([[
        redlock = require "redlock"
        DLM = redlock.new { servers = %s }
      ]]):format(nginx.lua_list(cl.urls)),
      locations = { LINE },
    }
  end)
  teardown(function()
    nginx.stop_all()
    cluster.stop_all()
  end)

  local function line(query)
    local status, body = srv:get("/line?" .. query)
    assert.equal(200, status, tostring(body) .. "\n" .. srv:error_log():sub(-2000))
    return (body:gsub("\n$", ""))
  end

  local function in_order(except)
    local t = {}
    for i = 1, K do
      if i ~= except then t[#t + 1] = tostring(i) end
    end
    return table.concat(t, ",")
  end

  it("take a lock in the order they began to wait", function()
    for _ = 1, 3 do assert.equal(in_order(), line("kind=lock")) end
  end)

  it("take a semaphore's slots in the order they began to wait", function()
    for _ = 1, 3 do assert.equal(in_order(), line("kind=sem")) end
  end)

  it("are not held up by one killed while it waited, the first or one behind", function()
    assert.equal(in_order(1), line("kind=lock&kill=1"))
    assert.equal(in_order(3), line("kind=sem&kill=3"))
    assert.equal(in_order(1), line("kind=sem&kill=1"))
  end)

  it("are not held up by one killed after it was woken and before it resumed", function()
    assert.equal(in_order(1), line("kind=lock&killwoken=1"))
    assert.equal(in_order(1), line("kind=sem&killwoken=1"))
  end)
end)

describe("the waiters of two nginx workers under wrk", function()
  local LIMIT = 2
  local cl, srv

  lazy_setup(function()
    cl = cluster.start(3)
    srv = nginx.start_tree {
      workers = 2,
      http = "lua_shared_dict holders 1m;",
      init = ([[
        redlock = require "redlock"
        DLM = redlock.new { servers = %s }
      ]]):format(nginx.lua_list(cl.urls)),
      locations = { ([[
        location = /hold {
          content_by_lua_block {
            local stats = ngx.shared.holders
            local lk, err = DLM:lock("holders", { limit = %d, ttl = 10000, wait = 20000 })
            if not lk then ngx.status = 503 return ngx.say("lock: ", tostring(err)) end
            -- each count reached is remembered, so the most is exact
            stats:set("seen:" .. stats:incr("now", 1, 0), true)
            ngx.sleep(0.005)
            stats:incr("now", -1, 0)
            lk:unlock()
            ngx.say("ok")
          }
        }]]):format(LIMIT), [[
        location = /most {
          content_by_lua_block {
            local stats, most = ngx.shared.holders, 0
            for _, k in ipairs(stats:get_keys(0)) do
              local n = tonumber(k:match("^seen:(%d+)$"))
              if n and n > most then most = n end
            end
            ngx.say(most, " ", stats:get("now") or 0)
          }
        }]] },
    }
  end)
  teardown(function()
    nginx.stop_all()
    cluster.stop_all()
  end)

  it("never let more than the limit hold a slot, and serve every request", function()
    local w = assert(srv:wrk("/hold", { threads = 2, connections = 16, seconds = 3, timeout = 25 }))
    -- requests still running when wrk stopped finish by themselves
    local body, most, now
    local by = proc.now_ms() + 10000
    repeat
      local status
      status, body = srv:get("/most")
      assert.equal(200, status)
      most, now = body:match("^(%d+) (%-?%d+)")
      if now ~= "0" then proc.sleep_ms(20) end
    until now == "0" or proc.now_ms() > by
    print(("    wrk: %d requests, %d non-2xx, %d socket errors; most holders %s"):format(w.requests,
      w.non2xx, w.socket_errors, most))
    assert.is_true(tonumber(most) >= 1 and tonumber(most) <= LIMIT, body)
    assert.equal("0", now)
    assert.equal(0, w.non2xx, w.out)
    assert.equal(0, w.socket_errors, w.out)
    assert.is_true(w.requests > 0)
  end)
end)
