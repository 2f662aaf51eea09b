-- Smoke tests for the nginx harness (spec/helpers/nginx.lua): a real nginx
-- with the lua module, cosockets to a real redis node, the redlock module
-- loaded inside a worker, and a measurement that tells a request that yields
-- from one that blocks the worker.

local nginx = require "helpers.nginx"
local cluster = require "helpers.cluster"

local ROOT = nginx.root
local BUILD = nginx.build

local PING = nginx.PING

--- A location that does one PING round trip to 127.0.0.1:port over a cosocket
-- and puts the connection back in the pool.
local function redis_ping_location(name, port)
  return ([[
    location = %s {
      content_by_lua_block {
        local sock = ngx.socket.tcp()
        sock:settimeouts(1000, 1000, 1000)
        local ok, err = sock:connect("127.0.0.1", %d)
        if not ok then ngx.status = 502 ngx.say("connect: ", err) return end
        local reused = sock:getreusedtimes()
        ok, err = sock:send("*1\r\n$4\r\nPING\r\n")
        if not ok then ngx.status = 502 ngx.say("send: ", err) return end
        local line, rerr = sock:receive("*l")
        if not line then ngx.status = 502 ngx.say("receive: ", rerr) return end
        sock:setkeepalive(10000, 16)
        ngx.say(line, " reused=", reused)
      }
    }]]):format(name, port)
end

describe("nginx harness", function()
  local srv, cl

  local function show_log()
    return srv and ("nginx error log:\n" .. srv:error_log()) or "(no nginx)"
  end

  after_each(function()
    if srv then srv:stop() end
    srv = nil
  end)

  teardown(function()
    nginx.stop_all()
    cluster.stop_all()
  end)

  it("runs one worker under the caller's own user and stops it by pid", function()
    srv = nginx.start { workers = 1, locations = { PING } }
    local workers = srv:worker_pids()
    assert.equal(1, #workers, show_log())
    local status, body = srv:get("/ping")
    assert.equal(200, status, show_log())
    assert.equal("pong\n", body)
    local uid = io.open("/proc/" .. workers[1] .. "/status"):read("*a"):match("\nUid:%s+(%d+)")
    local me = io.popen("id -u"):read("*l")
    assert.equal(me, uid)
    local master = srv.pid
    assert.is_true(srv:stop())
    local proc = require "helpers.proc"
    assert.is_false(proc.alive(master))
    assert.is_false(proc.alive(workers[1]))
    srv = nil
  end)

  it("talks to a redis node over a pooled cosocket", function()
    cl = cl or cluster.start(1)
    srv = nginx.start { workers = 1, locations = { redis_ping_location("/redis", cl.ports[1]) } }
    local status, body = srv:get("/redis")
    assert.equal(200, status, tostring(body) .. "\n" .. show_log())
    assert.equal("+PONG reused=0\n", body, show_log())
    -- one worker, so the second request finds the pooled connection
    status, body = srv:get("/redis")
    assert.equal(200, status, show_log())
    assert.equal("+PONG reused=1\n", body, show_log())
  end)

  it("loads the redlock module inside a worker (loading only)", function()
    srv = nginx.start {
      workers = 1,
      package_path = ROOT .. "/lua/?.lua;" .. ROOT .. "/lua/?/init.lua",
      package_cpath = BUILD .. "/?.so",
      locations = { [[
        location = /load {
          content_by_lua_block {
            local ok, m = pcall(require, "redlock")
            if ok then
              ngx.say(type(m), " ", tostring(m._VERSION))
            else
              ngx.say("error: ", tostring(m))
            end
          }
        }]] },
    }
    local status, body = srv:get("/load")
    assert.equal(200, status, show_log())
    assert.matches("^table ", body, 1, false)
  end)

  it("measures that a request yielding in ngx.sleep does not delay another one", function()
    srv = nginx.start {
      workers = 1,
      locations = {
        PING,
        "location = /sleep { content_by_lua_block { ngx.sleep(1.5) ngx.say('slept') } }",
      },
    }
    -- /ping goes out 200 ms after /sleep, while the only worker is inside it
    local r = srv:get_many({ "/sleep", { path = "/ping", after_ms = 200 } })
    local sleep, ping = r[1], r[2]
    assert.is_nil(sleep.err, sleep.err)
    assert.is_nil(ping.err, ping.err)
    assert.equal(200, sleep.status, show_log())
    assert.equal(200, ping.status, show_log())
    assert.equal("pong\n", ping.body)
    assert.is_true(sleep.elapsed_ms >= 1400, "sleep took " .. sleep.elapsed_ms .. " ms")
    assert.is_true(ping.finished_ms < sleep.finished_ms, "ping finished after sleep")
    assert.is_true(ping.elapsed_ms < 200, "ping took " .. ping.elapsed_ms .. " ms")
  end)

  it("detects a request that blocks the worker (the measurement is not vacuous)", function()
    srv = nginx.start {
      workers = 1,
      locations = {
        PING,
        [[location = /block { content_by_lua_block {
            local ffi = require "ffi"
            pcall(ffi.cdef, "int poll(void *fds, unsigned long nfds, int timeout);")
            ffi.C.poll(nil, 0, 1000)   -- blocks the whole worker for 1 s
            ngx.say('blocked')
        } }]],
      },
    }
    local r = srv:get_many({ "/block", { path = "/ping", after_ms = 200 } })
    local block, ping = r[1], r[2]
    assert.equal(200, block.status, show_log())
    assert.equal(200, ping.status, show_log())
    -- /ping waited for the blocked worker: at least most of the remaining 800 ms
    assert.is_true(ping.elapsed_ms >= 500, "ping took only " .. ping.elapsed_ms .. " ms")
  end)
end)
