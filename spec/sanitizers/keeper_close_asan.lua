-- A finalizer that closes a client while the client's first keep-alive
-- lock is on its way to the keeper (docs/lua-api.md: a finalizer may run
-- close() while a call on the same client is under way), run by plain
-- LuaJIT on the core built with ASan + UBSan (build-asan/). Not a default
-- spec: scripts/test runs it with the other spec/sanitizers/*_asan.lua.

local cluster = require "helpers.cluster"
local proc = require "helpers.proc"
local asan = require "helpers.asan"

local res = cluster.names("keeper_close")

describe("a finalizer's close() during the first keep-alive lock", function()
  local state = {}
  asan.nodes(setup, teardown, state)

  -- Before: close() freed the keeper that keeper_of (drop_guard_for) had
  -- just published, and the lock went on to rl_keeper_add on freed memory
  -- (heap-use-after-free); at keeper_new, the keeper started on the closed
  -- client was kept by a thread nothing stopped.
  for _, at in ipairs { "keeper_new", "drop_guard_for" } do
    it("refuses the lock, touching no freed memory, when it runs at " .. at, function()
      local r = res(at)
      local cl, dir = state.cl, state.dir
      local env = asan.env(dir)
      env.LUA_PATH, env.LUA_CPATH = package.path, proc.build .. "/?.so;;"
      local words = { "env" }
      for k, v in pairs(env) do words[#words + 1] = k .. "=" .. proc.quote(v) end
      for _, a in ipairs { "timeout", "30", "luajit", proc.root .. "/spec/helpers/finalizer_close.lua",
                           table.concat(cl.urls, ","), r, at } do
        words[#words + 1] = proc.quote(a)
      end
      local out, rc = proc.sh(table.concat(words, " "))
      local found = asan.reports(dir)
      assert.are.equal("", found, "sanitizer report:\n" .. found .. "\noutput:\n" .. out)
      assert.are.equal(0, rc, out)
      assert.matches("closed true", out, 1, true)
      assert.matches("lock [^\n]*closed", out)
      for i = 1, 3 do assert.is_nil(cluster.get(cl, i, r), "left held on node " .. i .. ":\n" .. out) end
    end)
  end
end)
