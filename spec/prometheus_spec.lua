-- A real Prometheus server scrapes what we expose and finds the
-- acquisitions made: an nginx whose /metrics shows its worker's counts, and
-- a host job (`redlock run`) whose script writes redlock.metrics() of its
-- client to a file that the same nginx serves. The spec starts its own
-- prometheus (Debian's package) on a loopback port, waits until both
-- targets were scraped with the final counts, and asks the HTTP API.

local cluster = require "helpers.cluster"
local nginx = require "helpers.nginx"
local prometheus = require "helpers.prometheus"
local proc = require "helpers.proc"

local ROOT = nginx.root
local BIN = os.getenv("REDLOCK_HOST") or (ROOT .. "/build/redlock")
if BIN:sub(1, 1) ~= "/" then BIN = ROOT .. "/" .. BIN end
local NGINX_LOCKS, HOST_LOCKS = 6, 9

describe("a real Prometheus server", function()
  local cl, srv, prom, dir
  setup(function()
    cl = cluster.start(3)
    dir = proc.tmpdir()
    srv = nginx.start_tree {
      http = "lua_shared_dict redlock_metrics 1m;",
      init = ("redlock = require 'redlock'; DLM = redlock.new { servers = %s }"):format(nginx.lua_list(cl.urls)),
      init_worker = 'require("redlock.nginx.metrics").start("redlock_metrics")',
      locations = {
        [[location = /lock {
            content_by_lua_block {
              local lk, err = DLM:try_lock("spec:prometheus:" .. ngx.var.arg_i, { ttl = 5000 })
              if lk then lk:unlock() end
              ngx.say(lk and "ok" or err)
            }
          }]],
        [[location = /metrics { content_by_lua_block { require("redlock.nginx.metrics").serve("redlock_metrics") } }]],
        ("location = /host-metrics { default_type text/plain; alias %s/host.prom; }"):format(dir),
      },
    }
  end)
  teardown(function()
    if prom then prom:stop() end
    nginx.stop_all()
    cluster.stop_all()
    proc.rmdir(dir)
  end)

  it("scrapes nginx /metrics and a host job's metrics file, and finds the acquisitions", function()
    if not prometheus.installed("prometheus") then pending("prometheus is not installed (scripts/deps installs it)") return end
    for i = 1, NGINX_LOCKS do
      local status, body = srv:get("/lock?i=" .. i)
      assert.equals(200, status)
      assert.equals("ok\n", body)
    end
    -- the host job: a `redlock run` script printing its client's exposition to a file
    local script = dir .. "/job.lua"
    proc.write_file(script, ([[
      local redlock = require "redlock"
      local dlm = redlock.default()
      for i = 1, %d do
        local lk = assert(dlm:try_lock("spec:prometheus:host:" .. i, { ttl = 5000 }))
        lk:unlock()
      end
      local f = assert(io.open(%q, "w"))
      f:write(redlock.metrics(dlm))
      f:close()
      os.rename(%q, %q)
    ]]):format(HOST_LOCKS, dir .. "/host.prom.tmp", dir .. "/host.prom.tmp", dir .. "/host.prom"))
    local out, rc = proc.sh(("%s run --servers %s %s"):format(proc.quote(BIN), table.concat(cl.urls, ","),
      proc.quote(script)))
    assert.equals(0, rc, out)

    prom = prometheus.start {
      { job = "nginx", target = "127.0.0.1:" .. srv.port, path = "/metrics" },
      { job = "host", target = "127.0.0.1:" .. srv.port, path = "/host-metrics" },
    }
    local q = 'sum(redlock_operations_total{job="%s",kind="acquire",outcome="ok"})'
    local got, why = {}
    local deadline = proc.now_ms() + 30000
    repeat
      got.nginx, why = prom:query(q:format("nginx"))
      got.host = prom:query(q:format("host"))
      if got.nginx == NGINX_LOCKS and got.host == HOST_LOCKS then break end
      proc.sleep_ms(250)
    until proc.now_ms() > deadline
    local targets, raw = prom:targets()
    assert.equals("up", targets.nginx, raw)
    assert.equals("up", targets.host, raw)
    assert.equals(NGINX_LOCKS, got.nginx, why)
    assert.equals(HOST_LOCKS, got.host)
    -- and a histogram: every decision counted in it
    assert.equals(HOST_LOCKS, prom:query('sum(redlock_decision_seconds_count{job="host",kind="acquire"})'))
    assert.equals(3, prom:query('count(redlock_node_up{job="nginx"} == 1)'))
  end)
end)
