-- The hub's connects inside nginx: a connect's timeout counts from when the
-- hub begins it, not from the lock call that asked for it. A fresh worker
-- runs its hub's timer only once it gets back to its event loop, which may
-- be long after the first calls began (other requests' work, a worker busy
-- starting); before, the engine dropped those connects at the hub's first
-- turn, never tried, as "connect timed out after N ms" with every node up.

local nginx = require "helpers.nginx"
local cluster = require "helpers.cluster"

local res = cluster.names("nginx_connect")

local CONNECT_TIMEOUT_MS = 1000
-- how long each request keeps its worker busy after its lock call began:
-- longer than the connect timeout, so the hub's timer runs after it
local BUSY_MS = CONNECT_TIMEOUT_MS + 200
local STARTS = 3      -- fresh nginx starts
local REQUESTS = 2    -- concurrent requests at each start (two workers)

-- A request that begins a lock call (a light thread: it runs until it
-- waits for the hub), then blocks its worker for BUSY_MS, then says what
-- the call got: "ok", or "fail <err>: <state error> | ...".
local BUSY = ([[
  location = /busy {
    content_by_lua_block {
      local th = ngx.thread.spawn(function()
        local lock, err, d = DLM:try_lock(ngx.var.arg_r)
        if not lock then
          local parts = {}
          for i = 1, #(d or {}) do parts[i] = tostring(d[i].state) .. " " .. tostring(d[i].error) end
          return "fail " .. tostring(err) .. ": " .. table.concat(parts, " | ")
        end
        local ok, uerr = lock:unlock()
        return ok and "ok" or ("unlock-fail " .. tostring(uerr))
      end)
      sproc.sleep_ms(%d)
      local _, out = ngx.thread.wait(th)
      ngx.say(out)
    }
  }]]):format(BUSY_MS)

describe("redlock inside nginx, a freshly started worker", function()
  local cl, srv

  lazy_setup(function() cl = cluster.start(3) end)
  after_each(function()
    if srv then srv:stop() end
    srv = nil
  end)
  lazy_teardown(function()
    nginx.stop_all()
    cluster.stop_all()
  end)

  it("connects for its first lock calls even when its hub's timer runs late", function()
    -- node_timeout: rounds wait out every request's busy spell of a worker
    local init = ([[
      redlock = require "redlock"
      sproc = require "helpers.proc"
      DLM = redlock.new { servers = %s, ttl = 10000, connect_timeout = %d, node_timeout = %d }
    ]]):format(nginx.lua_list(cl.urls), CONNECT_TIMEOUT_MS, (REQUESTS + 2) * BUSY_MS)
    local failed = {}
    for start = 1, STARTS do
      srv = nginx.start_tree { workers = 2, init = init, locations = { BUSY } }
      local reqs = {}
      for k = 1, REQUESTS do reqs[k] = "/busy?r=" .. res("r") end
      for _, r in ipairs(srv:get_many(reqs, REQUESTS, { timeout_ms = 30000 })) do
        assert.equal(200, r.status, tostring(r.err) .. "\n" .. srv:error_log():sub(-3000))
        if r.body ~= "ok\n" then failed[#failed + 1] = ("start %d: %s"):format(start, r.body) end
      end
      srv:stop()
      srv = nil
    end
    -- every node is up: no call may fail, least of all with a connect timeout
    assert.same({}, failed)
  end)
end)
