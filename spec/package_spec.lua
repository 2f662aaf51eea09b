-- The packages, tried as their users get them. Run by scripts/test's
-- "packages" stage, which builds them from the checkout (scripts/pack-deb,
-- scripts/pack-rock), installs the Debian package (dpkg -i) and names both:
--
--   REDLOCK_PACKAGE_DEB=build-pkg/redlock_X.Y.Z-1_ARCH.deb   (installed)
--   REDLOCK_PACKAGE_ROCK=build-pkg/redlock-X.Y.Z-1.src.rock
--
-- Without those it is pending: installing a package changes the machine.
-- Everything that uses an installed file runs outside the checkout with
-- LUA_PATH, LUA_CPATH and LUA_INIT unset (or, for the rock, set to its tree
-- alone), and locks against real nodes.

local function env(name)
  local v = os.getenv(name)
  return v ~= "" and v or nil
end
local DEB, ROCK = env("REDLOCK_PACKAGE_DEB"), env("REDLOCK_PACKAGE_ROCK")

if not DEB and not ROCK then
  describe("the packages", function()
    pending("are tried by scripts/test's packages stage (REDLOCK_PACKAGE_DEB, REDLOCK_PACKAGE_ROCK)")
  end)
  return
end

local ffi = require "ffi"
local cluster = require "helpers.cluster"
local nginx = require "helpers.nginx"
local proc = require "helpers.proc"
local q, sh = proc.quote, proc.sh

local VERSION = assert(proc.read_file(proc.root .. "/CMakeLists.txt"))
  :match("\nproject%(redlock VERSION (%d+%.%d+%.%d+)")
local res = cluster.names("package")

if not pcall(ffi.typeof, "rl_pkg_marker") then
  ffi.cdef [[
    typedef struct { int unused; } rl_pkg_marker;
    int rl_pkg_setenv(const char *name, const char *value, int overwrite) asm("setenv");
    int rl_pkg_unsetenv(const char *name) asm("unsetenv");
  ]]
end

local LUA_VARS = { "LUA_PATH", "LUA_CPATH", "LUA_INIT" }

-- f() with LUA_PATH, LUA_CPATH and LUA_INIT unset in this process (so in what
-- it starts, nginx included), put back after.
local function without_lua_env(f)
  local saved = {}
  for _, k in ipairs(LUA_VARS) do
    saved[k] = os.getenv(k)
    ffi.C.rl_pkg_unsetenv(k)
  end
  local ok, err = pcall(f)
  for k, v in pairs(saved) do ffi.C.rl_pkg_setenv(k, v, 1) end
  if not ok then error(err, 0) end
end

local function write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end

-- A LuaJIT script that says where the module and the C core came from, then
-- takes a lock on the nodes in arg (resource arg[1]), finds it busy from a
-- second try, and releases it.
local PROBE = [[
local resource = arg[1]
local urls = { select(2, ...) }
local redlock = require "redlock"
local cdefs = require "redlock.cdefs"
print("module " .. package.searchpath("redlock", package.path))
print("core " .. cdefs.path)
print("version " .. redlock._VERSION .. " " .. redlock.core_version)
local dlm = redlock.new { servers = urls }
local lock, err = dlm:lock(resource, { ttl = 10000, wait = 10000 })
print("lock " .. (lock and "ok" or tostring(err)))
local again, err2 = dlm:try_lock(resource)
print("again " .. (again and "ok" or tostring(err2)))
if lock then print("unlock " .. tostring((lock:unlock()))) end
dlm:close()
]]

local function check_probe(out, module, core)
  assert.are.equal(module, out:match("\nmodule (%S+)") or out:match("^module (%S+)"), out)
  assert.are.equal(core, out:match("\ncore (%S+)"), out)
  assert.are.equal(VERSION .. " " .. VERSION, out:match("\nversion ([^\n]+)"), out)
  assert.are.equal("ok", out:match("\nlock ([^\n]+)"), out)
  assert.are.equal("busy", out:match("\nagain ([^\n]+)"), out)
  assert.are.equal("true", out:match("\nunlock ([^\n]+)"), out)
end

describe("the Debian package", function()
  if not DEB then
    pending("REDLOCK_PACKAGE_DEB is not set")
    return
  end

  local tmp, cl, multiarch

  setup(function()
    tmp = proc.tmpdir()
    cl = cluster.start(3)
    multiarch = assert(sh("dpkg-architecture -qDEB_HOST_MULTIARCH")):match("^(%S+)")
  end)

  teardown(function()
    nginx.stop_all()
    cluster.stop_all()
    proc.rmdir(tmp)
  end)

  it("is installed, at the checkout's version", function()
    local out, rc = sh("dpkg-query -W -f='${Status} ${Version}' redlock")
    assert.are.equal(0, rc, out)
    assert.are.equal("install ok installed " .. VERSION .. "-1", out)
    out = sh("dpkg-deb -f " .. q(DEB) .. " Version")
    assert.are.equal(VERSION .. "-1", out:match("^(%S+)"))
  end)

  it("puts redlock on the PATH, and redlock --version says the version", function()
    local out, rc = sh(("cd %s && env -u LUA_PATH -u LUA_CPATH -u LUA_INIT PATH=/usr/bin:/bin "
      .. "sh -c 'command -v redlock && redlock --version'")
      :format(q(tmp)))
    assert.are.equal(0, rc, out)
    assert.are.equal("/usr/bin/redlock", out:match("^(%S+)\n"), out)
    assert.is_truthy(out:find("\nredlock " .. VERSION .. " ", 1, true), out)
  end)

  it("has redlock(1), which man finds and which renders without a warning", function()
    local out, rc = sh("man -w redlock")
    assert.are.equal(0, rc, out)
    assert.are.equal("/usr/share/man/man1/redlock.1.gz", out:match("^(%S+)"))
    out, rc = sh("gzip -dc /usr/share/man/man1/redlock.1.gz | groff -ww -z -man")
    assert.are.equal(0, rc, out)
    assert.are.equal("", out)
    out = sh("LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings redlock 2>&1 >/dev/null")
    assert.are.equal("", out)
  end)

  it("gives LuaJIT the module and its C core with no path settings, and they lock", function()
    write(tmp .. "/probe.lua", PROBE)
    local out, rc = sh(("cd %s && env -u LUA_PATH -u LUA_CPATH -u LUA_INIT luajit probe.lua %s %s")
      :format(q(tmp), q(res("luajit")), table.concat(cl.urls, " ")))
    assert.are.equal(0, rc, out)
    check_probe("\n" .. out, "/usr/share/lua/5.1/redlock/init.lua",
      "/usr/lib/" .. multiarch .. "/lua/5.1/redlock_core.so")
  end)

  it("gives nginx's lua module the module with no lua_package_path, and a location locks", function()
    local srv
    without_lua_env(function()
      srv = nginx.start {
        init = ([[
          redlock = require "redlock"
          DLM = redlock.new { servers = %s }
        ]]):format(nginx.lua_list(cl.urls)),
        locations = { [[
          location = /lock {
            content_by_lua_block {
              local r = ngx.var.arg_r
              local lock, err = DLM:lock(r, { ttl = 10000, wait = 10000 })
              local again, err2 = DLM:try_lock(r)
              ngx.say("module ", package.searchpath("redlock", package.path))
              ngx.say("core ", require("redlock.cdefs").path)
              ngx.say("version ", redlock._VERSION, " ", redlock.core_version)
              ngx.say("lock ", lock and "ok" or tostring(err))
              ngx.say("again ", again and "ok" or tostring(err2))
              if lock then ngx.say("unlock ", tostring((lock:unlock()))) end
            }
          }]] },
      }
    end)
    local conf = assert(proc.read_file(srv.conf))
    assert.is_nil(conf:find("lua_package", 1, true), conf)
    local status, body = srv:get("/lock?r=" .. res("nginx"))
    assert.are.equal(200, status, tostring(body) .. "\n" .. srv:error_log())
    check_probe("\n" .. body, "/usr/share/lua/5.1/redlock/init.lua",
      "/usr/lib/" .. multiarch .. "/lua/5.1/redlock_core.so")
  end)

  it("builds a C program with pkg-config --cflags --libs redlock that locks", function()
    write(tmp .. "/locker.c", [[
#include <stdio.h>
#include <string.h>
#include <redlock.h>

/* locker RESOURCE URL...: take RESOURCE on the nodes, find it busy from a
 * second try, release it. */
int main(int argc, char **argv) {
    char err[RL_ERR_LEN];
    rl_result r, again;
    if (argc < 3) return 64;
    if (strcmp(rl_version(), RL_VERSION) != 0) {
        fprintf(stderr, "header %s, library %s\n", RL_VERSION, rl_version());
        return 2;
    }
    rl_client *c = rl_client_new((const char *const *)argv + 2, argc - 2, NULL, err, sizeof(err));
    if (c == NULL) {
        fprintf(stderr, "rl_client_new: %s\n", err);
        return 3;
    }
    const char *res = argv[1];
    int got = 0;
    for (int i = 0; i < 100 && !got; i++) {
        got = rl_acquire(c, res, strlen(res), 10000, &r) == RL_OK && r.status == RL_STATUS_OK;
        if (!got) rl_sleep(c, 50);
    }
    printf("version %s\n", rl_version());
    printf("lock %s\n", got ? "ok" : rl_status_word(r.status));
    if (rl_acquire(c, res, strlen(res), 10000, &again) == RL_OK)
        printf("again %s\n", rl_status_word(again.status));
    if (got && rl_release(c, res, strlen(res), r.value, &r) == RL_OK)
        printf("unlock %s\n", rl_status_word(r.status));
    rl_client_free(c);
    return got ? 0 : 1;
}
]])
    local flags, rc = sh("pkg-config --cflags --libs redlock")
    assert.are.equal(0, rc, flags)
    assert.is_truthy(flags:find("-lredlock", 1, true), flags)
    local out
    out, rc = sh(("cd %s && cc -std=c11 -Wall -Wextra -Werror -o locker locker.c $(pkg-config --cflags --libs redlock)")
      :format(q(tmp)))
    assert.are.equal(0, rc, out)
    out = sh(("ldd %s"):format(q(tmp .. "/locker")))
    local major, minor = VERSION:match("^(%d+)%.(%d+)")
    local soname = "libredlock.so." .. major .. "." .. minor
    local found = out:match(soname:gsub("%.", "%%.") .. " => (%S+)")
    assert.is_truthy(found, out)
    -- /lib is /usr/lib on a merged-/usr system: compare where both lead.
    assert.are.equal(sh("readlink -f /usr/lib/" .. multiarch .. "/" .. soname), sh("readlink -f " .. q(found)))
    out, rc = sh(("cd %s && ./locker %s %s"):format(q(tmp), q(res("c")), table.concat(cl.urls, " ")))
    assert.are.equal(0, rc, out)
    assert.are.equal("version " .. VERSION .. "\nlock ok\nagain busy\nunlock ok\n", out)
  end)

  it("has no lintian error", function()
    local out, rc = sh("lintian --fail-on error " .. q(DEB))
    -- Shown in the log, warnings and all.
    io.stdout:write("\nlintian ", DEB, ":\n", out, "\n")
    assert.are.equal(0, rc, out)
    assert.is_nil(out:find("\nE: ") or out:find("^E: "), out)
  end)
end)

describe("the source rock", function()
  if not ROCK then
    pending("REDLOCK_PACKAGE_ROCK is not set")
    return
  end

  local tmp, tree, cl

  setup(function()
    tmp = proc.tmpdir()
    tree = tmp .. "/tree"
    cl = cluster.start(3)
  end)

  teardown(function()
    cluster.stop_all()
    proc.rmdir(tmp)
  end)

  it("holds the release rockspec and the source tarball", function()
    local out, rc = sh("unzip -Z1 " .. q(ROCK))
    assert.are.equal(0, rc, out)
    assert.are.equal(("redlock-%s-1.rockspec\nredlock-%s.tar.gz\n"):format(VERSION, VERSION), out)
    out = sh(("unzip -p %s redlock-%s-1.rockspec"):format(q(ROCK), VERSION))
    assert.are.equal(proc.read_file(("%s/rocks/redlock-%s-1.rockspec"):format(proc.root, VERSION)), out)
  end)

  -- Before: untracked files (a servers file with a password, build logs)
  -- went into the tarball too.
  it("packs the files git tracks, and nothing else", function()
    local listed = sh(("unzip -p %s redlock-%s.tar.gz | tar tzf - | grep -v '/$' | sed 's,^redlock-%s/,,' | sort")
      :format(q(ROCK), VERSION, VERSION))
    local tracked = sh(("cd %s && git ls-files | sort"):format(q(proc.root)))
    assert.are.equal(tracked, listed)
  end)

  it("installs with luarocks into a fresh tree, offline", function()
    local out, rc = sh(("cd %s && env -u LUA_PATH -u LUA_CPATH -u LUA_INIT "
      .. "timeout 600 luarocks --lua-version=5.1 --tree %s install %s")
      :format(q(tmp), q(tree), q(ROCK)))
    assert.are.equal(0, rc, "luarocks install failed:\n" .. out)
    assert.is_truthy(out:find("redlock " .. VERSION .. "-1 is now installed", 1, true), out)
    -- Every file CMake's install step wrote (or found up to date) is in the
    -- tree: before, the docs went to /usr/local/share/doc/redlock.
    local n = 0
    for path in out:gmatch("\n%-%- [%a-]+: (/[^\n]*)") do
      n = n + 1
      assert.are.equal(tree .. "/", path:sub(1, #tree + 1), "installed outside the tree: " .. path)
    end
    assert.is_true(n > 10, "no CMake install lines in the output:\n" .. out)
    out = sh(("luarocks --lua-version=5.1 --tree %s list --porcelain redlock"):format(q(tree)))
    assert.is_truthy(out:find("redlock\t" .. VERSION .. "-1\tinstalled", 1, true), out)
  end)

  it("gives a module that locks from that tree alone", function()
    write(tmp .. "/probe.lua", PROBE)
    local lpath = tree .. "/share/lua/5.1/?.lua;" .. tree .. "/share/lua/5.1/?/init.lua"
    local cpath = tree .. "/lib/lua/5.1/?.so"
    -- No ";;": LuaJIT's default paths (and the Debian package there) are left out.
    local out, rc = sh(("cd %s && env -u LUA_INIT LUA_PATH=%s LUA_CPATH=%s luajit probe.lua %s %s")
      :format(q(tmp), q(lpath), q(cpath), q(res("rock")), table.concat(cl.urls, " ")))
    assert.are.equal(0, rc, out)
    check_probe("\n" .. out, tree .. "/share/lua/5.1/redlock/init.lua", tree .. "/lib/lua/5.1/redlock_core.so")
  end)
end)
