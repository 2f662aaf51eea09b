-- redlock.cosocket: the transport inside nginx. The C core's engine
-- (rl_engine_*: the whole algorithm, no I/O, no clock) driven over
-- ngx.socket.tcp, so a lock call yields to nginx's event loop instead of
-- blocking the worker. Nothing of the algorithm is here: this file moves
-- bytes, reads the clock and sleeps.
--
-- A client has engines, not connections: a call takes an idle engine (or
-- makes one), drives it until its operations are done, and hands it back
-- with its semaphore and tables for the next call.
-- Calls running at once (two requests of one worker, or a timer) get engines
-- of their own, because a cosocket belongs to the request that made it.
-- During a call every node with work has a light thread that connects
-- (pooled: AUTH/SELECT/INFO only on a fresh connection) and reads; the
-- calling coroutine writes and waits on a semaphore until the engine's next
-- deadline. A connection whose commands are all answered goes back to the
-- pool at once. One still owed replies when the call returns (a node slower
-- than the quorum) keeps its reader for at most a node timeout more: if the
-- replies come, it is pooled; if not, it is closed, never pooled, so no
-- later request can read a reply that was not its own. Only then does the
-- engine go back to the client (nginx also waits for those readers before it
-- finishes the request: a slow node delays that by a node timeout at most).

local ffi = require "ffi"
local bit = require "bit"
local C = require("redlock.cdefs").lib

local ngx = ngx
local semaphore = require "ngx.semaphore"
local get_request = require("resty.core.base").get_request
local ffi_string, ffi_new, band, lshift = ffi.string, ffi.new, bit.band, bit.lshift
local now_ms = C.rl_now_ms
local co_running = coroutine.running

local RL_OK, RL_ERR = C.RL_OK, C.RL_ERR
local WANT_WRITE, WANT_CONNECT, WANT_CLOSE = C.RL_WANT_WRITE, C.RL_WANT_CONNECT, C.RL_WANT_CLOSE
local READ_CHUNK = 16384
local POOL_IDLE_MS, POOL_SIZE = 60000, 64

local _M = { name = "cosocket" }

-- The phases where nginx offers cosockets (ngx.get_phase()).
local COSOCKET_PHASES = { rewrite = true, access = true, content = true, timer = true,
                          ssl_cert = true, ssl_session_fetch = true }

-- nil, or why no lock call can run in this phase.
local function phase_refusal()
    local phase = ngx.get_phase()
    if COSOCKET_PHASES[phase] then return nil end
    return ("cannot lock in nginx's %s phase: it has no cosockets (and blocking the worker is not an option); "
        .. "lock in rewrite_by_lua*, access_by_lua*, content_by_lua* or an ngx.timer callback"):format(phase)
end

local client = {}
local client_mt = { __index = client }

local out_ptr = ffi_new("const char *[1]")

---------------------------------------------------------------------------
-- one call: an engine, its sockets and readers

-- What one coroutine's call drives: an engine with its sockets, readers and
-- semaphore, taken from the client's idle ones when it begins its first
-- operation (made only when none is idle) and handed back when nothing is
-- left in flight, so a call allocates nothing once the client is warm.
local function new_call(self, e)
    return { client = self, e = e, socks = {}, readers = {}, gen = {}, writing = {},
             sema = semaphore.new(0), co = nil, req = nil, in_call = false, retired = true }
end

local function take_call(self)
    local call = table.remove(self.idle)
    if call == nil then
        local e = C.rl_engine_new(self.urls, self.n, self.opts, self.errbuf, C.RL_ERR_LEN)
        if e == nil then return nil, ffi_string(self.errbuf) end
        call = new_call(self, ffi.gc(e, C.rl_engine_free))
    end
    call.co, call.req, call.in_call, call.retired = co_running(), get_request(), true, false
    return call
end

local function wake(call)
    if call.sema:count() < 1 then call.sema:post(1) end
end

-- Close node i's socket (its reader, if blocked on it, is killed first:
-- only the coroutine that spawned it can, and that is the caller). A write
-- the reader had begun is over with it.
local function close_node(call, i)
    call.gen[i] = (call.gen[i] or 0) + 1
    call.writing[i] = false
    local r = call.readers[i]
    if r and coroutine.status(r) ~= "dead" and r ~= co_running() then ngx.thread.kill(r) end
    call.readers[i] = nil
    local sock = call.socks[i]
    call.socks[i] = nil
    if sock then sock:close() end
end

-- Write what the engine has for node i, until nothing is left: what was
-- queued while a send yielded (a reply's EVAL, a cleanup decided meanwhile)
-- goes out too, since nobody else may be driving the engine by then. One
-- writer per socket at a time.
local function write_node(call, i)
    local sock = call.socks[i]
    if sock == nil or call.writing[i] then return end
    local e, gen = call.e, call.gen[i]
    while true do
        local len = tonumber(C.rl_engine_node_output(e, i, out_ptr))
        if len == 0 then return end
        local data = ffi_string(out_ptr[0], len)
        call.writing[i] = true
        local sent, err = sock:send(data)
        if call.gen[i] ~= gen then return end -- closed while the send yielded
        call.writing[i] = false
        if not sent then
            close_node(call, i)
            C.rl_engine_node_down(e, i, "connection lost: " .. tostring(err), now_ms())
            return
        end
        C.rl_engine_node_wrote(e, i, len, now_ms())
    end
end

-- Hand node i's connection back: to the pool if the engine calls it clean.
local function park(call, i)
    local sock = call.socks[i]
    call.socks[i], call.readers[i] = nil, nil
    call.gen[i] = (call.gen[i] or 0) + 1
    call.writing[i] = false
    if sock == nil then return end
    if C.rl_engine_node_detach(call.e, i, now_ms()) == 1 then
        local ok = sock:setkeepalive(POOL_IDLE_MS, POOL_SIZE)
        if not ok then sock:close() end
    else
        sock:close()
    end
end

-- Once a finished call has no connection left, its engine goes back to the
-- client for the next call.
local function retire_if_quiet(call)
    if call.in_call or call.retired or next(call.socks) ~= nil then return end
    call.retired = true
    local self = call.client
    if self.calls[call.co] == call then self.calls[call.co] = nil end
    self.idle[#self.idle + 1] = call
end

-- Node i's light thread: connect (from the pool if one is there), then read
-- and feed until nothing is owed, then put the connection back.
local function reader(call, i)
    local self, e, gen = call.client, call.e, call.gen[i]
    local sock = ngx.socket.tcp()
    call.socks[i] = sock
    sock:settimeouts(self.connect_timeout, self.node_timeout, self.node_timeout)
    local ok, err
    if self.ports[i] == 0 then
        ok, err = sock:connect("unix:" .. self.hosts[i], self.pool_opts[i])
    else
        ok, err = sock:connect(self.hosts[i], self.ports[i], self.pool_opts[i])
    end
    if call.gen[i] ~= gen then return end
    if not ok then
        call.socks[i], call.readers[i] = nil, nil
        C.rl_engine_node_down(e, i, "connect failed: " .. tostring(err), now_ms())
        wake(call)
        return retire_if_quiet(call)
    end
    local fresh = (sock:getreusedtimes() or 0) == 0 and 1 or 0
    if C.rl_engine_node_connected(e, i, fresh, now_ms()) ~= RL_OK then
        call.socks[i], call.readers[i] = nil, nil
        sock:close()
        wake(call)
        return retire_if_quiet(call)
    end
    write_node(call, i)
    wake(call)
    while call.gen[i] == gen and (C.rl_engine_node_unanswered(e, i) > 0 or call.writing[i]) do
        local data, rerr = sock:receiveany(READ_CHUNK)
        if call.gen[i] ~= gen then return end
        if data then
            if C.rl_engine_node_feed(e, i, data, #data, now_ms()) ~= RL_OK then
                close_node(call, i) -- the engine dropped the connection
                wake(call)
                return retire_if_quiet(call)
            end
            write_node(call, i) -- what the replies queued (an EVAL after NOSCRIPT)
        elseif rerr ~= "timeout" then
            close_node(call, i)
            C.rl_engine_node_down(e, i, "connection lost: " .. tostring(rerr), now_ms())
            wake(call)
            return retire_if_quiet(call)
        elseif not call.in_call then
            -- a tail past its node timeout: cut it (the engine answers what
            -- is owed with an error), and never pool the connection
            break
        end
        wake(call)
    end
    if call.gen[i] == gen then park(call, i) end
    retire_if_quiet(call)
end

-- A reader for node i, which connects it.
local function connect_node(call, i)
    close_node(call, i)
    local th, err = ngx.thread.spawn(reader, call, i)
    if not th then
        C.rl_engine_node_down(call.e, i, "cannot start a light thread: " .. tostring(err), now_ms())
    elseif coroutine.status(th) ~= "dead" then
        call.readers[i] = th
    end
end

-- Do what the engine asks: close, connect (a reader per node), write; until
-- it asks no more closes or connects (a connect that fails at once answers
-- commands, and that may ask for more).
local function service(call)
    local e, n = call.e, call.client.n
    local asked = true
    while asked do
        asked = false
        local bits = C.rl_engine_wanting(e)
        for i = 0, n - 1 do
            if band(bits, lshift(1, i)) ~= 0 then
                local w = C.rl_engine_node_wants(e, i)
                if band(w, WANT_CLOSE) ~= 0 then close_node(call, i) end
                if band(w, WANT_CONNECT) ~= 0 then connect_node(call, i) end
                if band(w, WANT_WRITE) ~= 0 then write_node(call, i) end
                asked = asked or band(w, WANT_CLOSE + WANT_CONNECT) ~= 0
            end
        end
    end
end

-- The call is over (nothing in flight, nothing to collect). Connections
-- whose replies are all in are already back in the pool; a reader still
-- owed replies finishes its tail on its own (see reader), and the engine
-- goes back to the client once no connection is left.
local function end_call(call)
    call.in_call = false
    retire_if_quiet(call)
end

---------------------------------------------------------------------------
-- the client: the methods init.lua calls (those of rl_client)

function client:begin(kind, resource, len, value, ttl)
    local why = phase_refusal()
    if why then self.err = why; return RL_ERR end
    local co = co_running()
    local call = self.calls[co]
    -- nginx reuses coroutines across requests: a call still serving the
    -- tail of an earlier request (its sockets belong to that request) is
    -- not this one's
    if call == nil or call.req ~= get_request() then
        local err
        call, err = take_call(self)
        if call == nil then self.err = err; return RL_ERR end
        self.calls[co] = call
    end
    call.in_call = true
    local now, id = now_ms(), nil
    if kind == 1 then id = C.rl_engine_begin_acquire(call.e, resource, len, ttl, now)
    elseif kind == 2 then id = C.rl_engine_begin_release(call.e, resource, len, value, now)
    else id = C.rl_engine_begin_extend(call.e, resource, len, value, ttl, now) end
    if id < 0 then
        self.err = ffi_string(C.rl_engine_errstr(call.e))
        if C.rl_engine_inflight(call.e) + C.rl_engine_done(call.e) == 0 then end_call(call) end
    end
    return id
end

function client:begin_acquire(resource, len, ttl) return self:begin(1, resource, len, nil, ttl) end
function client:begin_release(resource, len, value) return self:begin(2, resource, len, value) end

function client:wait(id, out)
    local co = co_running()
    local call = self.calls[co]
    if call == nil then
        self.err = ("no operation %d in flight"):format(tonumber(id))
        return RL_ERR
    end
    local e = call.e
    local got
    while true do
        got = C.rl_engine_take(e, id, out)
        if got ~= 0 then break end
        service(call)
        got = C.rl_engine_take(e, id, out)
        if got ~= 0 then break end
        local at, now = C.rl_engine_deadline(e), now_ms()
        if at < 0 or at > now then
            -- nginx's timers count whole milliseconds: never ask for less than one
            call.sema:wait(at < 0 and 1 or math.max(0.001, (at - now) / 1000))
        end
        C.rl_engine_advance(e, now_ms())
    end
    if got < 0 then self.err = ffi_string(C.rl_engine_errstr(e)) end
    service(call)
    if C.rl_engine_inflight(e) + C.rl_engine_done(e) == 0 then end_call(call) end
    return got == 1 and RL_OK or RL_ERR
end

local function blocking(self, id, out)
    if id < 0 then return RL_ERR end
    return self:wait(id, out)
end

function client:acquire(resource, len, ttl, out)
    return blocking(self, self:begin(1, resource, len, nil, ttl), out)
end

function client:release(resource, len, value, out)
    return blocking(self, self:begin(2, resource, len, value), out)
end

function client:extend(resource, len, value, ttl, out)
    return blocking(self, self:begin(3, resource, len, value, ttl), out)
end

function client:sleep(ms)
    if phase_refusal() == nil then ngx.sleep(ms / 1000) end
end

function client:errstr() return self.err end
function client:node_name(i) return self.names[i] end
function client:quorum() return self.quorum_ end

function client:free()
    self.idle = {}
end

--- A client for the nodes (rl_client_new's arguments; nothing is connected
--- until a call needs it). nil with errbuf filled on bad arguments.
function _M.client_new(urls, n, opts, errbuf, errlen)
    local e = C.rl_engine_new(urls, n, opts, errbuf, errlen)
    if e == nil then return nil end
    e = ffi.gc(e, C.rl_engine_free)
    local copy = ffi.new("rl_options")
    ffi.copy(copy, opts, ffi.sizeof("rl_options"))
    local self = setmetatable({
        n = n, opts = copy, urls = urls, errbuf = ffi_new("char[?]", C.RL_ERR_LEN), err = "",
        idle = nil, calls = setmetatable({}, { __mode = "k" }),
        hosts = {}, ports = {}, names = {}, pool_opts = {},
        quorum_ = C.rl_engine_quorum(e),
        node_timeout = opts.node_timeout_ms, connect_timeout = opts.connect_timeout_ms,
    }, client_mt)
    for i = 0, n - 1 do
        self.hosts[i] = ffi_string(C.rl_engine_node_host(e, i))
        self.ports[i] = C.rl_engine_node_port(e, i)
        self.names[i] = ffi_string(C.rl_engine_node_name(e, i))
        -- one pool per node URL (password and db included): a pooled
        -- connection is only ever reused with the AUTH/SELECT it was set up with
        self.pool_opts[i] = { pool = "redlock " .. ffi_string(urls[i]), pool_size = POOL_SIZE }
    end
    self.idle = { new_call(self, e) }
    return self
end

---------------------------------------------------------------------------
-- keep-alive: ngx.timer callbacks extend kept locks (rl_keeper's methods)

local KEEP_HELD, KEEP_LOST, KEEP_RELEASED = C.RL_KEEP_HELD, C.RL_KEEP_LOST, C.RL_KEEP_RELEASED
local STATUS_OK, STATUS_NOT_HELD = C.RL_STATUS_OK, C.RL_STATUS_NOT_HELD

local keeper = {}
local keeper_mt = { __index = keeper }

local tick

-- Extend again in delay ms, on a timer of its own (a timer is a request of
-- its own, with cosockets, that outlives the request that kept the lock).
local function schedule(k, id, delay)
    local ok = ngx.timer.at(delay / 1000, tick, k, id)
    if not ok then
        local entry = k.entries[id]
        if entry then entry.state = KEEP_LOST end
    end
end

-- One extension of kept lock id, as rl_keeper does it: every ttl/3; after a
-- failure, again soon, until the validity (less the margin) runs out; lost
-- when not held.
tick = function(premature, k, id)
    local entry = k.entries[id]
    if entry == nil or entry.state ~= KEEP_HELD or k.stopped then return end
    if premature then return k:release_entry(id) end
    local out = k.result
    local started = now_ms()
    local rc = k.client:extend(entry.resource, #entry.resource, entry.value, entry.ttl, out)
    entry = k.entries[id]
    if entry == nil or entry.state ~= KEEP_HELD then return end
    if rc == RL_OK and out.status == STATUS_OK then
        entry.valid_until = started + out.validity_ms
        return schedule(k, id, entry.ttl / 3)
    end
    if rc == RL_OK and out.status == STATUS_NOT_HELD then
        entry.state = KEEP_LOST
        return
    end
    local left = entry.valid_until - entry.margin - now_ms()
    if left <= 0 then
        entry.state = KEEP_LOST
        return
    end
    schedule(k, id, math.min(left / 2, entry.ttl / 10))
end

function keeper:add(resource, len, value, ttl, valid_until, margin, errbuf, errlen)
    local id = self.next_id
    self.next_id = id + 1
    self.entries[id] = { resource = ffi_string(resource, len), value = ffi_string(value), ttl = ttl,
                         valid_until = valid_until, margin = margin, state = KEEP_HELD }
    schedule(self, id, ttl / 3)
    if self.entries[id].state ~= KEEP_HELD then
        self.entries[id] = nil
        ffi.copy(errbuf, "cannot start an ngx.timer (lua_max_pending_timers reached?)")
        return RL_ERR
    end
    return id
end

function keeper:state(id, until_buf)
    local entry = self.entries[id]
    if entry == nil then return RL_ERR end
    if until_buf ~= nil then until_buf[0] = entry.valid_until end
    return entry.state
end

function keeper:update(id, ttl, started, valid_until)
    local entry = self.entries[id]
    if entry == nil or entry.state ~= KEEP_HELD then return RL_ERR end
    entry.ttl = ttl
    entry.valid_until = valid_until
    return RL_OK
end

function keeper:remove(id)
    if self.entries[id] == nil then return RL_ERR end
    self.entries[id] = nil
    return RL_OK
end

-- Release entry id from a timer (a finalizer, or a phase without cosockets,
-- cannot do it where it runs).
local function release_later(premature, k, resource, value)
    local _ = premature
    k.client:release(resource, #resource, value, k.result)
end

function keeper:release_entry(id)
    local entry = self.entries[id]
    if entry == nil then return 0 end
    self.entries[id] = nil
    if phase_refusal() then
        ngx.timer.at(0, release_later, self, entry.resource, entry.value)
        return 0
    end
    local rc = self.client:release(entry.resource, #entry.resource, entry.value, self.result)
    return (rc == RL_OK and self.result.status == STATUS_OK) and 1 or 0
end

function keeper:drop(id)
    local entry = self.entries[id]
    if entry == nil then return RL_ERR end
    self.entries[id] = nil
    -- called from a finalizer, which may run where timers are refused: the
    -- lock then expires after its ttl, as it would without keep-alive
    pcall(ngx.timer.at, 0, release_later, self, entry.resource, entry.value)
    return RL_OK
end

function keeper:release(_)
    local n = 0
    for id in pairs(self.entries) do n = n + self:release_entry(id) end
    return n
end

function keeper:free()
    self.stopped = true
    self.entries = {}
end

--- The keeper of client d (a redlock.new table): kept locks are extended by
--- ngx.timer callbacks on d's own client while the worker runs.
function _M.keeper_new(d)
    return setmetatable({ client = d.client, entries = {}, next_id = 0, stopped = false,
                          result = ffi_new("rl_result") }, keeper_mt)
end

_M.phase_refusal = phase_refusal

return _M
