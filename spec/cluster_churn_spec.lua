-- A long-lived client of a cluster whose masters keep moving to new
-- addresses (failovers to new hosts, rolling replacements). A client keeps
-- a shard (two links) per master address it meets, at most 48 (redlock.h's
-- RL_MAX_SHARDS). Before, it never dropped one: once it had met 48
-- addresses, every vote that needed a new one failed for good ("too many
-- cluster masters (48)"). Now a shard that no map names and that owes
-- nothing is reused for the new address, and both drivers (libev, and the
-- cosocket hub inside nginx) connect its links there.
--
-- Master 2 moves to a new port 50 times (CONFIG SET port: its old port
-- closes, the cluster learns the new one). The name's slot is master 1's,
-- migrating to master 2, so every acquire of a new name in it is sent on
-- with ASK to master 2 at its address of the moment: a new address for
-- the client each time.
local redlock = require "redlock"
local rcluster = require "helpers.rcluster"
local cluster = require "helpers.cluster"
local nginx = require "helpers.nginx"
local proc = require "helpers.proc"
local sys = require "redlock.devcluster.sys"

local names = cluster.names("cchurn")
local MOVES = 50 -- with masters 1, 2 and 3 at first: 53 addresses met, more than 48

describe("a cluster whose master keeps moving to new addresses", function()
  local c, srv
  lazy_setup(function() c = rcluster.start(3) end)
  lazy_teardown(function()
    if srv then srv:stop() end
    rcluster.stop_all()
  end)

  --- Move master 2 to a free port, and wait until master 1 (which sends the
  --- ASK) names it there.
  local function move_master_2()
    local port = sys.free_ports(1)[1]
    assert.equal("OK", (rcluster.cli(c, 2, "CONFIG", "SET", "port", port)))
    c.ports[2] = port
    local deadline = proc.now_ms() + 5000
    while not rcluster.cli(c, 1, "CLUSTER", "NODES"):find(":" .. port .. "@", 1, true) do
      assert(proc.now_ms() < deadline, "master 1 did not learn master 2's new port")
      proc.sleep_ms(10)
    end
  end

  --- Is key on master 2? (Its slot is master 1's: GET would say MOVED.)
  local function on_master_2(key)
    for _, k in ipairs(rcluster.keys(c, 2)) do
      if k == key then return true end
    end
    return false
  end

  it("keeps every vote past 48 addresses, in libev and in nginx", function()
    local tag -- every name "{tag}..." is in the slot of tag: one of master 1's
    for n = 1, 1000 do
      tag = "churn" .. n
      if rcluster.owner(c, tag) == 1 then break end
    end
    -- master 2 pings the others every 100 ms, so they learn its new port soon
    -- (only they could mark a node failed: their timeout stays)
    assert.equal("OK", (rcluster.cli(c, 2, "CONFIG", "SET", "cluster-node-timeout", 200)))
    local slot = rcluster.slot(c, tag)
    assert.equal("OK", (rcluster.cli(c, 2, "CLUSTER", "SETSLOT", slot, "IMPORTING", rcluster.id(c, 1))))
    assert.equal("OK", (rcluster.cli(c, 1, "CLUSTER", "SETSLOT", slot, "MIGRATING", rcluster.id(c, 2))))
    local seed = "redis-cluster://127.0.0.1:" .. c.ports[1]
    local dlm = redlock.new { servers = { seed }, ttl = 10000 }
    srv = nginx.start_tree { workers = 1, init = ([[
        DLM = require("redlock").new { servers = { %q }, ttl = 10000 }
      ]]):format(seed), locations = { nginx.PING, [[
        location = /lock {
          content_by_lua_block {
            local lock, err, d = DLM:try_lock(ngx.var.arg_r)
            if lock then ngx.say("ok ", lock.value) return end
            ngx.say("fail ", err, " ", d and d[1] and d[1].error or "")
          }
        }]] } }
    for move = 1, MOVES do
      move_master_2()
      local name = ("{%s}libev%d:%s"):format(tag, move, names("n"))
      local lock, err, detail = dlm:try_lock(name)
      assert(lock, ("move %d: %s %s"):format(move, tostring(err), cluster.show(detail)))
      assert(on_master_2(name), name) -- set on master 2, at its new port
      name = ("{%s}nginx%d:%s"):format(tag, move, names("n"))
      local status, body = srv:get("/lock?r=" .. name)
      assert.equal(200, status)
      assert(body:match("^ok %S+\n$"), ("move %d: %s"):format(move, body))
      assert(on_master_2(name), name)
    end
    dlm:close()
  end)
end)
