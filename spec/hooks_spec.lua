-- redlock.hooks, the extension point a host uses instead of replacing the
-- module's functions (docs/lua-api.md, "Extending (hosts)"): acquiring and
-- acquired around every lock call, whatever ends it; sleeping and awake
-- around the retry policy's calls and the sleeps between attempts; defaults for new clients; default()'s
-- servers. The host's own use (signals during acquisitions) is in
-- host_spec.lua and signals_spec.lua.

local redlock = require "redlock"
local cluster = require "helpers.cluster"
local proc = require "helpers.proc"

local q = proc.quote
local res = cluster.names("hooks")

local NONE = { acquiring = false, acquired = false, sleeping = false, awake = false,
               client_defaults = false, default_servers = false }

describe("redlock.hooks", function()
  local cl, dlm, calls

  lazy_setup(function()
    cl = cluster.start(3)
    dlm = redlock.new { servers = cl.urls, ttl = 5000 }
  end)

  lazy_teardown(function()
    redlock.hooks(NONE)
    if dlm then dlm:close() end
    cluster.stop_all()
  end)

  before_each(function()
    calls = {}
    redlock.hooks {
      acquiring = function(d)
        assert.equal(dlm, d)
        calls[#calls + 1] = "acquiring"
      end,
      acquired = function() calls[#calls + 1] = "acquired" end,
      sleeping = function() calls[#calls + 1] = "sleeping" end,
      awake = function() calls[#calls + 1] = "awake" end,
    }
  end)

  after_each(function() redlock.hooks(NONE) end)

  it("calls acquiring and acquired around each lock call, sleeping and awake around its sleeps", function()
    local r = res("busy")
    local held = assert(dlm:try_lock(r, { ttl = 30000 }))
    assert.same({ "acquiring", "acquired" }, calls)
    calls = {}
    -- two attempts with one delay between them, the resource held throughout;
    -- the policy is asked after each (the second time it gives up), between
    -- sleeping and awake as the sleep is
    local function policy(n)
      calls[#calls + 1] = "policy"
      if n < 2 then return 20 end
    end
    local lk, err = dlm:lock(r, { retry = policy })
    assert.is_nil(lk)
    assert.equal("busy", err)
    assert.same({ "acquiring", "sleeping", "policy", "awake", "sleeping", "awake",
      "sleeping", "policy", "awake", "acquired" }, calls)
    calls = {}
    local group = assert(dlm:lock_many { res("m1"), res("m2") })
    assert.same({ "acquiring", "acquired" }, calls)
    assert(group:unlock())
    calls = {}
    assert(held:unlock()) -- unlock is no acquisition
    assert.same({}, calls)
  end)

  it("calls acquired when the call raises, and the error passes on at the caller's line", function()
    local line = debug.getinfo(1, "l").currentline + 1
    local ok, e = pcall(function() dlm:lock(nil) end)
    assert.is_false(ok)
    assert.truthy(tostring(e):find("hooks_spec.lua:" .. line .. ": bad argument #1 to 'lock'", 1, true), e)
    assert.same({ "acquiring", "acquired" }, calls)
    calls = {}
    ok, e = pcall(dlm.with_lock, dlm, res("w"), nil, function() error("inside") end)
    assert.is_false(ok)
    assert.truthy(tostring(e):find("inside", 1, true), e)
    assert.same({ "acquiring", "acquired" }, calls) -- with_lock's lock
  end)

  -- Before: the caller got the hook's error and the lock stayed on the
  -- nodes with no handle to it (kept alive, too, until collected).
  it("releases what the call took when acquired raises, and passes its error on", function()
    local r = res("hook_raises")
    redlock.hooks { acquired = function() error("hook says no", 0) end }
    for _, kept in ipairs { false, true } do
      local ok, e = pcall(dlm.try_lock, dlm, r, { ttl = 30000, keepalive = kept })
      assert.is_false(ok)
      assert.are.equal("hook says no", e)
      assert(cluster.await_value(cl, r, nil, 1000), "the lock is left on the nodes")
    end
    local ok, e = pcall(dlm.lock_many, dlm, { r, res("hook_raises2") })
    assert.is_false(ok)
    assert.are.equal("hook says no", e)
    assert(cluster.await_value(cl, r, nil, 1000), "lock_many's lock is left on the nodes")
  end)

  it("leaves the others as they are when a call names some, and false removes one", function()
    local r = res("busy2")
    local held = assert(dlm:try_lock(r, { ttl = 30000 }))
    redlock.hooks { sleeping = false }
    calls = {}
    assert.is_nil(dlm:lock(r, { retry = redlock.retry.fixed(20, 2) }))
    assert.same({ "acquiring", "awake", "awake", "awake", "acquired" }, calls) -- policy, sleep, policy
    assert(held:unlock())
  end)

  it("fills client_defaults where new() is not given them, and never changes the caller's table", function()
    redlock.hooks { client_defaults = { keepalive = true } }
    local o = { servers = cl.urls }
    local a = redlock.new(o)
    assert.is_nil(o.keepalive)
    assert.is_true(a.keepalive)
    local b = redlock.new { servers = cl.urls, keepalive = false }
    assert.is_false(b.keepalive)
    redlock.hooks { client_defaults = false }
    local c = redlock.new { servers = cl.urls }
    assert.is_false(c.keepalive)
    a:close(); b:close(); c:close()
  end)

  it("raises at the caller for what it cannot take", function()
    local cases = {
      { 7, "bad argument #1 to 'hooks' (table expected, got 7)" },
      { { acquiring = 1 }, "bad argument #1 to 'hooks' (acquiring must be a function or false, got 1)" },
      { { acuiring = print }, "bad argument #1 to 'hooks' (unknown hook 'acuiring')" },
      { { client_defaults = true }, "bad argument #1 to 'hooks' (client_defaults must be a table or false, got boolean true)" },
      { { client_defaults = { ttl = 0 } },
        "bad argument #1 to 'hooks' (ttl must be a whole number of ms from 1 to 2147483647, got 0)" },
      { { client_defaults = { keepalive = "yes" } }, "bad argument #1 to 'hooks' (keepalive must be a boolean" },
    }
    for _, case in ipairs(cases) do
      local line = debug.getinfo(1, "l").currentline + 1
      local ok, e = pcall(function() redlock.hooks(case[1]) end)
      assert.is_false(ok)
      assert.truthy(tostring(e):find("hooks_spec.lua:" .. line .. ": " .. case[2], 1, true), e)
    end
    -- a refused call installed nothing
    assert(dlm:try_lock(res("after"))):unlock()
    assert.same({ "acquiring", "acquired" }, calls)
  end)

  it("gives redlock.default() its servers with default_servers (a fresh process)", function()
    local dir = proc.tmpdir()
    local script = dir .. "/child.lua"
    proc.write_file(script, [[
local redlock = require "redlock"
local urls = { ... }
redlock.hooks { default_servers = function() return urls end, client_defaults = { keepalive = true } }
local d = redlock.default()
io.write("nodes ", #d:nodes(), " keepalive ", tostring(d.keepalive), "\n")
d:close()
]])
    local out, rc = proc.sh(("env -u REDLOCK_SERVERS LUA_PATH=%s LUA_CPATH=%s luajit %s %s"):format(
      q(package.path), q(package.cpath), q(script), table.concat({ q(cl.urls[1]), q(cl.urls[2]), q(cl.urls[3]) }, " ")))
    proc.rmdir(dir)
    assert.truthy(out:find("nodes 3 keepalive true", 1, true), out)
    assert.equal(0, rc, out)
  end)
end)
