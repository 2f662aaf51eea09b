-- `luarocks make` installs a module that `require "redlock"` loads with
-- nothing but the target tree on the path: not the checkout's lua/, not build/;
-- it writes nothing outside that tree, and `luarocks remove` takes it all away.
-- `cmake --install` of the build tree puts the host, the modules, the C
-- library and a man page that renders cleanly under any prefix, with each
-- command's usage line. (The
-- packages made from the checkout are tried by spec/package_spec.lua.)

local proc = require "helpers.proc"
local q, sh = proc.quote, proc.sh

local function exists(path)
  local f = io.open(path, "rb")
  if f then f:close() end
  return f ~= nil
end

-- Every Lua module of the checkout, as a path under share/lua/5.1 (the
-- transports' modules in subdirectories included: redlock/nginx/...).
local function lua_modules()
  local list = {}
  local out = sh(("cd %s/lua && find redlock -name '*.lua' | sort"):format(q(proc.root)))
  for path in out:gmatch("[^\n]+") do list[#list + 1] = "/share/lua/5.1/" .. path end
  assert(#list > 10, out)
  return list
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
  local installed = {} -- what CMake's install step wrote, as its output names it

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
    for _, file in ipairs(lua_modules()) do
      assert.is_true(exists(tree .. file), "not installed: " .. tree .. file)
    end
    -- Nothing outside the tree: every file CMake's install step wrote (or
    -- found up to date) is under it. Before, the docs went to
    -- /usr/local/share/doc/redlock: a user without root could not install
    -- the rock at all, and `luarocks remove` left them behind.
    for path in out:gmatch("\n%-%- [%a-]+: (/[^\n]*)") do installed[#installed + 1] = path end
    assert.is_true(#installed > #lua_modules(), "no CMake install lines in the output:\n" .. out)
    for _, path in ipairs(installed) do
      assert.are.equal(tree .. "/", path:sub(1, #tree + 1), "installed outside the tree: " .. path)
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

  it("is removed by luarocks remove, leaving no file of its own", function()
    local out, rc = sh(("timeout 120 luarocks --lua-version=5.1 --tree %s remove redlock"):format(q(tree)))
    assert.are.equal(0, rc, "luarocks remove failed:\n" .. out)
    out = sh(("find %s -name '*redlock*'"):format(q(tree)))
    assert.are.equal("", out)
    assert.is_true(#installed > 0)
    for _, path in ipairs(installed) do
      assert.is_false(exists(path), "left behind: " .. path)
    end
  end)
end)

describe("cmake --install", function()
  local tmp, prefix
  local VERSION = assert(proc.read_file(proc.root .. "/CMakeLists.txt"))
    :match("\nproject%(redlock VERSION (%d+%.%d+%.%d+)")
  local major, minor = VERSION:match("^(%d+)%.(%d+)")

  setup(function()
    tmp = proc.tmpdir()
    prefix = tmp .. "/prefix"
  end)

  teardown(function()
    proc.rmdir(tmp)
  end)

  it("installs the host, the modules, the C library, redlock.pc and the man page under a prefix", function()
    local out, rc = sh(("cmake --install %s --prefix %s"):format(q(proc.build), q(prefix)))
    assert.are.equal(0, rc, "cmake --install failed:\n" .. out)
    -- The build tree's own layout (prefix /usr/local at configure time: lib/, not lib/<triplet>/).
    local libdir = exists(prefix .. "/lib/libredlock.so") and "/lib" or
      ("/" .. assert(out:match("/prefix/(lib/[^/\n]*)/libredlock%.so"), out))
    for _, file in ipairs { "/bin/redlock", "/share/lua/5.1/redlock/init.lua", "/share/man/man1/redlock.1.gz",
                            "/include/redlock.h", libdir .. "/libredlock.so",
                            libdir .. "/libredlock.so." .. major .. "." .. minor,
                            libdir .. "/pkgconfig/redlock.pc",
                            "/share/doc/redlock/LICENSE", "/share/doc/redlock/CHANGELOG.md",
                            "/share/doc/redlock/README.md" } do
      assert.is_true(exists(prefix .. file), "not installed: " .. file .. "\n" .. out)
    end
    for _, file in ipairs(lua_modules()) do
      assert.is_true(exists(prefix .. file), "not installed: " .. file)
    end
    -- README's links to the pages hold where they are installed
    -- (before: the pages were installed beside README, not in docs/).
    local readme = proc.read_file(prefix .. "/share/doc/redlock/README.md")
    local linked = 0
    for page in readme:gmatch("%]%((docs/[%w%-]+%.md)") do
      linked = linked + 1
      assert.is_true(exists(prefix .. "/share/doc/redlock/" .. page), "README links to " .. page .. ", not installed")
    end
    assert.is_true(linked >= 5, "README links to " .. linked .. " pages")
    -- Debian's doc files are the package's alone.
    assert.is_false(exists(prefix .. "/share/doc/redlock/copyright"))
    assert.is_false(exists(prefix .. "/share/doc/redlock/changelog.Debian.gz"))
  end)

  it("gives a host that finds its modules from any directory", function()
    local out, rc = sh(("cd %s && env -u LUA_PATH -u LUA_CPATH %s --version")
      :format(q(tmp), q(prefix .. "/bin/redlock")))
    assert.are.equal(0, rc, out)
    assert.is_truthy(out:find("redlock " .. VERSION .. " ", 1, true), out)
  end)

  describe("a man page, redlock(1),", function()
    local page
    setup(function()
      page = sh(("gzip -dc %s"):format(q(prefix .. "/share/man/man1/redlock.1.gz")))
      local f = assert(io.open(tmp .. "/redlock.1", "w"))
      f:write(page)
      f:close()
    end)

    it("that renders without a warning", function()
      local out, rc = sh(("groff -ww -z -man %s"):format(q(tmp .. "/redlock.1")))
      assert.are.equal(0, rc, out)
      assert.are.equal("", out)
      out, rc = sh(("LC_ALL=C.UTF-8 MANWIDTH=80 man --warnings -E UTF-8 -l %s >/dev/null"):format(q(tmp .. "/redlock.1")))
      assert.are.equal(0, rc, out)
      assert.are.equal("", out)
    end)

    -- Before: the URL line's continuation was a paragraph of its own,
    -- hanging under --servers-file.
    it("that keeps the server URL forms in one item", function()
      assert.matches("\n.TP\nURL:\nredis://[^\n]*\nfor TLS [^\n]*\nunix:///", page)
    end)

    it("with a section for every command of redlock --help", function()
      local help = sh(q(proc.build .. "/redlock") .. " --help")
      local block = assert(help:match("\nCommands:\n(.-)\n\n"), help)
      local n = 0
      for line in ("\n" .. block):gmatch("\n([^\n]*)") do
        local cmd = line:match("^  ([a-z][a-z-]*)")
        if cmd then
          n = n + 1
          assert.is_truthy(page:find("\n.SH \"?REDLOCK " .. cmd:upper()), "no section for " .. cmd)
          -- Every flag its own --help names.
          local opts = sh(q(proc.build .. "/redlock") .. " " .. cmd .. " --help")
          for flag in opts:gmatch("%-%-([a-z][a-z-]+)") do
            local roff = "\\-\\-" .. flag:gsub("%-", "\\-")
            assert.is_truthy(page:find(roff, 1, true), cmd .. ": --" .. flag .. " missing")
          end
        end
      end
      assert.is_true(n >= 3, block)
    end)

    -- The commands of `redlock --help`, each with its own --help text.
    local function commands()
      local help = sh(q(proc.build .. "/redlock") .. " --help")
      local list = {}
      for line in assert(help:match("\nCommands:\n(.-)\n\n"), help):gmatch("[^\n]+") do
        local cmd, args = line:match("^  ([a-z][a-z-]*) ?(.-)  ")
        if cmd then
          list[#list + 1] = { name = cmd, args = args, help = sh(q(proc.build .. "/redlock") .. " " .. cmd .. " --help") }
        end
      end
      assert.is_true(#list >= 3, help)
      return list
    end

    -- Before: only the text after each command's usage line was kept, so
    -- the page's one synopsis of status was "status RESOURCE".
    -- The page as plain text, a paragraph a line, blanks squeezed.
    local function text()
      local out, rc = sh(("LC_ALL=C MANWIDTH=1000 man -E ascii -l %s | col -b"):format(q(tmp .. "/redlock.1")))
      assert.are.equal(0, rc, out)
      return (out:gsub("[ \t]+", " "))
    end

    it("with each command's usage line in its section", function()
      local out = text()
      for _, cmd in ipairs(commands()) do
        local usage = assert(cmd.help:match("^Usage: (redlock [^\n]+)"), cmd.help):gsub("%s+", " ")
        local section = assert(out:match("\nREDLOCK " .. cmd.name:upper() .. "\n(.-)\n%u"), cmd.name .. ":\n" .. out)
        assert.is_truthy(section:find(usage, 1, true), cmd.name .. ": no '" .. usage .. "' in\n" .. section)
      end
    end)

    it("whose list of commands makes optional what each command's usage does", function()
      for _, cmd in ipairs(commands()) do
        local usage = cmd.help:match("^Usage: [^\n]+")
        for optional in usage:gmatch("%[([^%]]+)%]") do
          if cmd.args:find(optional, 1, true) then
            assert.is_truthy(cmd.args:find("[" .. optional .. "]", 1, true),
              ("redlock --help has '%s %s', its usage '%s'"):format(cmd.name, cmd.args, usage))
          end
        end
      end
    end)

    -- Before: help2man took run's description apart: its first sentence
    -- ("... Inside it:") became a heading (.SS), the lines of its example
    -- with a "-- comment" options (.TP), each "--" a bold flag.
    it("with each command's description as prose, no line of it taken for a heading or an option", function()
      local headings = { SYNOPSIS = "", DESCRIPTION = "", OPTIONS = "options", ["\"Exit status:\""] = "list" }
      for _, cmd in ipairs(commands()) do
        local section = assert(page:match("\n%.SH \"REDLOCK " .. cmd.name:upper() .. "\"\n(.-)\n%.SH "),
          "no section for " .. cmd.name)
        local heading = "(none)"
        for line in section:gmatch("[^\n]+") do
          local ss = line:match("^%.SS (.*)$")
          if ss then
            heading = ss
            local kind = headings[ss] or (ss:match('^"Options.*:"$') and "options")
            assert.is_truthy(kind, cmd.name .. ": a line taken for a heading: .SS " .. ss)
          elseif line == ".TP" then
            local kind = headings[heading] or (heading:match('^"Options.*:"$') and "options")
            assert.is_truthy(kind and kind ~= "", cmd.name .. ": a line under " .. heading .. " taken for an option (.TP)")
          end
          assert.is_nil(line:find("\\fB\\-\\-\\fR", 1, true), cmd.name .. ": a lone -- taken for a flag: " .. line)
        end
      end
    end)

    -- Before: "--insecure; or REDLOCK_CACERT, ..." began a line of the TLS
    -- sentence in redlock --help, and help2man made it an option (.HP),
    -- outdented, cutting the sentence in three paragraphs.
    it("with no line of a help text taken for an option", function()
      local line = page:match("\n%.HP\n([^\n]*)")
      assert.is_nil(line, "a sentence's line taken for an option: " .. tostring(line))
      local tls = assert(text():match("[^\n]*%-%-cacert FILE, %-%-cacertdir[^\n]*"), page)
      assert.is_truthy(tls:find("(the flags win)", 1, true), "the TLS sentence is cut: " .. tls)
    end)
  end)
end)
