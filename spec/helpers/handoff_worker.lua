-- Spec helper script (run as its own OS process, not required):
--
--   luajit spec/helpers/handoff_worker.lua LOG RESOURCE DURATION_MS HOLD_MS PAUSE_MS
--                                          MIN_MS MAX_MS NOTIFY URL...
--
-- For DURATION_MS: lock RESOURCE (retrying every MIN_MS..MAX_MS, without a
-- bound; NOTIFY "on" or "off": redlock.new's notify), append
-- "acq <pid> <us>" to LOG, hold it HOLD_MS, append "rel <pid> <us>", unlock,
-- pause PAUSE_MS. Times are proc.now_us (monotonic, the same clock in every
-- process). Prints "acquired=N errors=E:<last error>".
-- LUA_PATH / LUA_CPATH come from the spawning spec.

local proc = require "helpers.proc"
local redlock = require "redlock"

local logpath, resource = arg[1], arg[2]
local duration, hold, pause = tonumber(arg[3]), tonumber(arg[4]), tonumber(arg[5])
local min_ms, max_ms, notify = tonumber(arg[6]), tonumber(arg[7]), arg[8] == "on"
local urls = {}
for i = 9, #arg do urls[#urls + 1] = arg[i] end

local dlm = redlock.new { servers = urls, ttl = 10000, notify = notify,
                          tls = require("helpers.tls").from_env() } -- rediss://: set by the spawning spec
local log = assert(io.open(logpath, "a"))
log:setvbuf("no")
local pid = proc.getpid()
local deadline = proc.now_ms() + duration
local acquired, errors, last = 0, 0, ""
while proc.now_ms() < deadline do
  local lk, err = dlm:lock(resource, { retry = redlock.retry.forever(min_ms, max_ms),
                                       wait = math.max(1, deadline - proc.now_ms()) })
  if lk then
    log:write(("acq %d %d\n"):format(pid, proc.now_us()))
    acquired = acquired + 1
    if hold > 0 then proc.sleep_ms(hold) end
    log:write(("rel %d %d\n"):format(pid, proc.now_us()))
    lk:unlock()
    if pause > 0 then proc.sleep_ms(pause) end
  elseif err ~= "busy" then
    errors, last = errors + 1, tostring(err)
  end
end
log:close()
dlm:close()
io.write(("acquired=%d errors=%d:%s\n"):format(acquired, errors, last))
