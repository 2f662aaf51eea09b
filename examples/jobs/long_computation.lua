-- examples/jobs/long_computation.lua — keep-alive does not need the script's help.
--
--   redlock run examples/jobs/long_computation.lua [SECONDS]
--
-- Holds a lock with a 1 s ttl through a pure-Lua busy loop several times
-- longer than that, never calling into redlock meanwhile: the keeper thread
-- extends it. Afterwards the lock is still ours.

local redlock = require "redlock"
local seconds = tonumber(arg[1]) or 3

local dlm = redlock.default()
local lock = assert(dlm:lock("examples:long-computation", { ttl = 1000 }))

local clock, x = os.clock, 0
local stop = clock() + seconds
while clock() < stop do x = x + 1 end -- no call into redlock here

assert(not lock:lost(), "the lock was lost")
print(("computed %d iterations over %d s while holding a 1 s lock; %d ms of validity left")
    :format(x, seconds, lock:remaining()))
assert(lock:unlock())
