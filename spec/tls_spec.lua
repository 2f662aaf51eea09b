-- TLS (rediss://) in the libev driver: real redis-server nodes serving TLS
-- only (--port 0 --tls-port), certificates made by spec/helpers/tls.lua.
-- Locking, mutual TLS, fencing and hand-off over TLS; every way a TLS
-- connection fails is one failed vote with its reason; stalls cost at most
-- a node timeout; the host's TLS flags; a contention history over TLS.

local redlock = require "redlock"
local cluster = require "helpers.cluster"
local faults = require "helpers.faults"
local history = require "helpers.history"
local proc = require "helpers.proc"
local tls = require "helpers.tls"

local q = proc.quote
local res = cluster.names("tls")

local BIN = os.getenv("REDLOCK_HOST") or (proc.build .. "/redlock")
if BIN:sub(1, 1) ~= "/" then BIN = proc.root .. "/" .. BIN end

local PASSWORD = "tls-s3cret-pw"

-- try_lock (resource of its own) over and over until, for every node i
-- in want (index -> pattern), an error matching want[i] was seen, or ms
-- pass. A round decides as soon as quorum is impossible, so one attempt may
-- leave some nodes "pending": the errors are gathered over attempts. A
-- granted lock reports no votes; it is released. Returns seen (index ->
-- the first matching error, or every error seen joined by " | ") and
-- whether every pattern matched, and the last failed attempt's err.
-- drive_ms: between attempts, run the client's loop this long (rl_sleep)
-- rather than sleep, so that connects and handshakes go on meanwhile (and
-- time out) without waiting for the next attempt.
-- need: how many of the wanted nodes must match (default all). Nodes that
-- are down vote at once, in server order, and the round is decided when
-- quorum is impossible: the last node may never get to say anything.
local function gather(dlm, want, ms, drive_ms, need)
  local r = res("gather")
  local found, all = {}, {}
  local last_err
  local deadline = proc.now_ms() + (ms or 3000)
  repeat
    local lk, err, detail = dlm:try_lock(r, { ttl = 2000 })
    if lk then
      lk:unlock()
    else
      last_err = err
      for i = 1, #detail do
        local e = detail[i].error
        if e then
          all[i] = all[i] or {}
          if not all[i][e] then all[i][e] = true; table.insert(all[i], e) end
          if want[i] and not found[i] and e:find(want[i]) then found[i] = e end
        end
      end
    end
    local wanted, matched = 0, 0
    for i in pairs(want) do
      wanted = wanted + 1
      if found[i] then matched = matched + 1 end
    end
    if matched >= (need or wanted) then return found, true, last_err end
    if drive_ms then require("redlock.cdefs").lib.rl_sleep(dlm.client, drive_ms) else proc.sleep_ms(10) end
  until proc.now_ms() > deadline
  local seen = {}
  for i in pairs(want) do seen[i] = found[i] or table.concat(all[i] or { "(no error)" }, " | ") end
  return seen, false, last_err
end

-- want = { [i] = pattern } for i = 1..n.
local function every(n, pattern)
  local t = {}
  for i = 1, n do t[i] = pattern end
  return t
end

-- A majority of 3 nodes (see gather's need).
local MAJORITY = 2

local function show(seen)
  local t = {}
  for i, e in pairs(seen) do t[#t + 1] = ("[%d] %s"):format(i, e) end
  table.sort(t)
  return table.concat(t, "; ")
end

describe("TLS (libev driver)", function()
  local pki, tcl, mcl, pcl, ocl

  lazy_setup(function()
    pki = tls.make()
    local server = { cert = pki.server_cert, key = pki.server_key, ca = pki.ca }
    tcl = cluster.start(3, { tls = server, password = PASSWORD })
    mcl = cluster.start(3, { tls = { cert = pki.server_cert, key = pki.server_key, ca = pki.ca,
      auth_clients = "yes", client_cert = pki.client_cert, client_key = pki.client_key } })
    pcl = cluster.start(2)
    ocl = cluster.start(1, { tls = { cert = pki.other_cert, key = pki.other_key, ca = pki.ca } })
  end)

  teardown(function()
    cluster.stop_all()
    tls.cleanup()
  end)

  describe("over rediss://", function()
    it("locks, extends and unlocks, with the keys on the nodes", function()
      local dlm = redlock.new { servers = tcl.urls, tls = { cafile = pki.ca } }
      local r = res("basic")
      local lk, err, detail = dlm:lock(r, { ttl = 5000 })
      assert.is_truthy(lk, tostring(err) .. " " .. cluster.show(detail))
      assert.is_true(cluster.await_value(tcl, r, lk.value, 2000, nil, dlm))
      assert.is_truthy(lk:extend(20000))
      assert.is_true(cluster.await_all(tcl, function(i) return cluster.pttl(tcl, i, r) > 10000 end, 2000, nil, dlm))
      assert.is_true(lk:unlock())
      assert.is_true(cluster.await_value(tcl, r, nil, 2000, nil, dlm))
      dlm:close()
    end)

    it("keeps a lock alive over TLS from the keep-alive thread (its own client, same tls options)", function()
      local dlm = redlock.new { servers = tcl.urls, tls = { cafile = pki.ca } }
      local r = res("keepalive")
      local lk, err, detail = dlm:lock(r, { ttl = 400, keepalive = true })
      assert.is_truthy(lk, tostring(err) .. " " .. cluster.show(detail))
      collectgarbage() -- the tls strings are the client's to keep
      proc.sleep_ms(1200) -- three ttls, no call into redlock meanwhile
      assert.is_false(lk:lost())
      for i = 1, 3 do assert.equal(lk.value, cluster.get(tcl, i, r)) end
      assert.is_true(lk:unlock())
      dlm:close()
    end)

    it("never shows the password in node names or failure details", function()
      local dlm = redlock.new { servers = tcl.urls, tls = { cafile = pki.wrong_ca } }
      for i, name in ipairs(dlm:nodes()) do assert.equal("rediss://127.0.0.1:" .. tcl.ports[i], name) end
      local seen, ok = gather(dlm, every(3, "certificate verify failed"), nil, nil, MAJORITY)
      assert.is_true(ok, show(seen))
      assert.not_matches(PASSWORD, show(seen), 1, true)
      local _, _, detail = dlm:try_lock(res("names"))
      for i = 1, 3 do assert.equal("rediss://127.0.0.1:" .. tcl.ports[i], detail[i].server) end
      dlm:close()
    end)

    it("never shows the password in failure details when AUTH is refused (good CA, wrong password)", function()
      local WRONG = "tls-wr0ng-pw"
      local urls = {}
      for i = 1, 3 do urls[i] = "rediss://:" .. WRONG .. "@127.0.0.1:" .. tcl.ports[i] end
      local dlm = redlock.new { servers = urls, tls = { cafile = pki.ca } }
      -- the handshake succeeds, AUTH is sent and refused: its error is the
      -- detail; gather those (and every other error and err) over attempts
      local refused, texts = 0, {}
      local deadline = proc.now_ms() + 3000
      repeat
        local lk, err, detail = dlm:try_lock(res("wrongpw"), { ttl = 2000 })
        assert.is_nil(lk)
        texts[#texts + 1] = tostring(err)
        for i = 1, #detail do
          assert.equal("rediss://127.0.0.1:" .. tcl.ports[i], detail[i].server)
          local e = detail[i].error
          if e then
            texts[#texts + 1] = e
            if e:find("WRONGPASS", 1, true) then refused = refused + 1 end
          end
        end
        proc.sleep_ms(10)
      until refused >= MAJORITY or proc.now_ms() > deadline
      local all = table.concat(texts, " | ")
      assert.is_true(refused >= MAJORITY, all)
      assert.not_matches(WRONG, all, 1, true)
      assert.not_matches(PASSWORD, all, 1, true)
      dlm:close()
    end)

    it("locks over mutual TLS with certfile and keyfile", function()
      local dlm = redlock.new { servers = mcl.urls,
        tls = { cafile = pki.ca, certfile = pki.client_cert, keyfile = pki.client_key } }
      local r = res("mutual")
      local lk, err, detail = dlm:lock(r)
      assert.is_truthy(lk, tostring(err) .. " " .. cluster.show(detail))
      assert.is_truthy(lk:extend())
      assert.is_true(lk:unlock())
      dlm:close()
    end)

    it("verifies with a directory of hashed CA certificates (capath)", function()
      local dir = proc.tmpdir()
      local ok, err = pcall(function()
        local out, rc = proc.sh(("cp %s %s/ca.pem && openssl rehash %s"):format(q(pki.ca), q(dir), q(dir)))
        assert.equal(0, rc, out)
        local dlm = redlock.new { servers = tcl.urls, tls = { capath = dir } }
        local lk, lerr, detail = dlm:lock(res("capath"))
        assert.is_truthy(lk, tostring(lerr) .. " " .. cluster.show(detail))
        lk:unlock()
        dlm:close()
      end)
      proc.rmdir(dir)
      assert(ok, err)
    end)

    it("verifies the name given as server_name instead of the URL's host", function()
      local dlm = redlock.new { servers = tcl.urls, tls = { cafile = pki.ca, server_name = "localhost" } }
      local lk, err, detail = dlm:lock(res("sni"))
      assert.is_truthy(lk, tostring(err) .. " " .. cluster.show(detail))
      lk:unlock()
      dlm:close()
    end)

    it("hands out increasing fencing tokens", function()
      local dlm = redlock.new { servers = tcl.urls, tls = { cafile = pki.ca } }
      local r = res("fence")
      local last = 0
      for _ = 1, 3 do
        local lk, err, detail = dlm:lock(r, { fence = true })
        assert.is_truthy(lk, tostring(err) .. " " .. cluster.show(detail))
        assert.is_true(lk.token > last)
        last = lk.token
        lk:unlock()
      end
      dlm:close()
    end)

    it("mixes TLS and plain nodes in one client (3 rediss:// + 2 redis://)", function()
      local urls = { tcl.urls[1], tcl.urls[2], tcl.urls[3], pcl.urls[1], pcl.urls[2] }
      local dlm = redlock.new { servers = urls, tls = { cafile = pki.ca } }
      local r = res("mixed")
      local lk, err, detail = dlm:lock(r)
      assert.is_truthy(lk, tostring(err) .. " " .. cluster.show(detail))
      local held = function(cl, i) return cluster.get(cl, i, r) == lk.value end
      local deadline = proc.now_ms() + 2000
      while not (held(tcl, 1) and held(tcl, 2) and held(tcl, 3) and held(pcl, 1) and held(pcl, 2)) do
        assert.is_true(proc.now_ms() < deadline, "not on every node")
        cluster.drive(dlm)
        proc.sleep_ms(10)
      end
      lk:unlock()
      dlm:close()
    end)

    it("redlock.default() takes REDLOCK_SERVERS and the REDLOCK_* TLS variables", function()
      local cmd = ("cd %s && env REDLOCK_SERVERS=%s REDLOCK_CACERT=%s LUA_PATH=%s LUA_CPATH=%s luajit -e %s 2>&1"):format(
        q(proc.root), q(table.concat(tcl.urls, ",")), q(pki.ca), q(package.path), q(package.cpath),
        q([[local lk, err = require("redlock").default():lock("spec:tls:default"); ]]
          .. [[print(lk and "locked" or err); if lk then lk:unlock() end]]))
      local out = proc.sh(cmd)
      assert.equal("locked\n", out)
    end)

    it("speaks TLS 1.2 to a node that offers nothing newer (mutual TLS, and without a client certificate)", function()
      local old = cluster.start(1, { args = { "--tls-protocols", "TLSv1.2" }, tls = {
        cert = pki.server_cert, key = pki.server_key, ca = pki.ca, auth_clients = "yes",
        client_cert = pki.client_cert, client_key = pki.client_key } })
      local dlm = redlock.new { servers = old.urls,
        tls = { cafile = pki.ca, certfile = pki.client_cert, keyfile = pki.client_key } }
      local lk, err, detail = dlm:lock(res("tls12"))
      assert.is_truthy(lk, tostring(err) .. " " .. cluster.show(detail))
      lk:unlock()
      dlm:close()
      dlm = redlock.new { servers = old.urls, tls = { cafile = pki.ca } }
      local seen, ok = gather(dlm, { "^server requires a client certificate$" })
      assert.is_true(ok, show(seen))
      dlm:close()
    end)

    -- Before: any handshake failure without a client certificate of ours
    -- was reported as the server requiring one.
    it("says what a handshake with no cipher in common failed on, not a missing certificate", function()
      -- (started by hand: the helpers' readiness check is a TLS client too,
      -- and would not get in either; gather tries for 3 s meanwhile)
      local port = require("helpers.nginx").free_port()
      local pid = proc.spawn({ "redis-server", "--port", "0", "--tls-port", tostring(port), "--bind", "127.0.0.1",
        "--tls-cert-file", pki.server_cert, "--tls-key-file", pki.server_key, "--tls-ca-cert-file", pki.ca,
        "--tls-auth-clients", "no", "--tls-protocols", "TLSv1.3", "--tls-ciphersuites", "TLS_AES_128_CCM_8_SHA256",
        "--save", "", "--appendonly", "no" })
      local dlm = redlock.new { servers = { ("rediss://127.0.0.1:%d"):format(port) }, tls = { cafile = pki.ca } }
      local seen, ok = gather(dlm, { "handshake failure" })
      dlm:close()
      proc.stop(pid)
      assert.is_true(ok, show(seen))
      for _, text in pairs(seen) do assert.is_nil(text:find("client certificate", 1, true), show(seen)) end
    end)

    it("skips verification with verify = false", function()
      local dlm = redlock.new { servers = ocl.urls, tls = { cafile = pki.wrong_ca, verify = false } }
      local lk, err, detail = dlm:lock(res("insecure"))
      assert.is_truthy(lk, tostring(err) .. " " .. cluster.show(detail))
      lk:unlock()
      dlm:close()
    end)
  end)

  describe("connections the node ends", function()
    local lib = require("redlock.cdefs").lib

    -- Before: the next call's command went out on the closed connection,
    -- and that node's vote failed ("closed by the server (TLS close_notify)")
    it("a close_notify while idle is read before the next call: that call connects again at once", function()
      local dlm = redlock.new { servers = tcl.urls, tls = { cafile = pki.ca }, quorum = 3 }
      local lk = assert(dlm:lock(res("kill")))
      lk:unlock()
      local before = dlm:stats().nodes[2]
      assert.equal("1", (tcl:cli(2, "CLIENT", "KILL", "TYPE", "normal")))
      lib.rl_sleep(dlm.client, 10)
      local err, detail
      lk, err, detail = dlm:try_lock(res("killed"))
      assert.is_truthy(lk, tostring(err) .. " " .. require("helpers.cluster").show(detail))
      lk:unlock()
      local after = dlm:stats().nodes[2]
      assert.equal(before.lost + 1, after.lost)
      assert.equal(before.reconnects + 1, after.reconnects)
      dlm:close()
    end)

    -- A client made and then left alone (a plain-LuaJIT program between
    -- calls: nobody drives its handshakes) past the servers' idle timeout.
    -- Before: the first call failed on every node ("TLS handshake failed:
    -- connection closed by the server").
    it("a handshake the server ended while the program was away: the first call connects again at once", function()
      for i = 1, 3 do assert.equal("OK", (tcl:cli(i, "CONFIG", "SET", "timeout", "1"))) end
      local ok, err = pcall(function()
        local dlm = redlock.new { servers = tcl.urls, tls = { cafile = pki.ca }, quorum = 3 }
        os.execute("sleep 2.5") -- not rl_sleep: the client's loop must not run
        local lk, why, detail = dlm:try_lock(res("unused"))
        assert.is_truthy(lk, tostring(why) .. " " .. require("helpers.cluster").show(detail))
        assert.is_true(lk:unlock())
        dlm:close()
      end)
      for i = 1, 3 do tcl:cli(i, "CONFIG", "SET", "timeout", "0") end
      assert(ok, err)
    end)

    -- Before: any connection a server that had asked for a client
    -- certificate ended before its first reply was "server requires a client
    -- certificate", a close_notify too (a TLS proxy with optional client
    -- certificates whose backend is down); and a reset after a refused
    -- certificate was a bare "Connection reset by peer".
    it("before any reply: the reason first, the client certificate only as a hedge", function()
      local mine = { certfile = pki.client_cert, keyfile = pki.client_key }
      local NOTIFY = "connection lost: closed by the server (TLS close_notify)"
      local cases = {
        { "notify", nil, NOTIFY },
        { "notify", mine, NOTIFY },
        { "ask-notify", nil, NOTIFY .. "; it had asked for a client certificate" },
        { "ask-notify", mine, NOTIFY .. "; it had asked for a client certificate" },
        { "ask-reset", nil, "connection lost: server requires a client certificate? (connection reset before any reply)" },
        { "ask-reset", mine, "connection lost: server refused the client certificate? (connection reset before any reply)" },
      }
      for _, case in ipairs(cases) do
        local mode, cert, want = case[1], case[2], case[3]
        local fake = faults.tlsfake(mode, pki.server_cert, pki.server_key)
        local ok, err = pcall(function()
          local t = { cafile = pki.ca }
          for k, v in pairs(cert or {}) do t[k] = v end
          local dlm = redlock.new { servers = { fake.url }, tls = t }
          local seen, found = gather(dlm, { "^" .. want:gsub("%p", "%%%0") .. "$" })
          dlm:close()
          assert.is_true(found, ("%s%s: %s"):format(mode, cert and " (with a certificate)" or "", show(seen)))
        end)
        fake:stop()
        assert(ok, err)
      end
    end)

    it("the subscriber connections reconnect over TLS and hear releases again", function()
      local waiter = redlock.new { servers = tcl.urls, tls = { cafile = pki.ca } }
      local holder = redlock.new { servers = tcl.urls, tls = { cafile = pki.ca } }
      local r = res("sub")
      local function listening(n)
        local deadline = proc.now_ms() + 3000
        while lib.rl_client_listening(waiter.client) ~= n and proc.now_ms() < deadline do
          lib.rl_sleep(waiter.client, 10)
        end
        return lib.rl_client_listening(waiter.client)
      end
      assert.equal(0, lib.rl_watch(waiter.client, r, #r))
      assert.equal(3, listening(3))
      for i = 1, 3 do assert.equal("1", (tcl:cli(i, "CLIENT", "KILL", "TYPE", "pubsub"))) end
      lib.rl_sleep(waiter.client, 20)
      assert.equal(3, listening(3))
      lib.rl_sleep(waiter.client, 50) -- the SUBSCRIBEs reached the nodes
      local heard = lib.rl_heard(waiter.client, r, #r)
      local lk = assert(holder:lock(r))
      assert.is_true(lk:unlock())
      assert.equal(1, lib.rl_sleep_until(waiter.client, r, #r, heard, 3000))
      lib.rl_unwatch(waiter.client, r, #r)
      waiter:close()
      holder:close()
    end)
  end)

  describe("hand-off over TLS", function()
    it("wakes a waiter on release, far sooner than its 500 ms poll", function()
      -- two processes, each holding 30 ms and pausing 5 ms after its release;
      -- the waiter's policy sleeps 500 ms: only a heard release is faster
      local dir = proc.tmpdir()
      local logfile = dir .. "/events.log"
      local r = res("handoff")
      local env = tls.env({ cafile = pki.ca }, { LUA_PATH = package.path, LUA_CPATH = package.cpath })
      local pids = {}
      local ok, err = pcall(function()
        for w = 1, 2 do
          local argv = { "luajit", "spec/helpers/handoff_worker.lua", logfile, r, "3000",
                         "30", "5", "500", "500", "on" }
          for _, u in ipairs(tcl.urls) do argv[#argv + 1] = u end
          pids[w] = proc.spawn(argv, { out = dir .. "/worker" .. w .. ".out", env = env })
        end
        for w = 1, 2 do assert(proc.wait_gone(pids[w], 25000), "worker " .. w .. " did not finish") end
      end)
      for _, pid in ipairs(pids) do proc.stop(pid) end
      local summaries = (proc.read_file(dir .. "/worker1.out") or "") .. (proc.read_file(dir .. "/worker2.out") or "")
      local events = {}
      for line in (proc.read_file(logfile) or ""):gmatch("[^\n]+") do
        local kind, pid, us = line:match("^(%a+) (%d+) (%d+)$")
        events[#events + 1] = { kind = kind, pid = tonumber(pid), us = tonumber(us) }
      end
      proc.rmdir(dir)
      assert(ok, tostring(err) .. "\n" .. summaries)
      table.sort(events, function(a, b) return a.us < b.us end)
      local h = {}
      for i = 2, #events do
        local prev, e = events[i - 1], events[i]
        if e.kind == "acq" and prev.kind == "rel" and prev.pid ~= e.pid then h[#h + 1] = (e.us - prev.us) / 1000 end
      end
      table.sort(h)
      local median = h[math.floor((#h + 1) / 2)]
      print(("hand-off over TLS: n=%d median=%.2f ms max=%.2f ms (%s)"):format(#h, median or -1, h[#h] or -1,
        summaries:gsub("\n", " ")))
      assert.is_true(#h >= 5, summaries)
      assert.is_true(median < 250, "median hand-off " .. tostring(median) .. " ms")
    end)
  end)

  describe("failed votes, with their reason", function()
    it("a CA that did not sign the nodes' certificates: certificate verify failed, err unavailable", function()
      local dlm = redlock.new { servers = tcl.urls, tls = { cafile = pki.wrong_ca } }
      local seen, ok, err = gather(dlm, every(3, "^certificate verify failed: "), nil, nil, MAJORITY)
      assert.is_true(ok, show(seen))
      assert.equal("unavailable", err)
      local _, err2, detail = dlm:try_lock(res("verify"))
      assert.equal("unavailable", err2)
      local FAILED = { error = true, pending = true, timeout = true } -- pending when decided early
      for i = 1, 3 do assert.is_true(FAILED[detail[i].state] == true, cluster.show(detail)) end
      dlm:close()
    end)

    it("a certificate for another name: hostname mismatch", function()
      local dlm = redlock.new { servers = ocl.urls, tls = { cafile = pki.ca } }
      local seen, ok = gather(dlm, { "^hostname mismatch.*127%.0%.0%.1" })
      assert.is_true(ok, show(seen))
      dlm:close()
      dlm = redlock.new { servers = tcl.urls, tls = { cafile = pki.ca, server_name = "other.example" } }
      seen, ok = gather(dlm, every(3, "^hostname mismatch.*other%.example"), nil, nil, MAJORITY)
      assert.is_true(ok, show(seen))
      dlm:close()
    end)

    -- Before: a certificate without subject alternative names passed on its
    -- subject's CN (OpenSSL's fallback), though names are checked against
    -- the SANs.
    it("a certificate without subject alternative names is for no name, whatever its CN", function()
      local ncl = cluster.start(1, { tls = { cert = pki.nosan_cert, key = pki.nosan_key, ca = pki.ca } })
      local dlm = redlock.new { servers = ncl.urls, tls = { cafile = pki.ca, server_name = "localhost" } }
      local seen, ok = gather(dlm, { "^hostname mismatch: the server's certificate is not for localhost$" })
      dlm:close()
      ncl:stop()
      assert.is_true(ok, show(seen))
    end)

    -- Before: an IPv6 host was named expanded (0:0:0:0:0:0:0:1).
    it("names an IPv6 host as it was given", function()
      local port = require("redlock.devcluster.sys").free_ports(1)[1]
      local dir = proc.tmpdir()
      local pid = proc.spawn({ "redis-server", "--port", "0", "--tls-port", tostring(port), "--bind", "::1",
        "--tls-cert-file", pki.localhost_cert, "--tls-key-file", pki.localhost_key, "--tls-ca-cert-file", pki.ca,
        "--tls-auth-clients", "no", "--save", "", "--appendonly", "no", "--dir", dir }, { out = dir .. "/log" })
      local dlm = redlock.new { servers = { ("rediss://[::1]:%d"):format(port) }, tls = { cafile = pki.ca } }
      local seen, ok = gather(dlm, { "^hostname mismatch: the server's certificate is not for ::1$" })
      dlm:close()
      proc.stop(pid)
      proc.rmdir(dir)
      assert.is_true(ok, show(seen))
    end)

    it("no client certificate for a node that requires one", function()
      local dlm = redlock.new { servers = mcl.urls, tls = { cafile = pki.ca } }
      local seen, ok = gather(dlm, every(3, "server requires a client certificate"), nil, nil, MAJORITY)
      assert.is_true(ok, show(seen))
      dlm:close()
    end)

    it("redis:// to a TLS port, and rediss:// to a plain port, next to nodes that grant", function()
      local plain_to_tls = tcl.urls[1]:gsub("^rediss://", "redis://")
      local tls_to_plain = pcl.urls[1]:gsub("^redis://", "rediss://")
      local urls = { plain_to_tls, tls_to_plain, tcl.urls[2], tcl.urls[3], pcl.urls[2] }
      local dlm = redlock.new { servers = urls, tls = { cafile = pki.ca }, connect_timeout = 300 }
      local r = res("wrongport")
      local lk, err, detail = dlm:lock(r)
      assert.is_truthy(lk, tostring(err) .. " " .. cluster.show(detail))
      lk:unlock()
      dlm:close()
      -- each alone, so that its rounds fail and say why
      dlm = redlock.new { servers = { plain_to_tls } }
      local seen, ok = gather(dlm, { "^connection [lr]" }) -- lost (reset by the node), or reset (no answer)
      assert.is_true(ok, show(seen))
      dlm:close()
      dlm = redlock.new { servers = { tls_to_plain }, tls = { cafile = pki.ca }, connect_timeout = 300 }
      seen, ok = gather(dlm, { "^TLS handshake" }, 8000, 400)
      assert.is_true(ok, show(seen))
      dlm:close()
    end)

    -- Files are loaded when the client is made: redlock.new raises naming
    -- the option, the file and the real reason. Before: /dev/zero said "No
    -- such file or directory" (a stale errno), a missing keyfile "system
    -- lib", a directory as keyfile "PEM lib".
    it("bad option files are an error at creation naming the option, the file and why", function()
      local function why(t, servers)
        local ok, e = pcall(redlock.new, { servers = servers or tcl.urls, tls = t })
        local named = {}
        for k, v in pairs(t) do named[#named + 1] = k .. "=" .. tostring(v) end
        assert.is_false(ok, "made a client with " .. table.concat(named, " "))
        return (tostring(e):gsub("^bad argument #1 to 'new' %((.*)%)$", "%1"))
      end
      local dir = pki.dir
      local text, empty, encrypted = dir .. "/text.pem", dir .. "/empty.pem", dir .. "/encrypted.key"
      proc.write_file(text, "not a certificate\n")
      proc.write_file(empty, "")
      local out, rc = proc.sh(("openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -aes256 -pass pass:pw -out %s")
        :format(q(encrypted)))
      assert.equal(0, rc, out)
      local cert = { cafile = pki.ca, certfile = pki.client_cert }
      local function with(t) for k, v in pairs(cert) do t[k] = t[k] or v end return t end
      local cases = {
        { { cafile = "/dev/zero" }, "tls.cafile '/dev/zero': not a regular file" },
        { { cafile = dir .. "/missing.pem" }, "tls.cafile '" .. dir .. "/missing.pem': No such file or directory" },
        { { cafile = dir }, "tls.cafile '" .. dir .. "': is a directory" },
        { { cafile = text }, "tls.cafile '" .. text .. "': no certificate in it" },
        { { cafile = empty }, "tls.cafile '" .. empty .. "': no certificate in it" },
        { { capath = pki.ca }, "tls.capath '" .. pki.ca .. "': not a directory" },
        { { capath = dir .. "/missing" }, "tls.capath '" .. dir .. "/missing': No such file or directory" },
        { { certfile = dir .. "/nocert" }, "tls.certfile '" .. dir .. "/nocert': No such file or directory" },
        { { certfile = dir }, "tls.certfile '" .. dir .. "': is a directory" },
        { { certfile = pki.client_key }, "tls.certfile '" .. pki.client_key .. "': no certificate in it" },
        { { certfile = pki.client_cert }, "tls.certfile '" .. pki.client_cert .. "': no private key in it (and no tls.keyfile)" },
        { with { keyfile = dir .. "/nokey" }, "tls.keyfile '" .. dir .. "/nokey': No such file or directory" },
        { with { keyfile = "/tmp" }, "tls.keyfile '/tmp': is a directory" },
        { with { keyfile = "/dev/null" }, "tls.keyfile '/dev/null': not a regular file" },
        { with { keyfile = pki.client_cert }, "tls.keyfile '" .. pki.client_cert .. "': no private key in it" },
        { with { keyfile = encrypted },
          "tls.keyfile '" .. encrypted .. "': the key is encrypted (a passphrase cannot be given)" },
        { with { keyfile = pki.server_key }, "tls.keyfile '" .. pki.server_key .. "': the key does not match tls.certfile" },
      }
      for _, case in ipairs(cases) do assert.equal(case[2], why(case[1])) end
      -- named files are checked with plain redis:// servers too
      assert.equal("tls.cafile '" .. dir .. "/missing.pem': No such file or directory",
        why({ cafile = dir .. "/missing.pem" }, pcl.urls))
    end)

    it("misuse of the tls table raises at the call site", function()
      local function new(t) return function() redlock.new { servers = tcl.urls, tls = t } end end
      assert.has_error(new("yes"), "bad argument #1 to 'new' (tls must be a table, got string \"yes\")")
      assert.has_error(new { cafile = 1 }, "bad argument #1 to 'new' (tls.cafile must be a non-empty string, got 1)")
      assert.has_error(new { server_name = "" },
        "bad argument #1 to 'new' (tls.server_name must be a non-empty string, got string \"\")")
      assert.has_error(new { verify = "no" }, "bad argument #1 to 'new' (tls.verify must be a boolean, got string \"no\")")
      assert.has_error(new { ca = pki.ca }, "bad argument #1 to 'new' (unknown option 'tls.ca')")
      assert.has_error(new { keyfile = pki.client_key }, "bad argument #1 to 'new' (tls.keyfile needs tls.certfile)")
      -- SNI's limit (before: made, then every round failed every node)
      assert.has_error(new { server_name = ("x"):rep(256) },
        "bad argument #1 to 'new' (tls.server_name: longer than 255 bytes)")
      redlock.new({ servers = tcl.urls, tls = { server_name = ("x"):rep(255) } }):close()
    end)
  end)

  -- A TLS handshake that never finishes: a rediss:// URL to a plain port
  -- (redis-server reads a ClientHello as an inline command that never ends
  -- and says nothing), a server that accepts and never answers, a server
  -- whose ServerHello stops after 20 bytes (the fault proxy in front of a
  -- TLS node, cutting its replies). The connection lives out its connect
  -- timeout, across the rounds that fail meanwhile, then is closed and says
  -- "TLS handshake timed out". Before, each failed attempt's cleanup reset
  -- it: every attempt said "no reply within 50 ms" or "no answer to its
  -- setup", each made a new connection, and the timeout never came.
  describe("handshakes that never finish", function()
    local CT = 800 -- connect_timeout

    -- Attempts (try_lock, then the client's loop driven 50 ms) at the
    -- one node behind tool (a fake server or a proxy, counting accepts):
    -- connections made, ms taken from the client's creation, and each
    -- attempt's start (ms since creation) and node error.
    local function ten_attempts(tool)
      local lib = require("redlock.cdefs").lib
      local t0 = proc.now_ms()
      local dlm = redlock.new { servers = { "rediss://127.0.0.1:" .. tool.port }, tls = { cafile = pki.ca },
                                connect_timeout = CT, node_timeout = 50 }
      local seen = {}
      -- a node silent past its node timeout is suspect: later attempts fail
      -- at once, so go on until two connect timeouts and a half have passed
      for k = 1, 200 do
        if k > 10 and proc.now_ms() - t0 > 2.5 * CT then break end
        local at = proc.now_ms() - t0
        local lk, err, detail = dlm:try_lock(res("never"))
        assert.is_nil(lk)
        assert.equal("unavailable", err)
        seen[k] = { at = at, error = tostring(detail[1].error), state = detail[1].state }
        lib.rl_sleep(dlm.client, 50)
      end
      local accepts = tool:accepts()
      local ms = proc.now_ms() - t0
      dlm:close()
      return accepts, ms, seen
    end

    local function check(tool)
      local accepts, ms, seen = ten_attempts(tool)
      local lines = {}
      for k, a in ipairs(seen) do lines[k] = ("%5.0f ms %s: %s"):format(a.at, a.state, a.error) end
      local text = ("%d connections in %.0f ms:\n%s"):format(accepts, ms, table.concat(lines, "\n"))
      -- every connection but the last lived out its connect timeout
      assert.is_true(accepts >= 1 and accepts <= math.floor(ms / CT) + 1, text)
      local late = 0
      for _, a in ipairs(seen) do
        if a.at < CT - 100 then
          -- the first connection, still at it: a failed vote that says so
          assert.equal("timeout", a.state, text)
          assert.matches("^TLS handshake under way, %d+ of " .. CT .. " ms$", a.error, nil, false)
        elseif a.at > CT + 100 then
          late = late + 1
          assert.matches("TLS handshake timed out after " .. CT .. " ms", a.error, 1, true)
        end
      end
      assert.is_true(late >= 2, text)
      print(("    [tls] %d connection(s) in %.0f ms; last attempt: %s"):format(accepts, ms, seen[#seen].error))
    end

    it("rediss:// to a plain redis port", function()
      local px = faults.proxy(pcl.ports[1])
      local ok, err = pcall(check, px)
      px:stop()
      assert(ok, err)
    end)

    it("a server that accepts and never answers", function()
      local fake = faults.fakeserver("silent")
      local ok, err = pcall(check, fake)
      fake:stop()
      assert(ok, err)
    end)

    it("a ServerHello cut off after 20 bytes", function()
      local px = faults.proxy(tcl.ports[1], "cut 20")
      local ok, err = pcall(check, px)
      px:stop()
      assert(ok, err)
    end)

    it("a server that answers the ClientHello with garbage fails at once with OpenSSL's reason", function()
      local fake = faults.fakeserver("garbage")
      local ok, err = pcall(function()
        local dlm = redlock.new { servers = { "rediss://127.0.0.1:" .. fake.port }, tls = { cafile = pki.ca },
                                  connect_timeout = 5000, node_timeout = 1000 }
        local _, lerr, detail = dlm:try_lock(res("garbage"))
        dlm:close()
        assert.equal("unavailable", lerr)
        assert.equal("error", detail[1].state, cluster.show(detail))
        assert.matches("^TLS handshake failed: ", detail[1].error, nil, false)
        assert.is_true(detail.elapsed < 1000, cluster.show(detail))
      end)
      fake:stop()
      assert(ok, err)
    end)
  end)

  describe("stalls", function()
    after_each(function()
      for i = 1, 3 do tcl:kill(i, "CONT") end
    end)

    it("a TLS node stopped mid-round costs at most about its node timeout", function()
      local dlm = redlock.new { servers = tcl.urls, tls = { cafile = pki.ca }, node_timeout = 50 }
      local r = res("stall")
      local lk = assert(dlm:lock(r))
      lk:unlock()
      tcl:kill(3, "STOP")
      for _ = 1, 3 do
        local t0 = proc.now_ms()
        local l2, err, detail = dlm:lock(r, { retry = function() return nil end })
        local took = proc.now_ms() - t0
        assert.is_truthy(l2, tostring(err) .. " " .. cluster.show(detail))
        assert.is_true(took < 500, ("took %.1f ms"):format(took))
        l2:unlock()
      end
      dlm:close()
    end)

    it("a TLS node stopped before the handshake fails its vote with a timeout; the others grant", function()
      tcl:kill(3, "STOP")
      local dlm = redlock.new { servers = tcl.urls, tls = { cafile = pki.ca }, node_timeout = 50,
                                connect_timeout = 300 }
      local r = res("stall-handshake")
      local lk, err, detail = dlm:lock(r, { retry = function() return nil end })
      assert.is_truthy(lk, tostring(err) .. " " .. cluster.show(detail))
      lk:unlock()
      dlm:close()
      -- with every node needed, each round fails and says what node 3 does
      dlm = redlock.new { servers = tcl.urls, tls = { cafile = pki.ca }, node_timeout = 50,
                          connect_timeout = 300, quorum = 3 }
      local seen, ok = gather(dlm, { [3] = "^TLS handshake timed out after 300 ms" }, 8000, 400)
      assert.is_true(ok, show(seen))
      dlm:close()
    end)
  end)

  describe("the host", function()
    local dir

    before_each(function() dir = proc.tmpdir() end)
    after_each(function() proc.rmdir(dir) end)

    local function host(args, env)
      return proc.sh(("cd %s && env %s %s %s"):format(q(dir), env or "", q(BIN), args))
    end

    it("runs a command under the lock with --cacert and --servers rediss://...", function()
      local out, rc = host(("exec --cacert %s --servers %s %s -- sh -c 'echo held $REDLOCK_RESOURCE'")
        :format(q(pki.ca), q(table.concat(tcl.urls, ",")), q(res("exec"))))
      assert.equal(0, rc, out)
      assert.matches("held spec:tls:exec", out)
      -- a CA directory, and the name to verify given with --sni
      out, rc = proc.sh(("cp %s %s/ca.pem && openssl rehash %s"):format(q(pki.ca), q(dir), q(dir)))
      assert.equal(0, rc, out)
      out, rc = host(("exec --cacertdir %s --sni localhost --servers %s %s -- echo ok"):format(
        q(dir), q(table.concat(tcl.urls, ",")), q(res("exec"))))
      assert.equal(0, rc, out)
      assert.equal("ok\n", out)
      out, rc = host(("exec -n --cacert %s --sni other.example --servers %s %s -- echo no"):format(
        q(pki.ca), q(table.concat(tcl.urls, ",")), q(res("exec"))))
      assert.equal(69, rc, out)
      assert.matches("hostname mismatch", out, 1, true)
    end)

    it("reads the servers from --servers-file, and TLS settings from the environment", function()
      local file = dir .. "/servers"
      proc.write_file(file, "# the TLS nodes\n" .. table.concat(tcl.urls, "\n") .. "\n\n")
      local out, rc = host(("exec --servers-file %s %s -- echo ok"):format(q(file), q(res("file"))),
        "REDLOCK_CACERT=" .. q(pki.ca))
      assert.equal(0, rc, out)
      assert.equal("ok\n", out)
      -- mutual TLS from the environment
      proc.write_file(file, table.concat(mcl.urls, "\n"))
      out, rc = host(("exec --servers-file %s %s -- echo ok"):format(q(file), q(res("file"))),
        ("REDLOCK_CACERT=%s REDLOCK_CERT=%s REDLOCK_KEY=%s"):format(q(pki.ca), q(pki.client_cert), q(pki.client_key)))
      assert.equal(0, rc, out)
    end)

    it("fails per node with the reason, and never prints a password", function()
      local out, rc = host(("exec -n --cacert %s --servers %s %s -- echo no"):format(
        q(pki.wrong_ca), q(table.concat(tcl.urls, ",")), q(res("badca"))))
      assert.equal(69, rc, out)
      assert.matches("certificate verify failed", out, 1, true)
      assert.not_matches(PASSWORD, out, 1, true)
      out, rc = host(("exec -n --cacert %s --servers %s %s -- echo no"):format(
        q(dir .. "/none.pem"), q(table.concat(tcl.urls, ",")), q(res("nofile"))))
      assert.equal(64, rc, out)
      assert.matches("--cacert '" .. dir .. "/none.pem': No such file or directory", out, 1, true)
      assert.not_matches(PASSWORD, out, 1, true)
      -- run too (before: a traceback from the script's first redlock.default(), exit 1)
      local script = dir .. "/uses_default.lua"
      proc.write_file(script, "print('script ran') require('redlock').default()\n")
      out, rc = host(("run --cacert %s --servers %s %s"):format(
        q(dir .. "/none.pem"), q(table.concat(tcl.urls, ",")), q(script)))
      assert.equal(64, rc, out)
      assert.matches("--cacert '" .. dir .. "/none.pem': No such file or directory", out, 1, true)
      assert.is_nil(out:find("traceback", 1, true), out)
      assert.is_nil(out:find("script ran", 1, true), out)
    end)

    -- Before: only a message's leading "tls.<option>" became a flag, and
    -- always the flag: "--key: needs tls.certfile", "--cert '...': no private
    -- key in it (and no tls.keyfile)", "--cacert '/nonexist': ..." for
    -- REDLOCK_CACERT=/nonexist.
    it("names the flag or the variable that set each TLS file, wherever the message mentions it", function()
      local servers = q(table.concat(tcl.urls, ","))
      local cases = {
        { ("status --servers %s --cacert %s --key %s r1"):format(servers, q(pki.ca), q(pki.client_key)), nil,
          "redlock: --key needs --cert\n" },
        { ("status --servers %s --cacert %s --cert %s r1"):format(servers, q(pki.ca), q(pki.client_cert)), nil,
          ("redlock: --cert '%s': no private key in it (and no --key)\n"):format(pki.client_cert) },
        { ("status --servers %s r1"):format(servers), "REDLOCK_CACERT=/nonexist",
          "redlock: REDLOCK_CACERT '/nonexist': No such file or directory\n" },
        { ("status --servers %s --cacert %s r1"):format(servers, q(pki.ca)), "REDLOCK_KEY=" .. q(pki.client_key),
          "redlock: REDLOCK_KEY needs --cert\n" },
        { ("exec -n --servers %s --cacert %s --key %s r1 -- true"):format(servers, q(pki.ca), q(pki.client_key)), nil,
          "redlock: --key needs --cert\n" },
        { ("exec -n --servers %s --key %s r1 -- true"):format(servers, q(pki.server_key)),
          ("REDLOCK_CACERT=%s REDLOCK_CERT=%s"):format(q(pki.ca), q(pki.client_cert)),
          ("redlock: --key '%s': the key does not match REDLOCK_CERT\n"):format(pki.server_key) },
        { ("status --servers %s --sni %s r1"):format(servers, ("x"):rep(256)), nil,
          "redlock: --sni: longer than 255 bytes\n" },
      }
      for _, case in ipairs(cases) do
        local out, rc = host(case[1], case[2])
        assert.equal(64, rc, out)
        assert.equal(case[3], out)
      end
    end)

    it("--insecure (and REDLOCK_INSECURE) warn that verification is off", function()
      local out, rc = host(("exec --insecure --servers %s %s -- echo ok"):format(
        q(table.concat(ocl.urls, ",")), q(res("insecure"))))
      assert.equal(0, rc, out)
      assert.matches("warning: TLS certificate verification is off", out, 1, true)
      out, rc = host(("exec --servers %s %s -- echo ok"):format(q(table.concat(ocl.urls, ",")), q(res("insecure"))),
        "REDLOCK_INSECURE=1")
      assert.equal(0, rc, out)
      assert.matches("warning: TLS certificate verification is off", out, 1, true)
    end)

    it("status reads what TLS nodes hold", function()
      local r = res("status")
      local servers = q(table.concat(tcl.urls, ","))
      local out, rc = host(("exec --cacert %s --servers %s %s -- %s status --cacert %s --servers %s %s"):format(
        q(pki.ca), servers, q(r), q(BIN), q(pki.ca), servers, q(r)))
      assert.equal(0, rc, out)
      assert.matches("held: value %S+%.%.%. on 3 of 3 nodes", out)
      out, rc = host(("status --cacert %s --servers %s %s"):format(q(pki.wrong_ca), servers, q(r)))
      assert.equal(69, rc, out)
      assert.matches("certificate verify failed", out, 1, true)
      assert.not_matches(PASSWORD, out, 1, true)
    end)

    -- Before: demo refused --cacert ("unknown option", 64), and its workers
    -- read the nodes' votes without the TLS options.
    it("demo runs its workers over TLS with --cacert, and reads their votes with it", function()
      local out, rc = host(("demo --cacert %s --servers %s --workers 2 --rounds 2"):format(q(pki.ca),
        q(table.concat(tcl.urls, ","))))
      assert.equal(0, rc, out)
      assert.matches("OK: one holder at a time", out, 1, true)
      local votes = assert(out:match("votes for the granted locks: ([^\n]*)"), out)
      assert.is_nil(votes:find(": 0 ok", 1, true), out)
      assert.not_matches(PASSWORD, out, 1, true)
    end)

    it("lists the TLS flags in --help", function()
      for _, cmd in ipairs { "exec", "run", "status", "demo" } do
        local out = host(cmd .. " --help")
        for _, flag in ipairs { "--cacert", "--cacertdir", "--cert", "--key", "--sni", "--insecure", "--servers-file" } do
          assert.matches(flag, out, 1, true)
        end
      end
    end)
  end)

  describe("under contention", function()
    it("keeps mutual exclusion over TLS: no overlaps, no lost updates", function()
      local dir = proc.tmpdir()
      local logfile, counter = dir .. "/history.log", dir .. "/counter"
      local r = res("hammer")
      local env = tls.env({ cafile = pki.ca }, { LUA_PATH = package.path, LUA_CPATH = package.cpath })
      local pids = {}
      local run_ms = 3000
      local ok, err = pcall(function()
        for w = 1, 4 do
          local argv = { "luajit", "spec/helpers/worker.lua", "lock", logfile, counter, r, tostring(run_ms) }
          for _, u in ipairs(tcl.urls) do argv[#argv + 1] = u end
          pids[w] = proc.spawn(argv, { out = dir .. "/worker" .. w .. ".out", env = env })
        end
        for w = 1, 4 do assert(proc.wait_gone(pids[w], run_ms + 20000), "worker " .. w .. " did not finish") end
      end)
      for _, pid in ipairs(pids) do proc.stop(pid) end
      local summaries = {}
      for w = 1, 4 do summaries[w] = proc.read_file(dir .. "/worker" .. w .. ".out") or "" end
      local result = history.check(logfile, { counter = counter })
      proc.rmdir(dir)
      assert(ok, tostring(err) .. "\n" .. table.concat(summaries))
      print(("contention over TLS: %d acquisitions, %d overlaps, %d lost updates"):format(
        result.acquisitions, result.overlaps, result.lost_updates or -1))
      assert.is_true(result.acquisitions >= 20, table.concat(summaries))
      assert.equal(0, result.overlaps)
      assert.equal(0, result.unfinished)
      assert.equal(0, result.lost_updates)
    end)
  end)
end)
