-- Closing a client and leaving the process while locks are held or wanted:
-- a kept lock survives the collection of the prefix string it was
-- configured with.

local redlock = require "redlock"
local cluster = require "helpers.cluster"
local proc = require "helpers.proc"

local q = proc.quote
local res = cluster.names("closing") -- res(tag): a resource name no other run uses

local LONG_TTL = 60000
-- "Long before its ttl": generous for a loaded machine, far below LONG_TTL.
local SOON_MS = 10000

-- Run Lua source in a child luajit with this spec's module paths; the
-- arguments are arg[1..]. Return its output (stderr merged) and exit status.
local function child(dir, source, args)
  local script = dir .. "/child.lua"
  proc.write_file(script, source)
  local words = {}
  for i, a in ipairs(args or {}) do words[i] = q(a) end
  return proc.sh(("env LUA_PATH=%s LUA_CPATH=%s luajit %s %s"):format(
    q("spec/?.lua;" .. package.path), q(package.cpath), q(script), table.concat(words, " ")))
end

-- Prelude of every child: servers from arg[2..], the resource in arg[1].
local PRELUDE = [[
local redlock = require "redlock"
local r = arg[1]
local urls = {}
for i = 2, #arg do urls[#urls + 1] = arg[i] end
]]

describe("a kept lock of a client whose prefix was built at run time", function()
  local cl

  lazy_setup(function() cl = cluster.start(3) end)
  lazy_teardown(function() if cl then cl:stop() end end)

  -- Before: the keeper was started from options pointing into the collected
  -- prefix string; its extensions named another key, the lock was reported
  -- lost and unlock() said "not held".
  it("stays held across several ttls after the prefix string is collected", function()
    local tag = tostring(proc.getpid())
    local dlm = redlock.new { servers = cl.urls, prefix = "pfx:" .. tag .. ":" .. ("x"):rep(3) .. ":" }
    for _ = 1, 3 do collectgarbage() end
    local junk = {}
    for i = 1, 20000 do junk[i] = ("junk %d %s"):format(i, ("y"):rep(i % 64)) end
    junk = nil
    for _ = 1, 3 do collectgarbage() end
    for i = 1, 20000 do local _ = ("more junk %d %s"):format(i, ("z"):rep(i % 40)) end

    local r = res("prefixed")
    local lock = assert(dlm:lock(r, { ttl = 300, keepalive = true }))
    for i = 1, 20000 do local _ = ("late junk %d %s"):format(i, ("w"):rep(i % 40)) end
    proc.sleep_ms(1200) -- four ttls
    assert.is_false(lock:lost())
    assert.is_true(lock:valid())
    -- built only now: an equal string alive earlier would have kept the old one
    local key = ("pfx:%s:xxx:"):format(tag) .. r
    assert(cluster.await_value(cl, key, lock.value, 0))
    assert(cluster.await_value(cl, r, nil, 0)) -- nothing without the prefix
    assert.is_true(lock:unlock())
    assert(cluster.await_value(cl, key, nil, 1000))
    dlm:close()
  end)
end)
