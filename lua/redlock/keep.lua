-- redlock.keep: keep-alive for lock objects. A client's keeper (its
-- transport's: a thread of the core outside nginx, the worker's hub inside;
-- the schedule is the engine's either way) is started on first use; a kept
-- lock asks it for its state, tells it of its own extensions, and is handed
-- back to it when its object is collected without unlock().

local ffi = require "ffi"
local C = require("redlock.cdefs").lib
local backend = require "redlock.backend"
local check = require "redlock.check"
local held = require "redlock.held"
local results = require "redlock.results"
check.ours()

local ffi_string, ffi_gc = ffi.string, ffi.gc
local errbuf, ERR_LEN = results.errbuf, results.ERR_LEN
local hold_until, unhold = held.hold_until, held.unhold
local raise = check.raise
local now = C.rl_now_ms

local _M = {}

-- The longest close(), or a keeper collected with locks still kept, waits
-- for the keeper's releases.
local RELEASE_BOUND_MS = 1000
local guard_t = ffi.typeof("struct { int id; }")  -- a kept lock's finalizer rides on one of these
local until_buf = ffi.new("double[1]")

--- The fields a new client starts with.
function _M.init(d)
    d.keeper = nil         -- started on first use of keep-alive
    d.keeper_live = {}     -- .on while the keeper lives: what kept locks' finalizers check
    return d
end

-- A kept lock that is garbage-collected without unlock() must not stay
-- extended for the life of the process: its guard (a small cdata holding the
-- keeper's id for it) has the client's drop_guard as finalizer, which hands
-- the lock back to the keeper to release. One finalizer per client, not a
-- closure per lock: 10,000 kept locks cost 10,000 small cdata and nothing else.
-- The finalizer holds the keeper (so GC keeps the keeper until every guard is
-- done), never a lock (so locks can be collected), and checks `live`: close(),
-- and the keeper's own finalizer when lua_close runs every finalizer in no
-- particular order, clear it first.
local function drop_guard_for(k, live)
    return function(g)
        if live.on then k:drop(g.id) end
    end
end

-- The client's keeper, started on first use; or nil, why.
local function keeper_of(d)
    local k = d.keeper
    if k == nil then
        if d.client == nil then return nil, "cannot start keep-alive: the client was closed" end
        -- Collected (or closed with the Lua state, as on an uncaught error
        -- or os.exit(code, true)) with locks still kept, a keeper releases
        -- them in bounded time instead of leaving them for their ttl.
        k = backend.keeper_new(d, errbuf, RELEASE_BOUND_MS)
        if k == nil then return nil, "cannot start keep-alive: " .. ffi_string(errbuf) end
        local live = d.keeper_live
        local drop = drop_guard_for(k, live) -- allocates: a finalizer may close d here
        if d.client == nil then
            k:close()
            return nil, "cannot start keep-alive: the client was closed"
        end
        live.on = true
        d.keeper = k
        d.drop_guard = drop
    end
    return k
end

-- Hand a held lock to the keeper. Returns true, or nil, why.
local function keep(lk, margin)
    local d = lk.dlm
    local k, why = keeper_of(d)
    if not k then return nil, why end
    local id
    if lk.slot then
        id = k:add_slot(lk.resource, #lk.resource, lk.slot, lk.value, lk.ttl, lk.valid_until, margin or 0, errbuf, ERR_LEN)
    else
        id = k:add(lk.resource, #lk.resource, lk.value, lk.ttl, lk.valid_until, margin or 0, errbuf, ERR_LEN)
    end
    if id < 0 then return nil, "keep-alive refused the lock: " .. ffi_string(errbuf) end
    lk.kept, lk.margin = id, margin or 0
    lk.guard = ffi_gc(guard_t(id), d.drop_guard)
    unhold(d, lk.value) -- the keeper releases it, if its object is collected too
    return true
end

--- A kept lock whose release failed (redlock.lock's after_release): keep-alive
--- stops, and the keeper releases it, as it does a lock whose object was
--- collected.
function _M.let_go(lk)
    if lk.kept ~= nil and lk.dlm.keeper ~= nil then lk.dlm.keeper:drop(lk.kept) end
    if lk.guard ~= nil then ffi_gc(lk.guard, nil) end
    lk.kept, lk.guard = nil, nil
end

--- Make owner (a table; nil: the default) the owner of kept lock lk for its
--- keeper, where the keeper tells owners apart (inside nginx: an exiting
--- worker goes on extending a kept lock while its owner lives; by default
--- the owner is the request's ngx.ctx, which user code may replace).
--- Returns owner.
function _M.own(lk, owner)
    local k = lk.dlm.keeper
    if lk.kept ~= nil and k ~= nil then k:own(lk.kept, owner) end
    return owner
end

--- Keep every lock of a list, or release them all and raise at the caller:
--- a lock the caller never sees must not stay behind.
function _M.keep_or_release(locks, margin)
    for i = 1, #locks do
        local ok, why = keep(locks[i], margin)
        if not ok then
            for j = 1, #locks do
                local lk = locks[j]
                if not lk.released then lk:unlock() end -- (a failure: the keeper releases a kept one)
            end
            raise("redlock: " .. why)
        end
    end
end

--- A kept lock's state from its keeper (RL_KEEP_*), its validity brought up
--- to date; nil for a lock not kept, or no longer known to the keeper (its
--- validity says).
function _M.state(lk)
    local k = lk.dlm.keeper
    if lk.kept == nil or k == nil then return nil end
    local state = k:state(lk.kept, until_buf)
    if state < 0 then return nil end
    if state > 0 then lk.valid_until = until_buf[0] end
    return state
end

--- A kept lock was extended by its owner (begun at started, to ttl): the
--- keeper goes on from there, with lk.valid_until. True, or false when the
--- keeper refused it: it had found the lock lost and that stays so (our
--- value gone, or too little validity left above the margin: redlock.h,
--- "Keep-alive"), or the lock was released. True for a lock not kept.
function _M.update(lk, ttl, started)
    if lk.kept ~= nil and lk.dlm.keeper ~= nil then
        return lk.dlm.keeper:update(lk.kept, ttl, started, lk.valid_until) == C.RL_OK
    end
    return true
end

--- The keeper lets go of lk, after its last word on it: lk.valid_until is
--- the keeper's latest (lk.margin stays, and lost() goes on counting it).
--- The client lists it again until its key would be gone by itself (the
--- keeper's last extension was at most a ttl ago).
function _M.stop(lk)
    if lk.kept ~= nil then
        _M.state(lk)
        hold_until(lk, now(), lk.ttl)
    end
    if lk.kept ~= nil and lk.dlm.keeper ~= nil then lk.dlm.keeper:remove(lk.kept) end
    if lk.guard ~= nil then ffi_gc(lk.guard, nil) end
    lk.kept, lk.guard = nil, nil
end

--- For close(): the keeper releases what it still keeps (dropped locks),
--- within RELEASE_BOUND_MS, and stops.
function _M.close(d)
    local k = d.keeper
    if k ~= nil then
        d.keeper_live.on = false
        d.keeper = nil
        k:release(RELEASE_BOUND_MS)
        k:close() -- its memory to the collector: a finalizer's close() may run while a call holds k
    end
end

return _M
