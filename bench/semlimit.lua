-- semlimit.lua — what a semaphore's limit costs: one client, try_lock +
-- unlock of the last free slot of a semaphore whose other L-1 slots are
-- held, for each limit L; every acquire checks each of the L slots on
-- every node (docs/semaphore.md, "Large limits").
--
--   REDLOCK_SERVERS=redis://...,... build/redlock run bench/semlimit.lua
--
-- Environment: RB_LIMITS ("1 4 64 256 1024"), RB_SECS (1 per limit).
-- Prints one line per limit: cycles/s, the ratio to the first limit's, and
-- the first node's time per acquire script (INFO commandstats, read with
-- redis-cli, which comes with redis-server: the EVALs of the limit's run).

local redlock = require "redlock"
local now = require("redlock.cdefs").lib.rl_now_ms

local SECS = tonumber(os.getenv("RB_SECS") or "") or 1
local LIMITS = {}
for l in (os.getenv("RB_LIMITS") or "1 4 64 256 1024"):gmatch("%d+") do LIMITS[#LIMITS + 1] = tonumber(l) end

-- The first node (host, port) of REDLOCK_SERVERS, for redis-cli.
local first = ((os.getenv("REDLOCK_SERVERS") or ""):match("^rediss?://([^,]+)") or "")
local host, port = (first:match("@(.*)$") or first):match("^([^:/]+):(%d+)")

local function cli(args)
    if not host then return "" end
    local p = io.popen(("redis-cli -h %s -p %s %s 2>/dev/null"):format(host, port, args))
    local out = p:read("*a")
    p:close()
    return out
end

local dlm = redlock.default()
local base
for _, limit in ipairs(LIMITS) do
    local resource = ("rb:semlimit:%d:%d"):format(limit, math.floor(now()))
    local held = {}
    for i = 1, limit - 1 do held[i] = assert(dlm:try_lock(resource, { limit = limit, ttl = 60000 })) end
    cli("CONFIG RESETSTAT")
    local n, started = 0, now()
    while now() - started < SECS * 1000 do
        local lk = assert(dlm:try_lock(resource, { limit = limit }))
        lk:unlock()
        n = n + 1
    end
    local rate = n / ((now() - started) / 1000)
    base = base or rate
    local script_us = cli("INFO commandstats"):match("cmdstat_eval:[^\n]*usec_per_call=([%d.]+)")
    print(("limit %4d: %6.0f try_lock + unlock /s  (%.2f of limit %d's)  node 1: %s µs per acquire script"):format(
        limit, rate, rate / base, LIMITS[1], script_us or "?"))
    for _, lk in ipairs(held) do lk:unlock() end
end
dlm:close()
