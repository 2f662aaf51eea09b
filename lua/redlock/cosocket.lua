-- redlock.cosocket: the transport inside nginx. The C core's engine
-- (rl_engine_*: the whole algorithm, no I/O, no clock) driven over
-- ngx.socket.tcp, so a lock call yields to nginx's event loop instead of
-- blocking the worker. Nothing of the algorithm is here: this file moves
-- bytes, reads the clock and sleeps.
--
-- One driver per worker and configuration: the hub. A hub owns one engine
-- and its links (per node a command connection and, once something is
-- watched, a subscriber connection: redlock.h, "Links"), and runs in a
-- long-lived ngx.timer callback (a timer is a request of its own, so its
-- cosockets live as long as it runs). In it, one light thread per link
-- connects and reads, feeding what arrives to the engine; the timer's main
-- loop waits on a semaphore ("work posted") or until the engine's next
-- deadline, then does what the engine wants (close, connect, write),
-- advances it, and hands every finished result to the request waiting for
-- it. Everything begun since the last turn goes to each node in one send:
-- that is where the throughput comes from.
--
-- A lock call never touches a socket: it begins its operation on the hub's
-- engine (pure C), posts the hub's semaphore and waits on a semaphore of its
-- own for the result. Replies cannot cross requests: requests own no
-- sockets, and the engine pairs every reply with its command.
--
-- Clients made with the same servers and options (passwords included) share
-- the worker's hub: a client made per request costs no connection. The hub
-- starts with the first call; with nothing in flight, no tail and no call
-- for HUB_IDLE_MS it ends its timer and closes its connections (the next
-- call starts it again); when the worker exits it serves the operations
-- begun until decided, tails for at most a node timeout, and kept locks for
-- as long as they are kept, then stops. client:free() never stops a hub. It
-- also extends the worker's kept locks (see "kept locks").
-- rediss:// nodes: the connections speak TLS (see "TLS" below).

local ffi = require "ffi"
local bit = require "bit"
local C = require("redlock.cdefs").lib

local ngx = ngx
local semaphore = require "ngx.semaphore"
local ffi_string, ffi_new, ffi_copy, band, lshift = ffi.string, ffi.new, ffi.copy, bit.band, bit.lshift
local now_ms = C.rl_now_ms
local co_running, co_status = coroutine.running, coroutine.status
local tostring, xpcall, pairs = tostring, xpcall, pairs

local RL_OK, RL_ERR = C.RL_OK, C.RL_ERR
local WANT_WRITE, WANT_CONNECT, WANT_CLOSE = C.RL_WANT_WRITE, C.RL_WANT_CONNECT, C.RL_WANT_CLOSE
local READ_CHUNK = 65536
local RESULT_SIZE = ffi.sizeof("rl_result")
local HUB_IDLE_MS = 10000      -- a hub with nothing to do for this long stops
local HUB_SLICE_MS = 500       -- the longest the hub sleeps without looking at the worker's state
local READ_TIMEOUT_MS = 3600000 -- a reader waits this long for bytes, then again (the engine times replies)
local WAIT_MARGIN_MS = 2000    -- a call's safety timeout: node + connect timeout + this
local STALE_MS = 10000         -- a result nobody took for this long is dropped (its call is gone)
local EXIT_GC_MS = 5000        -- an exiting worker's hub that keeps locks collects garbage this often
-- Each connect costs the timer's request a little memory that nginx frees
-- only when the timer ends: after this many, the hub starts a fresh timer at
-- its first quiet moment (nothing in flight, no tail).
local ROTATE_CONNECTS = 1000

-- idle_ms: how long a hub with nothing to do keeps its timer and connections;
-- rotate_connects: after how many connects it starts a fresh timer (module
-- fields, read on every turn, so a test can change them).
local _M = { name = "cosocket", idle_ms = HUB_IDLE_MS, rotate_connects = ROTATE_CONNECTS,
             handoff = true } -- waiters wake on a heard release (client:watch, client:sleep_until)
                             -- and queue (client:acquire_queued), to be woken alone

-- The phases where nginx offers cosockets (ngx.get_phase()).
local COSOCKET_PHASES = { rewrite = true, access = true, content = true, timer = true,
                          ssl_cert = true, ssl_session_fetch = true }

-- nil, or why no lock call can run in this phase.
local function phase_refusal()
    local phase = ngx.get_phase()
    if COSOCKET_PHASES[phase] then return nil end
    return ("no redlock call can run in nginx's %s phase: it has no cosockets (and blocking the worker is not an option); "
        .. "lock in rewrite_by_lua*, access_by_lua*, content_by_lua* or an ngx.timer callback"):format(phase)
end

local out_ptr = ffi_new("const char *[1]")
local int_out = ffi_new("int[1]")

---------------------------------------------------------------------------
-- waiters: what a call waits on (its semaphore, a copy of its result), and
-- who it is (the coroutine that began it, the resource of an acquire: see
-- "calls that are gone")

local free_waiters, nfree = {}, 0

local function take_waiter()
    local w
    if nfree > 0 then
        w = free_waiters[nfree]
        free_waiters[nfree] = nil
        nfree = nfree - 1
    else
        w = { sema = semaphore.new(0), res = ffi_new("rl_result"), done = false, done_at = 0, err = nil, id = -1,
              co = nil, resource = nil, waiting = false, abandoned = false }
    end
    return w
end

-- Only a waiter whose semaphore holds nothing (it was waited on to the end,
-- or never posted) goes back to the list.
local function give_waiter(w)
    w.done, w.err, w.id, w.co, w.resource, w.abandoned = false, nil, -1, nil, nil, false
    if w.sema:count() ~= 0 then return end
    nfree = nfree + 1
    free_waiters[nfree] = w
end

---------------------------------------------------------------------------
-- the hub

local hubs = {}  -- configuration key -> hub, for this worker
local lost_reason -- lost_reason(hub, i, err): why link i's connection ended (defined with the TLS code)

local function wake(hub)
    local sema = hub.work
    if sema and sema:count() < 1 then sema:post(1) end
end

---------------------------------------------------------------------------
-- kept locks: keep-alive on the hub's engine
--
-- Kept locks are extended by the hub, not by an ngx.timer each: nginx
-- allows lua_max_pending_timers of those per worker, and one left pending
-- after an unlock counts until it fires. The schedule is the engine's
-- (rl_engine_keep_*, redlock.h's "Keep-alive": the same rules as
-- rl_keeper's): rl_engine_deadline counts it, rl_engine_advance begins the
-- extensions due as ordinary rounds (they go out with whatever else was
-- begun in that turn), and their results stay in the engine. The hub runs
-- while the engine keeps locks (rl_engine_keeping), and knows which request
-- or timer kept each one (hub.owners), for an exiting worker.

local OP_ACQUIRE, ERR_FULL, STATUS_OK = C.RL_OP_ACQUIRE, C.RL_ERR_FULL, C.RL_STATUS_OK

-- The worker exits: a kept lock whose owner (the request or timer that kept
-- it, by its ngx.ctx, which nginx lets go of when it ends) has ended and
-- been collected is not extended any more, so that it cannot hold the
-- worker up (one left in a module-level table, say). It is not released
-- either: it stays held until its validity less the margin runs out, then
-- lost (rl_engine_keep_lapse).
local function forget_unowned(hub)
    local kept, owners = hub.kept, hub.owners
    for id in pairs(kept) do
        if owners[id] == nil then
            kept[id] = nil
            C.rl_engine_keep_lapse(hub.e, id)
        end
    end
end

-- Release resource's lock of value from the hub, for nobody (a grant whose
-- request is gone): its result is dropped. An engine with every slot taken
-- gets it again on the loop's next turn.
local function release_orphan(hub, resource, value)
    local id = C.rl_engine_begin_release(hub.e, resource, #resource, value, now_ms())
    if id == ERR_FULL then
        local o = hub.orphans
        o[#o + 1] = { resource, value }
    end
    wake(hub)
end

local function retry_orphans(hub)
    local list = hub.orphans
    hub.orphans = {}
    for k = 1, #list do release_orphan(hub, list[k][1], list[k][2]) end
end

-- Kept locks the hub must run for (extended, or releases not decided), and
-- releases of orphans not begun yet.
local function keeping(hub)
    return C.rl_engine_keeping(hub.e) > 0 or hub.orphans[1] ~= nil
end

---------------------------------------------------------------------------
-- results, and calls that are gone
--
-- A request killed while it waits for a result (a client abort with
-- lua_check_client_abort on, an ngx.exit from another thread) never takes
-- it: ngx_lua takes its coroutine off the semaphore, so the semaphore's
-- count, -1 while it waits, is 0 again with nobody resumed. A lock such a
-- result grants is released by the hub, as is one granted after its caller
-- gave up waiting (w.abandoned) or left untaken until swept.

local gone_cos = setmetatable({}, { __mode = "k" }) -- coroutines found killed while they waited

local function granted(r)
    return r.op == OP_ACQUIRE and r.status == STATUS_OK
end

-- Nobody will take r, the result of w's operation.
local function orphaned(hub, w, r)
    if granted(r) and w.resource then release_orphan(hub, w.resource, ffi_string(r.value)) end
end

-- The request of coroutine co is gone: results of its other operations
-- that came in before and are not taken never will be.
local function forsake(hub, co)
    local waiters = hub.waiters
    for id, w in pairs(waiters) do
        if w.co == co and w.done then
            waiters[id] = nil
            if w.err == nil then orphaned(hub, w, w.res) end
        end
    end
end

-- Is w's caller gone (w not done)?
local function gone(hub, w)
    if w.abandoned then return true end
    if w.waiting then
        if w.sema:count() < 0 then return false end
        local co = w.co
        if co and not gone_cos[co] then
            gone_cos[co] = true
            forsake(hub, co)
        end
        return true
    end
    return w.co ~= nil and gone_cos[w.co] ~= nil
end

-- Hand every finished operation to the call waiting for it. Pure engine
-- work, no I/O: any coroutine of the worker may do it.
local function deliver(hub)
    local e, res, waiters = hub.e, hub.res, hub.waiters
    while C.rl_engine_collect(e, res) == 1 do
        local w = waiters[res.id]
        if w ~= nil and not w.done then
            if gone(hub, w) then
                -- dropped, not reused: a caller that timed out may still look at it
                waiters[res.id] = nil
                orphaned(hub, w, res)
            else
                ffi_copy(w.res, res, RESULT_SIZE)
                w.done, w.done_at = true, hub.now
                w.sema:post(1)
            end
        end
        -- else: the hub's own release, or a result swept; dropped
    end
end

-- Fail every call still waiting (the hub is stopping or broke); one whose
-- result is in takes it as it is.
local function fail_waiters(hub, why)
    for id, w in pairs(hub.waiters) do
        if not w.done and gone(hub, w) then
            hub.waiters[id] = nil
        elseif not w.done then
            w.err, w.done, w.done_at = why, true, hub.now
            w.sema:post(1)
        end
    end
end

-- Close link i's socket. Its reader, if any, is killed first: only the
-- coroutine that spawned it (the hub's loop) may, and only the loop calls
-- this while readers run.
local function close_node(hub, i)
    hub.gen[i] = hub.gen[i] + 1
    hub.up[i] = false
    local r = hub.readers[i]
    hub.readers[i] = nil
    -- (one that ended on its own is reaped by the loop: see reader)
    if r and co_status(r) ~= "dead" and r ~= co_running() then ngx.thread.kill(r) end
    local sock = hub.socks[i]
    hub.socks[i] = nil
    if sock then sock:close() end
end

-- Link i's connection failed or ended, seen by its own reader: forget the
-- socket (the reader is about to return) and tell the engine. A subscriber
-- link's reason goes to the error log, once per reason (not once per retry):
-- it costs wake-ups, which nothing else would show.
local function lost_node(hub, i, why)
    if i >= hub.n and hub.said[i] ~= why then
        ngx.log(ngx.WARN, "redlock: subscriber of ", hub.names[i], ": ", why)
    end
    hub.said[i] = why
    hub.gen[i] = hub.gen[i] + 1
    hub.up[i] = false
    hub.readers[i] = nil
    local sock = hub.socks[i]
    hub.socks[i] = nil
    if sock then sock:close() end
    C.rl_engine_node_down(hub.e, i, why, now_ms())
    wake(hub)
end

-- Write what the engine has for link i (everything queued since the last
-- turn, in one send), and what was queued while that send yielded.
local function write_node(hub, i)
    local e, gen = hub.e, hub.gen[i]
    while hub.up[i] and hub.gen[i] == gen do
        local len = tonumber(C.rl_engine_node_output(e, i, out_ptr))
        if len == 0 then return end
        local sent, err = hub.socks[i]:send(ffi_string(out_ptr[0], len))
        if hub.gen[i] ~= gen then return end -- closed while the send yielded
        if not sent then
            close_node(hub, i)
            C.rl_engine_node_down(e, i, lost_reason(hub, i, err), now_ms())
            return
        end
        C.rl_engine_node_wrote(e, i, len, now_ms())
    end
end

---------------------------------------------------------------------------
-- TLS (rediss:// nodes)
--
-- A cosocket speaks TLS after sock:sslhandshake(session, server_name,
-- verify). What it verifies against is nginx's, not the client's:
-- lua_ssl_trusted_certificate (the CAs) and lua_ssl_verify_depth; this
-- ngx_lua has no per-socket CA, so tls.cafile and tls.capath are not used
-- inside nginx (the hub says so in the error log once). server_name is both
-- the SNI and the name the certificate must be for: tls.server_name, else the
-- URL's host name. ngx_lua checks host names only (a certificate for
-- IP:127.0.0.1 "does not match host 127.0.0.1"), so an IP-address host with
-- verification on needs tls.server_name: without it the client is refused
-- rather than left unchecked; with verify off it is sent no SNI. A client
-- certificate (tls.certfile, and its key from tls.keyfile or else from the
-- same PEM file) is parsed once per hub and set on every socket with
-- sock:setclientcert.
--
-- There is no keepalive pool to reuse TLS connections from: the hub keeps
-- one connection per node for as long as it runs, and every call of the
-- worker goes over it, so a handshake is paid once per connection, not per
-- request. When a connection is made again (a lost node, a hub started
-- anew, the subscriber), the handshake resumes the node's last TLS session
-- (kept per node by the hub) when the server still has it. That is TLS 1.2,
-- what this ngx_lua offers by default: over TLS 1.3 (lua_ssl_protocols)
-- sslhandshake returns the session before the server's ticket arrives, and
-- every connect is a full handshake.

-- Is host an IP address (no SNI, no name to verify)?
local function ip_literal(host)
    return host:find("^%d+%.%d+%.%d+%.%d+$") ~= nil or host:find(":", 1, true) ~= nil
end

-- The TLS settings of rl_options.tls as Lua values (verify a boolean,
-- strings or nil); tls_load adds the parsed client certificate.
local TLS_STRINGS = { "cafile", "capath", "certfile", "keyfile", "server_name" }

local function tls_config(t)
    local c = { verify = t.verify ~= 0 }
    for _, f in ipairs(TLS_STRINGS) do
        if t[f] ~= nil then c[f] = ffi_string(t[f]) end
    end
    return c
end

local PEM_MAX = 1048576 -- a certificate chain or key file is far smaller (and /dev/zero never ends)

-- The text of file path (tls.<what>), or nil and "tls.<what> '<path>': why".
local function read_file(path, what)
    local f, err = io.open(path, "rb")
    local s
    if f then
        s, err = f:read(PEM_MAX + 1)
        f:close()
    end
    local why
    if not f then
        why = tostring(err)
        if why:sub(1, #path + 2) == path .. ": " then why = why:sub(#path + 3) end -- io.open's "path: reason"
    elseif not s and err then
        why = tostring(err)
    elseif not s or s == "" then
        why = "empty"
    elseif #s > PEM_MAX then
        why = "larger than 1 MB: not a certificate or key file"
    end
    if why == "Is a directory" then why = "is a directory" end
    if why then return nil, ("tls.%s '%s': %s"):format(what, path, why) end
    return s
end

-- Load what a TLS hub needs from nginx (the client certificate, parsed
-- once) and check that this ngx_lua has it. nil, or why not.
local function tls_load(c)
    pcall(require, "resty.core.socket") -- adds sslhandshake and setclientcert (nginx loads it first anyway)
    local sock_mt = debug.getregistry().__tcp_cosocket_mt
    if type(sock_mt) ~= "table" or type(sock_mt.sslhandshake) ~= "function" then
        return "rediss:// needs cosocket sslhandshake, which this nginx's lua module lacks"
    end
    if c.certfile then
        local ok, ssl = pcall(require, "ngx.ssl")
        if not ok or type(ssl.parse_pem_cert) ~= "function" or type(ssl.parse_pem_priv_key) ~= "function" then
            return "a client certificate inside nginx needs ngx.ssl.parse_pem_cert/parse_pem_priv_key "
                .. "(lua-resty-core), which is missing"
        end
        if type(sock_mt.setclientcert) ~= "function" then
            return "a client certificate inside nginx needs cosocket setclientcert "
                .. "(lua-nginx-module 0.10.21+ with lua-resty-core), which this nginx lacks"
        end
        local pem, err = read_file(c.certfile, "certfile")
        if not pem then return err end
        local cert, cerr = ssl.parse_pem_cert(pem)
        if not cert then return ("tls.certfile '%s': %s"):format(c.certfile, tostring(cerr)) end
        if c.keyfile then -- else the key is in certfile's PEM too
            pem, err = read_file(c.keyfile, "keyfile")
            if not pem then return err end
        end
        local key, kerr = ssl.parse_pem_priv_key(pem)
        if not key then
            return ("tls.%s '%s': %s"):format(c.keyfile and "keyfile" or "certfile (no tls.keyfile: its key)",
                c.keyfile or c.certfile, tostring(kerr))
        end
        c.cert, c.key = cert, key
    end
    return nil
end

-- lua-resty-core up to 0.1.26 (Debian 12 has 0.1.25) raises "assertion
-- failed!" in sslhandshake when the handshake itself succeeded but the
-- certificate did not verify (lua-resty-core issue 499): the error it had
-- just read is still in resty.core's shared errmsg buffer. The handshake
-- error, from what sslhandshake raised.
local errmsg_ptr
local function handshake_assert(raised)
    raised = tostring(raised)
    if raised:find("assertion failed", 1, true) then
        if errmsg_ptr == nil then
            local ok, base = pcall(require, "resty.core.base")
            errmsg_ptr = ok and base.get_errmsg_ptr and base.get_errmsg_ptr() or false
        end
        if errmsg_ptr and errmsg_ptr[0] ~= nil then
            local text = ffi_string(errmsg_ptr[0])
            if text == "certificate host mismatch" or text == "timeout" or text == "closed"
                or text:find("^handshake failed") then
                return text
            end
            return "0: " .. text -- a verify error, as sslhandshake returns them ("20: unable to ...")
        end
    end
    return "sslhandshake raised: " .. raised
end

-- A node's reason for a failed handshake (sslhandshake's error), short: the
-- engine keeps RL_NODE_ERR_LEN bytes of it.
local function handshake_reason(hub, i, err)
    err = tostring(err)
    if err == "timeout" then return ("TLS handshake timed out after %d ms"):format(hub.connect_timeout) end
    if err == "certificate host mismatch" then
        return ("certificate verify failed: not for '%s'"):format(hub.snis[i])
    end
    local text = err:match("^%d+: (.+)$") -- an X509 verify error: "20: unable to get local issuer ..."
    if text then return "certificate verify failed: " .. text end
    if err == "handshake failed" and hub.tls.cert == nil then
        -- most often: the server requires a client certificate (tls-auth-clients yes),
        -- nginx's error log has the server's alert
        return "TLS handshake failed: server requires a client certificate? (none set)"
    end
    return "TLS handshake failed: " .. err
end

-- A node's reason for a connection that ended. Over TLS 1.3 a server that
-- wants a client certificate refuses one after the handshake, so the
-- connection ends before its first reply.
function lost_reason(hub, i, err)
    if hub.tlss[i] and not hub.fed[i] and hub.tls.cert == nil then
        return ("lost after the TLS handshake: server requires a client certificate? (%s)"):format(tostring(err))
    end
    return "connection lost: " .. tostring(err)
end

-- Connect sock to node i and, for a rediss:// node, do the TLS handshake
-- within what is left of connect_timeout. true, or nil and why (the node's
-- reason). The engine is told of the handshake (its connect deadline then
-- says the handshake timed out, as ours does).
local function open(hub, i, sock)
    local t0 = now_ms()
    sock:settimeouts(hub.connect_timeout, hub.node_timeout, READ_TIMEOUT_MS)
    local ok, err
    if hub.ports[i] == 0 then
        ok, err = sock:connect("unix:" .. hub.hosts[i])
    else
        ok, err = sock:connect(hub.hosts[i], hub.ports[i])
    end
    if not ok and err == "timeout" then return nil, ("connect timed out after %d ms"):format(hub.connect_timeout) end
    if not ok then return nil, "connect failed: " .. tostring(err) end
    if not hub.tlss[i] then return true end
    C.rl_engine_node_handshaking(hub.e, i)
    local left = math.floor(hub.connect_timeout - (now_ms() - t0))
    if left < 1 then return nil, ("TLS handshake timed out after %d ms"):format(hub.connect_timeout) end
    sock:settimeouts(left, hub.node_timeout, READ_TIMEOUT_MS) -- ngx_lua times the handshake with it
    local tls = hub.tls
    if tls.cert then
        local set, serr = sock:setclientcert(tls.cert, tls.key)
        if not set then return nil, "TLS client certificate refused: " .. tostring(serr) end
    end
    local done, sess, herr = pcall(sock.sslhandshake, sock, hub.sessions[i], hub.snis[i], tls.verify)
    if not done then sess, herr = nil, handshake_assert(sess) end
    if not sess then
        hub.sessions[i] = nil
        return nil, handshake_reason(hub, i, herr)
    end
    hub.sessions[i] = sess -- resumed by the next connection to the node
    return true
end

-- Say once per hub, in the error log, what a TLS client's settings mean
-- inside nginx where that differs from elsewhere.
local function tls_notes(hub)
    local tls = hub.tls
    if tls.cafile or tls.capath then
        ngx.log(ngx.NOTICE, "redlock: tls.cafile/tls.capath are not used inside nginx: cosockets verify ",
            "rediss:// nodes against lua_ssl_trusted_certificate (and lua_ssl_verify_depth)")
    end
end

local post_heard -- post_heard(hub): wake the requests asleep on watches that heard a release (see "hand-off")

-- Link i's light thread: connect (a new connection: the engine sends
-- AUTH/SELECT/INFO first, or a subscriber's AUTH and SUBSCRIBE), then read
-- and feed until the connection ends or the loop closes it.
local function read_node(hub, i, gen)
    local e = hub.e
    local sock = ngx.socket.tcp()
    hub.socks[i] = sock
    local ok, err = open(hub, i, sock)
    if hub.gen[i] ~= gen then return end
    if not ok then return lost_node(hub, i, err) end
    if C.rl_engine_node_connected(e, i, 1, now_ms()) ~= RL_OK then
        -- the engine no longer wants it (it gave up on the connect meanwhile)
        hub.gen[i] = hub.gen[i] + 1
        hub.socks[i], hub.readers[i] = nil, nil
        sock:close()
        return wake(hub)
    end
    hub.up[i], hub.fed[i], hub.said[i] = true, false, nil
    wake(hub)
    local subscriber = i >= hub.n
    while true do
        local data, rerr = sock:receiveany(READ_CHUNK)
        if hub.gen[i] ~= gen then return end
        if data then
            hub.fed[i] = true
            if C.rl_engine_node_feed(e, i, data, #data, now_ms()) ~= RL_OK then
                -- the engine dropped the connection (it asks for a close too)
                hub.gen[i] = hub.gen[i] + 1
                hub.up[i] = false
                hub.socks[i], hub.readers[i] = nil, nil
                sock:close()
                hub.now = now_ms()
                deliver(hub)
                return wake(hub)
            end
            if subscriber then
                post_heard(hub)
            else
                hub.now = now_ms()
                deliver(hub)
                wake(hub)
            end
        elseif rerr ~= "timeout" then
            return lost_node(hub, i, lost_reason(hub, i, rerr))
        end
    end
end

-- A light thread that ends on its own stays a zombie until its parent (the
-- loop) waits for it: it files itself for the loop to reap.
local function reader(hub, i, gen)
    read_node(hub, i, gen)
    hub.ended[#hub.ended + 1] = co_running()
end

local function reap(hub)
    local ended = hub.ended
    for k = #ended, 1, -1 do
        local th = ended[k]
        if co_status(th) == "dead" then
            table.remove(ended, k)
            ngx.thread.wait(th)
        end
    end
end

local function connect_node(hub, i)
    close_node(hub, i)
    hub.connects = hub.connects + 1
    local gen = hub.gen[i]
    local th, err = ngx.thread.spawn(reader, hub, i, gen)
    if not th then
        C.rl_engine_node_down(hub.e, i, "cannot start a light thread: " .. tostring(err), now_ms())
    elseif co_status(th) ~= "dead" and hub.gen[i] == gen then
        hub.readers[i] = th
    end
end

-- Do what the engine asks: close, connect (a reader per link), write; until
-- it asks no more closes or connects (a connect that fails at once answers
-- commands, and that may ask for more).
local function service(hub)
    local e, links = hub.e, 2 * hub.n
    local asked = true
    while asked do
        asked = false
        local bits = C.rl_engine_wanting(e)
        if bits == 0 then return end
        for i = 0, links - 1 do
            if band(bits, lshift(1, i)) ~= 0 then
                local w = C.rl_engine_node_wants(e, i)
                if band(w, WANT_CLOSE) ~= 0 then close_node(hub, i) end
                if band(w, WANT_CONNECT) ~= 0 then connect_node(hub, i) end
                if band(w, WANT_WRITE) ~= 0 then write_node(hub, i) end
                asked = asked or band(w, WANT_CLOSE + WANT_CONNECT) ~= 0
            end
        end
    end
end

-- Results whose call is gone (killed while it waited, and not seen to be:
-- say, between its wake-up and its turn to run) are dropped after a while;
-- a lock one grants is released.
local function sweep(hub, now)
    local waiters = hub.waiters
    for id, w in pairs(waiters) do
        if w.done and now - w.done_at > STALE_MS then
            waiters[id] = nil
            if w.err == nil then orphaned(hub, w, w.res) end
        end
    end
end

---------------------------------------------------------------------------
-- hand-off: the engine's subscriber links, for the whole hub
--
-- Calls that wait for a lock watch their resource on the hub's engine
-- (refcounted per hub: the engine subscribes on every node, over the
-- subscriber links the loop drives like any other, and counts the release
-- messages it hears; redlock.h, "Hand-off"). Each call sleeps on a
-- semaphore of its own; after every read of a subscriber link, the watches
-- that heard a release post the semaphores of the calls asleep on them. A
-- node down, refusing AUTH or SUBSCRIBE, or sending what the engine drops
-- costs its wake-ups only: the engine connects again after its backoff, and
-- waiters poll as the retry policy says.

-- Watch c heard a release: wake whoever sleeps on it. broadcast: on the
-- resource's channel, whose message is the number of connections that
-- listened (this worker's is one); with the requests asleep here, that is
-- how many waiters compete, and all are woken. Otherwise only on the hub's
-- wake channel (the hub was the oldest in a node's queue): one request is
-- woken, alone, whichever node's message comes first.
local function wake_sleepers(hub, c, broadcast)
    -- sleepers[sema]: true while its request waits on it (count -1),
    -- "posted" once a message woke it (count 0 until it resumes); a
    -- semaphore nobody waits on any more belongs to a request that was
    -- killed asleep (client abort, ngx.exit from another thread), and is
    -- dropped so that it swallows no wake-up
    local sleepers, first, pending, asleep = c.sleepers, nil, false, 0
    for sema, state in pairs(sleepers) do
        local count = sema:count()
        if count < 0 then
            asleep = asleep + 1
            if broadcast then
                sema:post(1)
                sleepers[sema] = "posted"
            else
                first = first or sema
            end
        elseif state == "posted" and count == 0 then
            asleep, pending = asleep + 1, true
        else
            sleepers[sema] = nil
        end
    end
    if not broadcast then
        if first and not pending then
            first:post(1)
            sleepers[first] = "posted"
        end
        c.listeners = 1
        return
    end
    local said = C.rl_engine_heard_listeners(hub.e, c.resource, #c.resource)
    c.listeners = said - 1 + math.max(asleep, 1)
end

post_heard = function(hub)
    local e, watches = hub.e, hub.watches
    while true do
        local id = C.rl_engine_heard_next(e, int_out)
        if id < 0 then return end
        local c = watches[id]
        if c then wake_sleepers(hub, c, int_out[0] ~= 0) end
    end
end

-- The hub stopped for good (idle, the worker exiting): whatever was still
-- watched is forgotten (a call killed while it waited never unwatches).
local function forget_watches(hub)
    local e, now = hub.e, now_ms()
    for resource in pairs(hub.chans) do C.rl_engine_unwatch(e, resource, #resource, now) end
    hub.chans, hub.watches, hub.epoch = {}, {}, hub.epoch + 1
end

-- Close every connection (the engine forgets them) and fail what still waits.
local function shut(hub, why)
    local now = now_ms()
    hub.now = now
    for i = 0, 2 * hub.n - 1 do
        local up, connecting = hub.up[i], hub.socks[i] ~= nil
        close_node(hub, i)
        if up then
            C.rl_engine_node_detach(hub.e, i, now)
        elseif connecting then
            C.rl_engine_node_down(hub.e, i, "connect abandoned: the hub stopped", now)
        end
    end
    deliver(hub)
    fail_waiters(hub, why)
end

local function busy(e)
    return C.rl_engine_inflight(e) + C.rl_engine_tails(e) + C.rl_engine_done(e) > 0
end

-- The hub's loop: one turn per wake-up (work posted, a reader fed replies)
-- or engine deadline (kept locks' included).
local function loop(hub, premature)
    local e, work = hub.e, hub.work
    local exit_by = premature and now_ms() + hub.node_timeout or nil
    local sweep_at = now_ms() + STALE_MS
    local gc_at = 0 -- the next collection (exiting)
    while true do
        local now = now_ms()
        if hub.orphans[1] ~= nil then retry_orphans(hub) end
        C.rl_engine_advance(e, now)
        service(hub)
        hub.now = now_ms()
        deliver(hub)
        now = hub.now
        if now >= sweep_at then
            sweep(hub, now)
            sweep_at = now + STALE_MS
        end
        if hub.ended[1] ~= nil then reap(hub) end
        if exit_by == nil and ngx.worker.exiting() then exit_by = now + hub.node_timeout end
        if exit_by ~= nil then
            -- the worker exits. Kept locks keep the hub extending them: the
            -- requests holding them run on, and nginx waits for those anyway
            -- (a lock object dropped without unlock is released once it is
            -- collected, one whose owner ended is left to lapse: so collect).
            -- Operations begun are served until decided (the engine bounds
            -- that), tails for a node timeout.
            if keeping(hub) then
                if now >= gc_at then
                    collectgarbage()
                    forget_unowned(hub)
                    gc_at = now + EXIT_GC_MS
                end
            elseif C.rl_engine_inflight(e) == 0 and (not busy(e) or now >= exit_by) then
                return "the nginx worker is exiting"
            end
        elseif not busy(e) then
            -- idle: no call for idle_ms, nobody sleeping on a watched channel, no kept lock
            if now - hub.last_call >= _M.idle_ms and now >= hub.sleep_horizon and not keeping(hub) then return nil end
            if hub.connects >= _M.rotate_connects then return nil, true end
        end
        local at = C.rl_engine_deadline(e)
        local wait_ms = HUB_SLICE_MS
        if exit_by == nil and not busy(e) and not keeping(hub) then
            local idle_left = math.max(hub.last_call + _M.idle_ms, hub.sleep_horizon) - now
            if idle_left < wait_ms then wait_ms = idle_left end
        end
        if at >= 0 and at - now < wait_ms then wait_ms = at - now end
        if exit_by ~= nil and now < exit_by and exit_by - now < wait_ms then wait_ms = exit_by - now end
        -- nginx's timers count whole milliseconds: never ask for less than one
        if wait_ms > 0 then work:wait(wait_ms < 1 and 0.001 or wait_ms / 1000) end
    end
end

local start

local function hub_main(premature, hub, token)
    if token ~= hub.token then return end -- a timer given up on (see start)
    hub.started_at = nil -- it runs
    hub.connects, hub.ended = 0, {}
    local ok, why, rotate = xpcall(loop, debug.traceback, hub, premature)
    if not ok then
        ngx.log(ngx.ERR, "redlock: hub stopped on an error: ", why)
        why, rotate = "redlock's hub stopped on an error (see the error log)", false
    end
    shut(hub, why or "redlock's hub stopped")
    reap(hub)
    if not rotate then forget_watches(hub) end
    hub.running = false
    -- a fresh timer (its calls start it anyway if this fails; kept locks
    -- would go unextended until then); also when a lock object dropped
    -- while it stopped left a release to do
    if rotate or (ok and keeping(hub)) then
        local err = start(hub)
        if err and keeping(hub) then
            ngx.log(ngx.ERR, "redlock: kept locks are not extended until the next lock call: ", err)
        end
    end
end

-- How long a started hub timer may take to run before it counts as dropped
-- (nginx drops a pending timer when lua_max_running_timers are all busy,
-- logging it) and another is started.
local HUB_START_MS = 1000

-- Make sure the hub's timer runs. nil, or why it cannot.
start = function(hub)
    if hub.running and (hub.started_at == nil or now_ms() - hub.started_at < HUB_START_MS) then return nil end
    if hub.work == nil then hub.work = semaphore.new(0) end
    local token = {}
    local ok, err = ngx.timer.at(0, hub_main, hub, token)
    if not ok then return "cannot start the hub's ngx.timer: " .. tostring(err) end
    hub.running, hub.started_at, hub.token = true, now_ms(), token
    return nil
end

-- The configuration key of a client: everything rl_engine_new is given
-- (tls: opts.tls as tls_config made it).
local function config_key(urls, n, opts, t)
    local parts = {}
    for i = 0, n - 1 do
        local u = ffi_string(urls[i])
        parts[#parts + 1] = #u .. ":" .. u
    end
    local prefix = (opts.prefix ~= nil and opts.prefix_len > 0) and ffi_string(opts.prefix, opts.prefix_len) or ""
    parts[#parts + 1] = ("%d,%d,%d,%d,%d,%d,%.17g,%d:%s"):format(opts.node_timeout_ms, opts.connect_timeout_ms,
        opts.reconnect_min_ms, opts.reconnect_max_ms, opts.stall_reset_ms, opts.quorum, opts.drift_factor,
        #prefix, prefix)
    -- TLS: clients that verify differently, or show another certificate, get hubs of their own
    parts[#parts + 1] = "tls " .. (t.verify and 1 or 0)
    for _, f in ipairs(TLS_STRINGS) do
        local v = t[f]
        parts[#parts + 1] = v and (#v .. ":" .. v) or "-"
    end
    return table.concat(parts, "\n")
end

local function new_hub(e, n, opts, tls)
    local hub = {
        tls = tls, tlss = {}, snis = {}, sessions = {}, fed = {}, said = {},
        chans = {}, watches = {}, epoch = 0, sleep_horizon = 0, -- hand-off: resource -> watch, id -> watch
        e = e, n = n, res = ffi_new("rl_result"), waiters = {},
        kept = {}, orphans = {},                      -- ids of kept locks still extended (see "kept locks")
        owners = setmetatable({}, { __mode = "v" }),  -- kept lock's id -> ngx.ctx of who kept it
        socks = {}, readers = {}, gen = {}, up = {}, hosts = {}, ports = {}, names = {},
        work = nil, running = false, started_at = nil, token = nil, last_call = 0, now = 0, connects = 0, ended = {},
        node_timeout = opts.node_timeout_ms, connect_timeout = opts.connect_timeout_ms,
        quorum = C.rl_engine_quorum(e),
    }
    for i = 0, 2 * n - 1 do -- every link: the nodes' command connections, then their subscribers
        hub.hosts[i] = ffi_string(C.rl_engine_node_host(e, i))
        hub.ports[i] = C.rl_engine_node_port(e, i)
        hub.names[i] = ffi_string(C.rl_engine_node_name(e, i))
        hub.gen[i], hub.up[i] = 0, false
        hub.tlss[i] = C.rl_engine_node_tls(e, i) ~= 0
        if hub.tlss[i] then
            local host = hub.hosts[i]
            hub.snis[i] = tls.server_name or ((hub.ports[i] ~= 0 and not ip_literal(host)) and host or nil)
        end
    end
    return hub
end

---------------------------------------------------------------------------
-- the client: the methods of the transport contract (backend.lua; those of rl_client)

local client = {}
local client_mt = { __index = client }

-- Begin an operation on the hub's engine and register its waiter; the id,
-- or RL_ERR with self.err set.
function client:begin(kind, resource, len, value, ttl)
    local why = phase_refusal()
    if why then self.err = why; return RL_ERR end
    local hub = self.hub
    why = start(hub)
    if why then self.err = why; return RL_ERR end
    local e, now = hub.e, now_ms()
    local id
    if kind == 1 then id = C.rl_engine_begin_acquire(e, resource, len, ttl, now)
    elseif kind == 2 then id = C.rl_engine_begin_release(e, resource, len, value, now)
    elseif kind == 4 then id = C.rl_engine_begin_acquire_fenced(e, resource, len, ttl, now)
    elseif kind == 5 then id = C.rl_engine_begin_acquire_queued(e, resource, len, ttl, now)
    elseif kind == 6 then id = C.rl_engine_begin_release_quiet(e, resource, len, value, now)
    else id = C.rl_engine_begin_extend(e, resource, len, value, ttl, now) end
    if id < 0 then
        self.err = ffi_string(C.rl_engine_errstr(e))
        return id
    end
    local w = take_waiter()
    w.id, w.co = id, co_running()
    -- an acquire's resource: the hub releases a grant whose caller is gone
    if kind ~= 2 and kind ~= 3 then
        w.resource = (type(resource) == "string" and len == #resource) and resource or ffi_string(resource, len)
    end
    hub.waiters[id] = w
    hub.last_call = now
    wake(hub)
    return id
end

function client:begin_acquire(resource, len, ttl) return self:begin(1, resource, len, nil, ttl) end
function client:begin_acquire_fenced(resource, len, ttl) return self:begin(4, resource, len, nil, ttl) end
function client:begin_release(resource, len, value) return self:begin(2, resource, len, value) end
function client:begin_release_quiet(resource, len, value) return self:begin(6, resource, len, value) end

function client:wait(id, out)
    local hub = self.hub
    local w = hub.waiters[id]
    if w == nil then
        self.err = ("no operation %d in flight"):format(tonumber(id))
        return RL_ERR
    end
    if not w.done then
        -- (waiting: should this request be killed here, the hub can tell)
        w.waiting = true
        local ok = w.sema:wait(self.wait_s)
        w.waiting = false
        if not ok and not w.done then
            -- the hub never answered: give up on it (the hub drops a later
            -- result, and releases a lock it grants)
            w.abandoned = true
            self.err = ("no result from redlock's hub within %.0f ms"):format(self.wait_s * 1000)
            return RL_ERR
        end
    end
    if hub.waiters[id] == w then hub.waiters[id] = nil end
    local err = w.err
    if err == nil and out ~= nil then ffi_copy(out, w.res, RESULT_SIZE) end
    give_waiter(w)
    if err ~= nil then self.err = err; return RL_ERR end
    return RL_OK
end

local function blocking(self, id, out)
    if id < 0 then return id end -- RL_ERR, or RL_ERR_FULL: nothing was sent
    return self:wait(id, out)
end

function client:acquire_fenced(resource, len, ttl, out)
    return blocking(self, self:begin(4, resource, len, nil, ttl), out)
end

function client:acquire(resource, len, ttl, out)
    return blocking(self, self:begin(1, resource, len, nil, ttl), out)
end

function client:acquire_queued(resource, len, ttl, out)
    return blocking(self, self:begin(5, resource, len, nil, ttl), out)
end

function client:release(resource, len, value, out)
    return blocking(self, self:begin(2, resource, len, value), out)
end

function client:extend(resource, len, value, ttl, out)
    return blocking(self, self:begin(3, resource, len, value, ttl), out)
end

function client:sleep(ms) -- luacheck: ignore 212/self
    if phase_refusal() == nil then ngx.sleep(ms / 1000) end
end

-- Hand-off: a waiter watches its resource on the hub (the engine subscribes
-- on every node), reads how many releases of it were heard, and sleeps on a
-- semaphore of its own that a heard release posts. Resource nil (lock_many):
-- every resource this client watches, counted together.

local free_semas = {}

local function name_of(resource, len)
    return len ~= #resource and resource:sub(1, len) or resource
end

-- This client's watches (resource -> count), as of the hub's epoch: a hub
-- that stopped for good forgot every watch, and so does the client.
local function watching(self)
    local hub = self.hub
    if self.epoch ~= hub.epoch then self.watching, self.epoch = {}, hub.epoch end
    return self.watching
end

function client:watch(resource, len)
    if phase_refusal() then return 0 end
    local hub = self.hub
    if start(hub) then return 0 end -- no timer: the waiter polls
    local mine = watching(self)
    local r = name_of(resource, len)
    local c = hub.chans[r]
    if c == nil then
        local id = C.rl_engine_watch(hub.e, r, #r, now_ms())
        if id < 0 then return 0 end -- out of memory: the waiter polls
        c = { id = id, resource = r, refs = 0, listeners = 0, sleepers = {} }
        hub.chans[r], hub.watches[id] = c, c
        wake(hub) -- the loop subscribes (and connects the subscriber links)
    end
    c.refs = c.refs + 1
    mine[r] = (mine[r] or 0) + 1
    return 0
end

function client:unwatch(resource, len)
    local hub = self.hub
    local mine = watching(self)
    local r = name_of(resource, len)
    local k = mine[r]
    if k == nil then return end
    mine[r] = k > 1 and k - 1 or nil
    local c = hub.chans[r]
    if c == nil then return end
    c.refs = c.refs - 1
    if c.refs <= 0 then
        hub.chans[r], hub.watches[c.id] = nil, nil
        C.rl_engine_unwatch(hub.e, r, #r, now_ms())
        wake(hub)
    end
end

function client:heard(resource, len)
    local e = self.hub.e
    if resource == nil then
        local total = 0
        for r in pairs(watching(self)) do total = total + C.rl_engine_heard(e, r, #r) end
        return total
    end
    return C.rl_engine_heard(e, resource, len)
end

-- The waiters that competed for the last release heard of resource (nil:
-- the most over what this client watches); 0 when unknown.
function client:listeners(resource, len)
    local chans = self.hub.chans
    if resource == nil then
        local most = 0
        for r in pairs(watching(self)) do
            local c = chans[r]
            if c and c.listeners > most then most = c.listeners end
        end
        return most
    end
    local c = chans[name_of(resource, len)]
    return c and c.listeners or 0
end

-- Sleep up to ms; 1 as soon as heard(resource, len) ~= seen, else 0. Checked
-- and registered with no yield in between: a release heard after heard()
-- was read either shows in the count here or posts the semaphore.
function client:sleep_until(resource, len, seen, ms)
    if phase_refusal() then return 0 end
    if self:heard(resource, len) ~= seen then return 1 end
    local hub = self.hub
    local list
    if resource == nil then
        list = {}
        for r in pairs(watching(self)) do list[#list + 1] = hub.chans[r] end
    else
        list = { hub.chans[name_of(resource, len)] }
    end
    if list[1] == nil then
        -- nothing watched (the hub could not start): a plain sleep
        self:sleep(ms)
        return 0
    end
    local n = #free_semas
    local sema = free_semas[n]
    if sema then free_semas[n] = nil else sema = semaphore.new(0) end
    local horizon = now_ms() + ms
    if horizon > hub.sleep_horizon then hub.sleep_horizon = horizon end
    for k = 1, #list do list[k].sleepers[sema] = true end
    sema:wait(ms / 1000)
    for k = 1, #list do list[k].sleepers[sema] = nil end
    -- posted as the wait timed out, or by more than one channel: drain it
    while sema:count() > 0 do sema:wait(0) end
    free_semas[#free_semas + 1] = sema
    return self:heard(resource, len) ~= seen and 1 or 0
end

function client:listening()
    return C.rl_engine_listening(self.hub.e)
end

function client:errstr() return self.err end
function client:node_name(i) return self.hub.names[i] end
function client:quorum() return self.hub.quorum end

-- The hub is the worker's, shared with every client of the same
-- configuration: closing one client leaves it running (it stops when idle).
function client:free() end -- luacheck: ignore 212/self

--- A client for the nodes (rl_client_new's arguments; nothing is connected
--- until a call needs it): a handle on the worker's hub for this
--- configuration, made on first use. nil with errbuf filled on bad arguments.
function _M.client_new(urls, n, opts, errbuf, errlen)
    local tls = tls_config(opts.tls)
    local key = config_key(urls, n, opts, tls)
    local hub = hubs[key]
    if hub == nil then
        local e = C.rl_engine_new(urls, n, opts, errbuf, errlen)
        if e == nil then return nil end
        local tls_nodes = {}
        for i = 0, n - 1 do
            if C.rl_engine_node_tls(e, i) ~= 0 then tls_nodes[#tls_nodes + 1] = i end
        end
        if tls_nodes[1] ~= nil then
            local why, i = tls_load(tls), tls_nodes[1]
            if not why and tls.verify and tls.server_name == nil then
                -- fail closed: ngx_lua can check a certificate against names only
                for _, k in ipairs(tls_nodes) do
                    if C.rl_engine_node_port(e, k) ~= 0 and ip_literal(ffi_string(C.rl_engine_node_host(e, k))) then
                        why, i = "inside nginx a certificate is checked against host names only, not an IP "
                            .. "address: set tls.server_name to a name in the node's certificate", k
                        break
                    end
                end
            end
            if why then
                local msg = ("server %d: '%s': %s"):format(i + 1, ffi_string(C.rl_engine_node_name(e, i)), why)
                ffi.copy(errbuf, msg:sub(1, errlen - 1))
                C.rl_engine_free(e)
                return nil
            end
        end
        hub = new_hub(ffi.gc(e, C.rl_engine_free), n, opts, tls)
        hubs[key] = hub
        if tls_nodes[1] ~= nil then tls_notes(hub) end
    end
    return setmetatable({
        hub = hub, err = "", watching = {}, epoch = hub.epoch,
        wait_s = (opts.node_timeout_ms + opts.connect_timeout_ms + WAIT_MARGIN_MS) / 1000,
    }, client_mt)
end

---------------------------------------------------------------------------
-- keep-alive: rl_keeper's methods, on the hub's schedule (see "kept locks")
--
-- A keeper (one per redlock client) names its kept locks by id; the hub of
-- its client extends them, together with every other keeper's of the same
-- configuration, for as long as the worker runs. When the worker exits
-- (reload, stop), the hub keeps extending them while their requests run on:
-- nothing is released under a request, and nothing lapses unseen.

local keeper = {}
local keeper_mt = { __index = keeper }

local function ctx() return ngx.ctx end

-- The request or timer running: its ngx.ctx (nil where there is none).
local function owner()
    local ok, t = pcall(ctx)
    return ok and t or nil
end

-- Make sure the hub runs, from wherever a kept lock is let go (a finalizer:
-- errors are ignored; the hub's next start finds it).
local function poke(hub)
    if start(hub) == nil then wake(hub) end
end

function keeper:add(resource, len, value, ttl, valid_until, margin, errbuf, errlen)
    local hub = self.hub
    local why = start(hub)
    if why then
        ffi.copy(errbuf, why:sub(1, errlen - 1))
        return RL_ERR
    end
    local e = hub.e
    local before = C.rl_engine_deadline(e)
    local id = C.rl_engine_keep_add(e, resource, len, value, ttl, valid_until, margin, now_ms())
    if id < 0 then
        ffi.copy(errbuf, ffi_string(C.rl_engine_errstr(e)):sub(1, errlen - 1))
        return RL_ERR
    end
    -- the strings: for release_entry (interned already: the lock object has them)
    self.entries[id] = (type(resource) == "string" and len == #resource) and resource or ffi_string(resource, len)
    self.values[id] = type(value) == "string" and value or ffi_string(value)
    hub.kept[id], hub.owners[id] = true, owner()
    local at = C.rl_engine_deadline(e)
    if before < 0 or at < before then wake(hub) end -- the hub may sleep past it
    return id
end

function keeper:state(id, until_buf)
    if not self.entries[id] then return RL_ERR end
    return C.rl_engine_keep_state(self.hub.e, id, until_buf, now_ms())
end

-- The owner extended lock id itself (rl_engine_keep_update has the rules).
function keeper:update(id, ttl, started, valid_until)
    if not self.entries[id] then return RL_ERR end
    local rc = C.rl_engine_keep_update(self.hub.e, id, ttl, started, valid_until, now_ms())
    if rc == RL_OK then wake(self.hub) end
    return rc
end

-- Forget entry id (ours), for the engine and the hub.
local function forget(self, id)
    local hub = self.hub
    self.entries[id], self.values[id] = nil, nil
    hub.kept[id], hub.owners[id] = nil, nil
end

function keeper:remove(id)
    if not self.entries[id] then return RL_ERR end
    forget(self, id)
    return C.rl_engine_keep_remove(self.hub.e, id)
end

-- Lock id's object was collected without unlock (a finalizer calls this,
-- wherever it runs): the engine releases it, as rl_keeper_drop does. That
-- only changes the engine's schedule, never a stream: safe whatever the
-- hub was doing when the finalizer ran.
function keeper:drop(id)
    if not self.entries[id] then return RL_ERR end
    forget(self, id)
    local hub = self.hub
    local rc = C.rl_engine_keep_drop(hub.e, id, now_ms())
    pcall(poke, hub)
    return rc
end

-- Release entry id, here if this phase has cosockets, else from the hub.
-- 1 if a quorum released it here, else 0.
function keeper:release_entry(id)
    if not self.entries[id] then return 0 end
    if phase_refusal() then
        self:drop(id)
        return 0
    end
    local resource, value = self.entries[id], self.values[id]
    self:remove(id)
    local rc = self.client:release(resource, #resource, value, self.result)
    return (rc == RL_OK and self.result.status == STATUS_OK) and 1 or 0
end

function keeper:release(_)
    -- the ids first: a release yields, and a lock kept meanwhile would change the table under pairs()
    local ids, n = {}, 0
    for id in pairs(self.entries) do ids[#ids + 1] = id end
    for k = 1, #ids do n = n + self:release_entry(ids[k]) end
    return n
end

function keeper:free()
    for id in pairs(self.entries) do self:remove(id) end
end

--- The keeper of client d (a redlock.new table): its kept locks are
--- extended by the hub of d's client while the worker runs.
function _M.keeper_new(d)
    return setmetatable({ client = d.client, hub = d.client.hub, entries = {}, values = {},
                          result = ffi_new("rl_result") }, keeper_mt)
end

_M.phase_refusal = phase_refusal

return _M
