-- `luarocks make` installs a module that `require "redlock"` loads with
-- nothing but the target tree on the path: not the checkout's lua/, not build/.

local proc = require "helpers.proc"
local q, sh = proc.quote, proc.sh

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end


-- Loads the module and reports where everything came from.
local PROBE = [[
local redlock = require "redlock"
io.write("module ", package.searchpath("redlock", package.path), "\n")
io.write("lua_version ", tostring(redlock.version or redlock._VERSION), "\n")
local ffi = require "ffi"
local cdefs = require "redlock.cdefs"
local C = cdefs.C or cdefs.lib or cdefs.core or (cdefs.load and cdefs.load())
io.write("c_version ", ffi.string(C.rl_version()), "\n")
for line in io.lines("/proc/self/maps") do
  local path = line:match("%s(/%S*redlock%S*)$")
  if path then io.write("mapped ", path, "\n") end
end
io.write("path ", package.path, "\n", "cpath ", package.cpath, "\n")
]]

describe("luarocks make redlock-scm-1.rockspec", function()
  local tmp, tree

  setup(function()
    tmp = proc.tmpdir()
    tree = tmp .. "/tree"
    assert(os.execute("mkdir -p " .. q(tmp .. "/src") .. " " .. q(tmp .. "/cwd")) == 0)
  end)

  teardown(function()
    proc.rmdir(tmp)
  end)

  it("builds and installs into a tree of its own, offline", function()
    -- Build from a copy of the checkout without its build trees, as a fresh
    -- clone would be.
    local out, rc = sh(("tar --exclude=./.git --exclude='./build*' -cf - . | tar -C %s -xf -")
      :format(q(tmp .. "/src")))
    assert.are.equal(0, rc, out)
    out, rc = sh(("cd %s && timeout 600 luarocks --lua-version=5.1 --tree %s make redlock-scm-1.rockspec")
      :format(q(tmp .. "/src"), q(tree)))
    assert.are.equal(0, rc, "luarocks make failed:\n" .. out)
    for _, file in ipairs { "/share/lua/5.1/redlock/init.lua", "/share/lua/5.1/redlock/cdefs.lua",
                            "/lib/lua/5.1/redlock_core.so" } do
      assert.is_true(exists(tree .. file), "not installed: " .. tree .. file .. "\n" .. out)
    end
  end)

  it("gives a module that loads from that tree alone", function()
    local lpath = tree .. "/share/lua/5.1/?.lua;" .. tree .. "/share/lua/5.1/?/init.lua"
    local cpath = tree .. "/lib/lua/5.1/?.so"
    local f = assert(io.open(tmp .. "/probe.lua", "w"))
    f:write(PROBE)
    f:close()
    -- No ";;" in the paths: LuaJIT's defaults (./?.lua, /usr/...) are left out.
    local out, rc = sh(("cd %s && env -u LUA_INIT LUA_PATH=%s LUA_CPATH=%s luajit %s")
      :format(q(tmp .. "/cwd"), q(lpath), q(cpath), q(tmp .. "/probe.lua")))
    assert.are.equal(0, rc, "require failed:\n" .. out)

    local module = out:match("module (%S+)")
    assert.are.equal(tree .. "/share/lua/5.1/redlock/init.lua", module)
    assert.is_truthy(out:match("c_version %d+%.%d+%.%d+"), out)
    local mapped = 0
    for path in out:gmatch("mapped (%S+)") do
      mapped = mapped + 1
      assert.are.equal(tree .. "/", path:sub(1, #tree + 1), "library loaded from outside the tree: " .. path)
    end
    assert.is_true(mapped > 0, "redlock_core.so not mapped:\n" .. out)
    assert.is_nil(out:find(" [^ \n]*/build/", 1), "the build tree leaked onto the path:\n" .. out)
  end)
end)
