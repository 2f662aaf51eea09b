-- dlm:adopt: a lock acquired by one process taken over by another (its
-- resource and value handed over), through one extension round; then a lock
-- like any other (extend, keep-alive, lost(), unlock). Plain LuaJIT, inside
-- nginx, and `redlock exec` handing its lock to a `redlock run` script
-- through REDLOCK_VALUE.

local cluster = require "helpers.cluster"
local nginx = require "helpers.nginx"
local proc = require "helpers.proc"
local redlock = require "redlock"

local res = cluster.names("adopt")
local q = proc.quote

describe("dlm:adopt", function()
  local cl, owner, taker

  setup(function()
    cl = cluster.start(5)
    owner = redlock.new { servers = cl.urls, ttl = 2000 }
    taker = redlock.new { servers = cl.urls, ttl = 2000 }
  end)

  teardown(function()
    if owner then owner:close() end
    if taker then taker:close() end
    nginx.stop_all()
    cluster.stop_all()
  end)

  local function on_nodes(key)
    local n = 0
    for i = 1, cl.n do
      if cluster.get(cl, i, key) then n = n + 1 end
    end
    return n
  end

  it("takes over a held lock: one extension, then extend and unlock as its holder", function()
    local r = res("take")
    local lk = assert(owner:lock(r, { ttl = 1000 }))
    local a, err, detail = taker:adopt(r, lk.value, { ttl = 5000 })
    assert.is_nil(err)
    assert.is_table(detail == nil and {} or detail)
    assert.are.equal(lk.value, a.value)
    assert.are.equal(r, a.resource)
    assert.are.equal(5000, a.ttl)
    -- the validity is the extension's: more than the owner's ttl left, at most the new one
    assert.is_true(a.validity > 1000 and a.validity <= 5000, tostring(a.validity))
    assert.is_true(cluster.pttl(cl, 1, r) > 1000)
    assert.is_true(a:valid())
    assert.is_false(a:lost())
    assert.is_true((a:extend(4000)))
    assert.are.equal(5, on_nodes(r))
    assert.is_true((a:unlock()))
    assert.are.equal(0, on_nodes(r))
    -- the owner's own release now finds its value gone
    local ok, uerr = lk:unlock()
    assert.is_nil(ok)
    assert.are.equal("not held", uerr)
  end)

  it("fails with 'not held' and the per-node detail for a value that is not held", function()
    local r = res("nothere")
    local lk = assert(owner:lock(r))
    local other = ("0"):rep(40)
    local a, err, detail = taker:adopt(r, other)
    assert.is_nil(a)
    assert.are.equal("not held", err)
    assert.are.equal("not held", detail.status)
    local taken = 0 -- decided at quorum: the rest may be pending
    for i = 1, cl.n do
      assert.is_true(detail[i].state == "taken" or detail[i].state == "pending", detail[i].state)
      if detail[i].state == "taken" then taken = taken + 1 end
    end
    assert.is_true(taken >= 3)
    -- the holder's key was not touched
    assert.are.equal(lk.value, cluster.get(cl, 1, r))
    assert.is_true((lk:unlock()))
    -- nor is a lock whose key has gone
    a, err = taker:adopt(r, lk.value)
    assert.is_nil(a)
    assert.are.equal("not held", err)
  end)

  -- The minority answers after the round was decided (its replies come
  -- 40 ms late, through a proxy): it still extends, so it is released too.
  it("a value left on a minority that answers late: its keys are released too", function()
    local faults = require "helpers.faults"
    local px, urls = {}, {}
    for i = 1, 5 do
      if i <= 2 then
        px[i] = faults.proxy(cl.ports[i])
        urls[i] = px[i].url
      else
        urls[i] = cl.urls[i]
      end
    end
    local slow = redlock.new { servers = urls, ttl = 2000, node_timeout = 1000 }
    local ok, err = pcall(function()
      local r = res("late-minority")
      local lk = assert(owner:lock(r))
      for i = 3, 5 do cluster.del(cl, i, r) end
      for i = 1, 2 do px[i]:set("delay 40") end
      local a, why, detail = slow:adopt(r, lk.value, { ttl = 600000 })
      assert.is_nil(a)
      assert.are.equal("not held", why)
      -- decided before the minority answered
      assert.are.equal("pending", detail[1].state)
      assert(cluster.await_all(cl, function(i)
        local pttl = cluster.pttl(cl, i, r)
        return pttl < 0, "pttl " .. pttl
      end, 3000, nil, slow))
      lk:unlock()
    end)
    slow:close()
    for i = 1, 2 do px[i]:stop() end
    assert(ok, err)
  end)

  it("a value left on a minority only: 'not held', and the minority's keys are released, not extended", function()
    local r = res("minority")
    for _, shared in ipairs({ false, true }) do
      local lk = assert(owner:lock(r, { shared = shared or nil }))
      for i = 3, 5 do cluster.del(cl, i, r) end -- a majority lost the key (restarted empty)
      if shared then for i = 3, 5 do cluster.del(cl, i, "redlock:readers:" .. r) end end
      local a, err = taker:adopt(r, lk.value, { ttl = 600000 })
      assert.is_nil(a)
      assert.are.equal("not held", err)
      -- before, nodes 1 and 2 kept the value for the adopter's 600 s
      assert(cluster.await_all(cl, function(i)
        local pttl = cluster.pttl(cl, i, r)
        return pttl < 0, "pttl " .. pttl
      end, 3000, nil, taker))
      lk:unlock()
    end
  end)

  it("keeps an adopted lock alive past the ttl it was taken with, and sees it lost once it is gone", function()
    local r = res("keep")
    local lk = assert(owner:lock(r, { ttl = 600 }))
    local a = assert(taker:adopt(r, lk.value, { ttl = 600, keepalive = true }))
    assert.is_number(a.kept)
    proc.sleep_ms(1500) -- more than two ttls
    assert.is_false(a:lost())
    assert.is_true(a:valid())
    assert.are.equal(5, on_nodes(r))
    for i = 1, cl.n do cluster.call(cl, i, "DEL", r) end
    local deadline = proc.now_ms() + 3000
    while not a:lost() and proc.now_ms() < deadline do proc.sleep_ms(20) end
    assert.is_true(a:lost())
    assert.has_error(function() a:check() end)
  end)

  it("refuses misuse at the call site, naming the argument", function()
    local r = res("misuse")
    local good = ("ab"):rep(20)
    local function raises(pattern, ...)
      local args = { ... }
      local ok, e = pcall(function() local _ = taker:adopt(unpack(args, 1, 3)) end)
      assert.is_false(ok)
      assert.matches(pattern, tostring(e))
      assert.matches("adopt_spec.lua:%d+:", tostring(e)) -- raised at the caller's line
    end
    local bad_value = "bad argument #2 to 'adopt' %(value must be a lock value %(40 characters: lowercase hex after an optional"
      .. " label and '/', the last an 's' for a shared hold%), got "
    raises(bad_value .. "nil%)", r, nil)
    raises(bad_value .. "string \"abc\"%)", r, "abc")
    raises("bad argument #2 to 'adopt'", r, good:sub(1, 39))
    raises("bad argument #2 to 'adopt'", r, good .. "0")
    raises("bad argument #2 to 'adopt'", r, good:sub(1, 39) .. "g")
    raises(bad_value, r, good:upper()) -- the core makes lowercase values only: it could only be "not held"
    raises("bad argument #2 to 'adopt'", r, 42)
    raises("bad argument #1 to 'adopt' %(resource must be a non%-empty string", "", good)
    raises("bad argument #1 to 'adopt' %(resource string \"redlock:x\" is reserved", "redlock:x", good)
    raises("bad argument #3 to 'adopt' %(unknown option 'fence'%)", r, good, { fence = true })
    raises("bad argument #3 to 'adopt' %(unknown option 'wait'%)", r, good, { wait = 10 })
    raises("bad argument #3 to 'adopt' %(ttl must be", r, good, { ttl = 0 })
    raises("bad argument #3 to 'adopt' %(options must be a table", r, good, 5)
    raises("bad argument #3 to 'adopt' %(slot goes with a semaphore's value, not a shared hold's",
      r, good:sub(1, 39) .. "s", { slot = 1 })
    local ok, e = pcall(redlock.new { servers = cl.urls }.adopt, {}, r, good)
    assert.is_false(ok)
    assert.matches("bad argument #1 to 'adopt' %(a client expected", e)
    -- nothing was sent: no key appeared
    assert.are.equal(0, on_nodes(r))
  end)

  it("works inside nginx: a request adopts a lock taken by a plain LuaJIT process", function()
    local srv = nginx.start_tree {
      init = ([[
        redlock = require "redlock"
        DLM = redlock.new { servers = %s, ttl = 3000 }
      ]]):format(nginx.lua_list(cl.urls)),
      locations = { [[
        location = /adopt {
          content_by_lua_block {
            local a, err = DLM:adopt(ngx.var.arg_r, ngx.var.arg_v, { ttl = 4000 })
            if not a then ngx.say("fail ", err) return end
            local ext = a:extend(5000)
            local rem = a:remaining()
            local ok, uerr = a:unlock()
            ngx.say("ok ", tostring(ext), " ", rem > 3000 and "valid" or ("short " .. rem), " ",
                    ok and "unlocked" or tostring(uerr))
          }
        }]] },
    }
    local r = res("nginx")
    local lk = assert(owner:lock(r, { ttl = 1000 }))
    local status, body = srv:get("/adopt?r=" .. r .. "&v=" .. lk.value)
    assert.are.equal(200, status)
    assert.are.equal("ok true valid unlocked\n", body)
    assert.are.equal(0, on_nodes(r))
    status, body = srv:get("/adopt?r=" .. r .. "&v=" .. lk.value)
    assert.are.equal(200, status)
    assert.are.equal("fail not held\n", body)
  end)

  describe("redlock exec handing its lock to a redlock run script", function()
    local BIN = proc.root .. "/build/redlock"
    local TMP, ENV

    setup(function()
      TMP = proc.tmpdir()
      ENV = "REDLOCK_SERVERS=" .. table.concat(cl.urls, ",")
      -- the script exec runs: adopt exec's lock from its environment, then
      -- (argument 1) "release" it, "release-and-stay" for a while after, or
      -- "extend" it (without keep-alive, so that its exit leaves it to exec)
      proc.write_file(TMP .. "/adopter.lua", [[
        local redlock = require "redlock"
        local how = arg[1]
        local dlm = redlock.default()
        local ttl = how == "env-ttl" and tonumber(os.getenv("REDLOCK_TTL_MS")) or 4000
        local lock, err = dlm:adopt(os.getenv("REDLOCK_RESOURCE"), os.getenv("REDLOCK_VALUE"),
                                    { ttl = ttl, keepalive = how ~= "extend" and how ~= "env-ttl" })
        if not lock then io.stderr:write("adopt failed: ", tostring(err), "\n") os.exit(3) end
        io.stdout:write("adopted ", lock.value:sub(1, 8), "\n")
        if how == "env-ttl" then return end
        if how == "extend" then
          assert(lock:extend(6000))
          io.stdout:write("extended\n")
          return
        end
        assert(lock:unlock())
        io.stdout:write("released\n")
        io.stdout:flush() -- (exec SIGKILLs a command whose lock is gone: nothing is flushed at exit)
        if how == "release-and-stay" then
          local t = os.time() + 10
          while os.time() < t do require("redlock.host.sys").sleep_ms(50) end
        end
      ]])
    end)

    teardown(function() proc.rmdir(TMP) end)

    local function exec(r, how, ttl)
      local t0 = proc.wall_ms()
      local out, rc = proc.sh(("cd %s && env %s %s exec --ttl %d %s -- %s run adopter.lua %s"):format(
        q(TMP), ENV, q(BIN), ttl or 3000, q(r), q(BIN), how))
      return out, rc, proc.wall_ms() - t0
    end

    it("a script that adopts and releases: exec says the lock was no longer held, and exits with its status", function()
      local r = res("exec-release")
      local out, rc = exec(r, "release")
      assert.are.equal(0, rc, out)
      assert.matches("adopted %S+\nreleased\n", out)
      assert.matches("redlock: '" .. r:gsub("%p", "%%%0") .. "' was no longer held when %S*redlock's process group ended"
        .. " %(released by a process it was handed to, expired, or dropped by nodes that restarted%); exiting with"
        .. " %S*redlock's status 0", out)
      assert.are.equal(0, on_nodes(r))
    end)

    it("a script that releases and goes on: exec sees the lock lost, stops it and exits 75, without a hang", function()
      local r = res("exec-stay")
      local out, rc, ms = exec(r, "release-and-stay", 600)
      assert.are.equal(75, rc, out)
      assert.matches("released\n", out)
      -- our value is gone from the nodes: no validity left, so SIGKILL at once
      assert.matches("lock on '" .. r:gsub("%p", "%%%0") .. "' lost; stopped %S+ %(pid %d+%): SIGKILL %(no validity left%)",
        out)
      assert.is_true(ms < 8000, ms) -- the script would run 10 s: it was stopped
      assert.are.equal(0, on_nodes(r))
    end)

    -- Before, exec did not say its ttl: an adopter without keep-alive took
    -- the client's default (10 s), and with exec --ttl 45s the key lapsed
    -- 10 s after the adoption, until exec's next extension 15 s after its last.
    it("tells the command its ttl (REDLOCK_TTL_MS): an adopter that takes it leaves the nodes exec's lease", function()
      local r = res("exec-ttl")
      local out, rc = proc.sh(("cd %s && env %s %s exec --ttl 30s %s -- sh -c "
        .. "'echo ttl=$REDLOCK_TTL_MS; %s run adopter.lua env-ttl && redis-cli -p %d PTTL %s'"):format(
        q(TMP), ENV, q(BIN), q(r), q(BIN), cl.ports[1], q(r)))
      assert.are.equal(0, rc, out)
      assert.matches("ttl=30000\nadopted %S+\n", out)
      local pttl = tonumber(out:match("adopted %S+\n(%-?%d+)"))
      assert.is_true(pttl ~= nil and pttl > 20000, out)
      assert.are.equal(0, on_nodes(r))
    end)

    -- Before: COMMAND was not told exec's --prefix, and an adopter following
    -- the docs looked for RESOURCE without it: "not held".
    it("tells the command the prefix (REDLOCK_PREFIX), from --prefix too: the adopter finds the key", function()
      local r = res("exec-prefix")
      local out, rc = proc.sh(("cd %s && env %s %s exec --prefix app: %s -- sh -c "
        .. "'echo prefix=$REDLOCK_PREFIX; %s run adopter.lua release'"):format(q(TMP), ENV, q(BIN), q(r), q(BIN)))
      assert.are.equal(0, rc, out)
      assert.matches("prefix=app:\nadopted %S+\nreleased\n", out)
      assert.are.equal(0, on_nodes("app:" .. r))
      -- without a prefix it is unset, one from the environment included
      out, rc = proc.sh(("cd %s && env %s REDLOCK_PREFIX=env: %s exec --prefix '' %s -- sh -c "
        .. "'echo prefix=${REDLOCK_PREFIX-unset}; %s run adopter.lua release'"):format(q(TMP), ENV, q(BIN), q(r),
        q(BIN)))
      assert.are.equal(0, rc, out)
      assert.matches("prefix=unset\nadopted %S+\nreleased\n", out)
      assert.are.equal(0, on_nodes(r))
    end)

    it("a script that adopts and extends: exec still holds the lock and releases it at the end, silently", function()
      local r = res("exec-extend")
      local out, rc = exec(r, "extend")
      assert.are.equal(0, rc, out)
      assert.matches("adopted %S+\nextended\n", out)
      assert.not_matches("no longer held", out)
      assert.are.equal(0, on_nodes(r))
    end)
  end)
end)
