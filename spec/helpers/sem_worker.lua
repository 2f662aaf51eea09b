-- Spec helper script (run as its own OS process, not required) for
-- spec/semaphore_spec.lua:
--
--   luajit spec/helpers/sem_worker.lua LOG RESOURCE LIMIT RUN_MS HOLD_MS TTL URL...
--
-- Until RUN_MS have passed: take the semaphore RESOURCE of LIMIT slots
-- (ttl TTL, waiting up to 20 s, a poll every 200 ms, or SEM_RETRY_MS from
-- the environment: wake-ups do the rest), append "enter" to the history LOG
-- (spec/helpers/history.lua), hold HOLD_MS, append "exit", unlock. Prints
-- one line: "acquired=N past=P failed=F longest=W": P sections ended after
-- their lock's validity (a pause longer than it was left), F lock calls
-- that failed, W the longest a lock call took (ms).
local proc = require "helpers.proc"
local history = require "helpers.history"
local redlock = require "redlock"

local logpath, resource, limit, run_ms, hold, ttl = arg[1], arg[2], tonumber(arg[3]), tonumber(arg[4]),
  tonumber(arg[5]), tonumber(arg[6])
local urls = {}
for i = 7, #arg do urls[#urls + 1] = arg[i] end

local log = history.open(logpath)
local dlm = redlock.new { servers = urls, ttl = ttl, node_timeout = 100 }
local retry_ms = tonumber(os.getenv("SEM_RETRY_MS")) or 200
local opts = { limit = limit, ttl = ttl, wait = 20000, retry = function() return retry_ms end }
local acquired, past, failed, longest = 0, 0, 0, 0
local stop_at = proc.now_ms() + run_ms
while proc.now_ms() < stop_at do
  local t0 = proc.now_ms()
  local lk = dlm:lock(resource, opts)
  longest = math.max(longest, proc.now_ms() - t0)
  if lk then
    log:enter()
    acquired = acquired + 1
    proc.sleep_ms(hold)
    log:exit()
    if lk:remaining() <= 0 then past = past + 1 end
    lk:unlock()
  else
    failed = failed + 1
  end
end
dlm:close()
log:close()
io.write(("acquired=%d past=%d failed=%d longest=%d\n"):format(acquired, past, failed, longest))
