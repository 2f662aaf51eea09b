-- Misuse and what users see: every number is checked before anything is
-- sent, misuse is raised at the caller's line naming the function called,
-- error texts never show a password, `detail` always has one shape, and a
-- failed extend never leaves a lock looking more valid than it is.

local redlock = require "redlock"
local cluster = require "helpers.cluster"
local proc = require "helpers.proc"

local res = cluster.names("misuse") -- res(tag): a resource name no other run uses

local NAN, INF = 0 / 0, 1 / 0

-- The line of the caller: misuse(here(), function() ... end, ...) keeps the
-- call under test on the line here() reports.
local function here()
  return debug.getinfo(2, "l").currentline
end

-- fn must raise, at this spec's line `line`, the message `text` (exact), or
-- one containing every string of the list `text`.
local function misuse(line, fn, text)
  local ok, e = pcall(fn)
  assert.is_false(ok, "expected an error")
  assert.is_string(e)
  local at, msg = e:match("misuse_spec%.lua:(%d+): (.*)$")
  assert.is_not_nil(at, "not raised at the caller's line: " .. e)
  assert.equal(line, tonumber(at), e)
  if type(text) == "string" then
    assert.equal(text, msg)
  else
    for _, part in ipairs(text) do assert.is_truthy(msg:find(part, 1, true), e) end
  end
  return msg
end

-- Calls of SET (the acquire command) handled by every node of cl so far.
local function sets(cl) return cluster.calls(cl, "set") end

-- detail must have the one shape of every nil, err, detail.
local function one_shape(detail, err, cl)
  assert.is_table(detail)
  assert.is_number(detail.ok)
  assert.is_number(detail.quorum)
  assert.is_number(detail.elapsed)
  assert.equal(err, detail.status)
  assert.equal(cl.n, #detail)
  for i, d in ipairs(detail) do
    assert.equal("redis://127.0.0.1:" .. cl.ports[i], d.server)
    assert.is_string(d.state)
  end
end

describe("misuse", function()
  local cl, dlm, other

  lazy_setup(function()
    cl = cluster.start(3)
    dlm = redlock.new { servers = cl.urls, ttl = 5000, node_timeout = 100 }
    other = redlock.new { servers = cl.urls }
  end)
  lazy_teardown(function()
    if dlm then dlm:close() end
    if other then other:close() end
    cluster.stop_all()
  end)

  describe("numbers and option keys", function()
    it("new() refuses unknown keys and bad numbers, naming them", function()
      local u = cl.urls
      misuse(here(), function() redlock.new { servers = u, tll = 5 } end,
        "bad argument #1 to 'new' (unknown option 'tll')")
      for _, v in ipairs { NAN, 1.5, -1, INF, "3" } do
        misuse(here(), function() redlock.new { servers = u, max_extensions = v } end,
          { "bad argument #1 to 'new'", "max_extensions" })
      end
      -- 2^32 + 2 would reach the core as quorum 2
      for _, v in ipairs { 2 ^ 32 + 2, NAN, 0, 2.5 } do
        misuse(here(), function() redlock.new { servers = u, quorum = v } end,
          { "bad argument #1 to 'new'", "quorum" })
      end
      for _, v in ipairs { NAN, INF, 1 } do
        misuse(here(), function() redlock.new { servers = u, drift_factor = v } end,
          { "bad argument #1 to 'new'", "drift_factor" })
      end
      for _, v in ipairs { NAN, INF, 2 ^ 31, 0.5 } do
        misuse(here(), function() redlock.new { servers = u, node_timeout = v } end,
          { "bad argument #1 to 'new'", "node_timeout" })
      end
      assert(redlock.new { servers = u, max_extensions = 0, quorum = 3 }):close()
    end)

    it("lock calls refuse unknown option keys, naming the key and the call", function()
      local r = res("keys")
      misuse(here(), function() dlm:lock(r, { tll = 5 }) end, "bad argument #2 to 'lock' (unknown option 'tll')")
      misuse(here(), function() dlm:try_lock(r, { tll = 5 }) end, "bad argument #2 to 'try_lock' (unknown option 'tll')")
      misuse(here(), function() dlm:lock_many({ r }, { tll = 5 }) end, "bad argument #2 to 'lock_many' (unknown option 'tll')")
      misuse(here(), function() dlm:with_lock(r, { tll = 5 }, function() end) end,
        "bad argument #2 to 'with_lock' (unknown option 'tll')")
      misuse(here(), function() dlm:lock(r, { 5000 }) end, "bad argument #2 to 'lock' (unknown option [1])")
      assert(cluster.await_value(cl, r, nil, 0))
    end)

    it("refuses a wait that is NaN, infinite or negative", function()
      -- Before: wait = NaN was accepted and never timed out.
      for _, v in ipairs { NAN, INF, -1, "100" } do
        misuse(here(), function() dlm:lock(res("wait"), { wait = v }) end, { "bad argument #2 to 'lock'", "wait" })
      end
    end)

    -- ttl 5000: a grant's validity is at most 5000 - (50 + 2) ms. Before: a
    -- margin up to 4999 was taken, and a lock kept with 4947 or more was
    -- lost as it was granted (the keeper never extended it).
    it("refuses a margin that is not a whole number of ms below the validity, before sending anything", function()
      local before = sets(cl)
      for _, v in ipairs { INF, NAN, 2 ^ 40, 1.5, -1, 5000, 4999, 4947 } do
        local r = res("margin")
        misuse(here(), function() dlm:lock(r, { keepalive = true, margin = v }) end,
          { "bad argument #2 to 'lock'", "margin" })
        misuse(here(), function() dlm:try_lock(r, { keepalive = true, margin = v }) end,
          { "bad argument #2 to 'try_lock'", "margin" })
        misuse(here(), function() dlm:lock_many({ r, r .. ":2" }, { keepalive = true, margin = v }) end,
          { "bad argument #2 to 'lock_many'", "margin" })
        misuse(here(), function() dlm:with_lock(r, { margin = v }, function() end) end,
          { "bad argument #2 to 'with_lock'", "margin" })
        for i = 1, cl.n do
          assert.is_nil(cluster.get(cl, i, r))
          assert.is_nil(cluster.get(cl, i, r .. ":2"))
        end
      end
      -- Before: the lock was acquired, then keep-alive refused the margin.
      assert.equal(before, sets(cl), "an acquire was sent")
      local lock = assert(dlm:try_lock(res("margin"), { keepalive = true, margin = 4946 }))
      assert(lock:unlock())
    end)

    -- Before: a margin without keep-alive was taken and ignored: the lock
    -- was not called lost margin ms early, and lock.margin stayed nil.
    it("refuses a margin without keep-alive, before sending anything", function()
      local before = sets(cl)
      local r = res("margin_alone")
      local text = "margin needs keep-alive (keepalive = true): it says when keep-alive calls the lock lost"
      misuse(here(), function() dlm:lock(r, { ttl = 1000, margin = 900 }) end,
        "bad argument #2 to 'lock' (" .. text .. ")")
      misuse(here(), function() dlm:try_lock(r, { margin = 10, keepalive = false }) end,
        "bad argument #2 to 'try_lock' (" .. text .. ")")
      misuse(here(), function() dlm:lock_many({ r, r .. ":2" }, { margin = 10 }) end,
        "bad argument #2 to 'lock_many' (" .. text .. ")")
      misuse(here(), function() dlm:with_lock(r, { keepalive = false, margin = 10 }, function() end) end,
        "bad argument #2 to 'with_lock' (" .. text .. ")")
      misuse(here(), function() dlm:adopt(r, ("0"):rep(40), { margin = 10 }) end,
        "bad argument #3 to 'adopt' (" .. text .. ")")
      assert.equal(before, sets(cl), "an acquire was sent")
      -- with keep-alive, the client's included, the margin is taken
      local kept = redlock.new { servers = cl.urls, keepalive = true }
      local lock = assert(kept:try_lock(r, { ttl = 1000, margin = 900 }))
      assert.equal(900, lock.margin)
      assert(lock:unlock())
      kept:close()
      assert.equal("done", dlm:with_lock(r, { ttl = 1000, margin = 900 }, function(lk)
        assert.equal(900, lk.margin)
        return "done"
      end))
    end)

    it("refuses a bad max_extensions given as a call option only through new()", function()
      misuse(here(), function() dlm:lock(res("maxext"), { max_extensions = 1 }) end,
        "bad argument #2 to 'lock' (unknown option 'max_extensions')")
    end)

    describe("a retry policy", function()
      local blocker, r

      before_each(function()
        r = res("policy")
        blocker = assert(other:try_lock(r, { ttl = 30000 }))
        -- granted at quorum, a slow node may get its SET only as `other`
        -- does I/O again: let it, so the key is on every node
        assert(cluster.await_value(cl, r, blocker.value, 5000, nil, other))
      end)
      after_each(function() assert(blocker:unlock()) end)

      -- Before: a delay the core cannot sleep became 0 ms: 6 attempts in no time.
      for _, v in ipairs { 2 ^ 31, 2 ^ 40, INF, NAN, -5, "100", {} } do
        local shown = type(v) == "string" and ("%q"):format(v) or type(v) == "table" and "a table" or tostring(v)
        it(("that returns %s raises naming the bad return, after one attempt"):format(shown), function()
          local calls = 0
          local policy = function(n)
            calls = calls + 1
            if n < 6 then return v end
          end
          local msg = misuse(here(), function() dlm:lock(r, { retry = policy }) end,
            { "bad retry policy: after attempt 1 it returned" })
          assert.equal(1, calls)
          if type(v) == "number" then assert.is_truthy(msg:find(tostring(v), 1, true), msg) end
          assert.equal(blocker.value, cluster.get(cl, 1, r))
        end)
      end

      -- Before: the maker ran as the policy, and raised from inside the
      -- module naming 'forever' and the resource ("max must be ..., got
      -- string").
      for _, maker in ipairs { "fixed", "jitter", "exponential", "forever" } do
        it(("that is redlock.retry.%s itself, not a policy it made, is refused naming it"):format(maker),
          function()
            misuse(here(), function() dlm:lock(r, { retry = redlock.retry[maker] }) end,
              { "bad argument #2 to 'lock'", ("redlock.retry.%s makes one, call it"):format(maker) })
            misuse(here(), function() redlock.new { servers = cl.urls, retry = redlock.retry[maker] } end,
              { "bad argument #1 to 'new'", ("redlock.retry.%s makes one"):format(maker) })
          end)
      end

      it("may return fractions of a ms, nil or false to give up", function()
        local n = 0
        local lock, err = dlm:lock(r, { retry = function(a)
          n = a
          if a == 1 then return 0.5 end
          if a == 2 then return false end
        end })
        assert.is_nil(lock)
        assert.equal("busy", err)
        assert.equal(2, n)
      end)
    end)

    it("redlock.retry refuses delays the core cannot sleep and unknown keys", function()
      local retry = redlock.retry
      misuse(here(), function() retry.fixed(2 ^ 31, 3) end, { "bad argument #1 to 'fixed'", "delay" })
      misuse(here(), function() retry.jitter(0, 2 ^ 40, 3) end, { "bad argument #2 to 'jitter'", "max" })
      misuse(here(), function() retry.forever(0, 2 ^ 31) end, { "bad argument #2 to 'forever'", "max" })
      misuse(here(), function() retry.forever(false, 100) end, { "bad argument #1 to 'forever'", "min" })
      misuse(here(), function() retry.exponential { base = false } end, { "bad argument #1 to 'exponential'", "base" })
      misuse(here(), function() retry.exponential { cap = 2 ^ 40 } end, { "bad argument #1 to 'exponential'", "cap" })
      misuse(here(), function() retry.exponential { bse = 5 } end,
        "bad argument #1 to 'exponential' (unknown option 'bse')")
      misuse(here(), function() retry.fixed(10, 1.5) end, { "bad argument #2 to 'fixed'", "attempts" })
      assert.is_function(retry.fixed(2 ^ 31 - 1, 3))
    end)
  end)

  describe("the caller's line and function", function()
    it("names the call and the caller's line for a bad resource", function()
      -- Before: reported at init.lua's own lines.
      misuse(here(), function() dlm:lock(nil) end,
        "bad argument #1 to 'lock' (resource must be a non-empty string, got nil)")
      misuse(here(), function() dlm:try_lock(nil) end,
        "bad argument #1 to 'try_lock' (resource must be a non-empty string, got nil)")
      misuse(here(), function() dlm:with_lock(nil, nil, function() end) end,
        "bad argument #1 to 'with_lock' (resource must be a non-empty string, got nil)")
      misuse(here(), function() dlm:lock_many({ "a", 7 }) end,
        "bad argument #1 to 'lock_many' (resources[2] must be a non-empty string, got 7)")
      misuse(here(), function() redlock.new { servers = {} } end, { "bad argument #1 to 'new'", "servers" })
    end)

    -- Before: reported at init.lua's line, as "'lock' on a closed client".
    it("names with_lock and the caller's line on a closed client", function()
      local closed = redlock.new { servers = cl.urls }
      closed:close()
      misuse(here(), function() closed:with_lock(res("w"), nil, function() end) end,
        "'with_lock' on a closed client")
      misuse(here(), function() closed:lock(res("w")) end, "'lock' on a closed client")
    end)

    -- Before: a method run as a coroutine's body (no caller outside the
    -- module) got a position inside init.lua.
    it("gives no position when nothing outside the module called", function()
      local ok, e = pcall(coroutine.wrap(dlm.lock), dlm, nil)
      assert.is_false(ok)
      assert.equal("bad argument #1 to 'lock' (resource must be a non-empty string, got nil)", e)
    end)

    -- Before: 70,000 names began 65,536 acquires, then raised "too many
    -- operations in flight" without collecting or releasing them; every
    -- later call on the client raised the same, and close() set the keys.
    it("refuses lock_many with more names than operations can be in flight, before sending anything", function()
      local names = {}
      for i = 1, 65537 do names[i] = res("many") .. ":" .. i end
      local before = sets(cl)
      misuse(here(), function() dlm:lock_many(names) end,
        "bad argument #1 to 'lock_many' (resources may list at most 65536 names, got 65537)")
      assert.equal(before, sets(cl), "an acquire was sent")
      local lk = assert(dlm:try_lock(res("after_many")))
      assert(lk:unlock())
    end)

    -- Before: "unknown option '_VERSION'", from the module's own fields.
    it("says to call new with a dot when called with a colon", function()
      misuse(here(), function() redlock:new { servers = cl.urls } end,
        "bad argument #1 to 'new' (options table expected, got the module (call redlock.new{...} with a dot))")
    end)

    -- Before: configure() kept anything; the mistake surfaced in default()
    -- later, named as new()'s.
    it("checks configure()'s options where it is called", function()
      misuse(here(), function() redlock.configure { ttl = "x" } end,
        "bad argument #1 to 'configure' (ttl must be a whole number of ms from 1 to 2147483647, got string \"x\")")
      misuse(here(), function() redlock.configure { servers = { 7 } } end,
        "bad argument #1 to 'configure' (servers[1] must be a URL string or { cluster = {...} }, got 7)")
      misuse(here(), function() redlock.configure { tll = 5 } end, { "bad argument #1 to 'configure'", "tll" })
      -- without servers too (before: kept, and refused by default() later)
      for _, q in ipairs { "three", 0 / 0, -1, 2.5, 17, {} } do
        misuse(here(), function() redlock.configure { quorum = q } end,
          { "bad argument #1 to 'configure' (quorum must be a whole number from 1 to 16, got " })
      end
    end)

    -- Before: each of these returned true; the mistake surfaced in
    -- default() later, named as new()'s ("bad argument #1 to 'new'").
    it("checks configure()'s servers and prefix as new() would, and client_defaults' too", function()
      local u = cl.urls
      local seventeen = {}
      for i = 1, 17 do seventeen[i] = "redis://127.0.0.1:" .. i end
      misuse(here(), function() redlock.configure { servers = { "http://x" } } end,
        "bad argument #1 to 'configure' (server 1: 'http://x': unknown scheme (use redis://, rediss:// or unix://))")
      misuse(here(), function() redlock.configure { servers = { u[1], u[1] } } end,
        { "bad argument #1 to 'configure' (servers 1 and 2 are the same server", "one server would vote twice)" })
      misuse(here(), function() redlock.configure { servers = seventeen } end,
        "bad argument #1 to 'configure' (too many servers (17; at most 16))")
      misuse(here(), function() redlock.configure { prefix = "redlock:" } end,
        "bad argument #1 to 'configure' (prefix starts with \"redlock:\", where redlock keeps its own keys)")
      misuse(here(), function() redlock.configure { prefix = ("p"):rep(70000) } end,
        "bad argument #1 to 'configure' (prefix is 70000 bytes long, more than a key may be (65536))")
      misuse(here(), function() redlock.hooks { client_defaults = { servers = { "junk" } } } end,
        { "bad argument #1 to 'hooks' (server 1: 'junk': " })
      misuse(here(), function() redlock.hooks { client_defaults = { prefix = "redlock:x" } } end,
        "bad argument #1 to 'hooks' (prefix starts with \"redlock:\", where redlock keeps its own keys)")
    end)

    -- Before: configure kept the caller's table, so a change made after it
    -- reached default() unchecked; and the REDLOCK_* TLS variables were
    -- read only when configure gave no servers.
    it("keeps a copy of configure()'s options, and takes the TLS variables unless configure gave tls (a fresh process)",
      function()
        local dir = proc.tmpdir()
        local script = dir .. "/child.lua"
        proc.write_file(script, [[
local redlock = require "redlock"
local mode, a, b, c = ...
local opts = { servers = { a, b, c } }
if mode == "tls" then opts.tls = {} end
redlock.configure(opts)
opts.servers[1], opts.prefix = "http://x", "redlock:"
local ok, d = pcall(redlock.default)
if not ok then io.write("refused: ", tostring(d), "\n") return end
local lk = d:try_lock("misuse:configure:copy")
io.write(lk and "locked" or "not locked", " ", d:nodes()[1], "\n")
if lk then lk:unlock() end
d:close()
]])
        local function child(mode, env)
          return proc.sh(("env -u REDLOCK_SERVERS %s LUA_PATH=%s LUA_CPATH=%s luajit %s %s %s 2>&1"):format(env,
            proc.quote(package.path), proc.quote(package.cpath), proc.quote(script), mode,
            table.concat({ proc.quote(cl.urls[1]), proc.quote(cl.urls[2]), proc.quote(cl.urls[3]) }, " ")))
        end
        local plain = child("plain", "-u REDLOCK_CACERT")
        local missing = child("plain", "REDLOCK_CACERT=/nonexistent/ca.pem")
        local given = child("tls", "REDLOCK_CACERT=/nonexistent/ca.pem")
        proc.rmdir(dir)
        assert.equal("locked " .. cl.urls[1] .. "\n", plain)
        assert.truthy(missing:find("refused: redlock.default(): REDLOCK_CACERT '/nonexistent/ca.pem'", 1, true),
          missing)
        assert.equal("locked " .. cl.urls[1] .. "\n", given)
      end)

    -- Before: default() raised new()'s refusal ("bad argument #1 to 'new'"),
    -- named tls.cafile for REDLOCK_CACERT, and without servers told a plain
    -- LuaJIT program to pass --servers, a flag of the host only.
    it("refuses what the environment gave default() as default()'s, naming the variables (a fresh process)", function()
      local function child(env)
        return proc.sh(("env -u REDLOCK_SERVERS -u REDLOCK_CACERT %s LUA_PATH=%s LUA_CPATH=%s luajit -e %s 2>&1")
          :format(env, proc.quote(package.path), proc.quote(package.cpath),
            proc.quote("print(select(2, pcall(require('redlock').default)))")))
      end
      assert.equal("redlock.default(): server 1: 'redis://127.0.0.1:99999': port must be a number from 1 to 65535"
        .. " (the servers from REDLOCK_SERVERS)\n", child("REDLOCK_SERVERS=redis://127.0.0.1:99999"))
      assert.equal("redlock.default(): REDLOCK_CACERT '/nonexistent/ca.pem': No such file or directory\n",
        child("REDLOCK_SERVERS=" .. cl.urls[1] .. " REDLOCK_CACERT=/nonexistent/ca.pem"))
      -- Before: a password with a comma, split there, was shown up to the comma
      local split = child("REDLOCK_SERVERS=redis://alice:topsecret,2024@127.0.0.1:6379")
      assert.is_nil(split:find("topsecret", 1, true), split)
      assert.truthy(split:find("server 1: 'redis://alice:***'", 1, true), split)
      local none = child("")
      assert.truthy(none:find("^no servers configured: set REDLOCK_SERVERS"), none)
      assert.truthy(none:find("redlock.configure", 1, true), none)
      assert.is_nil(none:find("--servers", 1, true), none)
    end)

    -- Before: these were passed over: servers = { u1, u2, u3, replicas = 1 }
    -- granted locks without waiting for any replica, { "h1", nil, "h2" }
    -- locked h1 alone, and { "k1", "k2", extra = "k3" } two of three.
    it("refuses holes and other keys in servers, a cluster's seeds and lock_many's list, sending nothing", function()
      local u = cl.urls
      misuse(here(), function() redlock.new { servers = { u[1], u[2], u[3], replicas = 1 } } end,
        "bad argument #1 to 'new' (servers must be a list without holes or other keys, "
          .. "has the key 'replicas' besides [1] to [3])")
      misuse(here(), function() redlock.configure { servers = { u[1], u[2], u[3], replicas = 1 } } end,
        "bad argument #1 to 'configure' (servers must be a list without holes or other keys, "
          .. "has the key 'replicas' besides [1] to [3])")
      misuse(here(), function() redlock.new { servers = { { cluster = { u[1], replicas = 1 } } } } end,
        "bad argument #1 to 'new' (servers[1].cluster must be a list without holes or other keys, "
          .. "has the key 'replicas' besides [1] to [1])")
      local holes = { u[1] }
      holes[3] = u[3]
      local ok, e = pcall(redlock.new, { servers = holes })
      assert.is_false(ok)
      assert.truthy(e:find("bad argument #1 to 'new' (servers", 1, true), e)
      local before = sets(cl)
      misuse(here(), function() dlm:lock_many({ res("k1"), res("k2"), extra = res("k3") }) end,
        "bad argument #1 to 'lock_many' (resources must be a list without holes or other keys, "
          .. "has the key 'extra' besides [1] to [2])")
      local names = { res("h1") }
      names[3] = res("h2")
      ok, e = pcall(dlm.lock_many, dlm, names)
      assert.is_false(ok)
      assert.truthy(e:find("bad argument #1 to 'lock_many' (resources", 1, true), e)
      misuse(here(), function() dlm:lock_many({ res("h1"), nil, res("h2"), res("h3") }) end,
        "bad argument #1 to 'lock_many' (resources[2] must be a non-empty string, got nil)")
      assert.equal(before, sets(cl), "an acquire was sent")
    end)

    -- Before: a URL whose password was cut from its host (a list split at a
    -- comma inside the password) showed the password in the message.
    it("never shows the password of a URL cut before its '@'", function()
      local ok, e = pcall(redlock.new, { servers = { "redis://:topsecret", cl.urls[2], cl.urls[3] } })
      assert.is_false(ok)
      assert.matches("'redis://:***': missing host", e, 1, true)
      assert.is_nil(e:find("topsecret", 1, true), e)
    end)

    -- Before: the URL was silently cut at the NUL.
    it("refuses a server URL holding a NUL byte", function()
      misuse(here(), function() redlock.new { servers = { cl.urls[1] .. "\0junk", cl.urls[2], cl.urls[3] } } end,
        "bad argument #1 to 'new' (servers[1] holds a NUL byte)")
    end)

    it("names with_lock, not lock, for with_lock's options", function()
      misuse(here(), function() dlm:with_lock(res("w"), { ttl = 0 }, function() end) end,
        "bad argument #2 to 'with_lock' (ttl must be a whole number of ms from 1 to 2147483647, got 0)")
    end)

    it("shows the type of a value of the wrong type", function()
      misuse(here(), function() dlm:lock(res("t"), { ttl = "100" }) end,
        "bad argument #2 to 'lock' (ttl must be a whole number of ms from 1 to 2147483647, got string \"100\")")
      misuse(here(), function() dlm:lock(res("t"), { ttl = 1.5 }) end,
        "bad argument #2 to 'lock' (ttl must be a whole number of ms from 1 to 2147483647, got 1.5)")
      misuse(here(), function() dlm:lock(res("t"), { keepalive = "yes" }) end,
        "bad argument #2 to 'lock' (keepalive must be a boolean, got string \"yes\")")
    end)

    it("raises 'a lock expected' when a method is called with a dot", function()
      local lock = assert(dlm:try_lock(res("dot")))
      -- Before: "attempt to index local 'self'" inside init.lua.
      misuse(here(), function() lock.unlock() end,
        "bad argument #1 to 'unlock' (a lock expected, got nil; call it as lock:unlock())")
      misuse(here(), function() lock.extend(1000) end,
        "bad argument #1 to 'extend' (a lock expected, got 1000; call it as lock:extend(ttl))")
      for _, m in ipairs { "valid", "remaining", "lost", "check" } do
        misuse(here(), function() lock[m]() end, { ("bad argument #1 to '%s' (a lock expected"):format(m) })
      end
      misuse(here(), function() dlm.try_lock("x") end,
        "bad argument #1 to 'try_lock' (a client expected, got string \"x\"; call it as dlm:try_lock(...))")
      for _, m in ipairs { "lock", "lock_many", "with_lock", "nodes" } do
        misuse(here(), function() dlm[m]() end, { ("bad argument #1 to '%s' (a client expected"):format(m) })
      end
      assert(lock:unlock())
      local locks = assert(dlm:lock_many({ res("dot1"), res("dot2") }))
      for _, m in ipairs { "unlock", "extend", "valid" } do
        misuse(here(), function() locks[m]() end, { ("bad argument #1 to '%s' (a group of locks expected"):format(m) })
      end
      assert(locks:unlock())
    end)

    -- Before: "bad argument #1" whichever argument was not a client.
    it("names the argument of redlock.metrics that is not a client", function()
      misuse(here(), function() redlock.metrics("x") end,
        "bad argument #1 to 'metrics' (a client expected, got string \"x\"; call it as redlock.metrics(dlm, ...))")
      misuse(here(), function() redlock.metrics(dlm, "x") end,
        "bad argument #2 to 'metrics' (a client expected, got string \"x\"; call it as redlock.metrics(dlm, ...))")
      misuse(here(), function() redlock.metrics(dlm, nil, other) end,
        "bad argument #2 to 'metrics' (a client expected, got nil; call it as redlock.metrics(dlm, ...))")
      misuse(here(), function() redlock.metrics(dlm, other, 7) end,
        "bad argument #3 to 'metrics' (a client expected, got 7; call it as redlock.metrics(dlm, ...))")
    end)

    it("raises inside with_lock's function at that function's line", function()
      local line
      local ok, e = pcall(dlm.with_lock, dlm, res("inner"), nil, function(lock)
        line = here(); lock.unlock()
      end)
      assert.is_false(ok)
      assert.equal(("misuse_spec.lua:%d: bad argument #1 to 'unlock'"):format(line),
        e:match("misuse_spec%.lua:%d+: bad argument #1 to 'unlock'"))
    end)
  end)

  describe("passwords and long URLs in new()'s errors", function()
    it("never shows the password", function()
      -- Before: 'redis://:topsecret@127.0.0.1:99999': port must be ...
      for _, url in ipairs { "redis://:topsecret@127.0.0.1:99999", "redis://user:topsecret@127.0.0.1:99999",
                             "redis://topsecret@127.0.0.1:99999", "redis://:topsecret@127.0.0.1:1/x",
                             "redis://:top secret@127.0.0.1:1", "rediss://:topsecret@127.0.0.1:99999" } do
        local msg = misuse(here(), function() redlock.new { servers = { cl.urls[1], url } } end,
          { "bad argument #1 to 'new' (server 2: '", "***@127.0.0.1:" })
        assert.is_nil(msg:find("topsecret", 1, true), msg)
        assert.is_nil(msg:find("top secret", 1, true), msg)
      end
      local msg = misuse(here(), function() redlock.new { servers = { "redis://:topsecret@127.0.0.1:99999" } } end,
        "bad argument #1 to 'new' (server 1: 'redis://:***@127.0.0.1:99999': port must be a number from 1 to 65535)")
      assert.is_string(msg)
    end)

    -- Before: a cluster's seed refused in Lua was quoted whole, password and all.
    it("never shows the password of a cluster's seed", function()
      for _, seed in ipairs { "redis://:topsecret@127.0.0.1:1 ", "redis://:topsecret@127.0.0.1:1?replicas=1",
                              "redis://:topsecret@127.0.0.1:1+127.0.0.1:2", "redis://user:topsecret@127.0.0.1:1 ",
                              "redis://topsecret@127.0.0.1:1 ", "http://:topsecret@127.0.0.1:1", "redis://:top secret",
                              "redis://:p@ss:topsecret@127.0.0.1:1 " } do
        local msg = misuse(here(), function() redlock.new { servers = { { cluster = { seed } } } } end,
          { "bad argument #1 to 'new' (servers[1].cluster[1] must be a redis:// or rediss:// URL", "***" })
        assert.is_nil(msg:find("topsecret", 1, true), msg)
        assert.is_nil(msg:find("top secret", 1, true), msg)
      end
      misuse(here(), function() redlock.new { servers = { { cluster = { "redis://:topsecret@127.0.0.1:1 " } } } } end,
        "bad argument #1 to 'new' (servers[1].cluster[1] must be a redis:// or rediss:// URL (no '+', '?' or space), "
          .. "got string \"redis://:***@127.0.0.1:1 \")")
    end)

    -- Before: 'redis-cluster://admin:topsecret@': no seed ..., in new() and configure().
    it("never shows the password of a cluster URL with no seed", function()
      for _, url in ipairs { "redis-cluster://admin:topsecret@", "rediss-cluster://admin:topsecret@?replicas=1",
                             "redis-cluster://:topsecret@" } do
        local msg = misuse(here(), function() redlock.new { servers = { url } } end,
          { "bad argument #1 to 'new' (server 1: '", "': no seed (redis-cluster://host:port+host:port)" })
        assert.is_nil(msg:find("topsecret", 1, true), msg)
        msg = misuse(here(), function() redlock.configure { servers = { url } } end,
          { "bad argument #1 to 'configure' (server 1: '", "': no seed" })
        assert.is_nil(msg:find("topsecret", 1, true), msg)
      end
    end)

    it("cuts a long URL and keeps the reason", function()
      -- Before: the reason fell off the end of the message.
      local long = "redis://" .. ("h"):rep(300) .. ":6379"
      local msg = misuse(here(), function() redlock.new { servers = { long } } end,
        { "bad argument #1 to 'new' (server 1: 'redis://hhhh", "...': host name too long)" })
      assert.is_true(#msg < 200, msg)
      local pw = "redis://:" .. ("p"):rep(200) .. "@127.0.0.1:0"
      msg = misuse(here(), function() redlock.new { servers = { pw } } end,
        "bad argument #1 to 'new' (server 1: 'redis://:***@127.0.0.1:0': port must be a number from 1 to 65535)")
      assert.is_string(msg)
    end)
  end)

  describe("detail", function()
    it("has one shape for invalid and expired too", function()
      local lock = assert(dlm:try_lock(res("shape"), { ttl = 200 }))
      assert(lock:unlock())
      -- Before: detail was a string here.
      local ok, err, detail = lock:unlock()
      assert.is_nil(ok)
      assert.equal("invalid", err)
      one_shape(detail, "invalid", cl)
      assert.equal("the lock was already unlocked", detail.message)
      ok, err, detail = lock:extend(1000)
      assert.is_nil(ok)
      assert.equal("invalid", err)
      one_shape(detail, "invalid", cl)
      assert.is_string(detail.message)

      lock = assert(dlm:try_lock(res("shape"), { ttl = 50 }))
      while lock:remaining() > 0 do proc.sleep_ms(10) end
      ok, err, detail = lock:extend(1000)
      assert.is_nil(ok)
      assert.equal("expired", err)
      one_shape(detail, "expired", cl)
      -- Before: "the lock was lost: keep-alive found it gone or could not
      -- extend it in time", for a lock keep-alive never had.
      assert.equal("no validity left to extend", detail.message)

      local capped = redlock.new { servers = cl.urls, max_extensions = 1 }
      lock = assert(capped:try_lock(res("shape")))
      assert(lock:extend())
      ok, err, detail = lock:extend()
      assert.is_nil(ok)
      assert.equal("invalid", err)
      one_shape(detail, "invalid", cl)
      assert.equal("extension limit (1) reached", detail.message)
      assert(lock:unlock())
      capped:close()

      -- and a round's detail has the same fields
      local r2 = res("shape2")
      local blocker = assert(other:try_lock(r2))
      ok, err, detail = dlm:try_lock(r2)
      assert.is_nil(ok)
      assert.equal("busy", err)
      one_shape(detail, "busy", cl)
      assert(blocker:unlock())
    end)

    it("a lock_many group unlocked twice answers as a single lock does", function()
      local locks = assert(dlm:lock_many({ res("g1"), res("g2") }))
      assert.is_true(locks:unlock())
      -- Before: true again.
      local ok, err, detail = locks:unlock()
      assert.is_nil(ok)
      assert.equal("invalid", err)
      one_shape(detail, "invalid", cl)
      assert.is_string(detail.message)
    end)

    it("a group member whose release failed may be unlocked again", function()
      local rs = { res("gf1"), res("gf2") }
      local locks = assert(dlm:lock_many(rs, { ttl = 10000 }))
      assert(cluster.await_value(cl, rs[2], locks[2].value, 1000, nil, dlm))
      for i = 1, cl.n do cl:cli(i, "SET", rs[2], "someone-else", "PX", "10000") end
      local ok, err = locks:unlock()
      assert.is_nil(ok)
      assert.equal("not held", err)
      assert(cluster.await_value(cl, rs[1], nil, 1000, nil, dlm))
      for i = 1, cl.n do cl:cli(i, "DEL", rs[2]) end
      -- the one that failed is tried again, the released one is not
      ok, err = locks:unlock()
      assert.is_nil(ok)
      assert.equal("not held", err)
      assert.is_true(locks[1].released)
      assert.is_false(locks[2].released)
    end)
  end)

  describe("a failed extend", function()
    it("that reached the nodes with a tiny ttl leaves the lock invalid", function()
      local r = res("tiny")
      local lock = assert(dlm:try_lock(r, { ttl = 5000 }))
      local ok, err, detail = lock:extend(2)
      assert.is_nil(ok)
      assert.equal("timeout", err)
      one_shape(detail, "timeout", cl)
      -- Before: valid() true, remaining() about 4900, lost() false.
      assert.is_false(lock:valid())
      assert.is_true(lock:remaining() <= 0)
      assert.is_true(lock:lost())
      -- and indeed the keys are gone: another client may take it
      assert(cluster.await_value(cl, r, nil, 1000))
      local theirs = assert(other:try_lock(r))
      assert.is_false(lock:valid())
      assert(theirs:unlock())
    end)

    it("leaves a kept lock lost too, when the tiny ttl reached the nodes", function()
      local r = res("tinykept")
      local lock = assert(dlm:try_lock(r, { ttl = 5000, keepalive = true }))
      local ok, err = lock:extend(2)
      assert.is_nil(ok)
      assert.equal("timeout", err)
      assert.is_false(lock:valid())
      assert.is_true(lock:lost())
      assert.is_true(lock:remaining() <= 0)
      lock:unlock()
    end)

    it("that found our value gone from a majority declares the lock lost", function()
      local r = res("gone")
      local lock = assert(dlm:try_lock(r, { ttl = 10000 }))
      assert(cluster.await_value(cl, r, lock.value, 1000, nil, dlm))
      for i = 2, 3 do cl:cli(i, "SET", r, "someone-else", "PX", "10000") end
      local ok, err = lock:extend(3000)
      assert.is_nil(ok)
      assert.equal("not held", err)
      assert.is_false(lock:valid())
      assert.is_true(lock:lost())
      assert.is_true(lock:remaining() <= 0)
    end)

    it("that reached one node with a shorter ttl lowers the validity to that ttl's", function()
      local r = res("short")
      local lock = assert(dlm:try_lock(r, { ttl = 10000 }))
      assert(cluster.await_value(cl, r, lock.value, 1000, nil, dlm))
      assert(cl:kill(2, "STOP"))
      assert(cl:kill(3, "STOP"))
      local ok, err = lock:extend(1000)
      assert(cl:kill(2, "CONT"))
      assert(cl:kill(3, "CONT"))
      assert.is_nil(ok)
      assert.equal("unavailable", err)
      -- node 1 took the 1000 ms ttl: the lock may last no longer than that
      assert.is_true(cluster.pttl(cl, 1, r) <= 1000)
      -- Before: remaining() still said about 9900.
      assert.is_true(lock:remaining() <= 1000, "remaining " .. lock:remaining())
    end)
  end)
end)
