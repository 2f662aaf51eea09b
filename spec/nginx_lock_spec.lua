-- Locks inside nginx: redlock.cosocket (the C engine over ngx.socket.tcp)
-- against real redis nodes. Mutual exclusion with plain LuaJIT processes on
-- the same resource, a waiting lock call that does not block the worker,
-- stalled nodes, phases without cosockets, per-request and per-worker
-- clients sharing the worker's hub (one connection per node, an idle hub
-- stopping, a worker exiting), keep-alive on the hub's timer (many locks,
-- wrk, overlapping extensions, a reload), grants to aborted requests, and
-- replies that stay in step when rounds decided at quorum leave tails behind.

local nginx = require "helpers.nginx"
local cluster = require "helpers.cluster"
local faults = require "helpers.faults"
local history = require "helpers.history"
local proc = require "helpers.proc"
local redlock = require "redlock"

local res = cluster.names("nginx_lock")

local PING = nginx.PING

local lua_list = nginx.lua_list

-- init_by_lua: the module, and a per-worker client DLM (made before the
-- fork, so every worker has its own copy) on urls with extra options.
local function init_code(urls, extra)
  return ([[
    redlock = require "redlock"
    sproc = require "helpers.proc"
    URLS = %s
    DLM = redlock.new { servers = URLS, ttl = 3000 %s }
  ]]):format(lua_list(urls), extra and (", " .. extra) or "")
end

local start = nginx.start_tree
-- lock r (arg r), unlock; "ok" or "fail <err>" (with the per-node detail)
local LOCK_UNLOCK = [[
  location = /lock {
    content_by_lua_block {
      local r = ngx.var.arg_r
      local t0 = sproc.now_ms()
      local lock, err, d = DLM:try_lock(r)
      local t1 = sproc.now_ms()
      if not lock then
        local parts = {}
        for i = 1, #d do parts[i] = tostring(d[i].state) end
        ngx.say("fail ", err, " ", table.concat(parts, ","), (" lock_ms=%.0f"):format(t1 - t0))
        return
      end
      local ok, uerr = lock:unlock()
      ngx.say(ok and "ok" or ("unlock-fail " .. tostring(uerr)),
              (" lock_ms=%.0f unlock_ms=%.0f"):format(t1 - t0, sproc.now_ms() - t1))
    }
  }]]

-- INFO of node i, parsed into a table of field -> text
-- a client made per request: lock r (arg r) waiting for it, unlock, close
local PER_REQUEST = [[
  location = /perreq {
    content_by_lua_block {
      local dlm = redlock.new { servers = URLS, ttl = 3000 }
      local lock, err = dlm:lock(ngx.var.arg_r, { wait = 5000, retry = redlock.retry.jitter(1, 10, 100000) })
      if not lock then ngx.say("fail ", err) return end
      local ok, uerr = lock:unlock()
      dlm:close()
      ngx.say(ok and "ok" or ("unlock " .. tostring(uerr)))
    }
  }]]

local function info(cl, i)
  local out, ok = cl:cli(i, "INFO", "all")
  assert(ok, out)
  local t = {}
  for k, v in out:gmatch("([%w_]+):([^\r\n]*)") do t[k] = v end
  return t
end

local function calls(t, cmd)
  local s = t["cmdstat_" .. cmd]
  return s and tonumber(s:match("calls=(%d+)")) or 0
end

describe("redlock inside nginx", function()
  local cl, srv

  -- One worker with the per-worker client DLM on the spec's nodes, serving
  -- PING and the given location blocks.
  local function one_worker(locations)
    table.insert(locations, 1, PING)
    return start { workers = 1, init = init_code(cl.urls), locations = locations }
  end

  local function log()
    return srv and ("\nnginx error log:\n" .. srv:error_log():sub(-3000)) or ""
  end

  lazy_setup(function() cl = cluster.start(5) end)
  after_each(function()
    if srv then srv:stop() end
    srv = nil
  end)
  teardown(function()
    nginx.stop_all()
    faults.stop_all()
    cluster.stop_all()
  end)

  it("excludes plain LuaJIT processes and nginx workers from each other (same keys, same scripts)", function()
    local cnode = cluster.start(1) -- the counter lives on a node of its own
    local dir = proc.tmpdir()
    local logfile, stopfile = dir .. "/history.log", dir .. "/stop"
    local resource = res("rmw")
    srv = start {
      workers = 2,
      init = init_code(cl.urls) .. ([[
        RES, LOG, CPORT = %q, %q, %d
        SEQ = 0
        function event(kind, seq)
          local f = assert(io.open(LOG, "ab"))
          f:write(("%%s %%d %%d %%d\n"):format(kind, ngx.worker.pid(), seq, sproc.now_us()))
          f:close()
        end
        rcmd = require("helpers.resp").call
      ]]):format(resource, logfile, cnode.ports[1]),
      locations = { PING, [[
        location = /rmw {
          content_by_lua_block {
            local lock, err = DLM:lock(RES, { wait = 8000, retry = redlock.retry.jitter(1, 5, 1000000) })
            if not lock then ngx.say("fail ", err) return end
            SEQ = SEQ + 1
            local seq = SEQ
            event("enter", seq)
            local sock = ngx.socket.tcp()
            sock:settimeouts(1000, 1000, 1000)
            assert(sock:connect("127.0.0.1", CPORT))
            local v = tonumber(rcmd(sock, "GET", "counter") or "0")
            ngx.sleep(0.001)
            rcmd(sock, "SET", "counter", v + 1)
            sock:setkeepalive(10000, 32)
            event("exit", seq)
            local ok, uerr = lock:unlock()
            ngx.say(ok and "ok" or ("unlock " .. tostring(uerr)))
          }
        }]] },
    }
    local pids = {}
    local ok, err = pcall(function()
      for w = 1, 3 do
        local argv = { "luajit", "spec/helpers/rmw_worker.lua", logfile, stopfile, resource,
                       tostring(cnode.ports[1]) }
        for _, u in ipairs(cl.urls) do argv[#argv + 1] = u end
        pids[w] = proc.spawn_luajit(argv, dir .. "/w" .. w .. ".out")
      end
      proc.sleep_ms(200)
      local reqs = {}
      for i = 1, 300 do reqs[i] = "/rmw" end
      local t0 = proc.now_ms()
      local rs = srv:get_many(reqs, 8, { timeout_ms = 20000 })
      local ms = proc.now_ms() - t0
      proc.write_file(stopfile, "stop\n")
      for w = 1, 3 do assert(proc.wait_gone(pids[w], 15000), "worker " .. w .. " did not stop") end
      local ngx_ok, fails = 0, {}
      for _, r in ipairs(rs) do
        if r.status == 200 and r.body == "ok\n" then ngx_ok = ngx_ok + 1
        else fails[#fails + 1] = tostring(r.status) .. " " .. tostring(r.body or r.err) end
      end
      local plain, summaries = 0, {}
      for w = 1, 3 do
        local s = proc.read_file(dir .. "/w" .. w .. ".out") or ""
        summaries[w] = s
        local a = tonumber(s:match("acquired=(%d+)"))
        assert(a, "worker " .. w .. " said: " .. s)
        assert.is_true(a > 0, "worker " .. w .. " never got the lock: " .. s)
        plain = plain + a
      end
      local h = history.check(logfile)
      local counter = tonumber((cnode:cli(1, "GET", "counter")))
      local msg = ("nginx ok=%d (of 300, %.0f ms) plain=%d history=%d overlaps=%d unfinished=%d malformed=%d counter=%s %s\n%s%s")
        :format(ngx_ok, ms, plain, h.acquisitions, h.overlaps, h.unfinished, h.malformed,
          tostring(counter), table.concat(h.examples, "; "), table.concat(summaries),
          table.concat(fails, "\n", 1, math.min(5, #fails)))
      print("    [mutual exclusion] " .. msg:gsub("\n.*", ""))
      assert.equal(0, h.overlaps, msg .. log())
      assert.equal(0, h.unfinished, msg)
      assert.equal(0, h.malformed, msg)
      assert.equal(ngx_ok + plain, h.acquisitions, msg)
      assert.equal(h.acquisitions, counter, msg)
      assert.is_true(ngx_ok >= 290, msg .. log())
    end)
    proc.write_file(stopfile, "stop\n")
    for _, pid in ipairs(pids) do proc.stop(pid) end
    proc.rmdir(dir)
    cnode:stop()
    assert(ok, err)
  end)

  -- A release whose connection to a node ends before its reply (the link
  -- froze with it, then was cut: the node never got it) goes again on the
  -- hub's next connection to that node, with no request to drive it.
  -- Before: it was lost, and the node kept the key for the whole ttl.
  it("releases on a node whose connection dropped with the release unanswered", function()
    local px = faults.proxy(cl.ports[1])
    local urls = { px.url }
    for i = 2, cl.n do urls[i] = cl.urls[i] end
    local r = res("cut")
    srv = start {
      workers = 1,
      init = init_code(urls) .. ("CONTROL, NODE1 = %q, %d\n rcmd = require('helpers.resp').call"):format(px.control,
        cl.ports[1]),
      locations = { PING, [[
        location = /cut {
          content_by_lua_block {
            local lock, err = DLM:try_lock(ngx.var.arg_r, { ttl = 30000 })
            if not lock then ngx.say("fail ", err) return end
            sproc.write_file(CONTROL, "stall\n") -- the release reaches the proxy, not the node
            ngx.sleep(0.05)
            local ok, uerr = lock:unlock()
            local sock = ngx.socket.tcp()
            assert(sock:connect("127.0.0.1", NODE1))
            local held = rcmd(sock, "GET", ngx.var.arg_r)
            sock:close()
            sproc.write_file(CONTROL, "reset\n") -- the link is cut: what it held is lost
            ngx.sleep(0.05)
            sproc.write_file(CONTROL, "pass\n")
            ngx.say(ok and "ok" or ("unlock-fail " .. tostring(uerr)), " ", tostring(held == lock.value))
          }
        }]] },
    }
    local status, body = srv:get("/cut?r=" .. r)
    assert.equal(200, status)
    assert.equal("ok true\n", body) -- node 1 held the key once the release was out
    -- node 1 is reachable again: the release reaches it long before the ttl
    local gone, why = cluster.await_value(cl, r, nil, 3000)
    px:stop()
    assert(gone, tostring(why) .. log())
  end)

  -- A release kept for a node that never comes back is dropped once the
  -- longest ttl the client asked for has passed: its key has expired. The
  -- hub then goes idle and closes its connections to the other nodes.
  -- Before: it kept the release, and so its timer and every connection,
  -- for as long as the worker lived.
  it("lets go of a release kept for a node gone for good once its ttl has passed, and goes idle", function()
    local px = faults.proxy(cl.ports[1])
    local urls = { px.url }
    for i = 2, cl.n do urls[i] = cl.urls[i] end
    local function open_on_others()
      local n = 0
      for i = 2, cl.n do n = n + tonumber(info(cl, i).connected_clients) - 1 end -- less INFO's own
      return n
    end
    local base = open_on_others()
    srv = start {
      workers = 1,
      init = init_code(urls) .. ("CONTROL = %q\n require('redlock.nginx.hub').idle_ms = 300"):format(px.control),
      locations = { PING, [[
        location = /gone {
          content_by_lua_block {
            local lock, err = DLM:try_lock(ngx.var.arg_r, { ttl = 1000 })
            if not lock then ngx.say("fail ", err) return end
            sproc.write_file(CONTROL, "stall\n") -- the release reaches the proxy, not the node
            ngx.sleep(0.05)
            local ok = lock:unlock()
            sproc.write_file(CONTROL, "reset\n") -- the link is cut: the release is kept
            ngx.say(ok and "ok" or "unlock-fail")
          }
        }]] },
    }
    local status, body = srv:get("/gone?r=" .. res("gone"))
    assert.equal(200, status, log())
    assert.equal("ok\n", body, log())
    px:stop() -- node 1's address refuses from now on
    assert.is_true(open_on_others() > base, "the hub is not connected to the other nodes" .. log())
    -- 1000 ms of ttl (and 1 %), then 300 ms idle: every connection closed
    local deadline = proc.now_ms() + 6000
    local open
    repeat
      proc.sleep_ms(100)
      open = open_on_others()
    until open == base or proc.now_ms() > deadline
    assert.equal(base, open, "the hub kept its connections" .. log())
  end)

  -- Rounds decide at quorum: a release returns while node 1, its replies
  -- delayed by the fault proxy (well under the node timeout), still owes its
  -- reply, and that tail is finished by the node's reader. Many requests at
  -- once on one worker follow such a release at once, on the same client:
  -- none may take a late reply for its own (that would show as a reply out of
  -- step, or as a vote that is not the node's, letting two holders in).
  it("keeps every reply with its command when releases leave tails (one worker, a delayed node)", function()
    local cnode = cluster.start(1) -- the counter lives on a node of its own
    local px = faults.proxy(cl.ports[1])
    local urls = { px.url }
    for i = 2, cl.n do urls[i] = cl.urls[i] end
    local dir = proc.tmpdir()
    local logfile = dir .. "/history.log"
    local resource = res("tails")
    local CROSSED = { "out of step", "reply to no command", "protocol error", "unexpected reply" }
    local N = 200
    srv = start {
      workers = 1,
      init = init_code(urls, "node_timeout = 500") .. ([[
        RES, LOG, CPORT = %q, %q, %d
        SEQ = 0
        function event(kind, seq)
          local f = assert(io.open(LOG, "ab"))
          f:write(("%%s %%d %%d %%d\n"):format(kind, ngx.worker.pid(), seq, sproc.now_us()))
          f:close()
        end
        rcmd = require("helpers.resp").call
        JITTER = redlock.retry.jitter(1, 5, 1000000)
      ]]):format(resource, logfile, cnode.ports[1]),
      locations = { PING, [[
        location = /rmw {
          content_by_lua_block {
            -- every node error any round of this request saw
            local seen = {}
            local function note(d)
              if type(d) ~= "table" then return end
              for i = 1, #d do
                if d[i].error then seen[#seen + 1] = ("node %d %s: %s"):format(i, d[i].state, d[i].error) end
              end
            end
            local lock, err, d = DLM:lock(RES, { wait = 8000, retry = function(n, e, dd)
              note(dd)
              return JITTER(n, e, dd)
            end })
            if not lock then note(d) ngx.say("fail ", err, " ", table.concat(seen, "; ")) return end
            SEQ = SEQ + 1
            local seq = SEQ
            event("enter", seq)
            local sock = ngx.socket.tcp()
            sock:settimeouts(1000, 1000, 1000)
            assert(sock:connect("127.0.0.1", CPORT))
            local v = tonumber(rcmd(sock, "GET", "counter") or "0")
            ngx.sleep(0.001)
            rcmd(sock, "SET", "counter", v + 1)
            sock:setkeepalive(10000, 32)
            event("exit", seq)
            local ok, uerr, ud = lock:unlock()
            note(ud)
            if not ok then ngx.say("unlock ", tostring(uerr), " ", table.concat(seen, "; ")) return end
            -- "tail": the release was decided while node 1 still owed its reply
            local tail = type(ud) == "table" and ud[1].state == "pending"
            ngx.say("ok", tail and " tail" or "", #seen > 0 and (" " .. table.concat(seen, "; ")) or "")
          }
        }]] },
    }
    local ok, err = pcall(function()
      -- every connection up before node 1 turns slow
      local status, body = srv:get("/rmw")
      assert.equal(200, status, tostring(body) .. log())
      assert.matches("^ok", body, nil, false, log()) -- "ok tail" too: a node may be slower by chance
      px:set("delay 20")
      local reqs = {}
      for i = 1, N do reqs[i] = "/rmw" end
      local rs = srv:get_many(reqs, 10, { timeout_ms = 30000 })
      local oks, tails, fails, crossed = 1, 0, {}, {}
      for _, r in ipairs(rs) do
        local text = tostring(r.body or r.err)
        if r.status == 200 and text:match("^ok") then oks = oks + 1
        else fails[#fails + 1] = tostring(r.status) .. " " .. text end
        if r.status == 200 and text:match("^ok tail") then tails = tails + 1 end
        for _, c in ipairs(CROSSED) do
          if text:find(c, 1, true) then crossed[#crossed + 1] = text end
        end
      end
      local errlog = srv:error_log()
      for _, c in ipairs(CROSSED) do
        for line in errlog:gmatch("[^\n]*" .. c:gsub("%p", "%%%0") .. "[^\n]*") do crossed[#crossed + 1] = line end
      end
      for line in errlog:gmatch("[^\n]*%[alert%][^\n]*") do crossed[#crossed + 1] = line end
      local h = history.check(logfile)
      local counter = tonumber((cnode:cli(1, "GET", "counter")))
      local msg = ("ok=%d (of %d) tails=%d history=%d overlaps=%d unfinished=%d malformed=%d counter=%s %s\n%s\n%s")
        :format(oks, N + 1, tails, h.acquisitions, h.overlaps, h.unfinished, h.malformed, tostring(counter),
          table.concat(h.examples, "; "), table.concat(fails, "\n", 1, math.min(5, #fails)),
          table.concat(crossed, "\n", 1, math.min(5, #crossed)))
      print("    [tails] " .. msg:gsub("\n.*", ""))
      assert.equal(0, #crossed, msg .. log())
      assert.equal(0, h.overlaps, msg .. log())
      assert.equal(0, h.unfinished, msg)
      assert.equal(0, h.malformed, msg)
      assert.equal(N + 1, oks, msg .. log())
      assert.equal(oks, h.acquisitions, msg)
      assert.equal(h.acquisitions, counter, msg)
      -- and the case was made: releases did return with node 1's reply owed
      assert.is_true(tails > 0, "no release left a tail (node 1 never pending): " .. msg)
    end)
    px:stop()
    proc.rmdir(dir)
    cnode:stop()
    assert(ok, err)
  end)

  it("waits for a lock without blocking the worker", function()
    srv = one_worker { [[
        location = /wait {
          content_by_lua_block {
            local lock, err = DLM:lock(ngx.var.arg_r, { wait = 1500, retry = redlock.retry.fixed(20, 1000) })
            if not lock then ngx.say("fail ", err) return end
            ngx.say(lock:unlock() and "ok" or "unlock failed")
          }
        }]] }
    local r = res("wait")
    local dir = proc.tmpdir()
    local ready = dir .. "/ready"
    local argv = { "luajit", "spec/helpers/holder.lua", r, "700", ready }
    for _, u in ipairs(cl.urls) do argv[#argv + 1] = u end
    local pid = proc.spawn_luajit(argv, dir .. "/out")
    local ok, err = pcall(function()
      proc.wait_file(ready, 5000)
      local reqs = { "/wait?r=" .. r }
      for k = 1, 5 do reqs[#reqs + 1] = { path = "/ping", after_ms = 100 * k } end
      local rs = srv:get_many(reqs)
      assert.equal(200, rs[1].status, tostring(rs[1].err) .. log())
      assert.equal("ok\n", rs[1].body, log())
      -- it got the lock after the holder released it (about 700 ms), not before
      assert.is_true(rs[1].elapsed_ms > 300 and rs[1].elapsed_ms < 1500 + 1000,
        ("the waiting request took %.0f ms"):format(rs[1].elapsed_ms))
      local worst = 0
      for k = 2, #rs do
        assert.equal(200, rs[k].status, tostring(rs[k].err))
        assert.is_true(rs[k].finished_ms < rs[1].finished_ms)
        worst = math.max(worst, rs[k].elapsed_ms)
      end
      print(("    [never blocks] waiting request %.0f ms; slowest /ping %.1f ms"):format(rs[1].elapsed_ms, worst))
      assert.is_true(worst < 200, ("/ping took %.0f ms while a lock call waited"):format(worst))
      assert.is_true(proc.wait_gone(pid, 5000))
    end)
    local out = proc.read_file(dir .. "/out")
    proc.stop(pid)
    proc.rmdir(dir)
    assert(ok, tostring(err) .. "\nholder said: " .. tostring(out))
  end)

  it("bounds a stalled node's cost by node_timeout, acquires with 2 of 5 stalled, fails fast with 3", function()
    srv = start { workers = 1, init = init_code(cl.urls, "node_timeout = 100"), locations = { PING, LOCK_UNLOCK } }
    local function try(tag)
      local rs = srv:get_many({ "/lock?r=" .. res(tag), { path = "/ping", after_ms = 20 } })
      assert.equal(200, rs[2].status, tostring(rs[2].err))
      assert.is_true(rs[2].elapsed_ms < 200, ("/ping took %.0f ms"):format(rs[2].elapsed_ms))
      assert.equal(200, rs[1].status, tostring(rs[1].err) .. log())
      return rs[1].body, rs[1].elapsed_ms
    end
    local body, ms = try("healthy")
    assert.matches("^ok", body)
    local stopped = {}
    local ok, err = pcall(function()
      for _, case in ipairs { { 1, "^ok" }, { 2, "^ok" }, { 3, "^fail unavailable" } } do
        local n, want = case[1], case[2]
        assert(cl:kill(n, "STOP"))
        stopped[n] = true
        -- twice: once on a pooled connection, once after it was dropped
        for round = 1, 2 do
          body, ms = try("stalled" .. n)
          print(("    [faults] %d of 5 stopped, round %d: %.0f ms: %s"):format(n, round, ms, body:gsub("\n", "")))
          assert.matches(want, body, 1, false)
          assert.is_true(ms < (n < 3 and 1000 or 2000), ("%d stopped: took %.0f ms: %s"):format(n, ms, body))
        end
      end
    end)
    for n in pairs(stopped) do cl:kill(n, "CONT") end
    assert(ok, tostring(err) .. log())
    -- every node back: a quorum answers again (and soon every node)
    local deadline, last = proc.now_ms() + 5000
    repeat
      local _
      _, body = srv:get("/lock?r=" .. res("back"))
      last = body
      if tostring(body):match("^ok") then break end
      proc.sleep_ms(50)
    until proc.now_ms() > deadline
    assert.matches("^ok", tostring(last))
  end)

  it("refuses lock calls in phases without cosockets, naming the phase", function()
    srv = start {
      workers = 1,
      init = init_code(cl.urls),
      http = "lua_shared_dict phases 1m;",
      init_worker = [[
        local ok, err = pcall(DLM.lock, DLM, "spec:nginx_lock:init_worker")
        ngx.shared.phases:set("init_worker", tostring(ok) .. " " .. tostring(err))
        -- the same call from a timer (cosockets there) works
        ngx.timer.at(0, function()
          local lock, lerr = DLM:lock("spec:nginx_lock:timer:" .. ngx.worker.pid())
          ngx.shared.phases:set("timer", lock and tostring(lock:unlock()) or ("fail " .. tostring(lerr)))
        end)
      ]],
      locations = { PING, [[
        location = /set {
          set_by_lua_block $res {
            local ok, err = pcall(DLM.lock, DLM, "spec:nginx_lock:set")
            return tostring(ok) .. " " .. tostring(err)
          }
          return 200 "$res";
        }]], [[
        location = /kept {
          content_by_lua_block {
            if ngx.var.arg_unlock then
              ngx.say("lost=", tostring(KEPT:lost()), " unlock=", tostring(KEPT:unlock()))
            else
              KEPT = DLM:lock("spec:nginx_lock:kept:" .. ngx.worker.pid(), { ttl = 1000, keepalive = true })
              ngx.say(KEPT and "held" or "not held")
            end
          }
        }]], [[
        location = /unlockset {
          set_by_lua_block $res {
            -- Before: unlock() stopped keep-alive, then raised: the lock was
            -- neither kept nor released
            local ok, err = pcall(KEPT.unlock, KEPT)
            return tostring(ok) .. " " .. tostring(err)
          }
          return 200 "$res";
        }]], [[
        location = /close {
          set_by_lua_block $res {
            -- Before: close() returned, released nothing and marked the
            -- client's locks released
            local ok, err = pcall(DLM.close, DLM)
            return tostring(ok) .. " " .. tostring(err)
          }
          return 200 "$res";
        }]], [[
        location = /phases {
          content_by_lua_block {
            ngx.say(ngx.shared.phases:get("init_worker"))
            ngx.say(ngx.shared.phases:get("timer"))
          }
        }]] },
    }
    local status, body = srv:get("/set")
    assert.equal(200, status, log())
    assert.matches("^false .*set phase", body, 1, false)
    print("    [phases] set: " .. body)
    status, body = srv:get("/close")
    assert.equal(200, status, log())
    assert.matches("^false .*set phase", body, 1, false)
    assert.equal("held\n", select(2, srv:get("/kept")), log())
    status, body = srv:get("/unlockset")
    assert.equal(200, status, log())
    assert.matches("^false .*set phase", body, 1, false)
    proc.sleep_ms(1500) -- past the ttl: only keep-alive holds it
    assert.equal("lost=false unlock=true\n", select(2, srv:get("/kept?unlock=1")), log())
    local deadline = proc.now_ms() + 3000
    repeat
      status, body = srv:get("/phases")
      if body:match("\ntrue") then break end
      proc.sleep_ms(20)
    until proc.now_ms() > deadline
    assert.equal(200, status, log())
    local iw, timer = body:match("^([^\n]*)\n([^\n]*)")
    print("    [phases] init_worker: " .. tostring(iw))
    assert.matches("^false .*init_worker phase", iw, 1, false)
    assert.equal("true", timer, body .. log())
  end)

  -- Before: lock calls raised in server_rewrite_by_lua*, which has
  -- cosockets ("no redlock call can run in nginx's server_rewrite phase").
  it("takes locks in server_rewrite_by_lua*", function()
    srv = start {
      workers = 1,
      init = init_code(cl.urls),
      locations = { PING, [[
        server_rewrite_by_lua_block {
          if ngx.var.uri == "/srw" then
            local lock, err = DLM:lock("spec:nginx_lock:server_rewrite")
            ngx.say(lock and tostring(lock:unlock()) or ("fail " .. tostring(err)))
            return ngx.exit(200)
          end
        }]] },
    }
    local status, body = srv:get("/srw")
    assert.equal(200, status, log())
    assert.equal("true\n", body, log())
  end)

  -- Fencing tokens from nginx and from a plain LuaJIT client (the libev
  -- transport) on one resource: one sequence, strictly increasing.
  it("hands out fencing tokens that increase across requests and transports", function()
    srv = start {
      workers = 2,
      init = init_code(cl.urls),
      locations = { PING, [[
        location = /fenced {
          content_by_lua_block {
            local lock, err = DLM:lock(ngx.var.arg_r, { fence = true, wait = 5000 })
            if not lock then ngx.say("fail ", err) return end
            local token, text = lock.token, lock.token_string
            assert(lock:unlock())
            -- an exact int64_t cdata, and its decimal text
            assert(require("ffi").istype("int64_t", token) and ("%d"):format(token) == text)
            ngx.say(text)
          }
        }]] },
    }
    local r = res("fenced")
    local plain = redlock.new { servers = cl.urls }
    local tokens = {}
    for k = 1, 6 do
      local t
      if k % 3 == 0 then
        local lock = assert(plain:lock(r, { fence = true, wait = 5000 }))
        t = tonumber(lock.token_string) -- small here: exact as a number
        assert.is_true(lock.token == t)
        assert(lock:unlock())
      else
        local status, body = srv:get("/fenced?r=" .. r)
        assert.equal(200, status, log())
        t = tonumber(body:match("^(%d+)\n$"))
        assert.is_number(t, body .. log())
      end
      tokens[k] = t
    end
    plain:close()
    for k = 2, #tokens do
      assert.is_true(tokens[k] > tokens[k - 1], table.concat(tokens, " "))
    end
    local status, body = srv:get("/fenced?r=" .. r)
    assert.equal(200, status, log())
    -- +1 when the first attempt is granted; an attempt that fails (a node
    -- slower than the node timeout on a loaded machine) spends a count too
    assert.is_true(tonumber(body:match("^(%d+)\n$")) > tokens[#tokens], body)
  end)

  it("locks with a client made per request and with one made per worker, one by one and at once", function()
    srv = start {
      workers = 2,
      init = init_code(cl.urls),
      locations = { PING, PER_REQUEST, [[
        location = /shared {
          content_by_lua_block {
            local lock, err = DLM:lock(ngx.var.arg_r, { wait = 5000, retry = redlock.retry.jitter(1, 10, 100000) })
            if not lock then ngx.say("fail ", err) return end
            local ok, uerr = lock:unlock()
            ngx.say(ok and "ok" or ("unlock " .. tostring(uerr)))
          }
        }]] },
    }
    for _, loc in ipairs { "/perreq", "/shared" } do
      for _ = 1, 10 do
        local status, body = srv:get(loc .. "?r=" .. res("seq"))
        assert.equal(200, status, log())
        assert.equal("ok\n", body, log())
      end
      local same = res("same")
      local reqs = {}
      for k = 1, 40 do reqs[k] = loc .. "?r=" .. (k % 2 == 0 and same or res("many")) end
      for _, r in ipairs(srv:get_many(reqs, 8, { timeout_ms = 15000 })) do
        assert.equal(200, r.status, tostring(r.err) .. log())
        assert.equal("ok\n", r.body, r.path .. log())
      end
    end
  end)

  -- 100 sequential lock/unlock requests (1 worker, the per-worker client) on
  -- nodes with a password. Each new connection costs an AUTH and an INFO;
  -- a connection kept (the hub's) costs nothing more, so AUTH and INFO calls
  -- count connections.
  local function pool_run()
    local pcl = cluster.start(5, { password = "s3cret" })
    srv = start { workers = 1, init = init_code(pcl.urls), locations = { PING, LOCK_UNLOCK } }
    local nodes = {}
    local ok, err = pcall(function()
      for i = 1, 5 do assert.equal("OK", (pcl:cli(i, "CONFIG", "RESETSTAT"))) end
      for _ = 1, 100 do
        local status, body = srv:get("/lock?r=" .. res("pool"))
        assert.equal(200, status, log())
        assert.matches("^ok", body)
      end
      for i = 1, 5 do
        local t = info(pcl, i)
        -- less this INFO's own redis-cli connection (and its AUTH)
        nodes[i] = { conns = tonumber(t.total_connections_received) - 1, auth = calls(t, "auth") - 1,
                     info = calls(t, "info"), evals = calls(t, "evalsha") + calls(t, "eval") }
        print(("    [pooling] node %d: connections=%d auth=%d info=%d eval*=%d")
          :format(i, nodes[i].conns, nodes[i].auth, nodes[i].info, nodes[i].evals))
      end
    end)
    pcl:stop()
    assert(ok, tostring(err) .. log())
    return nodes
  end

  it("pools connections: AUTH and INFO only on fresh ones, far fewer connections than requests", function()
    -- the bound here is loose (the next test is tighter; the hub opens one
    -- connection per node for all 100)
    local nodes, total = pool_run(), 0
    for _, n in ipairs(nodes) do total = total + n.conns end
    assert.is_true(total < 200, ("%d connections in all for 100 requests"):format(total))
    for i, n in ipairs(nodes) do
      assert.is_true(n.conns >= 1 and n.conns < 100, ("node %d: %d connections"):format(i, n.conns))
      assert.is_true(n.auth >= n.conns - 1 and n.auth <= n.conns,
        ("node %d: %d AUTH on %d connections"):format(i, n.auth, n.conns))
      assert.is_true(n.info >= n.conns - 1 and n.info <= n.conns,
        ("node %d: %d INFO on %d connections"):format(i, n.info, n.conns))
      assert.is_true(n.evals >= 100, ("node %d: only %d scripts run"):format(i, n.evals))
    end
  end)

  -- An acquire decides at quorum while the slowest nodes still owe
  -- replies: the hub's readers finish that tail on the same connection, so
  -- the unlock that follows reuses it. (Before the hub, closing those
  -- connections instead cost 3-59 new connections per node for these 100
  -- requests.)
  it("pools connections: 100 lock/unlock requests open at most 10 connections per node", function()
    for i, n in ipairs(pool_run()) do
      assert.is_true(n.conns <= 10, ("node %d: %d connections"):format(i, n.conns))
    end
  end)

  -- Clients of one configuration share the worker's hub: one engine and one
  -- connection per node, whether the client is made per request (and closed
  -- by it) or once per worker. A hub with nothing to do stops (here after
  -- 400 ms instead of 10 s) and closes its connections; the next call starts it
  -- again on new ones.
  it("shares one hub per worker: one connection per node for per-request and per-worker clients;"
    .. " an idle hub closes them and starts again", function()
    local function counts()
      local t = {}
      for i = 1, cl.n do
        local inf = info(cl, i)
        -- less this INFO's own redis-cli connection
        t[i] = { total = tonumber(inf.total_connections_received), open = tonumber(inf.connected_clients) - 1 }
      end
      return t
    end
    local base = counts()
    srv = start {
      workers = 1,
      init = init_code(cl.urls) .. [[ require("redlock.nginx.hub").idle_ms = 400 ]],
      locations = { PING, LOCK_UNLOCK, PER_REQUEST },
    }
    local reqs = {}
    for k = 1, 60 do reqs[k] = (k % 2 == 0 and "/perreq?r=" or "/lock?r=") .. res("hub") end
    for k = 1, 10 do
      local status, body = srv:get(reqs[k])
      assert.equal(200, status, log())
      assert.matches("^ok", body, 1, false, log())
    end
    for _, r in ipairs(srv:get_many(reqs, 8, { timeout_ms = 15000 })) do
      assert.equal(200, r.status, tostring(r.err) .. log())
      assert.matches("^ok", r.body, 1, false, r.path .. log())
    end
    local busy = counts()
    for i = 1, cl.n do
      local made = busy[i].total - base[i].total - 1 -- less the first INFO's connection
      print(("    [hub] node %d: %d connection(s) made, %d open for 70 requests"):format(i, made, busy[i].open - base[i].open))
      assert.equal(1, made, ("node %d: %d connections for 70 requests"):format(i, made))
      assert.equal(1, busy[i].open - base[i].open, ("node %d"):format(i))
    end
    -- idle: the hub stops and closes its connections
    local deadline, idle = proc.now_ms() + 3000
    repeat
      proc.sleep_ms(100)
      idle = counts()
      local open = 0
      for i = 1, cl.n do open = open + idle[i].open - base[i].open end
      if open == 0 then break end
    until proc.now_ms() > deadline
    for i = 1, cl.n do
      assert.equal(0, idle[i].open - base[i].open, ("node %d: the idle hub kept its connection"):format(i))
    end
    -- and starts again with the next call
    local status, body = srv:get("/perreq?r=" .. res("hub"))
    assert.equal(200, status, log())
    assert.equal("ok\n", body, log())
    local again = counts()
    for i = 1, cl.n do
      assert.equal(1, again[i].open - base[i].open, ("node %d after the restart"):format(i))
    end
    assert.is_nil(srv:error_log():match("%[error%][^\n]*"), log())
  end)

  -- Operations begun together and waited for one by one (lock_many, a
  -- group's unlock, close() releasing what its client still holds) go
  -- through the hub like single calls, each waiter getting its own result.
  it("runs lock_many, a group's unlock and close() through the hub", function()
    srv = one_worker { [[
        location = /many {
          content_by_lua_block {
            local r = ngx.var.arg_r
            local names = { r .. ":1", r .. ":2", r .. ":3" }
            local locks, err = DLM:lock_many(names)
            if not locks then ngx.say("fail ", err) return end
            -- a second client (same configuration, so the same hub) cannot take any of them
            local other = redlock.new { servers = URLS, ttl = 3000 }
            local lk, oerr = other:try_lock(names[2])
            if lk then ngx.say("taken twice") return end
            local ok, uerr = locks:unlock()
            if not ok then ngx.say("unlock ", tostring(uerr)) return end
            -- close() releases what its client still holds
            local a = other:lock(names[1])
            local b = other:lock(names[3])
            if not (a and b) then ngx.say("relock failed") return end
            other:close()
            ngx.say("ok ", oerr)
          }
        }]] }
    for k = 1, 3 do
      local r = res("many" .. k)
      local status, body = srv:get("/many?r=" .. r)
      assert.equal(200, status, log())
      assert.equal("ok busy\n", body, log())
      for _, name in ipairs { r .. ":1", r .. ":2", r .. ":3" } do
        assert(cluster.await_all(cl, function(i) return cluster.pttl(cl, i, name) == -2 end, 1000),
          name .. " left behind" .. log())
      end
    end
  end)

  -- The hub's connection to a node that dies is reported down (one failed
  -- vote, the others decide), and a new one is made once the node is back.
  it("reconnects the hub to a node that was killed and restarted", function()
    local kcl = cluster.start(5)
    srv = start {
      workers = 1,
      init = init_code(kcl.urls),
      locations = { PING, [[
        location = /states {
          content_by_lua_block {
            -- the states shown: the acquire's on failure, the release's on success
            local lock, err, d = DLM:try_lock(ngx.var.arg_r)
            if lock then
              local ok, _, ud = lock:unlock()
              if not ok then ngx.say("unlock failed") return end
              d = ud
            end
            local parts = {}
            for i = 1, #d do parts[i] = tostring(d[i].state) end
            ngx.say(lock and "ok " or ("fail " .. tostring(err) .. " "), table.concat(parts, ","))
          }
        }]] },
    }
    local ok, err = pcall(function()
      local status, body = srv:get("/states?r=" .. res("kill"))
      assert.equal(200, status, log())
      assert.matches("^ok", body, 1, false, log())
      assert(kcl:kill(2, "KILL"))
      proc.sleep_ms(100)
      -- 4 of 5: still a quorum, node 2 fails its vote
      for _ = 1, 5 do
        status, body = srv:get("/states?r=" .. res("kill"))
        assert.equal(200, status, log())
        assert.matches("^ok", body, 1, false, log())
        -- node 2 never votes for it (error; pending when a reconnect is under way)
        assert.not_matches("^ok [^,]+,ok,", body, 1, false, body .. log())
      end
      kcl:restart(2)
      local deadline, last = proc.now_ms() + 5000
      repeat
        last = select(2, srv:get("/states?r=" .. res("kill")))
        -- node 2 votes again (nodes past the quorum may still be pending)
        if tostring(last):match("^ok [^,]+,ok,") then break end
        proc.sleep_ms(50)
      until proc.now_ms() > deadline
      print("    [hub] after node 2 restarted: " .. tostring(last):gsub("\n", ""))
      assert.matches("^ok [^,]+,ok,", tostring(last), 1, false, log())
    end)
    kcl:stop()
    assert(ok, tostring(err) .. log())
  end)

  -- Every connect costs the hub's timer a little memory that nginx frees
  -- when the timer ends, so after rotate_connects connects (1000; 5 here: on
  -- every quiet moment) the hub starts a fresh timer. Calls never notice.
  it("keeps serving while its hub moves to fresh timers", function()
    local function made()
      local t = {}
      for i = 1, cl.n do t[i] = tonumber(info(cl, i).total_connections_received) end
      return t
    end
    local before = made()
    srv = start {
      workers = 1,
      init = init_code(cl.urls) .. [[ require("redlock.nginx.hub").rotate_connects = 5 ]],
      locations = { PING, LOCK_UNLOCK },
    }
    for _ = 1, 20 do
      local status, body = srv:get("/lock?r=" .. res("rotate"))
      assert.equal(200, status, log())
      assert.matches("^ok", body, 1, false, log())
    end
    local reqs = {}
    for k = 1, 60 do reqs[k] = "/lock?r=" .. res("rotate") end
    for _, r in ipairs(srv:get_many(reqs, 8, { timeout_ms = 15000 })) do
      assert.equal(200, r.status, tostring(r.err) .. log())
      assert.matches("^ok", r.body, 1, false, r.path .. log())
    end
    local after = made()
    local rotations = after[1] - before[1] - 1
    print(("    [hub] %d connections to node 1 for 80 requests (a fresh timer each quiet moment)"):format(rotations))
    assert.is_true(rotations > 1, "the hub never moved to a fresh timer")
    assert.is_nil(srv:error_log():match("%[error%][^\n]*"), log())
    assert.is_nil(srv:error_log():match("%[alert%][^\n]*"), log())
  end)

  -- The hub's timer runs for as long as the hub has work or has had a call
  -- in the last 10 s; a worker told to exit must not wait for that.
  it("stops a running hub when its worker exits (graceful shutdown is not held up)", function()
    srv = start { workers = 1, init = init_code(cl.urls), locations = { PING, LOCK_UNLOCK } }
    local status, body = srv:get("/lock?r=" .. res("exit"))
    assert.equal(200, status, log())
    assert.matches("^ok", body, 1, false, log())
    local t0 = proc.now_ms()
    local s = srv
    srv = nil
    assert(s:stop { graceful = true, keep = true })
    local ms = proc.now_ms() - t0
    local errlog = s:error_log()
    proc.rmdir(s.prefix)
    print(("    [hub] graceful stop with a running hub: %.0f ms"):format(ms))
    assert.is_true(ms < 2000, ("graceful stop took %.0f ms"):format(ms))
    assert.is_nil(errlog:match("%[alert%][^\n]*"), errlog)
    assert.is_nil(errlog:match("%[error%][^\n]*"), errlog)
  end)

  -- A request to srv from a child luajit, so the test goes on while it runs
  -- (for up to timeout_ms, default 10 s); its status and body land in
  -- dir/out (dir: a fresh one unless given). Returns the pid and dir.
  local function request_in_background(path, timeout_ms, dir)
    dir = dir or proc.tmpdir()
    local code = ([[local n = require "helpers.nginx"
      local s, b = n.request(%d, %q, { timeout_ms = %d })
      io.write(tostring(s), " ", tostring(b))]]):format(srv.port, path, timeout_ms or 10000)
    return proc.spawn_luajit({ "luajit", "-e", code }, dir .. "/out"), dir
  end

  -- The nodes on which key r has a ttl left.
  local function holding(r)
    local n = 0
    for i = 1, cl.n do
      if cluster.pttl(cl, i, r) > 0 then n = n + 1 end
    end
    return n
  end

  -- Wait (up to 3 s) until every node holds r.
  local function await_held(r)
    assert(cluster.await_all(cl, function(i) return cluster.pttl(cl, i, r) > 0 end, 3000))
  end

  it("keeps a with_lock lock alive on ngx.timer while the function sleeps, then releases it", function()
    srv = one_worker { [[
        location = /with {
          content_by_lua_block {
            local lost, left = DLM:with_lock(ngx.var.arg_r, { ttl = 1500 }, function(lock)
              ngx.sleep(3.5)
              return lock:lost(), lock:remaining()
            end)
            ngx.say("lost=", tostring(lost), " remaining=", tostring(left))
          }
        }]] }
    local r = res("with")
    local pid, dir = request_in_background("/with?r=" .. r)
    local ok, err = pcall(function()
      await_held(r)
      local t0 = proc.now_ms()
      -- past the 1500 ms ttl (and well before the 3.5 s sleep ends: a look at five nodes takes
      -- a while on a loaded machine, and one that ended near 2.5 s met the release): only the
      -- keep-alive can hold it there. A ttl this long leaves each extension (every 500 ms) room.
      for _, at in ipairs { 1700, 2100 } do
        proc.sleep_ms(math.max(0, t0 + at - proc.now_ms()))
        local n = holding(r)
        print(("    [keepalive] %d ms after the lock: held on %d of 5"):format(proc.now_ms() - t0, n))
        assert.is_true(n >= 3, ("held on %d nodes %d ms after the lock"):format(n, proc.now_ms() - t0))
      end
      assert.is_true(proc.wait_gone(pid, 5000))
      local out = proc.read_file(dir .. "/out") or ""
      assert.matches("^200 lost=false remaining=%d+", out)
      assert(cluster.await_all(cl, function(i) return cluster.pttl(cl, i, r) == -2 end, 1000))
    end)
    local out = proc.read_file(dir .. "/out")
    proc.stop(pid)
    proc.rmdir(dir)
    assert(ok, tostring(err) .. "\nrequest: " .. tostring(out) .. log())
  end)
  -- Before: with_lock returned the function's "done" though the lock had run
  -- out while it slept (and another request could have held it meanwhile).
  it("raises from a with_lock whose lock ran out while the function ran, after the release", function()
    srv = one_worker { [[
        location = /outlived {
          content_by_lua_block {
            local ok, err = pcall(DLM.with_lock, DLM, ngx.var.arg_r, { ttl = 300, keepalive = false }, function()
              ngx.sleep(0.6)
              return "done"
            end)
            ngx.say(tostring(ok), " ", (tostring(err):gsub("^[^:]+:%d+: ", "")))
          }
        }]] }
    local r = res("outlived")
    local status, body = srv:get("/outlived?r=" .. r)
    assert.equal(200, status, log())
    assert.equal(("false lock on '%s' was lost while the function ran: its validity ran out before the function "
      .. "returned\n"):format(r), body, log())
  end)

  -- Before: the timers extended every ttl/3 whatever the margin, so a lock
  -- kept with ttl 6000 and margin 4800 had its validity fall below the
  -- margin between extensions (remaining ~4500 ms 3.5 s in) while lost()
  -- still said false. Now every third of ttl - margin (400 ms).
  it("extends a lock kept with a large margin before the margin is reached", function()
    srv = one_worker { [[
        location = /margin {
          content_by_lua_block {
            local lock = DLM:lock(ngx.var.arg_r, { ttl = 6000, keepalive = true, margin = 4800 })
            if not lock then ngx.say("not held") return end
            ngx.sleep(3.5)
            ngx.say(("lost=%s remaining=%.0f"):format(tostring(lock:lost()), lock:remaining()))
            lock:unlock()
          }
        }]] }
    local status, body = srv:get("/margin?r=" .. res("margin"))
    assert.equal(200, status, log())
    local lost, left = body:match("^lost=(%a+) remaining=(%-?%d+)")
    assert.equal("false", lost, body .. log())
    assert.is_true(tonumber(left) > 4800, body)
  end)
  -- Before: a hub timer that nginx dropped (every lua_max_running_timers
  -- slot busy) left the hub marked running for good: every later call in
  -- that worker raised "no result from redlock's hub" after 3 s. And later:
  -- the nodes whose connects the dropped hub never began became suspect
  -- meanwhile, and the first call after the timers were free again failed
  -- at once on every node ("still connecting, 2612 of 1000 ms").
  it("starts the hub again when nginx dropped its timer", function()
    srv = start {
      workers = 1,
      init = init_code(cl.urls),
      http = "lua_max_running_timers 2;",
      locations = { PING, [[
        location = /block {
          content_by_lua_block {
            for _ = 1, 2 do ngx.timer.at(0, function() ngx.sleep(5) end) end
            ngx.say("blocked")
          }
        }]], [[
        location = /try {
          content_by_lua_block {
            -- a fresh hub's first round may end before its connections are up
            local ok, lock, err = pcall(DLM.lock, DLM, ngx.var.arg_r, { wait = 2000, retry = redlock.retry.fixed(50, 40) })
            if ok and lock then lock:unlock() ngx.say("ok") return end
            ngx.say("fail ", tostring(lock), " ", tostring(err))
          }
        }]], [[
        location = /once {
          content_by_lua_block {
            local lock, err, detail = DLM:try_lock(ngx.var.arg_r)
            if lock then lock:unlock() ngx.say("ok") return end
            local said = {}
            for i, d in ipairs(detail or {}) do said[i] = tostring(d.state) .. ": " .. tostring(d.error) end
            ngx.say("fail ", tostring(err), " ", table.concat(said, " | "))
          }
        }]] },
    }
    local status = srv:get("/block")
    assert.equal(200, status, log())
    proc.sleep_ms(100) -- both timers running
    local body
    status, body = srv:get("/try?r=" .. res("dropped"))
    assert.equal(200, status, log())
    assert.matches("^fail", body) -- the hub's timer could not run (for 3 s)
    proc.sleep_ms(3000)         -- the blocking timers are over
    status, body = srv:get("/once?r=" .. res("first"))
    assert.equal(200, status, log())
    assert.equal("ok\n", body, log())
    status, body = srv:get("/try?r=" .. res("after"))
    assert.equal(200, status, log())
    assert.equal("ok\n", body, log())
  end)

  -- Before: a reload fired the keep-alive timers early, and they released
  -- the kept locks while their requests ran on (another worker took the
  -- lock within 0.5 s of the HUP, and lost() still said false).
  it("leaves a kept lock to the request that holds it when nginx reloads", function()
    srv = one_worker { [[
        location = /keep {
          content_by_lua_block {
            local lock = DLM:lock(ngx.var.arg_r, { ttl = 5000, keepalive = true })
            if not lock then ngx.say("not held") return end
            ngx.sleep(2)
            ngx.say("lost=", tostring(lock:lost()), " unlock=", tostring(lock:unlock()))
          }
        }]] }
    local r = res("reload")
    local pid, dir = request_in_background("/keep?r=" .. r)
    local ok, err = pcall(function()
      await_held(r)
      proc.kill(srv.pid, "HUP")
      proc.sleep_ms(700)
      assert.is_true(holding(r) >= 2, "released under the request after the reload")
      assert.is_true(proc.wait_gone(pid, 8000))
      assert.matches("^200 lost=false unlock=true", proc.read_file(dir .. "/out") or "")
    end)
    local out = proc.read_file(dir .. "/out")
    proc.stop(pid)
    proc.rmdir(dir)
    assert(ok, tostring(err) .. "\nrequest: " .. tostring(out) .. log())
  end)
  -- Before: an exiting worker's hub knew a kept lock's request by its
  -- ngx.ctx at keep time; a with_lock function that replaced ngx.ctx let the
  -- old table be collected, and the hub let the lock lapse under the request
  -- (lost about 3 s after the reload, its keys gone). with_lock's own frame
  -- now owns the lock.
  it("goes on extending a with_lock lock whose function replaced ngx.ctx when nginx reloads", function()
    srv = one_worker { [[
        location = /ctxswap {
          content_by_lua_block {
            local r, err = DLM:with_lock(ngx.var.arg_r, { wait = 1000, ttl = 1000 }, function(lock)
              ngx.ctx = { replaced = true }
              for _ = 1, 12 do
                ngx.sleep(0.5)
                collectgarbage()
              end
              return "lost=" .. tostring(lock:lost())
            end)
            ngx.say(tostring(r or err))
          }
        }]] }
    local r = res("ctxswap")
    local pid, dir = request_in_background("/ctxswap?r=" .. r)
    local ok, err = pcall(function()
      await_held(r)
      proc.kill(srv.pid, "HUP")
      proc.sleep_ms(4500) -- the exiting hub collects every 5 s; the ttl is 1 s
      assert.is_true(holding(r) >= 3, "the lock lapsed under the request after the reload")
      assert.is_true(proc.wait_gone(pid, 8000))
      assert.equal("200 lost=false\n", proc.read_file(dir .. "/out") or "")
    end)
    local out = proc.read_file(dir .. "/out")
    proc.stop(pid)
    proc.rmdir(dir)
    assert(ok, tostring(err) .. "\nrequest: " .. tostring(out) .. log())
  end)

  -- A kept lock whose lock object is dropped (the request ended without
  -- unlock) is released once it is garbage-collected: its guard's finalizer
  -- hands it to a timer that releases it. Without that, keep-alive would
  -- extend it for as long as the worker lives.
  it("releases a kept lock whose lock object was garbage-collected", function()
    srv = one_worker { [[
        location = /drop {
          content_by_lua_block {
            local lock = DLM:lock(ngx.var.arg_r, { ttl = 3000, keepalive = true })
            ngx.say(lock and "held" or "not held")
            lock = nil
            collectgarbage()
            collectgarbage()
          }
        }]] }
    local r = res("drop")
    local status, body = srv:get("/drop?r=" .. r)
    assert.equal(200, status, log())
    assert.equal("held\n", body, log())
    -- well within the 3 s ttl (kept alive, it would stay for good)
    assert(cluster.await_all(cl, function(i) return cluster.pttl(cl, i, r) == -2 end, 1500), log())
  end)

  -- Before: a kept lock still referenced from a module table when the
  -- worker's Lua state closed (reload, quit) had its finalizer start a
  -- timer inside lua_close; with another timer running (the metrics push)
  -- the worker died on SIGSEGV, every time.
  for _, how in ipairs { "HUP", "QUIT" } do
    it(("closes a worker's Lua state with a kept lock still referenced, on %s, without a crash"):format(how), function()
      srv = start {
        workers = 1, init = init_code(cl.urls) .. "\nKEPT = {}",
        http = "lua_shared_dict redlock_metrics 1m;",
        init_worker = 'require("redlock.nginx.metrics").start("redlock_metrics")',
        locations = { PING, [[
          location = /keep {
            content_by_lua_block {
              local lock, err = DLM:lock(ngx.var.arg_r, { ttl = 2000, keepalive = true })
              KEPT[#KEPT + 1] = lock
              ngx.say(lock and "held" or tostring(err))
            }
          }]] },
      }
      local workers = srv:worker_pids()
      local status, body = srv:get("/keep?r=" .. res("vmclose" .. how))
      assert.equal(200, status, log())
      assert.equal("held\n", body, log())
      proc.sleep_ms(1500)
      proc.kill(srv.pid, how)
      for _, pid in ipairs(workers) do assert.is_true(proc.wait_gone(pid, 10000), log()) end
      proc.sleep_ms(200)
      local errors = srv:error_log()
      assert.is_nil(errors:find("exited on signal", 1, true), log())
      assert.matches("exited with code 0", errors, 1, true)
    end)
  end

  -- Before: a request killed while it held a kept lock (the client went
  -- away, lua_check_client_abort on) left the lock extended until the
  -- worker's collector ran, which a quiet worker's never does (still held
  -- 30 s later). The hub now pushes the collector along while the worker is
  -- quiet and keeps a lock.
  it("releases the kept lock of a request killed while it held it, on a quiet worker", function()
    srv = one_worker { [[
        location = /hold {
          lua_check_client_abort on;
          content_by_lua_block {
            local lock = DLM:lock(ngx.var.arg_r, { ttl = 1000, keepalive = true })
            ngx.say(lock and "held" or "not held")
            ngx.flush(true)
            ngx.sleep(60)
            ngx.say(tostring(lock:unlock()))
          }
        }]] }
    local r = res("aborted")
    local dir = proc.tmpdir()
    local pid = proc.spawn({ "curl", "-s", "-N", ("http://127.0.0.1:%d/hold?r=%s"):format(srv.port, r) },
      { out = dir .. "/out" })
    local ok, err = pcall(function()
      assert.are.equal("held\n", proc.wait_file(dir .. "/out", 5000))
      proc.sleep_ms(1500) -- past the ttl: only keep-alive holds it
      assert.is_true(cluster.exists(cl, 1, r), "not kept alive" .. log())
      proc.kill(pid, "KILL") -- the client goes away: nginx ends the request
      local released = cluster.await_all(cl, function(i) return cluster.pttl(cl, i, r) == -2 end, 30000)
      assert(released, "the lock is still held 30 s after its request ended" .. log())
    end)
    proc.stop(pid)
    proc.rmdir(dir)
    assert(ok, err)
  end)

  -- Before: the hub pushed the collector along only when no lock call had
  -- come for a second; a with_lock whose function ended its request with
  -- ngx.exit left its lock kept alive for as long as lock calls kept coming
  -- (here: light traffic on another resource, and the waiter's own
  -- retries), and the waiter got busy after its whole wait. The hub now
  -- pushes the collector on every sweep while it keeps a lock.
  it("releases the lock of a with_lock whose function called ngx.exit while lock calls keep coming", function()
    srv = one_worker { [[
        location = /exitin {
          content_by_lua_block {
            DLM:with_lock(ngx.var.arg_r, { wait = 1000 }, function()
              ngx.say("inside")
              return ngx.exit(200)
            end)
          }
        }]], [[
        location = /waiter {
          content_by_lua_block {
            local t0 = sproc.now_ms()
            local r, err = DLM:with_lock(ngx.var.arg_r, { wait = 10000 }, function() return "held" end)
            ngx.say(tostring(r or err), (" after %.0f ms"):format(sproc.now_ms() - t0))
          }
        }]], [[
        location = /other {
          content_by_lua_block {
            local lock = DLM:try_lock(ngx.var.arg_r)
            ngx.say(lock and tostring(lock:unlock()) or "not held")
          }
        }]] }
    local r, other = res("exited"), res("exited_other")
    local status, body = srv:get("/exitin?r=" .. r)
    assert.equal(200, status, log())
    assert.equal("inside\n", body, log())
    local pid, dir = request_in_background("/waiter?r=" .. r, 15000)
    local ok, err = pcall(function()
      -- about 20 lock calls a second on another resource while it waits
      while proc.alive(pid) do
        srv:get("/other?r=" .. other)
        proc.sleep_ms(50)
      end
      local out = proc.read_file(dir .. "/out") or ""
      print("    [exit] waiter: " .. out:gsub("\n", ""))
      local ms = tonumber(out:match("^200 held after (%d+) ms"))
      assert(ms, "the waiter did not get the lock: " .. out .. log())
      assert.is_true(ms < 5000, out) -- "within a few seconds" (docs/nginx.md); before, 8 s or more
    end)
    proc.stop(pid)
    proc.rmdir(dir)
    assert(ok, err)
  end)

  -- Keep-alive runs on the hub's own timer. Before: every kept lock had an
  -- ngx.timer of its own, left pending after unlock until it fired (a third
  -- of the ttl later), and nginx allows lua_max_pending_timers (1,024) per
  -- worker: about the 1,024th with_lock in a row raised "keep-alive refused
  -- the lock: cannot start an ngx.timer: too many pending timers".
  it("runs 5,000 with_locks in one worker on a bounded number of timers", function()
    srv = one_worker { [[
        location = /many {
          content_by_lua_block {
            local r, n = ngx.var.arg_r, tonumber(ngx.var.arg_n)
            local pending, running = 0, 0
            for i = 1, n do
              local ok, err = DLM:with_lock(r .. ":" .. i, nil, function() return true end)
              if not ok then ngx.say("with_lock ", i, " failed: ", tostring(err)) return end
              pending = math.max(pending, ngx.timer.pending_count())
              running = math.max(running, ngx.timer.running_count())
            end
            ngx.say(("done=%d pending=%d running=%d"):format(n, pending, running))
          }
        }]] }
    local r = res("many")
    local status, body = srv:get("/many?n=5000&r=" .. r, { timeout_ms = 120000 })
    print("    [keepalive] 5,000 with_locks: " .. tostring(body):gsub("\n", ""))
    assert.equal(200, status, tostring(body) .. log())
    local done, pending, running = body:match("^done=(%d+) pending=(%d+) running=(%d+)")
    assert.equal("5000", done, body .. log())
    -- the hub's timer, and at most one more (a fresh hub timer while it moves)
    assert.is_true(tonumber(pending) <= 1, body)
    assert.is_true(tonumber(running) <= 2, body)
    assert.is_nil(srv:error_log():match("%[error%][^\n]*"), log())
  end)

  -- Before: after 1,024 kept locks even try_lock raised "cannot start the
  -- hub's ngx.timer" (the pending timers were all the keep-alive's).
  it("keeps 1,100 locks at once on the hub's schedule, past their ttl, and try_lock still works", function()
    srv = one_worker { [[
        location = /kept {
          content_by_lua_block {
            local r, n = ngx.var.arg_r, tonumber(ngx.var.arg_n)
            local locks = {}
            for i = 1, n do
              local lock, err = DLM:lock(r .. ":" .. i, { ttl = 3000, keepalive = true })
              if not lock then ngx.say("lock ", i, " failed: ", tostring(err)) return end
              locks[i] = lock
            end
            local one = DLM:try_lock(r .. ":one")
            sproc.write_file(ngx.var.arg_dir .. "/held", "1")
            ngx.sleep(4.5) -- past the 3 s ttl: only extensions keep them
            local lost, least = 0, math.huge
            for i = 1, n do
              if locks[i]:lost() then lost = lost + 1 end
              least = math.min(least, locks[i]:remaining())
            end
            local pending, running = ngx.timer.pending_count(), ngx.timer.running_count()
            for i = 1, n do locks[i]:unlock() end
            if one then one:unlock() end
            ngx.say(("try_lock=%s lost=%d least=%.0f pending=%d running=%d")
              :format(tostring(one ~= nil), lost, least, pending, running))
          }
        }]] }
    local r, n = res("kept"), 1100
    local dir = proc.tmpdir()
    local pid = request_in_background(("/kept?n=%d&r=%s&dir=%s"):format(n, r, dir), 60000, dir)
    local ok, err = pcall(function()
      local deadline = proc.now_ms() + 30000
      while not proc.read_file(dir .. "/held") and proc.alive(pid) and proc.now_ms() < deadline do proc.sleep_ms(20) end
      assert(proc.read_file(dir .. "/held"), "the locks were not all taken: " .. tostring(proc.read_file(dir .. "/out")))
      local t0 = proc.now_ms()
      proc.sleep_ms(4000) -- past the ttl of the last lock taken
      -- the first and the last lock kept are still on the nodes
      for _, k in ipairs { 1, n } do
        local h = holding(r .. ":" .. k)
        assert.is_true(h >= 3, ("lock %d held on %d nodes %.0f ms later"):format(k, h, proc.now_ms() - t0))
      end
      assert.is_true(proc.wait_gone(pid, 30000))
      local out = proc.read_file(dir .. "/out") or ""
      print("    [keepalive] 1,100 kept locks: " .. out:gsub("\n", ""))
      assert.matches("^200 try_lock=true lost=0 least=%d+ pending=0 running=1", out)
      assert(cluster.await_all(cl, function(i) return cluster.pttl(cl, i, r .. ":" .. n) == -2 end, 3000))
    end)
    local out = proc.read_file(dir .. "/out")
    proc.stop(pid)
    proc.rmdir(dir)
    assert(ok, tostring(err) .. "\nrequest: " .. tostring(out) .. log())
  end)

  -- Before: under wrk (300 connections, 2 ms holds, the default 10 s ttl:
  -- a keep-alive timer pending for 3.3 s after each request) 10-14% of the
  -- requests failed with "too many pending timers".
  it("serves wrk's 300 connections of with_lock (2 ms holds, default ttl) without a failure", function()
    srv = start {
      workers = 1,
      init = init_code(cl.urls) .. " WDLM = redlock.new { servers = URLS } ",
      locations = { PING, [[
        location = /wrk {
          content_by_lua_block {
            local ok, err = WDLM:with_lock("spec:nginx_lock:wrk:" .. ngx.var.request_id, nil, function()
              ngx.sleep(0.002)
              return true
            end)
            if not ok then
              ngx.log(ngx.ERR, "with_lock failed: ", tostring(err))
              return ngx.exit(500)
            end
            ngx.say("ok")
          }
        }]] },
    }
    local w, why = srv:wrk("/wrk", { threads = 2, connections = 300, seconds = 5 })
    assert(w, why)
    print(("    [keepalive] wrk: %d requests (%.0f/s), %d non-2xx, %d socket errors")
      :format(w.requests, w.rps or 0, w.non2xx, w.socket_errors))
    assert.is_true(w.requests > 300, w.out)
    assert.equal(0, w.non2xx, w.out .. log())
    assert.equal(0, w.socket_errors, w.out .. log())
    assert.is_nil(srv:error_log():match("%[error%][^\n]*"), log())
  end)

  -- Before: wrk closing its 100 connections at once killed some requests
  -- between the hub's hand-over of their grant and their turn to run; the
  -- hub swept such results only after 10 s, and went idle before that, so
  -- 3 to 66 keys of a 30 s ttl stayed on every node. A result handed to a
  -- request that does not wake within 1 s is now dropped, its lock released.
  it("releases the grants of requests wrk kills between their hand-over and their turn", function()
    srv = start {
      workers = 1,
      init = init_code(cl.urls) .. " ADLM = redlock.new { servers = URLS } ",
      locations = { PING, [[
        location = /grab {
          lua_check_client_abort on;
          content_by_lua_block {
            local lock = ADLM:lock("spec:nginx_lock:grab:" .. ngx.var.request_id, { wait = 0, ttl = 30000 })
            if lock then lock:unlock() end
            ngx.say("ok")
          }
        }]] },
    }
    local w, why = srv:wrk("/grab", { threads = 2, connections = 100, seconds = 1 })
    assert(w, why)
    assert.is_true(w.requests > 100, w.out)
    local empty, left = cluster.await_all(cl, function(i)
      local n = 0
      for _ in cl:cli(i, "KEYS", "spec:nginx_lock:grab:*"):gmatch("[^\n]+") do n = n + 1 end
      return n == 0, n .. " keys"
    end, 5000)
    assert(empty, tostring(left) .. log())
  end)

  -- rl_keeper_update's promise (redlock.h): when the owner's own extend
  -- overlaps one of the keeper's, nodes may hold either ttl, so the keeper
  -- counts the shorter validity and extends again at once. Every reply is
  -- held 350 ms, so the owner's extend to 18 s (begun at 1325 ms) and the
  -- hub's own to 4.5 s (due at 1500 ms, a third of the ttl) are in flight
  -- together; on the nodes the hub's comes last. Before: the hub took its
  -- result as the lock's validity and waited a third of 18 s to extend
  -- again; the key ran out at 6 s and lost() said true.
  it("extends again at once when the owner's extend overlaps the hub's (the shorter validity counts)", function()
    local pxs, urls = {}, {}
    for i = 1, cl.n do
      pxs[i] = faults.proxy(cl.ports[i], "delay 350")
      urls[i] = pxs[i].url
    end
    srv = start {
      workers = 1,
      init = init_code(cl.urls) .. (" PDLM = redlock.new { servers = %s, node_timeout = 2000 } "):format(lua_list(urls)),
      locations = { PING, [[
        location = /overlap {
          content_by_lua_block {
            local lock, err = PDLM:lock(ngx.var.arg_r, { ttl = 4500, keepalive = true })
            if not lock then ngx.say("not held ", tostring(err)) return end
            local t0 = sproc.now_ms()
            ngx.sleep(1.325)
            local ok, eerr = lock:extend(18000)
            ngx.sleep(math.max(0, t0 + 6500 - sproc.now_ms()) / 1000)
            ngx.say(("extend=%s lost=%s remaining=%.0f"):format(tostring(ok or eerr), tostring(lock:lost()), lock:remaining()))
            lock:unlock()
          }
        }]] },
    }
    local ok, err = pcall(function()
      local status, body = srv:get("/overlap?r=" .. res("overlap"), { timeout_ms = 20000 })
      print("    [keepalive] overlapping extensions: " .. tostring(body):gsub("\n", ""))
      assert.equal(200, status, log())
      local extended, lost, left = body:match("^extend=(%a+) lost=(%a+) remaining=(%-?%d+)")
      assert.equal("true", extended, body .. log())
      assert.equal("false", lost, body .. log())
      assert.is_true(tonumber(left) > 6000, body)
    end)
    for _, px in ipairs(pxs) do px:stop() end
    assert(ok, tostring(err) .. log())
  end)

  -- What the timers did before and the hub does now: an extension that finds
  -- the key gone turns the lock lost; one that fails (nodes stalled) is tried
  -- again until the validity runs out, and the lock stays held.
  it("turns a kept lock lost when its key is gone, and retries a failed extension", function()
    srv = one_worker { [[
        location = /watch {
          content_by_lua_block {
            local lock = DLM:lock(ngx.var.arg_r, { ttl = tonumber(ngx.var.arg_ttl), keepalive = true })
            if not lock then ngx.say("not held") return end
            sproc.write_file(ngx.var.arg_dir .. "/held", "1")
            local t0 = sproc.now_ms()
            while not lock:lost() and sproc.now_ms() - t0 < tonumber(ngx.var.arg_ms) do ngx.sleep(0.02) end
            ngx.say(("lost=%s after=%.0f remaining=%.0f"):format(tostring(lock:lost()), sproc.now_ms() - t0, lock:remaining()))
            lock:unlock()
          }
        }]] }
    -- the key deleted on every node: the next extension (a third of 900 ms) finds it not held
    local r, dir = res("gone"), proc.tmpdir()
    local pid = request_in_background(("/watch?r=%s&ttl=900&ms=3000&dir=%s"):format(r, dir), nil, dir)
    local ok, err = pcall(function()
      assert(proc.wait_file(dir .. "/held", 5000))
      for i = 1, cl.n do cluster.del(cl, i, r) end
      assert.is_true(proc.wait_gone(pid, 8000))
      local out = proc.read_file(dir .. "/out") or ""
      print("    [keepalive] key deleted: " .. out:gsub("\n", ""))
      local after = tonumber(out:match("^200 lost=true after=(%d+)"))
      assert(after, "the lock never turned lost: " .. out)
      -- by the next extension's answer, before the 900 ms ttl would have said it
      assert.is_true(after < 800, out)
    end)
    proc.stop(pid)
    proc.rmdir(dir)
    assert(ok, tostring(err) .. log())
    -- 3 of 5 nodes stopped for a second across the extension due at 2 s:
    -- it fails (unavailable), is tried again, and succeeds once they are back
    r, dir = res("retry"), proc.tmpdir()
    pid = request_in_background(("/watch?r=%s&ttl=6000&ms=7000&dir=%s"):format(r, dir), 15000, dir)
    local stopped = {}
    ok, err = pcall(function()
      assert(proc.wait_file(dir .. "/held", 5000))
      local t0 = proc.now_ms()
      proc.sleep_ms(1500)
      for i = 1, 3 do assert(cl:kill(i, "STOP")); stopped[i] = true end
      proc.sleep_ms(math.max(0, t0 + 2700 - proc.now_ms()))
      for i = 1, 3 do cl:kill(i, "CONT"); stopped[i] = nil end
      assert.is_true(proc.wait_gone(pid, 12000))
      local out = proc.read_file(dir .. "/out") or ""
      print("    [keepalive] extension failed, tried again: " .. out:gsub("\n", ""))
      local left = tonumber(out:match("^200 lost=false after=%d+ remaining=(%d+)"))
      assert(left, "lost, or no answer: " .. out)
      assert.is_true(left > 1000, out)
    end)
    for i in pairs(stopped) do cl:kill(i, "CONT") end
    proc.stop(pid)
    proc.rmdir(dir)
    assert(ok, tostring(err) .. log())
  end)

  -- Before: a request aborted by its client (lua_check_client_abort on)
  -- while its acquire was in flight left the lock to nobody: the grant came
  -- in after the request was gone and stayed for its whole ttl (3 of 8 keys
  -- stood on every node with a pttl of about 57 s). The hub releases a
  -- grant whose request is gone.
  it("releases the grants of 8 requests aborted while their acquires were in flight", function()
    srv = start {
      workers = 1,
      init = init_code(cl.urls) .. " SDLM = redlock.new { servers = URLS, node_timeout = 5000 } ",
      locations = { PING, [[
        location = /acq {
          lua_check_client_abort on;
          content_by_lua_block {
            local lock, err = SDLM:lock(ngx.var.arg_r, { ttl = 60000 })
            if not lock then ngx.say("fail ", tostring(err)) return end
            ngx.say("held")
          }
        }]] },
    }
    local warm = res("warm")
    local status, body = srv:get("/acq?r=" .. warm) -- the hub connected to every node
    assert.equal(200, status, log())
    assert.equal("held\n", body, log())
    local names, reqs = {}, {}
    for k = 1, 8 do
      names[k] = res("abort")
      reqs[k] = "/acq?r=" .. names[k]
    end
    local stopped = {}
    local ok, err = pcall(function()
      -- 3 of 5 nodes stalled: no acquire can be decided until they answer
      for i = 1, 3 do assert(cl:kill(i, "STOP")); stopped[i] = true end
      -- the clients give up after 400 ms: their requests die waiting
      for k, rs in ipairs(srv:get_many(reqs, 8, { timeout_ms = 400 })) do
        assert.matches("timed out", tostring(rs.err), 1, true,
          ("request %d was not left waiting: %s"):format(k, tostring(rs.status)))
      end
      proc.sleep_ms(200)
      for i = 1, 3 do cl:kill(i, "CONT"); stopped[i] = nil end
      -- every acquire is granted now, to nobody: the hub releases them, far within the 60 s ttl
      for k = 1, 8 do
        local gone, why = cluster.await_all(cl, function(i)
          local pttl = cluster.pttl(cl, i, names[k])
          return pttl == -2, "pttl " .. pttl
        end, 5000)
        assert(gone, ("request %d's key stayed: %s"):format(k, tostring(why)))
      end
    end)
    for i in pairs(stopped) do cl:kill(i, "CONT") end
    assert(ok, tostring(err) .. log())
  end)

  -- Before: with_lock in a worker that exits (a reload) acquired and then
  -- raised "keep-alive refused the lock: cannot start an ngx.timer: process
  -- exiting" (nginx refuses timers with a delay there), for each of 30
  -- waiters; and a lock kept across the reload was no longer extended (it
  -- lapsed under its request once its ttl ran out). Now the hub keeps
  -- extending kept locks while their requests run.
  it("runs the waiters of a worker that reloads with the lock, or returns nil, err; none raises", function()
    srv = one_worker { [[
        location = /wl {
          content_by_lua_block {
            local hold = tonumber(ngx.var.arg_hold) or 0.01
            local opts = { wait = 20000, ttl = tonumber(ngx.var.arg_ttl) }
            local ok, a, b = pcall(DLM.with_lock, DLM, ngx.var.arg_r, opts, function(lock)
              ngx.sleep(hold)
              return "ran", lock:lost()
            end)
            if not ok then ngx.say("raised ", tostring(a))
            elseif a == "ran" then ngx.say("ran lost=", tostring(b))
            else ngx.say("nil ", tostring(b)) end
          }
        }]], [[
        location = /waiting {
          content_by_lua_block { local r = ngx.var.arg_r ngx.say(DLM.client:waiting(r, #r)) }
        }]] }
    local r, long = res("reload_waiters"), res("reload_long")
    local holder = redlock.new { servers = cl.urls }
    local lk = assert(holder:lock(r, { ttl = 20000 }))
    local dir = proc.tmpdir()
    local code = ([[local n = require "helpers.nginx"
      local reqs = {}
      for k = 1, 30 do reqs[k] = %q end
      local out = {}
      for k, rs in ipairs(n.request_many(%d, reqs, 30, { timeout_ms = 30000 })) do
        out[k] = tostring(rs.status) .. " " .. tostring(rs.body or rs.err):gsub("\n", "")
      end
      io.write(table.concat(out, "\n"))]]):format("/wl?r=" .. r, srv.port)
    local pid = proc.spawn_luajit({ "luajit", "-e", code }, dir .. "/out")
    -- and one request that holds a lock of 600 ms ttl for 2.5 s, across the reload
    local long_pid, long_dir = request_in_background("/wl?r=" .. long .. "&ttl=600&hold=2.5")
    local ok, err = pcall(function()
      -- all 30 waiting in the worker
      local by, waiting = proc.now_ms() + 10000
      repeat
        local status, body = srv:get("/waiting?r=" .. r)
        assert.equal(200, status, log())
        waiting = tonumber(body)
        if waiting == 30 then break end
        proc.sleep_ms(20)
      until proc.now_ms() > by
      assert.equal(30, waiting, log())
      await_held(long)
      proc.kill(srv.pid, "HUP")
      local t0 = proc.now_ms()
      proc.sleep_ms(500)
      assert(lk:unlock())
      -- past the 600 ms ttl, in a worker that exits: only the hub's extensions hold it
      proc.sleep_ms(math.max(0, t0 + 1300 - proc.now_ms()))
      local n = holding(long)
      assert.is_true(n >= 3, ("the long lock was held on %d nodes %.0f ms after the reload"):format(n, proc.now_ms() - t0))
      assert.is_true(proc.wait_gone(long_pid, 10000))
      assert.equal("200 ran lost=false", (proc.read_file(long_dir .. "/out") or ""):gsub("\n", ""))
      assert.is_true(proc.wait_gone(pid, 40000))
      local out = proc.read_file(dir .. "/out") or ""
      local ran, refused = 0, 0
      for line in out:gmatch("[^\n]+") do
        if line:match("^200 ran lost=false$") then ran = ran + 1
        elseif line:match("^200 nil ") then refused = refused + 1
        else error("a waiter said: " .. line) end
      end
      print(("    [reload] 30 waiters: %d ran with the lock, %d returned nil, err"):format(ran, refused))
      assert.equal(30, ran + refused, out)
    end)
    proc.stop(pid)
    proc.stop(long_pid)
    proc.rmdir(dir)
    proc.rmdir(long_dir)
    holder:close()
    assert(ok, tostring(err) .. log())
  end)

  -- The other side of extending kept locks in an exiting worker: a lock
  -- kept by a request that has ended (left in a module-level table, never
  -- unlocked) must not hold the worker up. Its owner gone, the hub stops
  -- extending it (it lapses after its ttl) and the worker exits.
  it("does not let a kept lock whose request ended hold up a graceful stop", function()
    srv = one_worker { [[
        location = /leave {
          content_by_lua_block {
            LEFT = DLM:lock(ngx.var.arg_r, { ttl = 3000, keepalive = true })
            ngx.say(LEFT and "kept" or "not held")
          }
        }]] }
    local r = res("left")
    local status, body = srv:get("/leave?r=" .. r)
    assert.equal(200, status, log())
    assert.equal("kept\n", body, log())
    local t0 = proc.now_ms()
    local s = srv
    srv = nil
    assert(s:stop { graceful = true, keep = true })
    local ms = proc.now_ms() - t0
    local errlog = s:error_log()
    proc.rmdir(s.prefix)
    print(("    [reload] graceful stop with a kept lock left behind: %.0f ms"):format(ms))
    assert.is_true(ms < 3000, ("graceful stop took %.0f ms"):format(ms))
    assert.is_nil(errlog:match("%[alert%][^\n]*"), errlog)
  end)
  -- Before: a request that slept between attempts on a watched channel
  -- raised the hub's horizon to the end of its sleep, and a client abort
  -- that killed it asleep never lowered it: a graceful stop waited out the
  -- rest of its retry delay (60 s here). The hub now stays for the sleepers
  -- still asleep only.
  it("does not let a waiter killed asleep hold up a graceful stop for the rest of its retry delay", function()
    srv = one_worker { [[
        location = /slowwait {
          lua_check_client_abort on;
          content_by_lua_block {
            local lock, err = DLM:lock(ngx.var.arg_r, { wait = 600000, retry = redlock.retry.fixed(60000, 100) })
            ngx.say(lock and tostring(lock:unlock()) or err)
          }
        }]] }
    local r = res("slowwait")
    for i = 1, cl.n do assert(cluster.set_nx(cl, i, r, "other", 120000)) end
    -- the client gives up 1.5 s in: nginx kills the request asleep
    local status = srv:get("/slowwait?r=" .. r, { timeout_ms = 1500 })
    assert.is_not.equal(200, status, log())
    proc.sleep_ms(200)
    local s = srv
    local t0 = proc.now_ms()
    assert(proc.kill(s.pid, "QUIT"))
    local gone = proc.wait_gone(s.pid, 4000)
    local ms = proc.now_ms() - t0
    local errlog = s:error_log()
    srv = nil
    s:stop()
    print(("    [exit] graceful stop after a waiter killed asleep: %.0f ms"):format(ms))
    assert(gone, ("nginx still running %.0f ms after SIGQUIT\n%s"):format(ms, errlog:sub(-2000)))
    assert.is_nil(errlog:match("%[alert%][^\n]*"), errlog)
  end)

  -- Hand-off inside nginx: the hub subscribes on every node to the channels
  -- its waiters watch, and a heard release ends a waiter's sleep. The retry
  -- policy waits 500 ms between attempts; a holder releases 150 ms after the
  -- waiter's first attempt failed.
  local HANDOFF_RETRY = "redlock.retry.fixed(500, 100)"

  local function median(xs)
    local t = {}
    for k, v in ipairs(xs) do t[k] = v end
    table.sort(t)
    return t[math.floor((#t + 1) / 2)]
  end

  -- A waiting request (notify on or off) against a plain LuaJIT process
  -- that holds the resource for 150 ms, `rounds` times; the hand-offs
  -- (ms from the holder's release to the request's acquisition).
  local function process_handoffs(notify, rounds)
    srv = start {
      workers = 1,
      init = init_code(cl.urls, "notify = " .. tostring(notify)),
      locations = { PING, ([[
        location = /waiter {
          content_by_lua_block {
            local r, dir, rounds = ngx.var.arg_r, ngx.var.arg_dir, tonumber(ngx.var.arg_rounds)
            local out = {}
            for k = 1, rounds do
              local until_ = sproc.now_ms() + 5000
              while not io.open(dir .. "/ready" .. k) do
                if sproc.now_ms() > until_ then ngx.say("no holder in round ", k) return end
                ngx.sleep(0.002)
              end
              local lock, err = DLM:lock(r, { wait = 5000, retry = %s })
              local at = sproc.now_ms()
              if not lock then ngx.say("fail ", err) return end
              lock:unlock()
              out[k] = ("%%.3f"):format(at)
              sproc.write_file(dir .. "/taken" .. k, "1")
            end
            ngx.say(table.concat(out, " "))
          }
        }]]):format(HANDOFF_RETRY) },
    }
    local r = res("handoff_" .. tostring(notify))
    local dir = proc.tmpdir()
    local code = ([[
      local proc, redlock = require "helpers.proc", require "redlock"
      local dlm = redlock.new { servers = %s, ttl = 10000 }
      local dir, rel = %q, {}
      for k = 1, %d do
        local lock = assert(dlm:lock(%q, { wait = 5000 }))
        proc.write_file(dir .. "/ready" .. k, "1")
        proc.sleep_ms(150)
        rel[k] = ("%%.3f"):format(proc.now_ms())
        assert(lock:unlock())
        assert(proc.wait_file(dir .. "/taken" .. k, 5000))
      end
      proc.write_file(dir .. "/released", table.concat(rel, " "))
    ]]):format(lua_list(cl.urls), dir, rounds, r)
    local pid = proc.spawn_luajit({ "luajit", "-e", code }, dir .. "/out")
    local ok, err = pcall(function()
      local status, body = srv:get("/waiter?r=" .. r .. "&rounds=" .. rounds .. "&dir=" .. dir, { timeout_ms = 30000 })
      assert.equal(200, status, log())
      assert.truthy(proc.wait_gone(pid, 5000))
      local acq, rel = {}, {}
      for v in body:gmatch("[%d.]+") do acq[#acq + 1] = tonumber(v) end
      for v in (proc.read_file(dir .. "/released") or ""):gmatch("[%d.]+") do rel[#rel + 1] = tonumber(v) end
      assert.equal(rounds, #acq, body .. log())
      assert.equal(rounds, #rel, "holder said: " .. tostring(proc.read_file(dir .. "/out")))
      local h = {}
      for k = 1, rounds do h[k] = acq[k] - rel[k] end
      return h
    end)
    local out = proc.read_file(dir .. "/out")
    proc.stop(pid)
    proc.rmdir(dir)
    assert(ok, tostring(err) .. "\nholder said: " .. tostring(out))
    return err
  end

  local function show(h)
    local t = {}
    for k, v in ipairs(h) do t[k] = ("%.1f"):format(v) end
    return table.concat(t, " ")
  end

  it("wakes a waiting request when a plain LuaJIT holder releases (hand-off far below the policy's 500 ms)", function()
    local h = process_handoffs(true, 5)
    print(("    [hand-off] notify on: median %.1f ms (%s)"):format(median(h), show(h)))
    assert.is_true(median(h) < 150, "hand-offs " .. show(h) .. log())
    for _, v in ipairs(h) do assert.is_true(v < 400, "hand-offs " .. show(h) .. log()) end
  end)

  -- Before: a request killed while it waited (its client gave up, with
  -- lua_check_client_abort on) left its semaphore among the hub's sleepers,
  -- and the hub's wake-up went to it whenever pairs() listed it first: the
  -- live waiter slept out its policy's 3 s delay.
  it("wakes a live waiter, not one whose request was aborted while it waited", function()
    srv = one_worker { [[
        location = /wait {
          lua_check_client_abort on;
          content_by_lua_block {
            local lock, err = DLM:lock(ngx.var.arg_r, { wait = 8000, retry = redlock.retry.fixed(3000, 100) })
            if not lock then ngx.say("fail ", err) return end
            ngx.say(("%.3f"):format(sproc.now_ms()))
            lock:unlock()
          }
        }]] }
    local r = res("aborted")
    local holder = redlock.new { servers = cl.urls }
    local lk = assert(holder:lock(r, { ttl = 20000 }))
    -- twelve waiters whose clients give up after 300 ms: their requests die asleep
    local reqs = {}
    for k = 1, 12 do reqs[k] = { path = "/wait?r=" .. r .. "&k=" .. k } end
    for k, rs in ipairs(srv:get_many(reqs, 12, { timeout_ms = 300 })) do
      assert.matches("timed out", tostring(rs.err), 1, true,
        ("waiter %d was not left waiting: %s"):format(k, tostring(rs.status)))
    end
    local evals = cluster.calls(cl, "eval", 1)
    local pid, dir = request_in_background("/wait?r=" .. r .. "&k=live")
    local ok, err = pcall(function()
      -- the live waiter queued (its attempt while waiting is a script): it sleeps
      assert(cluster.await_all(cl, function(i) return i ~= 1 or cluster.calls(cl, "eval", 1) > evals end, 5000))
      local released = proc.now_ms()
      assert(lk:unlock())
      assert.is_true(proc.wait_gone(pid, 8000))
      local out = proc.read_file(dir .. "/out") or ""
      local at = tonumber(out:match("^200 ([%d.]+)"))
      assert(at, "the live waiter said: " .. out)
      local handoff = at - released
      print(("    [hand-off] past 12 aborted waiters: %.1f ms"):format(handoff))
      assert.is_true(handoff < 1500, ("hand-off %.0f ms (the policy polls every 3000 ms)"):format(handoff))
    end)
    proc.stop(pid)
    proc.rmdir(dir)
    holder:close()
    assert(ok, tostring(err) .. log())
  end)

  it("without notifications (notify = false) waits out the policy's delay (the contrast)", function()
    local h = process_handoffs(false, 3)
    print(("    [hand-off] notify off: median %.1f ms (%s)"):format(median(h), show(h)))
    assert.is_true(median(h) > 250, "hand-offs " .. show(h))
  end)

  -- lock_many waits on every resource of its list together, and a client
  -- with a prefix listens on the prefixed key's channel.
  -- A timer (another request) holds resource .. "b" for 150 ms; the request
  -- waits for both with lock_many. Body: "ok <hand-off ms>".
  local MANY = [[
        location = /many {
          content_by_lua_block {
            local a, b = ngx.var.arg_r .. "a", ngx.var.arg_r .. "b"
            local held = assert(DLM:lock(b, { wait = 5000 }))
            local rel_at
            assert(ngx.timer.at(0.15, function() rel_at = sproc.now_ms(); held:unlock() end))
            local locks, err = DLM:lock_many({ a, b }, { wait = 5000, retry = ]] .. HANDOFF_RETRY .. [[ })
            local at = sproc.now_ms()
            if not locks then ngx.say("fail ", err) return end
            locks:unlock()
            while rel_at == nil do ngx.sleep(0.01) end
            ngx.say(("ok %.1f"):format(at - rel_at))
          }
        }]]

  local function many_handoffs(rounds)
    local h = {}
    for k = 1, rounds do
      local status, body = srv:get("/many?r=" .. res("many"))
      assert.equal(200, status, log())
      h[k] = tonumber(body:match("^ok ([%d.]+)"))
      assert(h[k], body .. log())
    end
    return h
  end

  it("queues a waiting request with plain LuaJIT waiters: each release wakes the next in line, across transports", function()
    -- Queued in the order: process A, the request, process B. Each holds
    -- 100 ms. Every waiter's policy polls only every 2 s, so who comes next
    -- is decided by the queue: A, the request, B. A request that did not
    -- join the queues would come last, after B (woken from the queue by A's
    -- release), or by a poll.
    srv = one_worker { [[
        location = /queued {
          content_by_lua_block {
            local lock, err = DLM:lock(ngx.var.arg_r, { wait = 20000, retry = redlock.retry.fixed(2000, 100) })
            if not lock then ngx.say("fail ", err) return end
            local at = sproc.now_ms()
            ngx.sleep(0.1)
            local rel = sproc.now_ms()
            lock:unlock()
            ngx.say(("%.3f %.3f"):format(at, rel))
          }
        }]] }
    local r = res("queued")
    local queue = "redlock:queue:" .. r
    local dir = proc.tmpdir()
    local holder = redlock.new { servers = cl.urls }
    local pids = {}
    local function queued(n)
      assert(cluster.await_all(cl, function(i)
        local len = tonumber(cl:cli(i, "LLEN", queue):match("(%d+)"))
        return len == n, "queue length " .. tostring(len)
      end, 10000, nil, holder), "waiting for " .. n .. " queued" .. log())
    end
    local function process(name)
      local code = ([[
        local proc, redlock = require "helpers.proc", require "redlock"
        local dlm = redlock.new { servers = %s }
        local lock = assert(dlm:lock(%q, { wait = 20000, retry = redlock.retry.fixed(2000, 100) }))
        local at = proc.now_ms()
        proc.sleep_ms(100)
        local rel = proc.now_ms()
        assert(lock:unlock())
        proc.write_file(%q, ("%%.3f %%.3f"):format(at, rel))
      ]]):format(lua_list(cl.urls), r, dir .. "/" .. name)
      pids[#pids + 1] = proc.spawn_luajit({ "luajit", "-e", code }, dir .. "/" .. name .. ".out")
    end
    local ok, err = pcall(function()
      local lk = assert(holder:lock(r))
      assert(cluster.await_value(cl, r, lk.value, 5000, nil, holder))
      process("a")
      queued(1)
      pids[#pids + 1] = proc.spawn({ "curl", "-s", "-m", "30", ("http://127.0.0.1:%d/queued?r=%s"):format(srv.port, r) },
                                   { out = dir .. "/request" })
      queued(2)
      process("b")
      queued(3)
      assert.is_true(lk:unlock())
      local t = {}
      for _, name in ipairs { "a", "request", "b" } do
        local text = proc.wait_file(dir .. "/" .. name, 20000)
        local at, rel = text:match("^([%d.]+) ([%d.]+)")
        assert(at, name .. " said " .. text .. log())
        t[name] = { at = tonumber(at), rel = tonumber(rel) }
      end
      print(("    [hand-off] queued across transports: a -> request %.1f ms, request -> b %.1f ms"):format(
        t.request.at - t.a.rel, t.b.at - t.request.rel))
      assert.is_true(t.a.rel <= t.request.at and t.request.rel <= t.b.at,
        ("order: a %.1f-%.1f, request %.1f-%.1f, b %.1f-%.1f"):format(t.a.at, t.a.rel, t.request.at,
          t.request.rel, t.b.at, t.b.rel))
      -- woken by the release, not by a poll (every 2000 ms): each gap well under one
      assert.is_true(t.request.at - t.a.rel < 1000, ("a -> request %.1f ms"):format(t.request.at - t.a.rel) .. log())
      assert.is_true(t.b.at - t.request.rel < 1000, ("request -> b %.1f ms"):format(t.b.at - t.request.rel) .. log())
    end)
    for _, pid in ipairs(pids) do proc.stop(pid) end
    holder:close()
    proc.rmdir(dir)
    assert(ok, err)
  end)

  it("wakes lock_many on a release of any of its resources, with a key prefix", function()
    srv = start { workers = 1, init = init_code(cl.urls, 'prefix = "pfx{x}:"'), locations = { PING, MANY } }
    local h = many_handoffs(3)
    print(("    [hand-off] lock_many with a prefix: %s"):format(show(h)))
    assert.is_true(median(h) < 150, "hand-offs " .. show(h) .. log())
  end)

  it("subscribes with AUTH on nodes with a password", function()
    local pcl = cluster.start(3, { password = "s3cret" })
    local ok, err = pcall(function()
      srv = start { workers = 1, init = init_code(pcl.urls), locations = { PING, MANY } }
      local h = many_handoffs(3)
      print(("    [hand-off] nodes with a password: %s"):format(show(h)))
      assert.is_true(median(h) < 150, "hand-offs " .. show(h) .. log())
      assert.not_matches("s3cret", srv:error_log())
    end)
    pcl:stop()
    assert(ok, tostring(err) .. log())
  end)

  -- The holder is another request (an ngx.timer) that, when asked, kills
  -- every pubsub connection of the nodes (the hub's subscribers) just before
  -- it releases: the waiter then acquires by polling, and once the hub has
  -- subscribed again, by hearing the release. The holder's client has
  -- another configuration, and so another hub: a release through the
  -- waiter's own hub would wake it at once, without the nodes' messages.
  it("acquires by polling when the hub's subscriber connections are killed, and wakes again once they are back", function()
    local ports = {}
    for i, u in ipairs(cl.urls) do ports[i] = tonumber(u:match(":(%d+)$")) end
    srv = start {
      workers = 1,
      init = init_code(cl.urls) .. ("PORTS = {%s}\nrcmd = require('helpers.resp').call\n"):format(table.concat(ports, ","))
        .. "HOLDER = redlock.new { servers = URLS, ttl = 3000, node_timeout = 77 }\n",
      locations = { PING, ([[
        location = /killer {
          content_by_lua_block {
            local r, kill = ngx.var.arg_r, ngx.var.arg_kill == "1"
            local held = assert(HOLDER:lock(r, { wait = 5000 }))
            local rel_at, killed
            assert(ngx.timer.at(0.15, function()
              if kill then
                killed = 0
                for _, port in ipairs(PORTS) do
                  local sock = ngx.socket.tcp()
                  sock:settimeouts(1000, 1000, 1000)
                  assert(sock:connect("127.0.0.1", port))
                  killed = killed + (tonumber(tostring(rcmd(sock, "CLIENT", "KILL", "TYPE", "pubsub")):match("^:(%%d+)")) or 0)
                  sock:close()
                end
              end
              rel_at = sproc.now_ms()
              held:unlock()
            end))
            local lock, err = DLM:lock(r, { wait = 5000, retry = %s })
            local at = sproc.now_ms()
            if not lock then ngx.say("fail ", err) return end
            lock:unlock()
            while rel_at == nil do ngx.sleep(0.01) end
            ngx.say(("ok %%.1f %%s"):format(at - rel_at, tostring(killed)))
          }
        }]]):format(HANDOFF_RETRY) },
    }
    local r = res("killsub")
    local function round(kill)
      local status, body = srv:get("/killer?r=" .. r .. "&kill=" .. (kill and "1" or "0"), { timeout_ms = 10000 })
      assert.equal(200, status, log())
      local ms, killed = body:match("^ok ([%d.]+) (%S+)")
      assert(ms, body .. log())
      return tonumber(ms), tonumber(killed)
    end
    local before = round(false)
    local killed_h = {}
    for k = 1, 3 do
      local ms, killed = round(true)
      -- every node had the hub's subscriber connection to kill
      assert.is_true(killed >= #cl.urls, "killed " .. tostring(killed))
      killed_h[k] = ms
    end
    -- the subscribers come back after the backoff (50 ms): wake-ups again
    proc.sleep_ms(300)
    local after = {}
    for k = 1, 3 do after[k] = round(false) end
    print(("    [hand-off] before %.1f ms; subscribers killed: %s; after: %s"):format(before, show(killed_h), show(after)))
    assert.is_true(before < 150, "before " .. before)
    -- polled: the policy's next attempt, not a wake-up
    assert.is_true(median(killed_h) > 250, "with subscribers killed " .. show(killed_h))
    assert.is_true(median(after) < 150, "after " .. show(after) .. log())
  end)

  -- What a worker's calls meet when its hub cannot serve them. A worker that
  -- exits after a reload serves the requests still waiting for a lock from
  -- one set of connections, as before (the hub stays while they wait on a
  -- watched channel). A call whose hub cannot start (every pending timer
  -- taken) fails like a round no node answered: nil, "unavailable", the
  -- reason in every node's error; it does not raise.
  -- One worker for the hub tests below: waiters counted in a dict, the
  -- hub told to stop when idle, every pending timer taken.
  local function hub_worker(extra)
    return start {
      workers = 1,
      http = "lua_shared_dict spec 1m;" .. (extra and extra.http or ""),
      init = ([[
        redlock = require "redlock"
        DLM = redlock.new { servers = %s, ttl = 5000 }
      ]]):format(nginx.lua_list(cl.urls)),
      locations = {
        -- wait for r (up to 8 s), hold it a moment, answer
        [[location = /wait {
            content_by_lua_block {
              ngx.shared.spec:incr("waiting", 1, 0)
              local lk, err = DLM:lock(ngx.var.arg_r, { wait = 8000 })
              if not lk then ngx.say("fail ", tostring(err)) return end
              ngx.sleep(0.01)
              lk:unlock()
              ngx.say("ok")
            }
          }]],
        [[location = /try {
            content_by_lua_block {
              local lk, err, detail = DLM:try_lock(ngx.var.arg_r)
              if lk then lk:unlock() ngx.say("ok") return end
              ngx.say(tostring(err), " ", tostring(detail[1].error))
            }
          }]],
        [[location = /waiting { content_by_lua_block { ngx.say(ngx.shared.spec:get("waiting") or 0) } }]],
        [[location = /idle { content_by_lua_block { require("redlock.nginx.hub").idle_ms = 100 ngx.say("ok") } }]],
        -- take every pending timer left (each ends in 30 s)
        [[location = /fill {
            content_by_lua_block {
              local n = 0
              while ngx.timer.at(30, function() end) do n = n + 1 end
              ngx.say(n)
            }
          }]],
      },
    }
  end

  -- Before: the exiting worker's hub stopped as soon as nothing was in
  -- flight, so each attempt of each waiting request started a hub of its
  -- own, connected to every node, and stopped again: node 1 accepted 192
  -- connections in the 2 s after a reload with 20 requests waiting (3 in the
  -- 2 s before). nginx also warned of ngx.sleep(0) in their fallback sleeps.
  it("serves the requests waiting in an exiting worker from one set of connections", function()
    srv = hub_worker()
    local r = res("reload")
    local holder = redlock.new { servers = cl.urls }
    local lk = assert(holder:lock(r, { ttl = 10000 }))
    local dir = proc.tmpdir()
    local pids = {}
    for i = 1, 10 do
      pids[i] = proc.spawn({ "curl", "-s", "-m", "20", ("http://127.0.0.1:%d/wait?r=%s"):format(srv.port, r) },
        { out = dir .. "/" .. i })
    end
    local ok, err = pcall(function()
      -- every request has begun its wait (and the first attempt, busy, is long decided)
      local deadline = proc.now_ms() + 10000
      repeat
        local _, body = srv:get("/waiting")
        if tonumber(body) == 10 then break end
        proc.sleep_ms(20)
      until proc.now_ms() > deadline
      proc.sleep_ms(200)
      local before = tonumber(info(cl, 1).total_connections_received)
      assert(os.execute("kill -HUP " .. srv.pid) == 0)
      proc.sleep_ms(1500)
      local during = tonumber(info(cl, 1).total_connections_received) - before
      assert(lk:unlock())
      print(("    [exiting] node 1 accepted %d connections in the 1.5 s after the reload"):format(during))
      -- the new worker's hub and subscriber, a reconnect or two: a few, not
      -- one per attempt of each of the 10 waiters
      assert.is_true(during <= 8, ("node 1 accepted %d connections after the reload"):format(during))
      -- the old worker serves its waiters to the end
      for i = 1, 10 do
        assert.is_true(proc.wait_gone(pids[i], 15000), "request " .. i .. " did not end")
        assert.are.equal("ok\n", proc.read_file(dir .. "/" .. i))
      end
      assert.is_nil(srv:error_log():find("ngx.sleep(0) called without delayed events patch", 1, true),
        srv:error_log())
    end)
    holder:close()
    for _, pid in ipairs(pids) do proc.stop(pid) end
    proc.rmdir(dir)
    assert(ok, err)
  end)

  -- Before: the call raised "redlock: cannot start the hub's ngx.timer: too
  -- many pending timers", and the request answered 500.
  it("fails a call whose hub cannot start as unavailable, with the reason", function()
    srv = hub_worker { http = "lua_max_pending_timers 64;" }
    local r = res("notimer")
    assert.are.equal("ok\n", select(2, srv:get("/idle")))
    assert.are.equal("ok\n", select(2, srv:get("/try?r=" .. r)))
    -- the hub stops once idle (100 ms without a call); then no timer is left
    local body
    local deadline = proc.now_ms() + 5000
    repeat
      proc.sleep_ms(200)
      srv:get("/fill")
      local status
      status, body = srv:get("/try?r=" .. r)
      assert.are.equal(200, status, body)
    until body ~= "ok\n" or proc.now_ms() > deadline
    assert.matches("^unavailable cannot start the hub's ngx.timer: too many pending timers", body)
  end)
end)
