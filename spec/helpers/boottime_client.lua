-- Spec helper (run by spec/clock_spec.lua in a time namespace whose
-- CLOCK_BOOTTIME is far ahead of its CLOCK_MONOTONIC):
--   luajit boottime_client.lua URLS RESOURCE
-- prints, one per line:
--   clock <rl_now_ms minus /proc/uptime (the boot time), in ms>
--   run_until <ms rl_run_until took, asked for a deadline 200 ms ahead>
--   kept <valid> <lost> <remaining ms>   after 2.5 s of ttl 1000 kept alive
--   closed <ms dlm:close() took to release the kept lock>

local ffi = require "ffi"
local redlock = require "redlock"
local C = require("redlock.cdefs").lib

local urls, resource = arg[1], arg[2]
local servers = {}
for u in urls:gmatch("[^,]+") do servers[#servers + 1] = u end

local f = assert(io.open("/proc/uptime"))
local uptime_ms = tonumber(f:read("*l"):match("^(%S+)")) * 1000
f:close()
print(("clock %.0f"):format(C.rl_now_ms() - uptime_ms))

local curls = ffi.new("const char *[?]", #servers, servers)
local err = ffi.new("char[256]")
local client = C.rl_client_new(curls, #servers, nil, err, 256)
assert(client ~= nil, ffi.string(err))
local t0 = C.rl_now_ms()
C.rl_run_until(client, t0 + 200)
print(("run_until %.0f"):format(C.rl_now_ms() - t0))
C.rl_client_free(client)

local dlm = redlock.new { servers = servers, ttl = 1000 }
local lk = assert(dlm:lock(resource, { keepalive = true }))
os.execute("sleep 2.5") -- only the keeper's thread runs meanwhile
print(("kept %s %s %.0f"):format(tostring(lk:valid()), tostring(lk:lost()), lk:remaining()))
t0 = C.rl_now_ms()
dlm:close()
print(("closed %.0f"):format(C.rl_now_ms() - t0))
io.stdout:flush()
