-- redlock.libev: the transport outside nginx. The C core's rl_client (the
-- engine driven over non-blocking sockets on a libev loop of its own) and
-- rl_keeper (a thread that extends kept locks), with their functions as
-- methods: the contract of redlock.backend (backend.lua), which cosocket.lua
-- implements inside nginx, so the library calls client:acquire(...)
-- whichever transport runs.

local ffi = require "ffi"
local C = require("redlock.cdefs").lib

local pairs, next, setmetatable = pairs, next, setmetatable

local _M = {}

---------------------------------------------------------------------------
-- who holds each watch
--
-- A blocking wait cannot be killed half-way, but a coroutine can be
-- dropped while its retry policy yields, and then never unwatches. So the
-- watches of each client count who holds them: the waits that watch, each
-- by the holder table it passes (redlock.wait: one per wait, held by the
-- wait's frame only). Once the garbage collector has collected a wait's
-- holder, the next call on the client (sweep) undoes that wait's watches,
-- and the last one unsubscribes: the nodes, finding nobody listening, then
-- drop the client's place in their queues at the next release and wake
-- the next waiter. Else the client would listen on for the dead wait for
-- its life, and a release would wake it where nobody waits. Not from a
-- finalizer: the sweep runs between calls, never inside the client's loop.
--
-- holds[client][resource] = { n = its rl_watch calls not undone,
--                             by = { [holder] = how many of them are its } }
-- (by: weak keys). A watch given no holder is not counted: its caller
-- unwatches it itself.
-- One table for the Lua state, in its registry: a client's methods are
-- those of the first load of this module (an ffi metatype is set once),
-- and a second load (a test runner reloading modules between files) must
-- sweep what they recorded, not a table of its own.
local REGISTRY_KEY = "redlock.libev holds"
local holds = debug.getregistry()[REGISTRY_KEY]
if holds == nil then
    holds = setmetatable({}, { __mode = "k" })
    debug.getregistry()[REGISTRY_KEY] = holds
end
local WEAK_KEYS = { __mode = "k" }

local function name_of(resource, len)
    return len ~= #resource and resource:sub(1, len) or resource
end

local function watch(c, resource, len, holder)
    local rc = C.rl_watch(c, resource, len)
    if rc ~= C.RL_OK or holder == nil then return rc end
    local mine = holds[c]
    if mine == nil then
        mine = {}
        holds[c] = mine
    end
    local r = name_of(resource, len)
    local w = mine[r]
    if w == nil then
        w = { n = 0, by = setmetatable({}, WEAK_KEYS) }
        mine[r] = w
    end
    w.n = w.n + 1
    w.by[holder] = (w.by[holder] or 0) + 1
    return rc
end

-- One watch of holder's fewer, with undo (rl_unwatch or rl_unwatch_won). A
-- holder with no watch of resource counted (its rl_watch failed) has none
-- to undo.
local function unwatch_with(c, resource, len, holder, undo)
    if holder ~= nil then
        local mine = holds[c]
        local r = name_of(resource, len)
        local w = mine and mine[r]
        local k = w and w.by[holder]
        if k == nil then return end
        w.by[holder] = k > 1 and k - 1 or nil
        w.n = w.n - 1
        if w.n == 0 then
            mine[r] = nil
            if next(mine) == nil then holds[c] = nil end
        end
    end
    undo(c, resource, len)
end

--- Undo the watches of client c's waits that are gone (their holders
--- collected: see above), as a wait that failed does (rl_unwatch). The
--- library calls it at the start of every call on the client
--- (check.live_client); nothing to do costs one lookup.
function _M.sweep(c)
    local mine = holds[c]
    if mine == nil then return end
    for r, w in pairs(mine) do
        local held = 0
        for _, k in pairs(w.by) do held = held + k end
        for _ = held + 1, w.n do C.rl_unwatch(c, r, #r) end
        w.n = held
        if held == 0 then mine[r] = nil end
    end
    if next(mine) == nil then holds[c] = nil end
end

---------------------------------------------------------------------------
-- the client and the keeper

ffi.metatype("struct rl_client", { __index = {
    acquire = C.rl_acquire,
    acquire_fenced = C.rl_acquire_fenced,
    acquire_queued = C.rl_acquire_queued,
    acquire_shared = C.rl_acquire_shared,
    release = C.rl_release,
    extend = C.rl_extend,
    acquire_slot = C.rl_acquire_slot,
    on_slot = C.rl_on_slot,
    begin_on_slot = C.rl_begin_on_slot,
    begin_acquire = C.rl_begin_acquire,
    begin_acquire_fenced = C.rl_begin_acquire_fenced,
    begin_acquire_shared = C.rl_begin_acquire_shared,
    begin_release = C.rl_begin_release,
    begin_release_quiet = C.rl_begin_release_quiet,
    wait = C.rl_wait,
    sleep = C.rl_sleep,
    -- counted by holder, for the sweep (see "who holds each watch")
    watch = watch,
    unwatch = function(c, resource, len, holder) unwatch_with(c, resource, len, holder, C.rl_unwatch) end,
    unwatch_won = function(c, resource, len, holder) unwatch_with(c, resource, len, holder, C.rl_unwatch_won) end,
    heard = C.rl_heard,
    listeners = C.rl_heard_listeners,
    -- a blocking client has one waiter at a time: nobody to order (since),
    -- to wait behind or to pass a turn to
    sleep_until = function(c, resource, len, seen, ms) return C.rl_sleep_until(c, resource, len, seen, ms) end,
    waiting = function() return 0 end,
    first = function() return true end,
    pass_turn = function() end,
    slot_taken = function() end,
    slots_held = function() return 0 end,
    listening = C.rl_client_listening,
    errstr = C.rl_client_errstr,
    node_name = C.rl_client_node_name,
    quorum = C.rl_client_quorum,
    stats = C.rl_client_stats,
    engine = function(c) return c end, -- each client has an engine of its own
    -- Closed now, its memory freed by the collector (rl_client_free, below):
    -- a call further up the stack, under a finalizer that ran close(), may
    -- still hold c, and gets RL_ERR from it rather than freed memory.
    free = function(c)
        holds[c] = nil
        C.rl_client_close(c)
    end,
} })

ffi.metatype("struct rl_keeper", { __index = {
    add = C.rl_keeper_add,
    add_slot = C.rl_keeper_add_slot,
    state = C.rl_keeper_state,
    update = C.rl_keeper_update,
    remove = C.rl_keeper_remove,
    drop = C.rl_keeper_drop,
    release = C.rl_keeper_release,
    stats = C.rl_keeper_stats,
    own = function() end, -- one process: no owners to tell apart
    free = function(k) C.rl_keeper_free(ffi.gc(k, nil)) end,
    close = C.rl_keeper_close,
} })

_M.name = "libev"
_M.handoff = true  -- waiters hear releases (rl_watch, rl_sleep_until) and queue (rl_acquire_queued)

--- A client for the nodes (rl_client_new's arguments); nil with errbuf filled.
function _M.client_new(urls, n, opts, errbuf, errlen)
    local c = C.rl_client_new(urls, n, opts, errbuf, errlen)
    if c == nil then return nil end
    return ffi.gc(c, C.rl_client_free)
end

--- The keeper of client d (a redlock.new table): a thread of its own on the
--- same nodes. Collected with locks still kept, it first clears
--- d.keeper_live.on (what kept locks' finalizers check), then releases them
--- within bound_ms. nil with errbuf filled on failure.
function _M.keeper_new(d, errbuf, bound_ms)
    local k = C.rl_keeper_new(d.urls, #d.servers, d.options, errbuf, C.RL_ERR_LEN)
    if k == nil then return nil end
    local live = d.keeper_live
    return ffi.gc(k, function(p)
        live.on = false
        C.rl_keeper_release(p, bound_ms)
        C.rl_keeper_free(p)
    end)
end

return _M
