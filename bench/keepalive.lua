-- keepalive.lua — 10,000 locks held by one process while the host's keep-alive
-- thread extends them: resident memory and keep-alive CPU.
--
--   REDLOCK_SERVERS=redis://...,... build/redlock run bench/keepalive.lua
--
-- Environment: RB_KA_LOCKS (10000), RB_TTL_MS (10000: the Lua default; the
-- keeper extends every ttl/3), RB_KA_SECS (30: the measuring window),
-- RB_PIDDIR / RB_CLK_TCK (server CPU, as in the peers harness), RB_LABEL.
-- The main thread sleeps in poll(2) during the window, so every CPU tick the
-- process spends there is the keep-alive thread's. Prints one JSON line.

local ffi = require "ffi"
local redlock = require "redlock"
local C = require("redlock.cdefs").lib

ffi.cdef [[
int rb_ka_poll(void *fds, unsigned long nfds, int timeout) asm("poll");
]]

local function envn(k, d) local v = os.getenv(k); return (v and v ~= "") and tonumber(v) or d end
local NLOCKS, TTL, SECS = envn("RB_KA_LOCKS", 10000), envn("RB_TTL_MS", 10000), envn("RB_KA_SECS", 30)
local CLK = envn("RB_CLK_TCK", 100)

local function read(path)
    local f = io.open(path); if not f then return nil end
    local s = f:read("*a"); f:close(); return s
end
local function stat_ticks(path) -- utime + stime of a /proc/.../stat
    local s = read(path); if not s then return 0 end
    local f = {}
    for w in s:match("%) (.*)$"):gmatch("%S+") do f[#f + 1] = w end
    return tonumber(f[12]) + tonumber(f[13])
end
local function status_kb(field) return tonumber((read("/proc/self/status") or ""):match(field .. ":%s*(%d+)")) end
local function self_cpu_ms() return stat_ticks("/proc/self/stat") * 1000 / CLK end
local srv = {}
local piddir = os.getenv("RB_PIDDIR")
if piddir then
    local p = io.popen("ls " .. piddir .. " 2>/dev/null")
    for f in p:lines() do if f:match("^redis%-%d+%.pid$") then srv[#srv + 1] = tonumber(read(piddir .. "/" .. f)) end end
    p:close()
end
local function srv_cpu_ms()
    local t = 0
    for _, pid in ipairs(srv) do t = t + stat_ticks("/proc/" .. pid .. "/stat") end
    return t * 1000 / CLK
end
local function sleep_ms(ms) ffi.C.rb_ka_poll(nil, 0, ms) end

local dlm = redlock.default()
assert(dlm.keepalive, "keep-alive is not on: run this under the redlock host (build/redlock run ...)")
C.rl_sleep(dlm.client, 100)
local rss_before = status_kb("VmRSS")

local prefix = ("rb:%s:%d:ka:"):format(os.getenv("RB_LABEL") or "redlock-keepalive",
    tonumber(read("/proc/self/stat"):match("^(%d+)")))
local locks = {}
local t_acq = C.rl_now_ms()
for i = 1, NLOCKS do
    local lk, err = dlm:lock(prefix .. i, { ttl = TTL })
    if not lk then error("lock " .. i .. ": " .. tostring(err)) end
    locks[i] = lk
end
t_acq = C.rl_now_ms() - t_acq
collectgarbage(); collectgarbage()
sleep_ms(2000) -- settle: the first extensions start ttl/3 after each acquisition

local c0, s0, t0 = self_cpu_ms(), srv_cpu_ms(), C.rl_now_ms()
sleep_ms(SECS * 1000)
local c1, s1, t1 = self_cpu_ms(), srv_cpu_ms(), C.rl_now_ms()
local rss, hwm = status_kb("VmRSS"), status_kb("VmHWM")

local lost = 0
for i = 1, NLOCKS do if not locks[i]:valid() then lost = lost + 1 end end
local secs = (t1 - t0) / 1e3
local extends = NLOCKS * secs / (TTL / 3e3)
local t_rel = C.rl_now_ms()
for i = 1, NLOCKS do locks[i]:unlock() end
t_rel = C.rl_now_ms() - t_rel

io.stdout:write(("{\"peer\":\"redlock-keepalive\",\"impl\":\"redlock %s host (%s)\",\"nodes\":%d,\"workload\":\"keepalive\","
    .. "\"locks\":%d,\"ttl_ms\":%d,\"secs\":%.1f,\"rss_mb\":%.1f,\"rss_before_mb\":%.1f,\"hwm_mb\":%.1f,"
    .. "\"keepalive_cpu_pct\":%.2f,\"srv_cpu_pct\":%.1f,\"extends_per_s\":%.0f,\"keepalive_us_per_extend\":%.1f,"
    .. "\"lost\":%d,\"acquire_s\":%.2f,\"release_s\":%.2f}\n"):format(
    redlock._VERSION, jit.version, #dlm:nodes(), NLOCKS, TTL, secs, rss / 1024, rss_before / 1024, hwm / 1024,
    (c1 - c0) / (t1 - t0) * 100, (s1 - s0) / (t1 - t0) * 100, extends / secs, (c1 - c0) * 1e3 / extends,
    lost, t_acq / 1e3, t_rel / 1e3))
return 0
