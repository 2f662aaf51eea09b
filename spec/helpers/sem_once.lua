-- Spec helper script (run as its own OS process, not required):
--
--   luajit spec/helpers/sem_once.lua RESOURCE LIMIT NODE_TIMEOUT_MS URL...
--
-- One try_lock of the semaphore RESOURCE of LIMIT slots on the nodes URL...,
-- with the node timeout given. Prints "slot=K tryagain=N" (K the slot it
-- holds, or "nil: <error>"; N the TRYAGAIN replies its nodes met), then
-- releases what it holds.
local redlock = require "redlock"

local resource, limit, node_timeout = arg[1], tonumber(arg[2]), tonumber(arg[3])
local urls = {}
for i = 4, #arg do urls[#urls + 1] = arg[i] end

local dlm = redlock.new { servers = urls, ttl = 10000, node_timeout = node_timeout }
local lock, err = dlm:try_lock(resource, { limit = limit })
local tryagain = 0
for _, n in ipairs(dlm:stats().nodes) do tryagain = tryagain + n.tryagain end
print(("slot=%s tryagain=%d"):format(lock and tostring(lock.slot) or "nil: " .. tostring(err), tryagain))
io.stdout:flush()
if lock then lock:unlock() end
dlm:close()
