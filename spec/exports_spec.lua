-- Only the public API is exported (docs/c-api.md). The rl_* symbols in the
-- dynamic symbol table of redlock_core.so and libredlock.so are exactly the functions
-- core/include/redlock.h declares; the host executable exports those and the
-- rl_host_* functions the Lua side declares for the FFI, nothing else named
-- rl_*. Internals (rl_node_*, rl_round_*, the script texts, ...) stay inside.

local proc = require "helpers.proc"

local ROOT = io.popen("pwd"):read("*l")
local HOST = os.getenv("REDLOCK_HOST") or (ROOT .. "/build/redlock")
if HOST:sub(1, 1) ~= "/" then HOST = ROOT .. "/" .. HOST end

local function read(path)
  return assert(proc.read_file(path), "cannot read " .. path)
end

--- The functions a C header declares whose names start with rl_.
local function header_functions(path)
  local text = read(path):gsub("/%*.-%*/", " "):gsub("//[^\n]*", " ")
  local names = {}
  for name in text:gmatch("([%a_][%w_]*)%s*%(") do
    if name:match("^rl_") then names[name] = true end
  end
  return names
end

--- The rl_host_* functions that ffi.cdef strings under lua/ declare by their
-- own name (declarations renamed with asm("...") reach other symbols).
local function ffi_host_functions()
  local names = {}
  local p = assert(io.popen("find lua -name '*.lua' | sort"))
  for file in p:lines() do
    local text = read(file)
    for _, body in text:gmatch("ffi%.cdef%s*%(?%s*%[(=*)%[(.-)%]%1%]") do
      for decl in body:gmatch("[^;]+") do
        local name = decl:match("(rl_host_[%w_]+)%s*%(")
        if name and not decl:find("asm%s*%(") then names[name] = true end
      end
    end
  end
  p:close()
  return names
end

--- The defined dynamic symbols of an ELF file: { name = type letter }.
local function exported(file)
  assert(io.open(file, "rb"), file .. " is not built (cmake -S . -B build && cmake --build build)"):close()
  local out, rc = proc.sh("nm -D --defined-only " .. proc.quote(file))
  assert(rc == 0, "nm failed: " .. out)
  local syms = {}
  for kind, name in out:gmatch("%x*%s+(%a)%s+(%S+)") do
    syms[name:gsub("@.*", "")] = kind
  end
  return syms
end

local function sorted_keys(t, pred)
  local list = {}
  for k in pairs(t) do
    if not pred or pred(k) then list[#list + 1] = k end
  end
  table.sort(list)
  return list
end

local function is_rl(name) return name:match("^rl_") ~= nil end

describe("exported symbols", function()
  local api = header_functions("core/include/redlock.h")
  local ffi_host = ffi_host_functions()

  it("the header reader found the API", function()
    -- Guards the checks below against comparing nothing.
    assert.is_true(api.rl_client_new)
    assert.is_true(api.rl_keeper_release_all)
    assert.is_true(#sorted_keys(api) >= 20)
    assert.is_true(ffi_host.rl_host_spawn)
    assert.is_nil(ffi_host.rl_host_redisFree) -- an asm("...") alias
  end)

  -- The Lua module's redlock_core.so and the C programs' libredlock.so: one
  -- set of objects, linked twice.
  local function library(name, path)
    describe("of " .. name, function()
      local syms

      setup(function() syms = exported(path()) end)

      it("include every function of redlock.h", function()
        assert.are.same({}, sorted_keys(api, function(n) return not syms[n] end))
      end)

      it("include no other rl_* symbol", function()
        assert.are.same({}, sorted_keys(syms, function(n) return is_rl(n) and not api[n] end))
      end)

      it("include nothing else but linker markers", function()
        local markers = { _init = true, _fini = true, _edata = true, _end = true, __bss_start = true }
        assert.are.same({}, sorted_keys(syms, function(n) return not is_rl(n) and not markers[n] end))
      end)
    end)
  end

  library("redlock_core.so", function()
    local path = require("redlock.cdefs").path
    return path:match("%.so$") and path or (ROOT .. "/build/redlock_core.so")
  end)
  library("libredlock.so", function() return ROOT .. "/build/libredlock.so" end)

  describe("of the redlock host executable", function()
    local syms

    setup(function() syms = exported(HOST) end)

    it("include every function of redlock.h", function()
      assert.are.same({}, sorted_keys(api, function(n) return not syms[n] end))
    end)

    it("include every rl_host_* function the Lua side declares for the FFI", function()
      assert.are.same({}, sorted_keys(ffi_host, function(n) return not syms[n] end))
    end)

    it("include no other rl_* symbol", function()
      assert.are.same({}, sorted_keys(syms, function(n)
        return is_rl(n) and not api[n] and not ffi_host[n]
      end))
    end)
  end)
end)
