-- Spec helper script (run as its own OS process, not required):
--
--   luajit spec/helpers/rmw_worker.lua LOG STOPFILE RESOURCE COUNTER_PORT URL...
--
-- Until STOPFILE exists: lock RESOURCE (redlock over the core's own sockets),
-- append "enter" to the shared history LOG, read-modify-write the key
-- "counter" on the redis node at 127.0.0.1:COUNTER_PORT (GET, a 1 ms pause,
-- SET +1), append "exit", unlock. The same loop as nginx_lock_spec's /rmw
-- location, from outside nginx. Prints "acquired=N failed=M moved=X ask=Y
-- errors=...", X and Y the MOVED and ASK replies met (cluster nodes).
local proc = require "helpers.proc"
local history = require "helpers.history"
local socket = require "socket"
local resp = require "helpers.resp"
local redlock = require "redlock"

local logpath, stopfile, resource, cport = arg[1], arg[2], arg[3], tonumber(arg[4])
local urls = {}
for i = 5, #arg do urls[#urls + 1] = arg[i] end

local conn = assert(socket.connect("127.0.0.1", cport))
conn:settimeout(5)
local function cmd(...)
  return resp.call(conn, ...)
end

math.randomseed(proc.getpid())
local log = history.open(logpath)
local dlm = redlock.new { servers = urls, ttl = 3000 }
local acquired, failed, errors = 0, 0, {}
while not io.open(stopfile, "rb") do
  local lock, err = dlm:lock(resource, { wait = 8000, retry = redlock.retry.jitter(1, 5, 1000000) })
  if lock then
    log:enter()
    local v = tonumber(cmd("GET", "counter") or "0")
    proc.sleep_ms(1)
    cmd("SET", "counter", v + 1)
    log:exit()
    acquired = acquired + 1
    local ok, uerr = lock:unlock()
    if not ok then errors[#errors + 1] = "unlock:" .. tostring(uerr) end
  else
    failed = failed + 1
    errors[#errors + 1] = "lock:" .. tostring(err)
  end
  proc.sleep_ms(math.random(0, 2))
end
local moved, ask = 0, 0
for _, n in ipairs(dlm:stats().nodes) do moved, ask = moved + n.moved, ask + n.ask end
dlm:close()
log:close()
io.write(("acquired=%d failed=%d moved=%d ask=%d errors=%d:%s\n")
  :format(acquired, failed, moved, ask, #errors, table.concat(errors, ",", 1, math.min(#errors, 5))))
