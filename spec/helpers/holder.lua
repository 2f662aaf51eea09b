-- Spec helper script (run as its own OS process, not required):
--
--   luajit spec/helpers/holder.lua RESOURCE HOLD_MS READYFILE URL...
--
-- Locks RESOURCE (ttl 10 s), writes its lock value to READYFILE, holds the
-- lock for HOLD_MS, then releases it and exits; exit status 0 on success.
local proc = require "helpers.proc"
local redlock = require "redlock"

local resource, hold_ms, ready = arg[1], tonumber(arg[2]), arg[3]
local urls = {}
for i = 4, #arg do urls[#urls + 1] = arg[i] end

local dlm = redlock.new { servers = urls, ttl = 10000 }
local lock, err = dlm:lock(resource, { wait = 5000 })
if not lock then
  io.stderr:write("holder: lock failed: ", tostring(err), "\n")
  os.exit(1)
end
proc.write_file(ready, lock.value)
proc.sleep_ms(hold_ms)
local ok, uerr = lock:unlock()
dlm:close()
if not ok then
  io.stderr:write("holder: unlock failed: ", tostring(uerr), "\n")
  os.exit(1)
end
os.exit(0)
