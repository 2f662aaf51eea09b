-- semlimit.lua — what a semaphore's limit costs: one client, try_lock +
-- unlock of the last free slot of a semaphore whose other L-1 slots are
-- held, for each limit L; every acquire checks each of the L slots on
-- every node (docs/semaphore.md, "Large limits").
--
--   REDLOCK_SERVERS=redis://...,... build/redlock run bench/semlimit.lua
--
-- Environment: RB_LIMITS ("1 4 64 256 1024"), RB_SECS (1 per limit).
-- Prints one line per limit: cycles/s and the ratio to limit 1's.

local redlock = require "redlock"
local now = require("redlock.cdefs").lib.rl_now_ms

local SECS = tonumber(os.getenv("RB_SECS") or "") or 1
local LIMITS = {}
for l in (os.getenv("RB_LIMITS") or "1 4 64 256 1024"):gmatch("%d+") do LIMITS[#LIMITS + 1] = tonumber(l) end

local dlm = redlock.default()
local base
for _, limit in ipairs(LIMITS) do
    local resource = ("rb:semlimit:%d:%d"):format(limit, math.floor(now()))
    local held = {}
    for i = 1, limit - 1 do held[i] = assert(dlm:try_lock(resource, { limit = limit, ttl = 60000 })) end
    local n, started = 0, now()
    while now() - started < SECS * 1000 do
        local lk = assert(dlm:try_lock(resource, { limit = limit }))
        lk:unlock()
        n = n + 1
    end
    local rate = n / ((now() - started) / 1000)
    base = base or rate
    print(("limit %4d: %6.0f try_lock + unlock /s  (%.2f of limit %d's)"):format(limit, rate, rate / base, LIMITS[1]))
    for _, lk in ipairs(held) do lk:unlock() end
end
dlm:close()
