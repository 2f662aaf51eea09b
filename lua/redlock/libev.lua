-- redlock.libev: the transport outside nginx. The C core's rl_client (the
-- engine driven over non-blocking sockets on a libev loop of its own) and
-- rl_keeper (a thread that extends kept locks), with their functions as
-- methods: the contract of redlock.backend (backend.lua), which cosocket.lua
-- implements inside nginx, so the library calls client:acquire(...)
-- whichever transport runs.

local ffi = require "ffi"
local C = require("redlock.cdefs").lib

local _M = {}

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
    -- (a blocking wait cannot be killed half-way: the holder is not needed)
    watch = function(c, resource, len) return C.rl_watch(c, resource, len) end,
    unwatch = function(c, resource, len) C.rl_unwatch(c, resource, len) end,
    unwatch_won = function(c, resource, len) C.rl_unwatch_won(c, resource, len) end,
    heard = C.rl_heard,
    listeners = C.rl_heard_listeners,
    -- a blocking client has one waiter at a time: nobody to order (since),
    -- to wait behind or to pass a turn to
    sleep_until = function(c, resource, len, seen, ms) return C.rl_sleep_until(c, resource, len, seen, ms) end,
    waiting = function() return 0 end,
    first = function() return true end,
    pass_turn = function() end,
    listening = C.rl_client_listening,
    errstr = C.rl_client_errstr,
    node_name = C.rl_client_node_name,
    quorum = C.rl_client_quorum,
    stats = C.rl_client_stats,
    engine = function(c) return c end, -- each client has an engine of its own
    free = function(c) C.rl_client_free(ffi.gc(c, nil)) end,
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
    free = function(k) C.rl_keeper_free(ffi.gc(k, nil)) end,
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
