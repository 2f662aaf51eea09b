-- Spec helper script (run as its own OS process, not required):
--
--   luajit spec/helpers/worker.lua MODE LOG COUNTER RESOURCE DURATION_MS URL...
--
-- Hammers RESOURCE for DURATION_MS: acquire, append "enter" to the shared
-- LOG, read-modify-write the COUNTER file, append "exit", release. MODE
-- "lock" uses redlock; MODE "nolock" skips the lock (to prove the checker
-- sees the overlaps and lost updates that mutual exclusion prevents).
-- Prints one summary line: "acquired=N failed=M late=L errors=E:...".
-- LUA_PATH / LUA_CPATH come from the spawning spec.

local proc = require "helpers.proc"
local history = require "helpers.history"

local mode, logpath, counter, resource, duration = arg[1], arg[2], arg[3], arg[4], tonumber(arg[5])
local urls = {}
for i = 6, #arg do urls[#urls + 1] = arg[i] end

math.randomseed(proc.getpid())
local log = history.open(logpath)
local deadline = proc.now_ms() + duration
local acquired, failed, late = 0, 0, 0
local errors = {}

local function critical_section()
  log:enter()
  history.bump_counter(counter, 1)
  log:exit()
end

if mode == "nolock" then
  while proc.now_ms() < deadline do
    critical_section()
    acquired = acquired + 1
    proc.sleep_ms(math.random(0, 1))
  end
else
  local redlock = require "redlock"
  local dlm = redlock.new {
    servers = urls,
    tls = require("helpers.tls").from_env(), -- rediss:// nodes: set by the spawning spec
    ttl = 3000,
    retry = redlock.retry.jitter(1, 5, 1000),
  }
  while proc.now_ms() < deadline do
    local lock, err = dlm:lock(resource, { wait = 2000 })
    if lock then
      critical_section()
      if lock:remaining() <= 0 then late = late + 1 end
      acquired = acquired + 1
      local ok, uerr = lock:unlock()
      if not ok then errors[#errors + 1] = "unlock:" .. tostring(uerr) end
    else
      failed = failed + 1
      errors[#errors + 1] = "lock:" .. tostring(err)
    end
    proc.sleep_ms(math.random(0, 2))
  end
  dlm:close()
end
log:close()
io.write(("acquired=%d failed=%d late=%d errors=%d:%s\n")
  :format(acquired, failed, late, #errors, table.concat(errors, ",", 1, math.min(#errors, 5))))
