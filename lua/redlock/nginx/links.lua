-- redlock.nginx.links: the hub's connections (redlock.h, "Links": per node
-- a command connection and, once something is watched, a subscriber
-- connection). One light thread per link connects and reads, feeding what
-- arrives to the engine; another writes what the engine has for the link.
-- The hub's loop does what the engine wants (close, connect, wake the
-- writer: service) and shuts every link when it stops. Only the loop's
-- coroutine calls these, and the readers and writers it spawned; a reader
-- or writer that finds its connection gone leaves the closing to the loop
-- (only the loop may kill the other thread of the link).
--
-- The writer is a thread of its own so that a node whose end stops taking
-- bytes (a stopped process: its kernel buffers fill) blocks only its own
-- link. It sends a chunk at a time and reports each as written, and its
-- sends have no short timeout: the engine decides about such a node (it
-- turns suspect, or its watchdog resets the connection) as it does for the
-- libev driver. Before, the loop sent itself, with the node timeout as the
-- send timeout: a stopped node's connection was closed with commands still
-- in its kernel, which it ran on resuming, after what went out on its next
-- connection (a failed acquire's cleanup, a release), and their keys stayed
-- for their ttl.

local ffi = require "ffi"
local bit = require "bit"
local C = require("redlock.cdefs").lib
local calls = require "redlock.nginx.calls"
local tls = require "redlock.nginx.tls"
local watch = require "redlock.nginx.watch"

local semaphore = require "ngx.semaphore"

local ngx = ngx
local ffi_string, ffi_new, band = ffi.string, ffi.new, bit.band
local now_ms = C.rl_now_ms
local co_running, co_status = coroutine.running, coroutine.status
local tostring, table_remove, pairs, next = tostring, table.remove, pairs, next
local wake, deliver, fail_waiters = calls.wake, calls.deliver, calls.fail_waiters
local open, lost_reason, post_heard = tls.open, tls.lost_reason, watch.post_heard

local RL_OK = C.RL_OK
local WANT_WRITE, WANT_CONNECT, WANT_CLOSE = C.RL_WANT_WRITE, C.RL_WANT_CONNECT, C.RL_WANT_CLOSE
local READ_CHUNK = 65536
local READ_TIMEOUT_MS = 3600000 -- a reader waits this long for bytes, then again (the engine times replies)
local WRITE_CHUNK = 16384       -- a writer reports its progress a chunk at a time (the watchdog judges it)
local WRITE_TIMEOUT_MS = 3600000 -- a chunk may wait this long for room (the engine judges a link that takes nothing)
local IDLE_WRITER_S = 3600      -- a writer with nothing to write waits this long to be posted, then again

local out_ptr = ffi_new("const char *[1]")

local _M = {}

-- Learn where link i connects, as the engine says now. A TLS session
-- kept for it is dropped when that changed (it was another server's).
local function learn(hub, i)
    local e, t = hub.e, hub.tls
    local host, port = ffi_string(C.rl_engine_node_host(e, i)), C.rl_engine_node_port(e, i)
    if hub.hosts[i] ~= host or hub.ports[i] ~= port then hub.sessions[i] = nil end
    hub.hosts[i], hub.ports[i] = host, port
    hub.names[i] = ffi_string(C.rl_engine_node_name(e, i))
    hub.tlss[i] = C.rl_engine_node_tls(e, i) ~= 0
    hub.snis[i] = nil
    if hub.tlss[i] then
        -- the host as given, or the hostname a cluster master announces
        local name = ffi_string(C.rl_engine_node_tls_name(e, i))
        hub.snis[i] = t.server_name or (not tls.ip_literal(name) and name or nil)
    end
end

--- Learn where every link the engine has made since the last look connects
--- (links 0 .. 2N-1 when the hub is made; a cluster node's shards, two
--- links each, as its map comes in).
function _M.place(hub)
    for i = hub.placed, C.rl_engine_links(hub.e) - 1 do
        learn(hub, i)
        hub.gen[i], hub.up[i] = 0, false
        hub.placed = i + 1
    end
end

-- A subscriber link: a node's (N .. 2N-1), or a shard's (2N + 2k + 1).
local function is_subscriber(hub, i)
    if i < 2 * hub.n then return i >= hub.n end
    return (i - 2 * hub.n) % 2 == 1
end

-- Close link i's socket. Its reader, if any, is killed first: only the
-- coroutine that spawned it (the hub's loop) may, and only the loop calls
-- this while readers run.
-- Kill th, link i's reader or writer, unless it is the caller or has ended
-- (one that ended on its own is reaped by the loop: see reap).
local function kill(th)
    if th and co_status(th) ~= "dead" and th ~= co_running() then ngx.thread.kill(th) end
end

local function close_node(hub, i)
    hub.gen[i] = hub.gen[i] + 1
    hub.up[i] = false
    local r, w = hub.readers[i], hub.writers[i]
    hub.readers[i], hub.writers[i], hub.wakers[i] = nil, nil, nil
    kill(r)
    kill(w)
    local sock = hub.socks[i]
    hub.socks[i] = nil
    if sock then sock:close() end
end

-- Link i's connection (of generation gen) failed or ended, seen by its
-- reader or its writer, which is about to return: the loop closes it and
-- tells the engine (close_failed). A subscriber link's reason goes to the
-- error log, once per reason (not once per retry): it costs wake-ups, which
-- nothing else would show.
local function lost_node(hub, i, why, gen)
    if hub.gen[i] ~= gen or hub.failed[i] then return end
    if is_subscriber(hub, i) and hub.said[i] ~= why then
        ngx.log(ngx.WARN, "redlock: subscriber of ", hub.names[i], ": ", why)
    end
    hub.said[i] = why
    hub.up[i] = false
    hub.failed[i] = why
    wake(hub)
end

-- Close the links whose reader or writer found their connection gone.
local function close_failed(hub)
    for i, why in pairs(hub.failed) do
        hub.failed[i] = nil
        close_node(hub, i)
        C.rl_engine_node_down(hub.e, i, why, now_ms())
    end
end

-- Link i's writer (of generation gen): what the engine has for the link, a
-- chunk at a time, each reported written once the socket took it; then it
-- waits until the loop posts it (waker) and goes on.
local function write_node(hub, i, gen, waker)
    local e = hub.e
    while hub.gen[i] == gen do
        local len = tonumber(C.rl_engine_node_output(e, i, out_ptr))
        if len == 0 then
            waker:wait(IDLE_WRITER_S)
        else
            if len > WRITE_CHUNK then len = WRITE_CHUNK end
            local sent, err = hub.socks[i]:send(ffi_string(out_ptr[0], len))
            if hub.gen[i] ~= gen then return end -- closed while the send yielded
            if not sent then return lost_node(hub, i, lost_reason(hub, i, err), gen) end
            C.rl_engine_node_wrote(e, i, len, now_ms())
            wake(hub) -- the engine may want more done now (a deadline, a round decided)
        end
    end
end

local function writer(hub, i, gen, waker)
    write_node(hub, i, gen, waker)
    hub.ended[#hub.ended + 1] = co_running()
end

-- Have link i's writer write what the engine has for it: start one, or
-- post the one waiting.
local function start_writing(hub, i)
    if not hub.up[i] then return end
    local th = hub.writers[i]
    if th and co_status(th) ~= "dead" then -- (a writer and its waker are set together)
        local w = hub.wakers[i]
        if w:count() < 1 then w:post(1) end
        return
    end
    local gen = hub.gen[i]
    local w = semaphore.new(0)
    hub.wakers[i] = w
    local err
    th, err = ngx.thread.spawn(writer, hub, i, gen, w)
    if not th then
        lost_node(hub, i, "cannot start a light thread: " .. tostring(err), gen)
    elseif co_status(th) ~= "dead" and hub.gen[i] == gen then
        hub.writers[i] = th
    end
end

-- Link i's light thread: connect (a new connection: the engine sends
-- AUTH/SELECT/INFO first, or a subscriber's AUTH and SUBSCRIBE), then read
-- and feed until the connection ends or the loop closes it.
local function read_node(hub, i, gen)
    local e = hub.e
    local sock = ngx.socket.tcp()
    hub.socks[i] = sock
    local ok, err = open(hub, i, sock, READ_TIMEOUT_MS, WRITE_TIMEOUT_MS)
    if hub.gen[i] ~= gen then return end
    if not ok then return lost_node(hub, i, err, gen) end
    if C.rl_engine_node_connected(e, i, 1, now_ms()) ~= RL_OK then
        -- the engine no longer wants it (it gave up on the connect meanwhile)
        hub.gen[i] = hub.gen[i] + 1
        hub.socks[i], hub.readers[i] = nil, nil
        sock:close()
        return wake(hub)
    end
    hub.up[i], hub.fed[i], hub.said[i] = true, false, nil
    wake(hub)
    local subscriber = is_subscriber(hub, i)
    while true do
        local data, rerr = sock:receiveany(READ_CHUNK)
        if hub.gen[i] ~= gen then return end
        if data then
            hub.fed[i] = true
            if C.rl_engine_node_feed(e, i, data, #data, now_ms()) ~= RL_OK then
                -- the engine dropped the connection: it asks the loop to close it
                hub.up[i] = false
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
            return lost_node(hub, i, lost_reason(hub, i, rerr), gen)
        end
    end
end

-- A light thread that ends on its own stays a zombie until its parent (the
-- loop) waits for it: it files itself for the loop to reap (so does a writer).
local function reader(hub, i, gen)
    read_node(hub, i, gen)
    hub.ended[#hub.ended + 1] = co_running()
end

function _M.reap(hub)
    local ended = hub.ended
    for k = #ended, 1, -1 do
        local th = ended[k]
        if co_status(th) == "dead" then
            table_remove(ended, k)
            ngx.thread.wait(th)
        end
    end
end

local function connect_node(hub, i)
    close_node(hub, i)
    -- a shard's link goes where the engine says now: it may have reused the
    -- shard for another master (redlock.h, "Links")
    if i >= 2 * hub.n then learn(hub, i) end
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
function _M.service(hub)
    local e = hub.e
    local asked = true
    while asked do
        asked = false
        if next(hub.failed) ~= nil then close_failed(hub) end
        local i = C.rl_engine_next_wanting(e, -1)
        while i >= 0 do
            if i >= hub.placed then _M.place(hub) end
            local w = C.rl_engine_node_wants(e, i)
            if band(w, WANT_CLOSE) ~= 0 then close_node(hub, i) end
            if band(w, WANT_CONNECT) ~= 0 then connect_node(hub, i) end
            if band(w, WANT_WRITE) ~= 0 then start_writing(hub, i) end
            asked = asked or band(w, WANT_CLOSE + WANT_CONNECT) ~= 0
            i = C.rl_engine_next_wanting(e, i)
        end
    end
end

-- Close every connection (the engine forgets them) and fail what still waits.
function _M.shut(hub, why)
    local now = now_ms()
    hub.now = now
    for i in pairs(hub.failed) do hub.failed[i] = nil end
    for i = 0, hub.placed - 1 do
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

return _M
