-- Spec helper script (run as its own OS process, not required):
--
--   luajit spec/helpers/shared_worker.lua MODE DIR RESOURCE TTL RUN URL...
--
-- Holds RESOURCE, shared or exclusive, and logs each hold's critical section
-- (helpers/history.lua) to DIR/readers.log or DIR/writers.log. MODE:
--   reader   shared holds of 30 ms back to back until the file DIR/stop
--            exists (or RUN ms have passed)
--   writer   RUN exclusive holds of 100 ms, one after the other
--   mix      for RUN ms: holds of 2-20 ms, one in three exclusive, with
--            0-3 ms between them
--   hold     one shared hold of RUN ms; DIR/held-<pid> is written once held
-- Prints one summary line: "shared=N exclusive=M failed=F late=L errors=...":
-- late counts the holds whose validity had run out by their end (a pause
-- longer than the validity), where mutual exclusion is not promised.
-- LUA_PATH / LUA_CPATH come from the spawning spec.

local proc = require "helpers.proc"
local history = require "helpers.history"
local redlock = require "redlock"

local mode, dir, resource, ttl, run = arg[1], arg[2], arg[3], tonumber(arg[4]), tonumber(arg[5])
local urls = {}
for i = 6, #arg do urls[#urls + 1] = arg[i] end

math.randomseed(proc.getpid())
local logs = { [true] = history.open(dir .. "/readers.log"), [false] = history.open(dir .. "/writers.log") }
local dlm = redlock.new { servers = urls, ttl = ttl, node_timeout = 200, retry = redlock.retry.jitter(1, 10, 100000) }
local counts = { [true] = 0, [false] = 0 }
local failed, late, errors = 0, 0, {}

-- One hold of hold_ms (then held(), if given); true if it was held.
local function hold(shared, hold_ms, held)
  local lock, err = dlm:lock(resource, { shared = shared, wait = 10000 })
  if not lock then
    failed = failed + 1
    errors[#errors + 1] = "lock:" .. tostring(err)
    return false
  end
  local log = logs[shared]
  log:enter()
  if held then held() end
  proc.sleep_ms(hold_ms)
  if lock:remaining() <= 0 then late = late + 1 end
  log:exit()
  counts[shared] = counts[shared] + 1
  local ok, uerr = lock:unlock()
  if not ok then errors[#errors + 1] = "unlock:" .. tostring(uerr) end
  return true
end

-- DIR/stop exists
local function told_to_stop()
  local f = io.open(dir .. "/stop", "rb")
  if f then f:close() end
  return f ~= nil
end

local deadline = proc.now_ms() + run
if mode == "reader" then
  while proc.now_ms() < deadline and not told_to_stop() do hold(true, 30) end
elseif mode == "hold" then
  hold(true, run, function() proc.write_file(("%s/held-%d"):format(dir, proc.getpid()), "held") end)
elseif mode == "writer" then
  for _ = 1, run do hold(false, 100) end
else
  while proc.now_ms() < deadline do
    hold(math.random(3) ~= 1, math.random(2, 20))
    proc.sleep_ms(math.random(0, 3))
  end
end
dlm:close()
logs[true]:close()
logs[false]:close()
io.write(("shared=%d exclusive=%d failed=%d late=%d errors=%d:%s\n"):format(counts[true], counts[false], failed,
  late, #errors, table.concat(errors, ",", 1, math.min(#errors, 5))))
