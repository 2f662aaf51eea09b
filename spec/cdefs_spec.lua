-- The FFI declarations in lua/redlock/cdefs.lua must mirror
-- core/include/redlock.h: every function, struct, typedef and enum constant,
-- with the same types, and the same layout as the C compiler gives them.

local ffi = require "ffi"
local proc = require "helpers.proc"

local HEADER = "core/include/redlock.h"
local CDEFS_FILE = "lua/redlock/cdefs.lua"

local function read(path)
  return assert(proc.read_file(path), "cannot read " .. path)
end

----------------------------------------------------------------------------
-- A small C declaration reader: enough for a header written for the FFI
-- (plain declarations, no macros in prototypes, no varargs).
----------------------------------------------------------------------------

-- Run the preprocessor conditionals we need (#ifndef/#ifdef/#else/#endif,
-- nothing defined but what the file defines: __cplusplus is not) and collect
-- object-like #defines. Returns the surviving text and { NAME = "value" }.
local function preprocess(src)
  src = src:gsub("/%*.-%*/", " "):gsub("//[^\n]*", " ")
  local defined, defines, out, stack = {}, {}, {}, {}
  local function active()
    for _, v in ipairs(stack) do if not v then return false end end
    return true
  end
  for line in (src .. "\n"):gmatch("([^\n]*)\n") do
    local directive, rest = line:match("^%s*#%s*(%a+)%s*(.-)%s*$")
    if directive == "ifndef" then
      stack[#stack + 1] = not defined[rest]
    elseif directive == "ifdef" then
      stack[#stack + 1] = defined[rest] or false
    elseif directive == "else" then
      stack[#stack] = not stack[#stack]
    elseif directive == "endif" then
      stack[#stack] = nil
    elseif directive == "define" then
      if active() then
        local name, value = rest:match("^([%w_]+)%s*(.-)$")
        defined[name] = true
        if value ~= "" then defines[name] = value end
      end
    elseif directive then
      if active() and directive ~= "include" then
        error("unexpected preprocessor directive in header: " .. line)
      end
    elseif active() then
      out[#out + 1] = line
    end
  end
  return table.concat(out, "\n"), defines
end

local function tokenize(src)
  local toks, i = {}, 1
  while i <= #src do
    local s, e = src:find("^%s+", i)
    if s then
      i = e + 1
    else
      local tok = src:match("^[%a_][%w_]*", i) or src:match("^%d[%w%.]*", i)
        or src:match('^"[^"]*"', i) or src:match("^%.%.%.", i) or src:sub(i, i)
      toks[#toks + 1] = tok
      i = i + #tok
    end
  end
  return toks
end

-- Split a token list into top-level declarations (ended by ';' outside braces).
local function declarations(toks)
  local decls, cur, depth = {}, {}, 0
  for _, t in ipairs(toks) do
    if t == "{" then depth = depth + 1 elseif t == "}" then depth = depth - 1 end
    if t == ";" and depth == 0 then
      if #cur > 0 then decls[#decls + 1] = cur end
      cur = {}
    else
      cur[#cur + 1] = t
    end
  end
  assert(#cur == 0, "unterminated declaration: " .. table.concat(cur, " "))
  return decls
end

local function slice(t, a, b)
  local r = {}
  for k = a, b or #t do r[#r + 1] = t[k] end
  return r
end

local function is_ident(t) return t:match("^[%a_][%w_]*$") ~= nil end

-- Evaluate a constant expression of numbers, known names, + - * ( ).
local function evaluate(toks, consts)
  local parts = {}
  for _, t in ipairs(toks) do
    if is_ident(t) then
      local v = consts[t]
      if v == nil then return nil, "unknown constant " .. t end
      parts[#parts + 1] = "(" .. tostring(v) .. ")"
    elseif t:match("^%d") then
      parts[#parts + 1] = (t:gsub("[uUlL]+$", ""))
    elseif t:match("^[-+*/()]$") then
      parts[#parts + 1] = t
    else
      return nil, "cannot evaluate " .. table.concat(toks, " ")
    end
  end
  local f = loadstring("return " .. table.concat(parts, " "))
  local ok, v = pcall(f)
  if not ok or type(v) ~= "number" then return nil, "cannot evaluate " .. table.concat(toks, " ") end
  return v
end

local BUILTIN_TYPES = {
  void = true, char = true, short = true, int = true, long = true, float = true,
  double = true, signed = true, unsigned = true, const = true, volatile = true,
  struct = true, enum = true, union = true, size_t = true, ssize_t = true,
  int8_t = true, int16_t = true, int32_t = true, int64_t = true, uint8_t = true,
  uint16_t = true, uint32_t = true, uint64_t = true, bool = true, _Bool = true,
}

-- Split "type tokens ... name [dims]" into the type and the name; array
-- dimensions are evaluated so that [RL_ERR_LEN] and [256] compare equal.
local function declarator(toks, consts, typenames)
  local dims = {}
  while toks[#toks] == "]" do
    local open
    for k = #toks, 1, -1 do if toks[k] == "[" then open = k break end end
    local v, err = evaluate(slice(toks, open + 1, #toks - 1), consts)
    table.insert(dims, 1, v or ("?" .. err))
    toks = slice(toks, 1, open - 1)
  end
  local name
  local last = toks[#toks]
  if #toks > 1 and is_ident(last) and not BUILTIN_TYPES[last] and not typenames[last]
     and toks[#toks - 1] ~= "struct" and toks[#toks - 1] ~= "enum" then
    name = last
    toks = slice(toks, 1, #toks - 1)
  end
  local ty = table.concat(toks, " ")
  for _, d in ipairs(dims) do ty = ty .. "[" .. tostring(d) .. "]" end
  return ty, name
end

-- Parse C declarations into { functions, structs, typedefs, consts, order }.
-- consts_in: constants known before parsing (the header's #defines).
local function parse(src, consts_in)
  local model = { functions = {}, structs = {}, typedefs = {}, enums = {}, consts = {} }
  local consts = setmetatable({}, { __index = consts_in })
  local typenames = {}
  -- First pass: typedef names, so unnamed parameters are told from names.
  local decls = declarations(tokenize(src))
  for _, d in ipairs(decls) do
    if d[1] == "typedef" then typenames[d[#d]] = true end
  end
  for _, d in ipairs(decls) do
    if d[1] == "enum" and d[2] == "{" then
      local k, value = 3, -1
      while d[k] ~= "}" do
        local name = d[k]
        local j = k + 1
        if d[j] == "=" then
          local e = j + 1
          while d[e] ~= "," and d[e] ~= "}" do e = e + 1 end
          value = assert(evaluate(slice(d, j + 1, e - 1), consts))
          j = e
        else
          value = value + 1
        end
        model.enums[name] = value
        consts[name] = value
        k = (d[j] == ",") and j + 1 or j
      end
    elseif d[1] == "static" and d[2] == "const" then
      -- static const int NAME = value;  (LuaJIT's way to declare a constant)
      local eq
      for k = 1, #d do if d[k] == "=" then eq = k break end end
      local name = d[eq - 1]
      local v = assert(evaluate(slice(d, eq + 1), consts))
      model.consts[name] = v
      consts[name] = v
    elseif d[1] == "typedef" and d[2] == "struct" and d[4] == "{" then
      local fields = {}
      local close
      for k = #d, 1, -1 do if d[k] == "}" then close = k break end end
      local body = slice(d, 5, close - 1)
      for _, f in ipairs(declarations(body)) do
        local ty, name = declarator(f, consts, typenames)
        fields[#fields + 1] = { name = name, type = ty }
      end
      model.structs[d[#d]] = { tag = d[3], fields = fields }
      model.typedefs[d[#d]] = "struct " .. d[3]
    elseif d[1] == "typedef" then
      local ty = declarator(slice(d, 2), consts, typenames)
      model.typedefs[d[#d]] = ty:gsub(" " .. d[#d] .. "$", "")
    else
      local open
      for k = 1, #d do if d[k] == "(" then open = k break end end
      assert(open and d[#d] == ")", "not a declaration this spec knows: " .. table.concat(d, " "))
      local name = d[open - 1]
      local ret = table.concat(slice(d, 1, open - 2), " ")
      local params, cur, depth = {}, {}, 0
      for k = open + 1, #d - 1 do
        local t = d[k]
        if t == "(" then depth = depth + 1 elseif t == ")" then depth = depth - 1 end
        if t == "," and depth == 0 then
          params[#params + 1] = (declarator(cur, consts, typenames))
          cur = {}
        else
          cur[#cur + 1] = t
        end
      end
      if #cur > 0 then params[#params + 1] = (declarator(cur, consts, typenames)) end
      model.functions[name] = ret .. " " .. name .. "(" .. table.concat(params, ", ") .. ")"
    end
  end
  return model
end

-- The cdef text of the cdefs module: its exported string if it has one,
-- else every string literal the file passes to ffi.cdef.
local function cdefs_source(mod)
  if type(mod) == "table" then
    for _, k in ipairs { "source", "cdef", "cdefs", "declarations", "text" } do
      if type(mod[k]) == "string" then return mod[k], "redlock.cdefs." .. k end
    end
  end
  local file = read(CDEFS_FILE)
  local parts = {}
  local pos = 1
  while true do
    local s, e, eqs = file:find("ffi%.cdef%s*%(?%s*%[(=*)%[", pos)
    if not s then break end
    local close = "]" .. eqs .. "]"
    local cs = file:find(close, e + 1, true)
    parts[#parts + 1] = file:sub(e + 1, cs - 1)
    pos = cs + #close
  end
  return table.concat(parts, "\n"), CDEFS_FILE .. " (ffi.cdef strings)"
end

-- pairs() in a stable order, so the spec lists its tests the same way each run.
local function sorted(t)
  local keys = {}
  for k in pairs(t) do keys[#keys + 1] = k end
  table.sort(keys)
  local i = 0
  return function()
    i = i + 1
    if keys[i] ~= nil then return keys[i], t[keys[i]] end
  end
end

----------------------------------------------------------------------------

describe("lua/redlock/cdefs.lua", function()
  local header_text, defines = preprocess(read(HEADER))
  local define_values = {}
  for name, v in pairs(defines) do
    -- Numbers only: the string RL_VERSION is checked by spec/version_spec.lua.
    if name:match("^RL_") and not v:match('^"') then define_values[name] = assert(evaluate(tokenize(v), {})) end
  end
  local header = parse(header_text, define_values)

  local cdefs = require "redlock.cdefs"
  local source, where = cdefs_source(cdefs)
  local mirror = parse((source:gsub("/%*.-%*/", " "):gsub("//[^\n]*", " ")), define_values)

  it("has a cdef text to compare (" .. tostring(where) .. ")", function()
    assert.is_string(source)
    assert.is_true(#source > 0)
  end)

  it("the header parser found the API", function()
    -- Guards this spec against silently comparing nothing.
    assert.is_truthy(header.functions.rl_client_new)
    assert.is_truthy(header.functions.rl_acquire)
    assert.is_truthy(header.structs.rl_result)
    assert.is_truthy(header.enums.RL_STATUS_OK)
    assert.is_truthy(define_values.RL_ERR_LEN)
  end)

  describe("declares every function of redlock.h", function()
    for name, proto in sorted(header.functions) do
      it(name, function()
        assert.are.equal(proto, mirror.functions[name])
      end)
    end
  end)

  describe("finds every function of redlock.h in the loaded core", function()
    local lib = type(cdefs) == "table" and (cdefs.lib or cdefs.C)
    for name in sorted(header.functions) do
      it(name, function()
        assert.is_truthy(lib, "redlock.cdefs exports no library handle (.lib)")
        local ok, fn = pcall(function() return lib[name] end)
        assert.is_true(ok, tostring(fn))
        assert.is_truthy(fn)
      end)
    end
  end)

  describe("declares every struct of redlock.h with the same fields", function()
    for name, st in sorted(header.structs) do
      it(name, function()
        assert.is_table(mirror.structs[name], "struct " .. name .. " missing")
        assert.are.same(st, mirror.structs[name])
      end)
    end
  end)

  describe("declares every typedef of redlock.h", function()
    for name, ty in sorted(header.typedefs) do
      it(name, function()
        assert.are.equal(ty, mirror.typedefs[name])
      end)
    end
  end)

  describe("gives every enum constant of redlock.h its value", function()
    for name, v in sorted(header.enums) do
      it(name, function()
        local got = mirror.enums[name] or mirror.consts[name]
        assert.are.equal(v, got)
        assert.are.equal(v, tonumber(ffi.C[name]))
      end)
    end
  end)

  it("declares nothing that redlock.h lacks", function()
    local extra = {}
    for name in pairs(mirror.functions) do
      if not header.functions[name] then extra[#extra + 1] = "function " .. name end
    end
    for name in pairs(mirror.structs) do
      if not header.structs[name] then extra[#extra + 1] = "struct " .. name end
    end
    for name in pairs(mirror.enums) do
      if not header.enums[name] and not define_values[name] then
        extra[#extra + 1] = "enum constant " .. name
      end
    end
    for name in pairs(mirror.consts) do
      if not header.enums[name] and not define_values[name] then
        extra[#extra + 1] = "constant " .. name
      end
    end
    table.sort(extra)
    assert.are.same({}, extra)
  end)

  it("gives every RL_* #define the Lua code uses the header's value", function()
    -- Constants the cdef declares (static const / enum) must equal the #define;
    -- any RL_* name the Lua code (lua/**/*.lua) looks up in a namespace or table
    -- (C.RL_OK, cdefs.RL_ERR_LEN) must exist in the header.
    local declared = {}
    for name, v in pairs(mirror.enums) do declared[name] = v end
    for name, v in pairs(mirror.consts) do declared[name] = v end
    for name, v in pairs(declared) do
      if define_values[name] ~= nil then
        assert.are.equal(define_values[name], v, name)
        assert.are.equal(define_values[name], tonumber(ffi.C[name]), name)
      end
    end
    local p = io.popen("find lua -name '*.lua' | sort")
    local unknown = {}
    for file in p:lines() do
      local text = read(file)
      for name in text:gmatch("%.(RL_[%u%d_]+)") do
        if define_values[name] == nil and header.enums[name] == nil
           and not unknown[name] then
          unknown[#unknown + 1] = name .. " (" .. file .. ")"
          unknown[name] = true
        end
      end
    end
    p:close()
    local list = {}
    for _, v in ipairs(unknown) do list[#list + 1] = v end
    assert.are.same({}, list)
    -- Values the cdefs module exports as Lua numbers (e.g. cdefs.RL_ERR_LEN).
    if type(cdefs) == "table" then
      for name, v in pairs(define_values) do
        if type(cdefs[name]) == "number" then assert.are.equal(v, cdefs[name], name) end
      end
    end
  end)

  it("lays structs out as the C compiler does (sizeof, offsetof)", function()
    -- Compile a probe against the real header and compare with the FFI.
    local dir = proc.tmpdir()
    local lines = { "#include <stdio.h>", "#include <stddef.h>", '#include "redlock.h"',
                    "int main(void) {" }
    local expect = {}
    local names = {}
    for name in sorted(header.structs) do names[#names + 1] = name end
    table.sort(names)
    for _, name in ipairs(names) do
      lines[#lines + 1] = ('printf("sizeof %s %%zu\\n", sizeof(%s));'):format(name, name)
      expect[#expect + 1] = { "sizeof " .. name, ffi.sizeof(name) }
      for _, f in ipairs(header.structs[name].fields) do
        lines[#lines + 1] = ('printf("offsetof %s.%s %%zu\\n", offsetof(%s, %s));')
          :format(name, f.name, name, f.name)
        expect[#expect + 1] = { "offsetof " .. name .. "." .. f.name, ffi.offsetof(name, f.name) }
      end
    end
    for name, v in pairs(define_values) do
      lines[#lines + 1] = ('printf("define %s %%ld\\n", (long)(%s));'):format(name, name)
      expect[#expect + 1] = { "define " .. name, v }
    end
    for name, v in sorted(header.enums) do
      lines[#lines + 1] = ('printf("enum %s %%ld\\n", (long)(%s));'):format(name, name)
      expect[#expect + 1] = { "enum " .. name, v }
    end
    lines[#lines + 1] = "return 0; }"
    local f = assert(io.open(dir .. "/probe.c", "w"))
    f:write(table.concat(lines, "\n"), "\n")
    f:close()
    local cc = os.getenv("CC") or "cc"
    local ok = os.execute(("%s -std=c11 -Icore/include -o %s/probe %s/probe.c"):format(cc, dir, dir))
    assert.are.equal(0, ok, "probe did not compile")
    local p = io.popen(dir .. "/probe")
    local got = {}
    for line in p:lines() do
      local k, v = line:match("^(.-) (%-?%d+)$")
      got[k] = tonumber(v)
    end
    p:close()
    proc.rmdir(dir)
    for _, e in ipairs(expect) do
      assert.are.equal(got[e[1]], tonumber(e[2]), e[1])
    end
  end)
end)
