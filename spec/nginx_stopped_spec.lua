-- Inside nginx, a node that stops (SIGSTOP: its process runs nothing, its
-- kernel takes our bytes until its buffers fill) while the hub writes it
-- megabytes of commands: its connection must be kept, as the libev driver
-- keeps it, so that the node, once it runs again, reads everything in the
-- order it was sent. Before, the hub's loop sent with the node timeout as
-- the send timeout and closed the connection when a send met full buffers:
-- the commands already in the node's kernel (SETs) could run after what
-- went out on its next connection (their releases), and their keys stayed
-- for their ttl (seen with a 50-slot semaphore under wrk). (Releases for a
-- node that has turned suspect are kept up to a bound, 1 MB, which these
-- 60 KB names pass: what the node has left then is not this spec's.)

local nginx = require "helpers.nginx"
local cluster = require "helpers.cluster"
local proc = require "helpers.proc"

local res = cluster.names("nginx_stopped")

local NAMES = 64
local NAME_BYTES = 60000 -- 64 names: some 4 MB of SETs, and as much again of releases

describe("redlock inside nginx, a node stopped under a large write", function()
  local cl, srv

  lazy_setup(function() cl = cluster.start(3) end)
  lazy_teardown(function()
    for i = 1, 3 do cl:kill(i, "CONT") end
    nginx.stop_all()
    cluster.stop_all()
  end)

  it("keeps the node's connection, and the node runs the releases after the SETs", function()
    srv = nginx.start_tree {
      init = ([[
        redlock = require "redlock"
        -- (a node timeout long enough that every round sends the node its
        -- commands, and its buffers fill)
        DLM = redlock.new { servers = %s, ttl = 60000, node_timeout = 3000 }
      ]]):format(nginx.lua_list(cl.urls)),
      locations = { ([[
        location = /many {
          content_by_lua_block {
            local names = {}
            local pad = ngx.var.arg_short and 1 or %d
            for k = 1, %d do names[k] = ngx.var.arg_r .. ":" .. k .. ":" .. string.rep("x", pad) end
            local group, err = DLM:lock_many(names)
            if not group then ngx.say("fail ", err) return end
            local ok, uerr = group:unlock()
            ngx.say(ok and "ok" or ("unlock-fail " .. tostring(uerr)))
          }
        }
        location = /conns {
          content_by_lua_block {
            local n = DLM:stats().nodes[3]
            ngx.say("lost=", n.lost, " resets=", n.resets, " reconnects=", n.reconnects, " suspected=", n.suspected)
          }
        }]]):format(NAME_BYTES, NAMES) },
    }
    local r = res("many")
    -- connected and set up first (a warm-up with short names)
    local warm = { srv:get(("/many?r=%s:warm&short=1"):format(r)) }
    assert.are.equal(200, warm[1], tostring(warm[2]))
    assert(cl:kill(3, "STOP"))
    local got = {}
    for k = 1, 3 do got[k] = { srv:get(("/many?r=%s:%d"):format(r, k), { timeout_ms = 30000 }) } end
    proc.sleep_ms(300)
    assert(cl:kill(3, "CONT"))
    for k = 1, 3 do
      assert.are.equal(200, got[k][1], tostring(got[k][2]))
      assert.matches("^ok", got[k][2])
    end
    -- its one connection was kept throughout: once it runs again, the node
    -- works through what it was sent, in the order it was sent
    local _, conns = srv:get("/conns")
    assert.matches("lost=0 resets=0 reconnects=0", conns, 1, true)
  end)
end)
