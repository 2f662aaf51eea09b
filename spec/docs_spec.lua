-- The documentation keeps up with the code:
--   - every public name of the Lua module (its functions and fields, a
--     client's, a lock's and a group's methods, the options redlock.new and
--     the lock calls accept, redlock.retry, redlock.devcluster) is named in
--     docs/lua-api.md, in the form a reader looks for (`dlm:close(`,
--     `lock.token`, a `| `ttl` |` row of the options table, ...);
--   - every relative link in README.md and docs/*.md reaches a file of the
--     checkout, and its #anchor a heading of that file;
--   - the nginx snippet of docs/nginx.md runs as printed in a real nginx
--     against real nodes.
-- The names are read from the objects themselves (metatables, module
-- tables, redlock._OPTIONS), so a function added without its line in the
-- page fails here; the second test shows that the check does catch one.

local redlock = require "redlock"
local devcluster = require "redlock.devcluster"
local cluster = require "helpers.cluster"
local nginx = require "helpers.nginx"
local proc = require "helpers.proc"

local ROOT = proc.root
local res = cluster.names("docs")

local function read(path)
  local f = assert(io.open(ROOT .. "/" .. path, "rb"))
  local s = f:read("*a")
  f:close()
  return s
end

local function keys(t)
  local list = {}
  for k in pairs(t) do list[#list + 1] = k end
  table.sort(list)
  return list
end

local function plain(s) return (s:gsub("%p", "%%%0")) end

-- The text of the section under heading (a "## " line starting with it), up
-- to the next "## " heading.
local function section(doc, heading)
  local at = doc:find("\n## " .. heading, 1, true)
  assert(at, "docs/lua-api.md has no section '## " .. heading .. "'")
  local stop = doc:find("\n## ", at + 1, true) or #doc + 1
  return doc:sub(at, stop - 1)
end

-- What the page must show for each public name: { name, where, pattern }.
-- Filled from live objects by the first test's setup.
local expected

local function build_expected(client, lk, group, cl)
  local e = {}
  local function want(name, where, text, pat)
    e[#e + 1] = { name = name, where = where, pattern = pat or plain(text) }
  end
  for _, k in ipairs(keys(redlock)) do
    if k == "_VERSION" or k:sub(1, 1) ~= "_" then
      want(k, "module", "`redlock." .. k, plain("`redlock." .. k) .. "[`(]")
    end
  end
  for _, k in ipairs(keys(redlock.retry)) do
    if k:sub(1, 1) ~= "_" then -- as for the module: _name is the module's own
      want(k, "redlock.retry", "`redlock.retry." .. k, plain("`redlock.retry." .. k) .. "[`(]")
    end
  end
  for _, k in ipairs(keys(getmetatable(client).__index)) do want(k, "client", "`dlm:" .. k .. "(") end
  for _, k in ipairs(keys(getmetatable(lk).__index)) do want(k, "lock", "`lock:" .. k .. "(") end
  for _, k in ipairs(keys(getmetatable(group).__index)) do want(k, "group", "`locks:" .. k .. "(") end
  -- a lock's public fields: checked to exist on a fenced lock, so the list is not stale
  for _, k in ipairs { "resource", "value", "ttl", "validity", "votes", "token", "token_string", "shared" } do
    assert(lk[k] ~= nil, "a fenced lock has no field " .. k)
    want(k, "lock field", "`lock." .. k .. "`")
  end
  for _, k in ipairs(redlock._OPTIONS.new) do want(k, "new() option", "| `" .. k .. "` |") end
  for _, k in ipairs(redlock._OPTIONS.tls) do want(k, "tls option", "`tls." .. k .. "`") end
  for _, k in ipairs(redlock._OPTIONS.lock) do want(k, "per-call option", "| `" .. k .. "` |") end
  for _, k in ipairs(keys(devcluster)) do
    if k:sub(1, 1) ~= "_" then want(k, "devcluster", "`devcluster." .. k .. "(") end
  end
  for _, k in ipairs(keys(getmetatable(cl).__index)) do want(k, "cluster", "`cl:" .. k .. "(") end
  return e
end

-- Where each kind of name must be: options in their own tables, the rest
-- anywhere on the page.
local SECTION = {
  ["new() option"] = "Options of `redlock.new`",
  ["per-call option"] = "Per-call options",
}

-- The expected names that doc does not show; empty when all are there.
local function undocumented(doc)
  local missing = {}
  for _, x in ipairs(expected) do
    local text = SECTION[x.where] and section(doc, SECTION[x.where]) or doc
    if not text:find(x.pattern) then missing[#missing + 1] = x.where .. " " .. x.name end
  end
  return missing
end

describe("docs/lua-api.md", function()
  local cl

  setup(function()
    cl = cluster.start(1)
    local dlm = redlock.new { servers = cl.urls, ttl = 5000 }
    local lk = assert(dlm:lock(res("fenced"), { fence = true, keepalive = true }))
    local group = assert(dlm:lock_many { res("a"), res("b") })
    expected = build_expected(dlm, lk, group, cl)
    assert(lk:unlock())
    assert(group:unlock())
    dlm:close()
  end)

  teardown(function() cluster.stop_all() end)

  it("names every public function, field and option of the module", function()
    assert.is_true(#expected > 50, "only " .. #expected .. " names found: the enumeration is broken")
    assert.same({}, undocumented(read("docs/lua-api.md")))
  end)

  it("fails for a name the page stops showing, of every kind", function()
    local doc = read("docs/lua-api.md")
    local seen = {}
    for _, x in ipairs(expected) do
      if not seen[x.where] then
        seen[x.where] = true
        -- hide the name where it is required: every match of its pattern
        local scope = SECTION[x.where] and section(doc, SECTION[x.where]) or doc
        local hidden = scope:gsub(x.pattern, "`HIDDEN`")
        local changed = SECTION[x.where] and doc:gsub(plain(scope), (hidden:gsub("%%", "%%%%"))) or hidden
        local missing = undocumented(changed)
        assert.is_true(#missing >= 1, "hiding " .. x.where .. " " .. x.name .. " went unnoticed")
        assert.equal(x.where .. " " .. x.name, missing[1])
      end
    end
    assert.is_true(seen["client"] and seen["lock"] and seen["group"] and seen["module"]
      and seen["new() option"] and seen["per-call option"] and true or false)
  end)

  it("exports the option lists that redlock.new and the lock calls check", function()
    local servers = { "redis://127.0.0.1:1" }
    local dlm = redlock.new { servers = servers }
    for _, k in ipairs(redlock._OPTIONS.new) do
      -- a wrong value raises about the value, never "unknown option"
      local ok, err = pcall(redlock.new, { servers = servers, [k] = {} })
      if ok then
        err:close() -- tls = {} is a valid table
      else
        assert.is_nil(tostring(err):find("unknown option", 1, true), k .. ": " .. tostring(err))
      end
    end
    for _, k in ipairs(redlock._OPTIONS.lock) do
      local ok, err = pcall(dlm.try_lock, dlm, res("opt"), { [k] = {} })
      assert.is_false(ok)
      assert.is_nil(tostring(err):find("unknown option", 1, true), k .. ": " .. tostring(err))
    end
    local ok, err = pcall(redlock.new, { servers = servers, reconnect_max_ms = 100 })
    assert.is_false(ok)
    assert.truthy(tostring(err):find("unknown option 'reconnect_max_ms'", 1, true))
    dlm:close()
  end)
end)

-- GitHub's anchor for a heading: lower case, punctuation dropped (but - and
-- _), spaces to hyphens.
local function slug(heading)
  return (heading:lower():gsub("[^%w%s%-_\128-\255]", ""):gsub("%s", "-"))
end

local function anchors(text)
  local set = {}
  for line in (text .. "\n"):gmatch("([^\n]*)\n") do
    local h = line:match("^#+%s+(.-)%s*$")
    if h then set[slug(h)] = true end
  end
  return set
end

describe("links in README.md and docs/", function()
  it("reach files of the checkout and headings that exist", function()
    local pages = { "README.md" }
    for name in io.popen("cd " .. proc.quote(ROOT) .. " && ls docs/*.md"):lines() do pages[#pages + 1] = name end
    local broken, checked = {}, 0
    for _, page in ipairs(pages) do
      local dir = page:match("^(.*)/") or "."
      local text = read(page):gsub("```.-```", "")
      for target in text:gmatch("%]%(([^)%s]+)%)") do
        if not target:find("^%a[%w+.-]*:") then -- not https:, mailto:, ...
          checked = checked + 1
          local file, anchor = target:match("^([^#]*)#?(.*)$")
          local path = file == "" and page or (dir == "." and file or (dir .. "/" .. file))
          while path:find("[^/]+/%.%./") do path = path:gsub("[^/]+/%.%./", "", 1) end
          path = path:gsub("^%./", "")
          local f = io.open(ROOT .. "/" .. path, "rb")
          if not f then
            broken[#broken + 1] = page .. ": " .. target .. " (no " .. path .. ")"
          else
            local body = f:read("*a")
            f:close()
            if anchor ~= "" and path:match("%.md$") and not anchors(body)[anchor] then
              broken[#broken + 1] = page .. ": " .. target .. " (no heading #" .. anchor .. " in " .. path .. ")"
            end
          end
        end
      end
    end
    assert.is_true(checked > 40, "only " .. checked .. " links found")
    assert.same({}, broken)
  end)

  it("would see a link to a missing file or heading", function()
    -- the anchor rule against headings whose anchors GitHub is known to make
    local set = anchors("## Options of `redlock.new`\n## The hub's lifecycle\n## Waiting for a release (hand-off)\n")
    assert.is_true(set["options-of-redlocknew"])
    assert.is_true(set["the-hubs-lifecycle"])
    assert.is_true(set["waiting-for-a-release-hand-off"])
    assert.is_nil(set["options-of-redlock-new"])
  end)
end)

describe("the nginx snippet of docs/nginx.md", function()
  local cl, srv

  -- The block that follows "<opening> {" in text, up to its matching brace.
  local function block(text, opening)
    local at = assert(text:find(opening .. "%s*{"), "no '" .. opening .. " {' in the snippet")
    local open = text:find("{", at, true)
    local depth, i = 0, open
    repeat
      local c = text:sub(i, i)
      if c == "{" then depth = depth + 1 elseif c == "}" then depth = depth - 1 end
      i = i + 1
    until depth == 0 or i > #text
    return text:sub(open + 1, i - 2)
  end

  setup(function()
    cl = cluster.start(3)
    local snippet = assert(read("docs/nginx.md"):match("```nginx\n(.-)```"), "no nginx block in docs/nginx.md")
    -- the snippet as printed, with the servers of a throwaway cluster
    local init = block(snippet, "init_by_lua_block"):gsub("servers = %b{}", "servers = " .. nginx.lua_list(cl.urls), 1)
    local location = "location /orders {" .. block(snippet, "location /orders") .. "}"
    srv = nginx.start {
      package_path = ROOT .. "/lua/?.lua;" .. ROOT .. "/lua/?/init.lua",
      package_cpath = nginx.build .. "/?.so",
      init = init,
      locations = { location },
    }
  end)

  teardown(function()
    nginx.stop_all()
    cluster.stop_all()
  end)

  local function log() return "nginx error log:\n" .. srv:error_log() end

  it("answers the order under its lock, 400 without an order number, 409 while it is held elsewhere", function()
    local status, body = srv:get("/orders?id=42")
    assert.equal(200, status, log())
    assert.equal("done\n", body)

    for _, path in ipairs { "/orders", "/orders?id=", "/orders?id=x:fence" } do
      status, body = srv:get(path)
      assert.equal(400, status, path .. "\n" .. log())
      assert.truthy(body:find("id=", 1, true), body)
    end

    local dlm = redlock.new { servers = cl.urls }
    local held = assert(dlm:lock("orders:7", { ttl = 30000 }))
    status = srv:get("/orders?id=7", { timeout_ms = 20000 })
    assert.equal(409, status, log())
    assert(held:unlock())
    status, body = srv:get("/orders?id=7")
    assert.equal(200, status, log())
    assert.equal("done\n", body)
    dlm:close()
    assert.is_nil(srv:error_log():find("%[error%]"), log())
  end)
end)
