-- nginx: every worker counts in its own engine, and one /metrics location
-- shows the sum over every worker through a lua_shared_dict
-- (redlock.nginx.metrics). Each of the 2 workers makes a known number of
-- acquisitions from a timer of its own at start, so the sum is known
-- exactly. The location also prints another exposition first (what
-- nginx-lua-prometheus would print), and promtool checks the whole
-- response: no family clashes.

local cluster = require "helpers.cluster"
local nginx = require "helpers.nginx"
local prometheus = require "helpers.prometheus"
local proc = require "helpers.proc"

local EACH = 7 -- acquisitions per worker

-- What nginx-lua-prometheus prints for a counter of its own, and its error counter.
local OTHER = [[
# HELP nginx_http_requests_total Number of HTTP requests
# TYPE nginx_http_requests_total counter
nginx_http_requests_total{host="localhost",status="200"} 3
# HELP nginx_metric_errors_total Number of nginx-lua-prometheus errors
# TYPE nginx_metric_errors_total counter
nginx_metric_errors_total 0
]]

--- The value of the sample named (with its labels) in text, or nil.
local function sample(text, name)
  local v = text:match("\n" .. name:gsub("%p", "%%%0") .. " (%S+)\n")
  return v and tonumber(v)
end

--- Every histogram in text is cumulative and ends where its _count says.
local function histograms_whole(text)
  local last, inf = {}, {}
  for series, le, v in text:gmatch('\n([%w_]+_bucket{[^\n]-)le="([^"]+)"} (%S+)') do
    v = tonumber(v)
    if last[series] and v < last[series] then return false, series .. " le=" .. le .. " falls" end
    last[series] = v
    if le == "+Inf" then inf[series] = v end
  end
  for series, v in pairs(inf) do
    local base, lbl = series:match("^([%w_]+)_bucket{(.-),?$")
    local count = sample(text, base .. "_count" .. (lbl ~= "" and ("{" .. lbl .. "}") or ""))
    if count ~= v then return false, ("%s: +Inf %s, _count %s"):format(series, v, tostring(count)) end
  end
  return next(inf) ~= nil, "no histogram"
end

--- srv's /metrics once both workers have made their acquisitions and
--- enough(text) holds (within 10 s); the last text read otherwise.
local function scrape(srv, enough)
  local deadline = proc.now_ms() + 10000
  local text
  repeat
    local status, body = srv:get("/done")
    if status == 200 and tonumber(body) == 2 then
      local st
      st, text = srv:get("/metrics")
      assert.equals(200, st)
      if enough(text) then break end
    end
    proc.sleep_ms(100)
  until proc.now_ms() > deadline
  return text
end

--- An nginx of 2 workers, each making EACH acquisitions from a timer at
--- start, that pushes to a dict of dict_size every 0.2 s.
local function start_nginx(cl, dict_size)
  return nginx.start_tree {
      workers = 2,
      http = ("lua_shared_dict redlock_metrics %s;"):format(dict_size),
      init = ([[
        redlock = require "redlock"
        URLS = %s
        OTHER = %q
      ]]):format(nginx.lua_list(cl.urls), OTHER),
      init_worker = ([[
        local m = require "redlock.nginx.metrics"
        assert(m.start("redlock_metrics", 0.2))
        ngx.timer.at(0, function()
          local dlm = redlock.new { servers = URLS }
          for i = 1, %d do
            local lk = assert(dlm:try_lock("spec:nginx_metrics:" .. ngx.worker.id() .. ":" .. i, { ttl = 5000 }))
            lk:unlock()
          end
          ngx.shared.redlock_metrics:incr("spec:done", 1, 0)
        end)
      ]]):format(EACH),
      locations = {
        [[location = /metrics {
            content_by_lua_block {
              ngx.print(OTHER)
              require("redlock.nginx.metrics").serve("redlock_metrics")
            }
          }]],
        [[location = /done { content_by_lua_block { ngx.say(ngx.shared.redlock_metrics:get("spec:done") or 0) } }]],
        -- a client made here shares its worker's hub, and so its engine and counts
        [[location = /stats {
            content_by_lua_block { ngx.say(redlock.new({ servers = URLS }):stats().operations.acquire.ok) }
          }]],
        -- two clients of one configuration (a prefix of their own: a hub nothing else uses)
        -- share one engine; one acquisition, then what each view says
        [[location = /shared_engine {
            content_by_lua_block {
              local a = redlock.new { servers = URLS, prefix = "spec:shared_engine:" }
              local b = redlock.new { servers = URLS, prefix = "spec:shared_engine:" }
              assert(a:try_lock("r", { ttl = 5000 })):unlock()
              ngx.say(a:stats().operations.acquire.ok)
              ngx.print(redlock.metrics(a, b))
            }
          }]],
      },
    }
end

describe("nginx /metrics", function()
  local cl, srv
  setup(function()
    cl = cluster.start(3)
    srv = start_nginx(cl, "1m")
  end)
  teardown(function()
    nginx.stop_all()
    cluster.stop_all()
  end)

  it("sums every worker's counts, and sits beside another exposition", function()
    local ok_sample = 'redlock_operations_total{kind="acquire",outcome="ok"}'
    local text = scrape(srv, function(t) return sample(t, ok_sample) == 2 * EACH end)
    assert.equals(2 * EACH, sample(text, ok_sample), text)
    assert.equals(2 * EACH, sample(text, 'redlock_operations_total{kind="release",outcome="ok"}'))
    -- each worker's hub connected to every node once: the sum says 2
    assert.equals(2, sample(text, ('redlock_node_connects_total{node="%s"}'):format(cl.urls[1])))
    assert.equals(1, select(2, text:gsub("# TYPE redlock_operations_total counter", "")))
    assert.equals(1, text:find(OTHER, 1, true))
    local _, body = srv:get("/stats")
    assert.equals(EACH .. "\n", body)
    if prometheus.installed("promtool") then
      local ok, out = prometheus.check(text)
      assert(ok, out)
    end
  end)

  -- Before: each worker wrote its ~240 samples one by one with set(), which
  -- evicts other keys when the dict is full: sums lost part of a worker
  -- (acquisitions counted 20 of 24, histograms not cumulative), silently.
  it("with a dict too small for every worker, says so and shows whole workers only", function()
    local small = start_nginx(cl, "28k") -- room for one worker's entry (14 KB), not two
    finally(function() small:stop() end)
    local text = scrape(small, function(t) return sample(t, 'redlock_operations_total{kind="release",outcome="ok"}') end)
    local workers = sample(text, ('redlock_node_connects_total{node="%s"}'):format(cl.urls[1]))
    assert.equals(1, workers, text)
    assert.equals(EACH, sample(text, 'redlock_operations_total{kind="acquire",outcome="ok"}'), text)
    assert.equals(EACH, sample(text, 'redlock_operations_total{kind="release",outcome="ok"}'), text)
    assert(histograms_whole(text))
    local said = "this worker's counts were not written (no memory)"
    local deadline = proc.now_ms() + 5000 -- the other worker's next push (every 0.2 s)
    while not small:error_log():find(said, 1, true) and proc.now_ms() < deadline do proc.sleep_ms(50) end
    assert.matches(said, small:error_log(), 1, true)
  end)

  -- Before: redlock.metrics(a, b) summed a's and b's tables, each the whole
  -- of the engine they share: one acquisition showed as 2.
  it("counts an engine that clients share once", function()
    local status, body = srv:get("/shared_engine")
    assert.equals(200, status, body)
    local said = tonumber(body:match("^(%d+)\n"))
    assert.equals(1, said, body)
    assert.equals(1, sample(body, 'redlock_operations_total{kind="acquire",outcome="ok"}'), body)
    assert.equals(1, sample(body, 'redlock_operations_total{kind="release",outcome="ok"}'), body)
    assert.equals(1, sample(body, ('redlock_node_connects_total{node="%s"}'):format(cl.urls[1])), body)
  end)

  it("keeps every histogram cumulative", function()
    local _, text = srv:get("/metrics")
    assert(histograms_whole(text))
  end)
end)

-- One worker, a dict with room for its entry of one 3-node hub and not of
-- two. Before: the entry that grew past the room took the old one with it
-- (nginx frees an entry before it takes room for a longer one), and the
-- worker's counts left the sum; and a client with stats = false shared its
-- hub with clients that count, so whichever came first decided for all.
describe("nginx /metrics, one worker", function()
  local cl, srv
  setup(function()
    cl = cluster.start(3)
    local db1 = {}
    for i, u in ipairs(cl.urls) do db1[i] = u .. "/1" end
    srv = nginx.start_tree {
      workers = 1,
      http = "lua_shared_dict redlock_metrics 32k;",
      init = ([[
        redlock = require "redlock"
        URLS, URLS1 = %s, %s
      ]]):format(nginx.lua_list(cl.urls), nginx.lua_list(db1)),
      init_worker = [[ assert(require("redlock.nginx.metrics").start("redlock_metrics", 0.2)) ]],
      locations = {
        [[location = /metrics { content_by_lua_block { require("redlock.nginx.metrics").serve("redlock_metrics") } }]],
        [[location = /lock {
            content_by_lua_block {
              local dlm = redlock.new { servers = ngx.var.arg_db1 and URLS1 or URLS }
              assert(dlm:try_lock("spec:nginx_metrics:one", { ttl = 5000 })):unlock()
              ngx.say("ok")
            }
          }]],
        [[location = /nostats {
            content_by_lua_block {
              local off = redlock.new { servers = URLS, stats = false, prefix = "spec:nostats:" }
              local on = redlock.new { servers = URLS, prefix = "spec:nostats:" }
              assert(off:try_lock("r", { ttl = 5000 })):unlock()
              assert(on:try_lock("r", { ttl = 5000 })):unlock()
              ngx.say(off:stats().operations.acquire.ok, " ", on:stats().operations.acquire.ok)
            }
          }]],
      },
    }
  end)
  teardown(function()
    nginx.stop_all()
    cluster.stop_all()
  end)

  local ok_sample = 'redlock_operations_total{kind="acquire",outcome="ok"}'

  it("keeps a worker's previous entry when the dict has no room for its larger one", function()
    assert.equals(200, (srv:get("/lock")))
    local _, text = srv:get("/metrics")
    assert.equals(1, sample(text, ok_sample), text)
    assert.equals(200, (srv:get("/lock?db1=1"))) -- a second hub: its series do not fit
    local said = "this worker's counts were not written (no memory)"
    local deadline = proc.now_ms() + 5000
    while not srv:error_log():find(said, 1, true) and proc.now_ms() < deadline do proc.sleep_ms(50) end
    assert.matches(said, srv:error_log(), 1, true)
    _, text = srv:get("/metrics")
    assert.equals(1, sample(text, ok_sample), text)
  end)

  it("counts for a client with stats on beside one with stats off", function()
    local status, body = srv:get("/nostats")
    assert.equals(200, status, body)
    assert.equals("0 1\n", body)
  end)
end)
