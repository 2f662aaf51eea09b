-- Spec helper (spec/sanitizers/keeper_close_asan.lua):
--   luajit finalizer_close.lua URLS RESOURCE FUNCTION
-- A client's first keep-alive lock, with a finalizer closing the client at
-- the collection a call hook runs as FUNCTION (a function of redlock.keep
-- or redlock.libev) is entered: one allocation point of that lock's way to
-- its keeper. Prints "closed <bool>" and "lock <ok|error text>".

local ffi = require "ffi"
local redlock = require "redlock"

jit.off() -- the hook sees every call

local urls, resource, target = arg[1], arg[2], arg[3]
local servers = {}
for u in urls:gmatch("[^,]+") do servers[#servers + 1] = u end
local dlm = redlock.new { servers = servers, ttl = 2000 }

local armed, closed = false, false
do -- garbage already: its finalizer closes the client when collected
  ffi.gc(ffi.new("int[1]"), function()
    if armed and not closed then
      closed = true
      dlm:close()
    end
  end)
end
debug.sethook(function()
  if armed then return end
  local info = debug.getinfo(2, "nS")
  local ours = info.source:find("redlock/keep.lua", 1, true) or info.source:find("redlock/libev.lua", 1, true)
  if info.name == target and ours then
    armed = true
    collectgarbage()
  end
end, "c")
local ok, lk = pcall(dlm.lock, dlm, resource, { keepalive = true })
debug.sethook()
print("closed " .. tostring(closed))
print("lock " .. (ok and (lk and "ok" or "nil") or tostring(lk)))
if ok and lk then print("valid " .. tostring(lk:valid())) end
io.stdout:flush()
