-- Spec helper: Debian's prometheus package. `promtool check metrics` on an
-- exposition text, and a real Prometheus server, our own process on a free
-- loopback port with its own config and storage in a temporary directory
-- (the package's system service plays no part), queried through its HTTP API.
--
--   prometheus.installed("promtool")                           -- or "prometheus"
--   local ok, out = prometheus.check(text)                     -- promtool check metrics
--   local prom = prometheus.start { { job = "nginx", target = "127.0.0.1:8080", path = "/metrics" }, ... }
--   prom:query('sum(redlock_operations_total{job="nginx"})')  -- number, or nil and why
--   prom:stop()                                                -- by its pid

local nginx = require "helpers.nginx"
local proc = require "helpers.proc"

local M = {}

--- Is the program (promtool, prometheus) installed?
function M.installed(program)
  local _, rc = proc.sh("command -v " .. program)
  return rc == 0
end

--- Run `promtool check metrics` on text: true if it passes (lint
--- warnings included), and what it printed.
function M.check(text)
  local dir = proc.tmpdir()
  local path = dir .. "/metrics.txt"
  proc.write_file(path, text)
  local out, rc = proc.sh("promtool check metrics < " .. proc.quote(path))
  proc.rmdir(dir)
  return rc == 0 and out == "", out
end

local function urlencode(s)
  return (s:gsub("[^%w%-_.~]", function(c) return ("%%%02X"):format(c:byte()) end))
end

local server = {}
server.__index = server

--- The value of an instant query whose result is one sample: a number, or
--- nil and what the server said.
function server:query(expr)
  local status, body = nginx.request(self.port, "/api/v1/query?query=" .. urlencode(expr))
  if status ~= 200 then return nil, tostring(status) .. " " .. tostring(body) end
  local v = body:match('"value":%[[^,]+,"([^"]+)"%]')
  if not v then return nil, body end
  return tonumber(v)
end

--- The health of every scrape target: "up"/"down"/"unknown" by job.
function server:targets()
  local _, body = nginx.request(self.port, "/api/v1/targets")
  local t = {}
  for job, health in (body or ""):gmatch('"job":"([^"]+)".-"health":"(%a+)"') do t[job] = health end
  return t, body
end

function server:stop()
  if self.pid then proc.stop(self.pid) end
  self.pid = nil
  proc.rmdir(self.dir)
end

--- Start Prometheus scraping every target each 500 ms; wait until its API
--- answers (within 20 s). targets: { job, target ("host:port"), path }.
function M.start(targets)
  local dir = proc.tmpdir()
  local conf = { "global:", "  scrape_interval: 500ms", "  scrape_timeout: 400ms", "scrape_configs:" }
  for _, t in ipairs(targets) do
    conf[#conf + 1] = ("  - job_name: %q\n    metrics_path: %q\n    static_configs:\n      - targets: [%q]")
      :format(t.job, t.path, t.target)
  end
  proc.write_file(dir .. "/prometheus.yml", table.concat(conf, "\n") .. "\n")
  local port = nginx.free_port()
  local self = setmetatable({ dir = dir, port = port }, server)
  self.pid = proc.spawn({ "prometheus", "--config.file=" .. dir .. "/prometheus.yml",
    "--storage.tsdb.path=" .. dir .. "/data", "--web.listen-address=127.0.0.1:" .. port,
    "--log.level=warn" }, { out = dir .. "/prometheus.log" })
  local deadline = proc.now_ms() + 20000
  repeat
    local status = nginx.request(port, "/-/ready")
    if status == 200 then return self end
    proc.sleep_ms(100)
  until proc.now_ms() > deadline or not proc.alive(self.pid)
  local log = proc.read_file(dir .. "/prometheus.log") or ""
  self:stop()
  error("prometheus did not become ready: " .. log)
end

return M
