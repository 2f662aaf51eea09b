-- Spec helper: the C fault tools in build/spec/tools/ (see spec/tools/*.c).
--
--   local faults = require "helpers.faults"
--   local fake = faults.fakeserver("garbage")   -- fake.url, fake.port, fake.pid
--   local tfake = faults.tlsfake("ask-notify", cert, key) -- a TLS node that drops connections
--   local px = faults.proxy(cl.ports[1])        -- px.url; px:set("stall") ...
--   local dns = faults.fakedns()                -- dns.addr; dns:set("answer 127.0.0.1")
--   fake:stop(); px:stop()
--
-- Every process is stopped by its pid; stop_all() stops whatever is left.

local proc = require "helpers.proc"

local M = {}

local build = os.getenv("REDLOCK_BUILD_DIR") or "build"
M.tools_dir = build .. "/spec/tools"

local started = {}

local function tool(name)
  local path = M.tools_dir .. "/" .. name
  local f = io.open(path, "rb")
  if not f then
    error(path .. " not found: build it first (cmake -S . -B build && cmake --build build)", 3)
  end
  f:close()
  return path
end

local Proc = {}
Proc.__index = Proc

function Proc:stop()
  if self.stopped then return true end
  self.stopped = true
  local ok = proc.stop(self.pid)
  proc.rmdir(self.dir)
  return ok
end

function Proc:alive()
  return proc.alive(self.pid)
end

--- Change the proxy's mode ("pass", "delay MS", "stall", "blackhole", "drop",
-- "reset", "throttle N", "cut N") or the fake DNS server's ("deaf", "answer
-- ADDR") and wait long enough for the tool to have read it.
function Proc:set(mode)
  assert(self.control, "this tool has no modes")
  proc.write_file(self.control, mode .. "\n")
  proc.sleep_ms(20) -- the proxy re-reads its control file every few ms
end

--- What the tool printed (stdout and stderr).
function Proc:log()
  return proc.read_file(self.dir .. "/out.log") or ""
end

--- How many connections the fake server or the proxy has accepted so far.
function Proc:accepts()
  return select(2, self:log():gsub("%f[^\n%z]accept\n", ""))
end

local function start(argv_tail_fn, name)
  local dir = proc.tmpdir()
  local portfile = dir .. "/port"
  local self = setmetatable({ dir = dir }, Proc)
  local argv = argv_tail_fn(self, portfile)
  table.insert(argv, 1, tool(name))
  self.pid = proc.spawn(argv, { out = dir .. "/out.log" })
  started[#started + 1] = self
  local ok, text = pcall(proc.wait_file, portfile, 5000)
  if not ok then
    self:stop()
    error(name .. " did not start: " .. tostring(proc.read_file(dir .. "/out.log")), 3)
  end
  self.port = tonumber(text:match("%d+"))
  self.url = "redis://127.0.0.1:" .. self.port
  return self
end

--- A fake node that misbehaves in MODE: garbage, silent, reset, error,
-- readonly, oom, loading, ok (+OK to every command), noscript, huge,
-- nested, escape, integer, drip (see spec/tools/fakeserver.c).
function M.fakeserver(mode)
  return start(function(_, portfile) return { mode, portfile } end, "rl-fakeserver")
end

--- A TLS node (certificate cert, key key) that drops every connection
-- after reading its first bytes, before any reply: mode "hello-reset" (a
-- TCP RST after the ClientHello, no handshake), "notify" (a
-- close_notify), "ask-notify" (the same, having asked for an optional client
-- certificate), "ask-reset" (asked, then a TCP RST). fake.url is rediss://.
function M.tlsfake(mode, cert, key)
  local self = start(function(_, portfile) return { mode, cert, key, portfile } end, "rl-tlsfake")
  self.url = "rediss://127.0.0.1:" .. self.port
  return self
end

--- A DNS server on UDP port 53 of some 127.53.X.Y (binding it needs root),
-- at first deaf: it reads queries and never answers. dns.addr is its
-- address (put it in a resolv.conf); dns:set("answer 127.0.0.1") makes it
-- answer; dns:log() is what it was asked, a line per query.
function M.fakedns()
  local dir = proc.tmpdir()
  local self = setmetatable({ dir = dir, control = dir .. "/control" }, Proc)
  proc.write_file(self.control, "deaf\n")
  local addrfile = dir .. "/addr"
  self.pid = proc.spawn({ tool("rl-fakedns"), addrfile, self.control }, { out = dir .. "/out.log" })
  started[#started + 1] = self
  local ok, text = pcall(proc.wait_file, addrfile, 5000)
  if not ok then
    self:stop()
    error("rl-fakedns did not start: " .. tostring(proc.read_file(dir .. "/out.log")), 2)
  end
  self.addr = text:match("[%d.]+")
  return self
end

--- A proxy in front of 127.0.0.1:upstream_port, initially in mode "pass"
-- (or mode: see Proc:set).
function M.proxy(upstream_port, mode)
  return start(function(self, portfile)
    self.control = self.dir .. "/control"
    proc.write_file(self.control, (mode or "pass") .. "\n")
    return { portfile, tostring(upstream_port), self.control }
  end, "rl-faultproxy")
end

function M.stop_all()
  for _, p in ipairs(started) do p:stop() end
  started = {}
end

return M
