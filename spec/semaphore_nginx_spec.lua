-- A semaphore inside nginx: the upstream-limit example of docs/semaphore.md
-- ("Inside nginx"), taken from the page itself, run by two workers under wrk
-- against real redis nodes. The example's code is used as written; the spec
-- only points it at its nodes, lowers the limit to 3, puts a 5 ms handler
-- where the upstream was, and counts, in a shared dict, the requests that
-- hold a permit (from try_lock's return to the unlock's call, a part of the
-- time each holds its slot) and the statuses answered.

local nginx = require "helpers.nginx"
local cluster = require "helpers.cluster"
local proc = require "helpers.proc"

local ROOT = nginx.root
local LIMIT = 3

-- The nginx block of docs/semaphore.md's "Inside nginx": the body of its
-- init_by_lua_block and its location block.
local function example()
  local page = assert(proc.read_file(ROOT .. "/docs/semaphore.md"))
  local section = assert(page:match("## Inside nginx(.-)\n## "), "no \"Inside nginx\" section")
  local block = assert(section:match("```nginx\n(.-)```"), "no nginx block in it")
  local init = assert(block:match("init_by_lua_block (%b{})"), "no init_by_lua_block in the example")
  local location = assert(block:match("(location /api/ %b{})"), "no location /api/ in the example")
  return init:sub(2, -2), location
end

-- s with pattern replaced exactly once (the example changed if not).
local function once(s, pattern, repl, what)
  local out, n = s:gsub(pattern, repl)
  assert(n == 1, ("the example no longer has %s (%d matches)"):format(what, n))
  return out
end

describe("a semaphore inside nginx (docs/semaphore.md's example)", function()
  local cl, srv

  lazy_setup(function() cl = cluster.start(3) end)
  teardown(function()
    nginx.stop_all()
    cluster.stop_all()
  end)

  it("never lets more than the limit hold a permit under wrk, and answers 503 beyond it", function()
    local init, location = example()
    init = once(init, "servers = %b{}", "servers = URLS", "a servers list")
    location = once(location, "limit = 50", "limit = " .. LIMIT, "limit = 50")
    location = once(location, "ngx%.ctx%.permit = lk", "ngx.ctx.permit = lk ENTERED()", "ngx.ctx.permit = lk")
    location = once(location, "function%(%) lk:unlock%(%) end", "function() LEFT() lk:unlock() end",
      "the unlock in a timer")
    location = once(location, "local lk = ngx%.ctx%.permit", "COUNT_STATUS() local lk = ngx.ctx.permit",
      "the log phase's permit")
    location = once(location, "proxy_pass http://api_backend;",
      "content_by_lua_block { ngx.sleep(0.005) ngx.say('ok') }", "proxy_pass")
    local urls = {}
    for i, u in ipairs(cl.urls) do urls[i] = ("%q"):format(u) end
    srv = nginx.start_tree {
      workers = 2,
      http = "lua_shared_dict permits 1m;",
      init = ([[
        URLS = { %s }
        local stats = ngx.shared.permits
        -- holders now; each count reached is remembered ("seen:n"), so the
        -- most is exact whichever worker reached it
        function ENTERED() stats:set("seen:" .. stats:incr("now", 1, 0), true) end
        function LEFT() stats:incr("now", -1, 0) end
        function COUNT_STATUS() stats:incr("status:" .. ngx.status, 1, 0) end
      ]]):format(table.concat(urls, ", ")) .. init,
      locations = { location, [[
        location = /stats {
          content_by_lua_block {
            local stats, most = ngx.shared.permits, 0
            for _, k in ipairs(stats:get_keys(0)) do
              local n = tonumber(k:match("^seen:(%d+)$"))
              if n and n > most then most = n end
            end
            local st = {}
            for _, k in ipairs(stats:get_keys(0)) do
              local code = k:match("^status:(%d+)$")
              if code then st[#st + 1] = code .. "=" .. stats:get(k) end
            end
            table.sort(st)
            ngx.say("most=", most, " now=", stats:get("now") or 0, " ", table.concat(st, " "))
          }
        }]] },
    }
    local w, why = srv:wrk("/api/x", { threads = 2, connections = 50, seconds = 3 })
    assert(w, why)
    -- the last permits are given back from timers just after their requests
    local stats
    local by = proc.now_ms() + 5000
    repeat
      local status, body = srv:get("/stats")
      assert.equal(200, status, tostring(body))
      stats = body
      if body:match("now=0 ") then break end
      proc.sleep_ms(20)
    until proc.now_ms() > by
    assert.matches("now=0 ", stats)
    print(("    wrk: %d requests, %d non-2xx, %d socket errors; %s"):format(w.requests, w.non2xx,
      w.socket_errors, stats:gsub("\n", "")))
    local most = tonumber(stats:match("most=(%d+)"))
    local ok = tonumber(stats:match(" 200=(%d+)") or 0)
    local busy = tonumber(stats:match(" 503=(%d+)") or 0)
    assert.is_true(most >= 1 and most <= LIMIT, stats)
    assert.is_true(ok > 0, stats)
    assert.is_true(busy > 0, stats)
    for code in stats:gmatch(" (%d+)=%d+") do
      assert.is_true(code == "200" or code == "503", "status " .. code .. " answered: " .. stats)
    end
    assert.equal(0, w.socket_errors, w.out)
    -- no Lua error anywhere (a socket timing out on a loaded machine is not one)
    for line in srv:error_log():gmatch("[^\n]*%[error%][^\n]*") do
      assert.matches("timed out", line, 1, true)
    end
  end)
end)
