-- Keys of our own: hand-off keeps its queues under "redlock:queue:" .. key
-- and its channels under "redlock:", and a fenced lock's counter is its key
-- .. ":fence". A lock whose key (prefix .. resource) were one of those would
-- share it with us: a waiter on "zz" once cut the ttl of a lock named
-- "redlock:queue:zz" from 600 s to 60 s (its holder's remaining() still said
-- 593 s). Such resources are refused in every call, at the caller's line,
-- naming the argument; the C begin functions refuse them too (so does the
-- engine inside nginx), and `redlock exec` says so as a usage error. A
-- queue key that holds something else is left alone by the waiters.

local ffi = require "ffi"
local redlock = require "redlock"
local cluster = require "helpers.cluster"
local proc = require "helpers.proc"

local lib = require("redlock.cdefs").lib
local res = cluster.names("namespace")

local function here() return debug.getinfo(2, "l").currentline end

-- fn must raise at this spec's line `line` a message holding every string of `parts`.
local function misuse(line, fn, parts)
  local ok, e = pcall(fn)
  assert.is_false(ok, "expected an error")
  assert.is_string(e)
  local at = e:match("namespace_spec%.lua:(%d+): ")
  assert.equal(line, tonumber(at), e)
  for _, part in ipairs(parts) do assert.is_truthy(e:find(part, 1, true), e) end
  return e
end

local STARTS = 'starts with "redlock:"'
local ENDS = 'ends with ":fence"'

describe("keys of our own", function()
  local cl, dlm

  lazy_setup(function()
    cl = cluster.start(3)
    dlm = redlock.new { servers = cl.urls, ttl = 5000 }
  end)
  lazy_teardown(function()
    if dlm then dlm:close() end
    cluster.stop_all()
  end)

  -- Commands that could have touched a key: SETs and scripts, over every node.
  local function sent() return cluster.calls(cl, "set") + cluster.calls(cl, "eval") + cluster.calls(cl, "evalsha") end

  it("are refused as resources by lock, try_lock, with_lock and lock_many, before anything is sent", function()
    local before = sent()
    for _, case in ipairs {
      { "redlock:queue:zz", STARTS }, { "redlock:", STARTS }, { "redlock:released:x", STARTS },
      { "x:fence", ENDS }, { "orders:42:fence", ENDS }, { ":fence", ENDS },
    } do
      local r, why = case[1], case[2]
      local shown = ('resource string "%s" is reserved'):format(r)
      misuse(here(), function() dlm:lock(r) end, { "bad argument #1 to 'lock'", shown, why })
      misuse(here(), function() dlm:try_lock(r, { fence = true }) end, { "bad argument #1 to 'try_lock'", shown, why })
      misuse(here(), function() dlm:with_lock(r, nil, function() end) end, { "bad argument #1 to 'with_lock'", shown, why })
      misuse(here(), function() dlm:lock_many({ res("first"), r }) end,
        { "bad argument #1 to 'lock_many'", ('resources[2] string "%s" is reserved'):format(r), why })
    end
    assert.equal(before, sent(), "a refused call sent something")
  end)

  it("counts the prefix: the whole key decides, not the resource alone", function()
    local p1 = redlock.new { servers = cl.urls, prefix = "redlock" }
    local p2 = redlock.new { servers = cl.urls, prefix = "red" }
    local p3 = redlock.new { servers = cl.urls, prefix = "app:" }
    local p4 = redlock.new { servers = cl.urls, prefix = "app:fence:" }
    local ok, err = pcall(function()
      misuse(here(), function() p1:try_lock(":queue:zz") end, { "bad argument #1 to 'try_lock'", STARTS })
      misuse(here(), function() p2:lock("lock:queue:zz") end, { "bad argument #1 to 'lock'", STARTS })
      misuse(here(), function() p3:try_lock("x:fence") end, { ENDS })
      -- keys outside: "app:redlock:queue:zz", "redlockx", "app:fence:x", "x:fenced"
      for _, c in ipairs { { p3, "redlock:queue:zz" }, { p1, "x" }, { p4, "x" }, { dlm, res("x") .. ":fenced" },
                           { dlm, "redlock" } } do
        local lk, why = c[1]:try_lock(c[2])
        assert.is_not_nil(lk, c[2] .. ": " .. tostring(why))
        assert.is_true(lk:unlock())
      end
      -- the prefix alone already in the namespace: refused by new()
      misuse(here(), function() redlock.new { servers = cl.urls, prefix = "redlock:app:" } end,
        { "bad argument #1 to 'new'", 'prefix starts with "redlock:"' })
    end)
    for _, d in ipairs { p1, p2, p3, p4 } do d:close() end
    assert(ok, err)
  end)

  -- Before: no bound below Redis' 512 MB: a 2 MB name's release missed the
  -- node timeout (and every later unlock said "not held"), an 8 MB one
  -- failed the client's next small call too.
  it("refuses a key longer than 65,536 bytes, prefix included, before anything is sent", function()
    local before = sent()
    local long = ("r"):rep(65537)
    misuse(here(), function() dlm:try_lock(long) end,
      { "bad argument #1 to 'try_lock'", "resource is 65537 bytes long, more than a key may be (65536 bytes" })
    misuse(here(), function() dlm:lock_many({ res("a"), long }) end, { "resources[2] is 65537 bytes long" })
    local p = redlock.new { servers = cl.urls, prefix = "app:" }
    misuse(here(), function() p:lock(long:sub(1, 65533)) end, { "resource is 65533 bytes long" })
    assert.equal(before, sent(), "a refused call sent something")
    local lk = assert(p:try_lock(long:sub(1, 65532))) -- the longest: 65,536 with the prefix
    assert.is_true(lk:unlock())
    p:close()
  end)

  it("are refused by every C begin function, RL_ERR with the reason", function()
    local c = dlm.client
    local value = ("0"):rep(40)
    for _, r in ipairs { "redlock:queue:zz", "x:fence" } do
      for name, begin in pairs {
        acquire = function() return lib.rl_begin_acquire(c, r, #r, 1000) end,
        acquire_fenced = function() return lib.rl_begin_acquire_fenced(c, r, #r, 1000) end,
        acquire_queued = function() return lib.rl_begin_acquire_queued(c, r, #r, 1000) end,
        release = function() return lib.rl_begin_release(c, r, #r, value) end,
        extend = function() return lib.rl_begin_extend(c, r, #r, value, 1000) end,
      } do
        assert.equal(lib.RL_ERR, begin(), name .. " " .. r)
        assert.matches("^resource is reserved: its key %(prefix %+ resource%) ", ffi.string(lib.rl_client_errstr(c)))
      end
    end
    local function reserved(prefix, r) return lib.rl_reserved_key(prefix, #prefix, r, #r) ~= nil end
    assert.is_false(reserved("app:", "redlock:x"))
    assert.is_true(reserved("red", "lock:x"))
    assert.is_true(reserved("x:fe", "nce"))
    assert.is_false(reserved("", "x:fenc"))
  end)

  it("the issue's case: a holder of redlock:queue:zz is refused, and a waiter on zz cuts no foreign key's ttl", function()
    local zz = res("zz")
    local queue = "redlock:queue:" .. zz
    -- our holder of that name: refused at its call
    misuse(here(), function() dlm:lock(queue, { ttl = 600000 }) end, { "bad argument #1 to 'lock'", STARTS })
    -- another Redlock client's holder of it (600 s), and a holder of zz
    for i = 1, cl.n do assert.is_true(cluster.set_nx(cl, i, queue, "foreign-holder", 600000)) end
    local holder = redlock.new { servers = cl.urls }
    local waiter = redlock.new { servers = cl.urls }
    local ok, err = pcall(function()
      local lk = assert(holder:lock(zz, { ttl = 1000 }))
      assert(cluster.await_value(cl, zz, lk.value, 5000, nil, holder))
      -- a waiter's refused attempts, then its lock once zz's holder is gone
      local out = ffi.new("rl_result")
      for _ = 1, 3 do
        assert.equal(0, lib.rl_acquire_queued(waiter.client, zz, #zz, 10000, out))
        assert.equal(lib.RL_STATUS_BUSY, out.status)
      end
      local got, why, detail = waiter:lock(zz, { wait = 10000 })
      assert.is_not_nil(got, tostring(why) .. " " .. cluster.show(detail))
      assert.is_true(got:unlock())
      -- the foreign lock kept its value and its 600 s (before: 60 s)
      assert(cluster.await_all(cl, function(i)
        local v, pttl = cluster.get(cl, i, queue), cluster.pttl(cl, i, queue)
        return v == "foreign-holder" and pttl > 590000, ("value %s, pttl %s"):format(tostring(v), tostring(pttl))
      end, 5000, nil, waiter))
    end)
    for i = 1, cl.n do cluster.del(cl, i, queue) end
    holder:close()
    waiter:close()
    assert(ok, err)
  end)

  it("the :fence case: a lock named after a fenced lock's counter is refused, the counter untouched", function()
    local r = res("fenced")
    local lk = assert(dlm:lock(r, { fence = true }))
    local token = lk.token
    assert.is_true(lk:unlock())
    -- before: try_lock(r .. ":fence") was "busy" for ever (SET NX on the
    -- counter), and a holder of it made the next fenced grant of r fail
    misuse(here(), function() dlm:try_lock(r .. ":fence") end, { "bad argument #1 to 'try_lock'", ENDS })
    local again = assert(dlm:lock(r, { fence = true }))
    assert.is_true(again.token > token)
    assert.is_true(again:unlock())
  end)

  it("`redlock exec` refuses such a RESOURCE as a usage error (64), a --prefix in the namespace too;"
    .. " `run` at the script's line", function()
    local bin = os.getenv("REDLOCK_HOST") or (proc.build .. "/redlock")
    if bin:sub(1, 1) ~= "/" then bin = proc.root .. "/" .. bin end
    local env = "REDLOCK_SERVERS=" .. table.concat(cl.urls, ",")
    local before = sent()
    for _, c in ipairs {
      { "redlock:queue:zz", "RESOURCE 'redlock:queue:zz' is reserved: its key (prefix + resource) " .. STARTS },
      { "--prefix redlock :queue:zz", "RESOURCE ':queue:zz' is reserved" },
      { "jobs:fence", "RESOURCE 'jobs:fence' is reserved: its key (prefix + resource) " .. ENDS },
      { "--prefix redlock:jobs: x", [[--prefix 'redlock:jobs:' starts with "redlock:"]] },
    } do
      local out, rc = proc.sh(("env %s %s exec %s -- true"):format(env, proc.quote(bin), c[1]))
      assert.equal(64, rc, out)
      assert.is_truthy(out:find("redlock: " .. c[2], 1, true), out)
    end
    local dir = proc.tmpdir()
    proc.write_file(dir .. "/ours.lua", "local dlm = require('redlock').default()\n\nlocal l = dlm:lock('redlock:queue:zz')\n")
    local out, rc = proc.sh(("cd %s && env %s %s run ours.lua"):format(proc.quote(dir), env, proc.quote(bin)))
    proc.rmdir(dir)
    assert.equal(1, rc, out)
    assert.is_truthy(out:find("ours.lua:3: bad argument #1 to 'lock' (resource string \"redlock:queue:zz\" is reserved: "
      .. "its key (prefix + resource) " .. STARTS, 1, true), out)
    assert.equal(before, sent(), "a refused exec or run sent something")
  end)
end)

describe("keys of our own inside nginx", function()
  local nginx = require "helpers.nginx"
  local cl, srv

  lazy_setup(function() cl = cluster.start(3) end)
  lazy_teardown(function()
    if srv then srv:stop() end
    nginx.stop_all()
    cluster.stop_all()
  end)

  it("are refused by the lock calls and by the hub's engine", function()
    srv = nginx.start_tree {
      workers = 1,
      init = ([[
        redlock = require "redlock"
        DLM = redlock.new { servers = %s, prefix = "redlock" }
      ]]):format(nginx.lua_list(cl.urls)),
      locations = { nginx.PING, [[
        location = /reserved {
          content_by_lua_block {
            local ok, e = pcall(DLM.try_lock, DLM, ":queue:zz")
            ngx.say("lock: ", tostring(ok), " ", tostring(e))
            -- the transport's own begin: the engine refuses
            local c = DLM.client
            local id = c:begin_acquire(":queue:zz", 9, 1000)
            ngx.say("begin: ", tostring(id), " ", tostring(c.err))
            local lk, err = DLM:try_lock("x")
            ngx.say("plain: ", lk and "ok" or tostring(err))
            if lk then lk:unlock() end
          }
        }]] },
    }
    local status, body = srv:get("/reserved")
    assert.equal(200, status, body .. srv:error_log():sub(-2000))
    assert.matches("lock: false [^\n]*bad argument #1 to 'try_lock' %(resource string \":queue:zz\" is reserved: its key "
      .. "%(prefix %+ resource%) starts with \"redlock:\"", body)
    assert.matches("begin: %-1 resource is reserved: its key %(prefix %+ resource%) starts with \"redlock:\"", body)
    assert.matches("plain: ok", body)
  end)
end)
