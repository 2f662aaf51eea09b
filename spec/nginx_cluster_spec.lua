-- Cluster nodes inside nginx (docs/cluster.md): the cosocket hub drives the
-- same engine, so a worker's client routes by hash slot to every shard of
-- 3 clusters of 3 masters, its shard links made as the maps come in.

local nginx = require "helpers.nginx"
local rcluster = require "helpers.rcluster"
local cluster = require "helpers.cluster"

local res = cluster.names("nginx_cluster")

describe("cluster nodes inside nginx", function()
  local cs, srv = {}, nil
  lazy_setup(function() for i = 1, 3 do cs[i] = rcluster.start(3) end end)
  lazy_teardown(function()
    if srv then srv:stop() end
    rcluster.stop_all()
  end)

  it("locks, fences and lock_many's names of every shard from a worker", function()
    local urls = { cs[1].url, cs[2].url, cs[3].url }
    srv = nginx.start_tree { workers = 1, init = ([[
        redlock = require "redlock"
        DLM = redlock.new { servers = %s, ttl = 3000 }
      ]]):format(nginx.lua_list(urls)), locations = { nginx.PING, [[
        location = /lock {
          content_by_lua_block {
            local lock, err, d = DLM:lock(ngx.var.arg_r, { fence = true })
            if not lock then ngx.say("fail ", err) return end
            local token = lock.token_string
            ngx.say(lock:unlock() and "ok " or "unlock-failed ", token)
          }
        }
        location = /wait {
          content_by_lua_block {
            -- polling alone would ask again only after 5 s: a wake-up lets it in
            local lock, err = DLM:lock(ngx.var.arg_r, { wait = 8000, retry = redlock.retry.fixed(5000, 3) })
            if not lock then ngx.say("fail ", err) return end
            ngx.say(lock:unlock() and "ok " or "unlock-failed ", DLM:stats().wakeups)
          }
        }
        location = /many {
          content_by_lua_block {
            local g, err = DLM:lock_many({ ngx.var.arg_a, ngx.var.arg_b, ngx.var.arg_c })
            if not g then ngx.say("fail ", err) return end
            ngx.say(g:unlock() and "ok" or "unlock-failed")
          }
        }]] } }
    -- one name per master of cluster 1 (the others: wherever they fall)
    local names, by, n = {}, {}, 0
    while #names < 3 do
      n = n + 1
      local name = res("n" .. n)
      local j = rcluster.owner(cs[1], name)
      if not by[j] then by[j] = true; names[#names + 1] = name end
    end
    for _, name in ipairs(names) do
      -- (tokens grow; an attempt that failed on a loaded machine, and was
      -- made again, may have skipped one)
      local tokens = {}
      for round = 1, 2 do
        local status, body = srv:get("/lock?r=" .. name)
        assert.are.equal(200, status)
        tokens[round] = tonumber(body:match("^ok (%d+)\n$"))
        assert(tokens[round] and tokens[round] >= round, body)
      end
      assert.is_true(tokens[2] > tokens[1], tokens[1] .. " then " .. tokens[2])
      -- the counter lives in the name's slot on each cluster: a quorum of them says the token
      local agree = 0
      for i = 1, 3 do
        local owner = rcluster.owner(cs[i], name)
        if rcluster.cli(cs[i], owner, "GET", "{" .. name .. "}:fence") == tostring(tokens[2]) then agree = agree + 1 end
      end
      assert.is_true(agree >= 2, agree .. " clusters hold token " .. tokens[2])
    end
    local status, body = srv:get(("/many?a=%s&b=%s&c=%s"):format(names[1], names[2], names[3]))
    assert.are.equal(200, status)
    assert.are.equal("ok\n", body)
  end)

  it("wakes a waiting request through sharded pub/sub", function()
    local proc = require "helpers.proc"
    local name = res("wake")
    local dir = proc.tmpdir()
    local argv = { "luajit", "spec/helpers/holder.lua", name, "700", dir .. "/ready", cs[1].url, cs[2].url, cs[3].url }
    local pid = proc.spawn_luajit(argv, dir .. "/out")
    local ok, err = pcall(function()
      proc.wait_file(dir .. "/ready", 10000)
      local status, body = srv:get("/wait?r=" .. name, { timeout_ms = 20000 })
      assert.are.equal(200, status)
      local wakeups = tonumber(body:match("^ok (%d+)"))
      assert.is_truthy(wakeups, body)
      assert.is_true(wakeups > 0, body)
    end)
    proc.wait_gone(pid, 5000)
    proc.stop(pid)
    proc.rmdir(dir)
    assert(ok, err)
  end)
end)
