-- Bad input and bad nodes: misuse raises at the call site naming the
-- argument; a node that speaks garbage, never answers, resets, refuses auth
-- or answers with an error is one failed vote, never a crash.

local redlock = require "redlock"
local cluster = require "helpers.cluster"
local faults = require "helpers.faults"
local proc = require "helpers.proc"

local NODE_TIMEOUT = 50
local ROUND_BOUND = 10 * NODE_TIMEOUT

local res = cluster.names("input") -- res(tag): a resource name no other run uses

-- fn must raise a "bad argument" error that names what is wrong.
local function raises(fn, pattern)
  local ok, e = pcall(fn)
  assert.is_false(ok, "expected an error matching " .. pattern)
  assert.is_string(e)
  assert.matches("bad argument", e)
  assert.matches(pattern, e)
  return e
end

describe("input", function()
  local cl

  lazy_setup(function() cl = cluster.start(3) end)
  teardown(function()
    faults.stop_all()
    cluster.stop_all()
  end)

  describe("redlock.new", function()
    it("rejects a missing or empty server list", function()
      raises(function() redlock.new {} end, "servers")
      raises(function() redlock.new { servers = {} } end, "servers")
      raises(function() redlock.new { servers = "redis://127.0.0.1:6379" } end, "servers")
      raises(function() redlock.new() end, "#1")
    end)

    local bad_urls = {
      "",
      "127.0.0.1:6379",
      "redis://",
      "redis://127.0.0.1:",
      "redis://127.0.0.1:abc",
      "redis://127.0.0.1:0",
      "redis://127.0.0.1:70000",
      "redis://127.0.0.1:-1",
      "redis://127.0.0.1:6379/notadb",
      "redis://:6379",
      "http://127.0.0.1:6379",
      "memcached://127.0.0.1:6379",
      "unix://",
      "unix:///tmp/x.sock?db=abc",
    }
    -- what is not a port after "host:" may be a password cut from its host
    -- ("user:top,secret@h" split at the comma): the message hides it
    local shown = { ["redis://127.0.0.1:abc"] = "redis://127.0.0.1:***", ["redis://127.0.0.1:-1"] = "redis://127.0.0.1:***" }
    for _, url in ipairs(bad_urls) do
      it(("rejects the malformed URL %q naming the server and the URL"):format(url), function()
        local e = raises(function() redlock.new { servers = { url } } end, "server")
        if url ~= "" then assert.matches(shown[url] or url, e, 1, true) end
        -- also when it hides among good ones: the message says which one
        e = raises(function() redlock.new { servers = { cl.urls[1], url, cl.urls[2] } } end, "server")
        assert.matches("2", e, 1, true)
      end)
    end

    it("rejects a server entry that is not a string", function()
      raises(function() redlock.new { servers = { cl.urls[1], 42 } } end, "servers")
      raises(function() redlock.new { servers = { {} } } end, "servers")
    end)

    it("rejects a node listed twice", function()
      local e = raises(function()
        redlock.new { servers = { cl.urls[1], cl.urls[2], cl.urls[1] } }
      end, "servers")
      assert.matches("127.0.0.1:" .. cl.ports[1], e, 1, true)
    end)

    it("rejects one node written twice with and without a password or db 0", function()
      local u = "redis://127.0.0.1:" .. cl.ports[1]
      raises(function() redlock.new { servers = { u, "redis://:pw@127.0.0.1:" .. cl.ports[1] } } end,
        "servers")
      raises(function() redlock.new { servers = { u, u .. "/0" } } end, "servers")
    end)

    it("rejects ttl <= 0 or not a number", function()
      for _, ttl in ipairs { 0, -1, -1000 } do
        raises(function() redlock.new { servers = cl.urls, ttl = ttl } end, "ttl")
      end
      raises(function() redlock.new { servers = cl.urls, ttl = "10000x" } end, "ttl")
      raises(function() redlock.new { servers = cl.urls, ttl = {} } end, "ttl")
    end)

    it("rejects bad node_timeout, drift_factor, quorum, prefix and retry", function()
      raises(function() redlock.new { servers = cl.urls, node_timeout = 0 } end, "node_timeout")
      raises(function() redlock.new { servers = cl.urls, node_timeout = "x" } end, "node_timeout")
      raises(function() redlock.new { servers = cl.urls, drift_factor = -0.1 } end, "drift_factor")
      raises(function() redlock.new { servers = cl.urls, quorum = 1 } end, "quorum") -- below 3/2+1
      raises(function() redlock.new { servers = cl.urls, quorum = 4 } end, "quorum") -- above N
      raises(function() redlock.new { servers = cl.urls, prefix = 7 } end, "prefix")
      raises(function() redlock.new { servers = cl.urls, retry = 5 } end, "retry")
    end)
  end)

  describe("lock calls", function()
    local dlm

    lazy_setup(function()
      dlm = redlock.new { servers = cl.urls, node_timeout = NODE_TIMEOUT }
    end)
    lazy_teardown(function() if dlm then dlm:close() end end)

    it("reject an empty or non-string resource", function()
      raises(function() dlm:try_lock("") end, "resource")
      raises(function() dlm:lock("") end, "resource")
      raises(function() dlm:try_lock(nil) end, "resource")
      raises(function() dlm:try_lock({}) end, "resource")
      raises(function() dlm:with_lock("", {}, function() end) end, "resource")
      raises(function() dlm:lock_many({ "a", "" }) end, "resource")
      raises(function() dlm:lock_many({}) end, "got an empty table")
      -- Before: "got an empty table" for a table with keys but no [1]
      raises(function() dlm:lock_many({ [2] = "a" }) end, "got a table with no %[1%]")
    end)

    it("reject ttl <= 0 or not a number", function()
      raises(function() dlm:try_lock(res("t"), { ttl = 0 }) end, "ttl")
      raises(function() dlm:try_lock(res("t"), { ttl = -5 }) end, "ttl")
      raises(function() dlm:lock(res("t"), { ttl = "soon" }) end, "ttl")
    end)

    it("reject bad options", function()
      raises(function() dlm:lock(res("o"), "fast") end, "#2")
      raises(function() dlm:lock(res("o"), { wait = -1 }) end, "wait")
      raises(function() dlm:lock(res("o"), { retry = "always" }) end, "retry")
      raises(function() dlm:with_lock(res("o"), {}, "notafunction") end, "#3")
    end)

    it("reject a bad extend ttl", function()
      local lock = assert(dlm:try_lock(res("ext")))
      raises(function() lock:extend(0) end, "ttl")
      raises(function() lock:extend("x") end, "ttl")
      assert(lock:unlock())
    end)

    it("are binary-safe: a resource with NUL bytes is its own key", function()
      local base = res("nul")
      local r1 = base .. "\0one"
      local r2 = base .. "\0two"
      local l1 = assert(dlm:try_lock(r1))
      assert.equal(r1, l1.resource)
      for i = 1, 3 do
        assert.equal(l1.value, cluster.get(cl, i, r1))
        assert.is_nil(cluster.get(cl, i, base)) -- not cut at the NUL
      end
      -- a different resource that shares the bytes before the NUL is free
      local l2 = assert(dlm:try_lock(r2))
      for i = 1, 3 do assert.equal(l2.value, cluster.get(cl, i, r2)) end
      -- and the same one is busy
      local l3, err = dlm:try_lock(r1)
      assert.is_nil(l3)
      assert.equal("busy", err)
      assert(l1:extend(5000))
      for i = 1, 3 do assert.is_true(cluster.pttl(cl, i, r1) > 4000) end
      assert(l1:unlock())
      assert(l2:unlock())
      for i = 1, 3 do
        assert.is_nil(cluster.get(cl, i, r1))
        assert.is_nil(cluster.get(cl, i, r2))
      end
    end)

    it("accept a binary resource made of every byte value", function()
      local t = {}
      for b = 0, 255 do t[#t + 1] = string.char(b) end
      local r = res("bytes") .. table.concat(t)
      local lock = assert(dlm:try_lock(r))
      for i = 1, 3 do assert.equal(lock.value, cluster.get(cl, i, r)) end
      assert(lock:unlock())
      for i = 1, 3 do assert.is_nil(cluster.get(cl, i, r)) end
    end)
  end)

  describe("bad nodes", function()
    -- One bad node among two real ones: the lock is still granted by the
    -- real two and the bad one shows as a failed vote. Three bad nodes: the
    -- lock fails with "unavailable" within a bounded time. Never a crash.
    local cases = {
      { mode = "garbage", state = "error" },
      { mode = "reset", state = "error" },
      { mode = "error", state = "error", text = "boom" },
      { mode = "readonly", state = "error", text = "READONLY" },
      { mode = "oom", state = "error", text = "OOM" },
      { mode = "loading", state = "error", text = "LOADING" },
      -- Before: "replies out of step with commands (a reply was lost)", when
      -- none was: the node answered SET with an integer
      { mode = "integer", state = "error", text = "connection reset: an integer reply where SET's was expected" },
      -- silent: a round times out; the connection, whose setup was never
      -- answered, lives on until its connect timeout (1000 ms), after which
      -- the node is down a while and says why
      { mode = "silent", state = "timeout", or_error = "AUTH/SELECT/INFO timed out after 1000 ms" },
    }
    for _, case in ipairs(cases) do
      describe(("a node that answers '%s'"):format(case.mode), function()
        local fakes, dlm

        lazy_setup(function()
          fakes = { faults.fakeserver(case.mode), faults.fakeserver(case.mode), faults.fakeserver(case.mode) }
        end)
        lazy_teardown(function()
          if dlm then dlm:close() end
          for _, f in ipairs(fakes or {}) do f:stop() end
        end)

        it("is one failed vote; the two real nodes grant the lock", function()
          dlm = redlock.new { servers = { fakes[1].url, cl.urls[2], cl.urls[3] },
                              node_timeout = NODE_TIMEOUT }
          for _ = 1, 3 do
            local r = res(case.mode)
            local lock, err, detail = dlm:try_lock(r)
            assert.is_nil(err, tostring(err) .. " " .. cluster.show(detail))
            for i = 2, 3 do assert.equal(lock.value, cluster.get(cl, i, r)) end
            assert(lock:unlock())
          end
          dlm:close()
          dlm = nil
        end)

        it("makes the lock unavailable when every node does it, with per-node detail", function()
          dlm = redlock.new { servers = { fakes[1].url, fakes[2].url, fakes[3].url },
                              node_timeout = NODE_TIMEOUT }
          for _ = 1, 3 do
            local t0 = proc.now_ms()
            local lock, err, detail = dlm:try_lock(res(case.mode))
            local ms = proc.now_ms() - t0
            assert.is_nil(lock)
            assert.equal("unavailable", err)
            assert.is_true(ms < ROUND_BOUND, ("took %.1f ms"):format(ms))
            assert.equal(0, detail.ok)
            -- decided as soon as quorum is impossible: 2 failed votes of 3;
            -- a node not needed for that may still be pending
            local failed = 0
            for i = 1, 3 do
              assert.equal(fakes[i].url, detail[i].server)
              local st = detail[i].state
              local also = case.or_error and st == "error"
              assert.is_truthy(st == case.state or st == "pending" or also, cluster.show(detail))
              if also then assert.matches(case.or_error, detail[i].error, 1, true) end
              if st == case.state or also then failed = failed + 1 end
              if st == "error" then
                assert.is_string(detail[i].error)
                assert.is_true(#detail[i].error > 0)
                if case.text then
                  assert.matches(case.text, detail[i].error, 1, true)
                end
              end
            end
            assert.is_true(failed >= 2, cluster.show(detail))
          end
          -- the process is fine: the fake servers are still up, we are too
          for i = 1, 3 do assert.is_true(fakes[i]:alive()) end
          dlm:close()
          dlm = nil
        end)
      end)
    end

    it("a node that is not listening at all is one failed vote", function()
      -- a port that was free a moment ago: nothing listens on it
      local ports = {}
      local tmp = cluster.start(1)
      ports[1] = tmp.ports[1]
      tmp:stop()
      local dlm = redlock.new { servers = { "redis://127.0.0.1:" .. ports[1], cl.urls[2], cl.urls[3] },
                                node_timeout = NODE_TIMEOUT }
      local lock, err, detail = dlm:try_lock(res("refused"))
      assert.is_nil(err, tostring(err) .. " " .. cluster.show(detail))
      assert(lock:unlock())
      dlm:close()
    end)
  end)

  describe("passwords", function()
    local pcl

    lazy_setup(function() pcl = cluster.start(3, { password = "right-pw" }) end)
    lazy_teardown(function() if pcl then pcl:stop() end end)

    it("authenticate with the password in the URL", function()
      local dlm = redlock.new { servers = pcl.urls }
      local r = res("auth")
      local lock, err, detail = dlm:try_lock(r)
      assert.is_nil(err, tostring(err) .. " " .. cluster.show(detail))
      for i = 1, 3 do assert.equal(lock.value, cluster.get(pcl, i, r)) end
      assert(lock:unlock())
      dlm:close()
    end)

    it("never show the password in detail", function()
      local dlm = redlock.new { servers = pcl.urls }
      local r = res("nopw")
      assert.is_true(cluster.set_nx(pcl, 1, r, "x", 10000))
      assert.is_true(cluster.set_nx(pcl, 2, r, "x", 10000))
      local _, err, detail = dlm:try_lock(r)
      assert.equal("busy", err)
      for i = 1, 3 do
        assert.equal("redis://127.0.0.1:" .. pcl.ports[i], detail[i].server)
        assert.is_nil(tostring(detail[i].error):find("right-pw", 1, true))
      end
      dlm:close()
    end)

    it("make a wrong or missing password a failed vote with the reason", function()
      for _, auth in ipairs { ":wrong-pw@", "" } do
        local urls = {}
        for i = 1, 3 do urls[i] = "redis://" .. auth .. "127.0.0.1:" .. pcl.ports[i] end
        local dlm = redlock.new { servers = urls, node_timeout = NODE_TIMEOUT }
        for _ = 1, 2 do
          local t0 = proc.now_ms()
          local lock, err, detail = dlm:try_lock(res("wrongpw"))
          local ms = proc.now_ms() - t0
          assert.is_nil(lock)
          assert.equal("unavailable", err)
          assert.is_true(ms < ROUND_BOUND, ("took %.1f ms"):format(ms))
          local refused = 0
          for i = 1, 3 do
            if detail[i].state ~= "pending" then -- decided once 2 of 3 refused
              assert.equal("error", detail[i].state, cluster.show(detail))
              local text = tostring(detail[i].error):upper()
              assert.is_truthy(text:find("AUTH", 1, true) or text:find("PASS", 1, true),
                cluster.show(detail))
              refused = refused + 1
            end
          end
          assert.is_true(refused >= 2, cluster.show(detail))
        end
        dlm:close()
      end
    end)

    it("grant the lock when only one node has the wrong password", function()
      local urls = { "redis://:wrong-pw@127.0.0.1:" .. pcl.ports[1], pcl.urls[2], pcl.urls[3] }
      local dlm = redlock.new { servers = urls, node_timeout = NODE_TIMEOUT }
      local r = res("onewrong")
      local lock, err, detail = dlm:try_lock(r)
      assert.is_nil(err, tostring(err) .. " " .. cluster.show(detail))
      assert.is_nil(cluster.get(pcl, 1, r))
      assert(lock:unlock())
      dlm:close()
    end)
  end)

  describe("other ways to reach a node", function()
    it("locks over unix sockets", function()
      local dir, nodes, urls = proc.tmpdir(), {}, {}
      for i = 1, 3 do
        local path = ("%s/node%d.sock"):format(dir, i)
        nodes[i] = cluster.start(1, { args = { "--unixsocket", path, "--unixsocketperm", "700" } })
        urls[i] = "unix://" .. path
      end
      local dlm = redlock.new { servers = urls }
      local r = res("unix")
      local lock, err, detail = dlm:try_lock(r)
      assert.is_nil(err, tostring(err) .. " " .. cluster.show(detail))
      for i = 1, 3 do assert.equal(lock.value, cluster.get(nodes[i], 1, r)) end
      assert(lock:unlock())
      for i = 1, 3 do assert.is_nil(cluster.get(nodes[i], 1, r)) end
      dlm:close()
      for i = 1, 3 do nodes[i]:stop() end
      proc.rmdir(dir)
    end)

    it("selects the database in the URL, and makes a refused SELECT a failed vote with the reason", function()
      local urls = {}
      for i = 1, 3 do urls[i] = cl.urls[i] .. "/5" end
      local dlm = redlock.new { servers = urls }
      local r = res("db")
      local lock, err, detail = dlm:try_lock(r)
      assert.is_nil(err, tostring(err) .. " " .. cluster.show(detail))
      for i = 1, 3 do
        assert.is_nil(cluster.get(cl, i, r)) -- not in db 0
        assert.equal(lock.value, (cl:cli(i, "-n", "5", "GET", r)))
      end
      assert(lock:unlock())
      dlm:close()

      urls[1] = cl.urls[1] .. "/99" -- redis has 16 databases
      dlm = redlock.new { servers = urls, node_timeout = NODE_TIMEOUT }
      for _ = 1, 2 do
        lock, err, detail = dlm:try_lock(res("baddb"))
        assert.is_nil(err, tostring(err) .. " " .. cluster.show(detail))
        assert.equal(2, lock.votes)
        assert(lock:unlock())
      end
      dlm:close()

      urls[2] = cl.urls[2] .. "/99"
      dlm = redlock.new { servers = urls, node_timeout = NODE_TIMEOUT }
      lock, err, detail = dlm:try_lock(res("baddb"))
      assert.is_nil(lock)
      assert.equal("unavailable", err)
      for i = 1, 2 do
        assert.equal("error", detail[i].state, cluster.show(detail))
        assert.matches("SELECT refused: ERR DB index is out of range", detail[i].error, 1, true)
      end
      dlm:close()
    end)

    it("authenticates as an ACL user, and names a wrong user password in the reason", function()
      local acl = cluster.start(3, { args = { "--user", "locker", "on", ">locker-pw", "~*", "+@all" } })
      local urls, bad = {}, {}
      for i = 1, 3 do
        urls[i] = "redis://locker:locker-pw@127.0.0.1:" .. acl.ports[i]
        bad[i] = "redis://locker:nope@127.0.0.1:" .. acl.ports[i]
      end
      local dlm = redlock.new { servers = urls }
      local r = res("acl")
      local lock, err, detail = dlm:try_lock(r)
      assert.is_nil(err, tostring(err) .. " " .. cluster.show(detail))
      for i = 1, 3 do assert.equal(lock.value, cluster.get(acl, i, r)) end
      assert(lock:unlock())
      dlm:close()

      dlm = redlock.new { servers = bad, node_timeout = NODE_TIMEOUT }
      lock, err, detail = dlm:try_lock(res("aclbad"))
      assert.is_nil(lock)
      assert.equal("unavailable", err)
      for i = 1, 3 do
        if detail[i].state ~= "pending" then
          assert.matches("AUTH refused: WRONGPASS", detail[i].error, 1, true)
          assert.is_nil(detail[i].error:find("nope", 1, true))
        end
      end
      dlm:close()
      acl:stop()
    end)
  end)
end)
