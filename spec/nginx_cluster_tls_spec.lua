-- A Redis Cluster over TLS inside nginx, its seed given by host name and
-- its masters announcing IP addresses only (the default). ngx_lua's
-- sslhandshake checks the certificate's name only when it is given one, so
-- a master with no name to check (no tls.server_name, no announced
-- hostname) would be checked by its chain alone: any certificate of the
-- trusted CA would do. Such a master is refused instead, each time, with a
-- reason that says what to set (docs/tls.md, "Inside nginx").
--
-- The certificates are for DNS:localhost only (not for 127.0.0.1, where the
-- masters are). nginx finds the seed "localhost" through its `resolver`
-- directive, here rl-fakedns (spec/tools) answering 127.0.0.1: binding its
-- UDP port 53 needs root.

local nginx = require "helpers.nginx"
local rcluster = require "helpers.rcluster"
local cluster = require "helpers.cluster"
local faults = require "helpers.faults"
local proc = require "helpers.proc"
local tls = require "helpers.tls"

local res = cluster.names("nginx_cluster_tls")

-- /lock?r=NAME&c=CLIENT: "ok" (locked and unlocked) or "fail <the cluster's
-- reason>"; a CLIENT not made yet is made then, by NEW()
local LOCK = [[
  location = /lock {
    content_by_lua_block {
      DLMS[ngx.var.arg_c] = DLMS[ngx.var.arg_c] or NEW() -- a client made now
      local lock, err, d = DLMS[ngx.var.arg_c]:try_lock(ngx.var.arg_r)
      if not lock then ngx.say("fail ", d and d[1] and d[1].error or err) return end
      ngx.say(lock:unlock() and "ok" or "unlock-failed")
    }
  }]]

describe("redlock inside nginx, a TLS cluster whose masters announce IP addresses", function()
  local pki, c, dns, srv

  lazy_setup(function()
    if proc.sh("id -u"):gsub("%s", "") ~= "0" then return end
    pki = tls.make()
    local certs = setmetatable({ server_cert = pki.localhost_cert, server_key = pki.localhost_key }, { __index = pki })
    c = rcluster.start(3, { tls = certs })
    dns = faults.fakedns()
    dns:set("answer 127.0.0.1")
  end)
  lazy_teardown(function()
    if srv then srv:stop() end
    nginx.stop_all()
    faults.stop_all()
    rcluster.stop_all()
    tls.cleanup()
  end)

  it("refuses a master with no name to check the certificate against, and says what to set", function()
    -- (then the masters announce a hostname: the same client settings lock)
    if not c then return pending("needs root (rl-fakedns binds UDP port 53)") end
    local seed = "rediss-cluster://localhost:" .. c.ports[1]
    srv = nginx.start_tree {
      workers = 1,
      lua_ssl_trusted_certificate = pki.ca,
      http = ("resolver %s ipv6=off;"):format(dns.addr),
      init = ([[
        redlock = require "redlock"
        DLMS = {
          -- verification on, no tls.server_name: the seed is checked against
          -- "localhost", the masters (127.0.0.1) have no name
          bare = redlock.new { servers = { %q }, ttl = 3000, node_timeout = 1000 },
          named = redlock.new { servers = { %q }, ttl = 3000, node_timeout = 1000,
                                tls = { server_name = "localhost" } },
        }
        -- (another node_timeout: a hub of its own, that reads the map anew)
        NEW = function() return redlock.new { servers = { %q }, ttl = 3000, node_timeout = 1200 } end
      ]]):format(seed, seed, seed),
      locations = { nginx.PING, LOCK },
    }
    local function get(path)
      local status, body = srv:get(path, { timeout_ms = 10000 })
      assert.are.equal(200, status, tostring(body) .. "\n" .. srv:error_log():sub(-3000))
      return body
    end
    -- a name on each master
    local names, by, n = {}, {}, 0
    while #names < c.n do
      n = n + 1
      local name = res("m" .. n)
      local j = rcluster.owner(c, name)
      if not by[j] then by[j], names[#names + 1] = true, name end
    end
    for _, name in ipairs(names) do
      local want = ("fail no host name to verify: set tls.server_name or announce hostnames (master 127.0.0.1:%d)\n")
        :format(c.ports[rcluster.owner(c, name)])
      -- the first try may fail for want of the cluster's map: it is asked for then
      local body = get("/lock?c=bare&r=" .. name)
      if body ~= want then body = get("/lock?c=bare&r=" .. name) end
      assert.are.equal(want, body)
      assert.are.equal("", (rcluster.cli(c, rcluster.owner(c, name), "GET", name)))
      -- with a name to check, the same masters lock
      body = get("/lock?c=named&r=" .. name)
      if body ~= "ok\n" then body = get("/lock?c=named&r=" .. name) end
      assert.are.equal("ok\n", body)
    end
    assert.matches("tls.server_name", srv:error_log(), 1, true)
    -- masters that announce a hostname are checked against it: no tls.server_name needed
    for j = 1, c.n do
      rcluster.cli(c, j, "CONFIG", "SET", "cluster-announce-hostname", "localhost")
      rcluster.cli(c, j, "CONFIG", "SET", "cluster-preferred-endpoint-type", "hostname")
    end
    local deadline = proc.now_ms() + 10000
    while select(2, (rcluster.cli(c, 1, "CLUSTER", "NODES")):gsub(",localhost", "")) < c.n do
      assert(proc.now_ms() < deadline, "the masters' hostname did not spread")
      proc.sleep_ms(50)
    end
    for _, name in ipairs(names) do
      local body = get("/lock?c=announced&r=" .. name)
      if body ~= "ok\n" then body = get("/lock?c=announced&r=" .. name) end
      assert.are.equal("ok\n", body)
    end
  end)
end)
