-- redlock.nginx.client: the client of the transport contract inside nginx
-- (backend.lua; the methods of rl_client), a handle on the worker's hub for
-- its configuration (redlock.cosocket has the whole picture). A call never
-- touches a socket: it begins its operation on the hub's engine (pure C),
-- wakes the hub and waits on a semaphore of its own for the result.

local ffi = require "ffi"
local C = require("redlock.cdefs").lib
local calls = require "redlock.nginx.calls"
local hub_mod = require "redlock.nginx.hub"
local watch = require "redlock.nginx.watch"

local ngx = ngx
local ffi_string, ffi_copy = ffi.string, ffi.copy
local now_ms = C.rl_now_ms
local co_running = coroutine.running
local type, tonumber, pairs, setmetatable = type, tonumber, pairs, setmetatable
local phase_refusal, start, wake = calls.phase_refusal, calls.start, calls.wake
local take_waiter, give_waiter, request, running = calls.take_waiter, calls.give_waiter, calls.request, calls.running
local get_hub = hub_mod.get
local hand_off = watch.hand_off

local RL_OK, RL_ERR = C.RL_OK, C.RL_ERR
local UNREACHABLE = require("redlock.cdefs").UNREACHABLE
local RESULT_SIZE = calls.RESULT_SIZE
local WAIT_MARGIN_MS = 2000    -- a call's safety timeout: node + connect timeout + this

local _M = {}

local client = {}
local client_mt = { __index = client }

local function name_of(resource, len)
    return (type(resource) == "string" and len == #resource) and resource or ffi_string(resource, len)
end

-- Begin an operation on the hub's engine and register its waiter; the id,
-- or RL_ERR (UNREACHABLE when the hub cannot start) with self.err set.
-- kind: 1 acquire, 2 release, 3 extend, 4
-- fenced, 5 queued, 6 quiet release, 7 a semaphore's acquire (sem: its
-- limit; ticket: a waiter's, or 0), 8 and 9 a release and an extension of
-- slot sem, 10 shared.
function client:begin(kind, resource, len, value, ttl, sem, ticket)
    local why = phase_refusal()
    if why then self.err = why; return RL_ERR end
    local hub = self.hub
    why = start(hub)
    if why then self.err = why; return UNREACHABLE end
    local e, now = hub.e, now_ms()
    local id
    if kind == 1 then id = C.rl_engine_begin_acquire(e, resource, len, ttl, now)
    elseif kind == 2 then id = C.rl_engine_begin_release(e, resource, len, value, now)
    elseif kind == 4 then id = C.rl_engine_begin_acquire_fenced(e, resource, len, ttl, now)
    elseif kind == 5 then id = C.rl_engine_begin_acquire_queued(e, resource, len, ttl, now)
    elseif kind == 6 then id = C.rl_engine_begin_release_quiet(e, resource, len, value, now)
    elseif kind == 7 then id = C.rl_engine_begin_acquire_slot(e, resource, len, sem, ttl, ticket, now)
    elseif kind == 8 then id = C.rl_engine_begin_on_slot(e, C.RL_OP_RELEASE, resource, len, sem, value, 0, now)
    elseif kind == 9 then id = C.rl_engine_begin_on_slot(e, C.RL_OP_EXTEND, resource, len, sem, value, ttl, now)
    elseif kind == 10 then id = C.rl_engine_begin_acquire_shared(e, resource, len, ttl, now)
    else id = C.rl_engine_begin_extend(e, resource, len, value, ttl, now) end
    if id < 0 then
        self.err = ffi_string(C.rl_engine_errstr(e))
        return id
    end
    local w = take_waiter()
    w.id, w.co, w.ctx = id, co_running(), request()
    running(w.co)
    -- an acquire's resource: the hub releases a grant whose caller is gone
    if kind == 1 or kind == 4 or kind == 5 or kind == 7 or kind == 10 then w.resource = name_of(resource, len) end
    hub.waiters[id] = w
    hub.last_call = now
    -- a release: the worker's next waiter attempts behind it (first, so
    -- that the hub writes both at once)
    if kind == 2 or kind == 8 then hand_off(hub, name_of(resource, len), kind == 8 and value or nil) end
    wake(hub)
    return id
end

function client:begin_acquire(resource, len, ttl) return self:begin(1, resource, len, nil, ttl) end
function client:begin_acquire_fenced(resource, len, ttl) return self:begin(4, resource, len, nil, ttl) end
function client:begin_acquire_shared(resource, len, ttl) return self:begin(10, resource, len, nil, ttl) end
function client:begin_release(resource, len, value) return self:begin(2, resource, len, value) end
function client:begin_release_quiet(resource, len, value) return self:begin(6, resource, len, value) end
function client:begin_on_slot(kind, resource, len, slot, value, ttl)
    return self:begin(kind == C.RL_OP_RELEASE and 8 or 9, resource, len, value, ttl, slot)
end

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
            return UNREACHABLE
        end
    end
    if hub.waiters[id] == w then hub.waiters[id] = nil end
    local err = w.err
    if err == nil and out ~= nil then ffi_copy(out, w.res, RESULT_SIZE) end
    give_waiter(w)
    if err ~= nil then self.err = err; return UNREACHABLE end -- the hub stopped
    return RL_OK
end

local function blocking(self, id, out)
    if id < 0 then return id end -- RL_ERR, RL_ERR_FULL or UNREACHABLE: nothing was sent
    return self:wait(id, out)
end

function client:acquire_fenced(resource, len, ttl, out)
    return blocking(self, self:begin(4, resource, len, nil, ttl), out)
end

function client:acquire(resource, len, ttl, out)
    return blocking(self, self:begin(1, resource, len, nil, ttl), out)
end

function client:acquire_shared(resource, len, ttl, out)
    return blocking(self, self:begin(10, resource, len, nil, ttl), out)
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

function client:acquire_slot(resource, len, limit, ttl, ticket, out)
    return blocking(self, self:begin(7, resource, len, nil, ttl, limit, ticket), out)
end

function client:on_slot(kind, resource, len, slot, value, ttl, out)
    return blocking(self, self:begin_on_slot(kind, resource, len, slot, value, ttl), out)
end

-- Sleep ms, at least 1 (nginx's timers count whole milliseconds, and warns
-- of ngx.sleep(0) without its delayed-events patch).
function client:sleep(ms) -- luacheck: ignore 212/self
    if phase_refusal() == nil then ngx.sleep((ms < 1 and 1 or ms) / 1000) end
end

-- Hand-off: watch, unwatch, unwatch_won, heard, listeners, sleep_until, waiting,
-- first, pass_turn, slot_taken, slots_held, listening
-- (redlock.nginx.watch).
for name, f in pairs(watch.methods) do client[name] = f end

function client:errstr() return self.err end
function client:node_name(i) return self.hub.names[i] end
function client:quorum() return self.hub.quorum end
-- the hub's engine: every client of the worker's configuration, and its kept locks
function client:stats(out) watch.stats(self.hub, out) end
function client:engine() return self.hub end

-- The hub is the worker's, shared with every client of the same
-- configuration: closing one client leaves it running (it stops when idle).
function client:free() end -- luacheck: ignore 212/self

--- A client for the nodes (rl_client_new's arguments; nothing is connected
--- until a call needs it): a handle on the worker's hub for this
--- configuration, made on first use. nil with errbuf filled on bad arguments.
function _M.client_new(urls, n, opts, errbuf, errlen)
    local hub = get_hub(urls, n, opts, errbuf, errlen)
    if hub == nil then return nil end
    return setmetatable({
        hub = hub, err = "", watched = {}, epoch = hub.epoch,
        wait_s = (opts.node_timeout_ms + opts.connect_timeout_ms + WAIT_MARGIN_MS) / 1000,
    }, client_mt)
end

return _M
