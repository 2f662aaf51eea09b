-- redlock.nginx.hub: the hub, one per worker and configuration
-- (redlock.cosocket has the whole picture): its engine and state, its
-- ngx.timer's loop and lifecycle (started by the first call, idle, rotated,
-- the worker exiting), and the worker's table of hubs.

local ffi = require "ffi"
local C = require("redlock.cdefs").lib
local calls = require "redlock.nginx.calls"
local links = require "redlock.nginx.links"
local tls = require "redlock.nginx.tls"
local watch = require "redlock.nginx.watch"
local keep = require "redlock.nginx.keep"

local ngx = ngx
local ffi_string, ffi_new = ffi.string, ffi.new
local now_ms = C.rl_now_ms
local xpcall, ipairs, setmetatable, next, math_max, math_ceil = xpcall, ipairs, setmetatable, next, math.max, math.ceil
local start, deliver, sweep, keeping, retry_orphans = calls.start, calls.deliver, calls.sweep, calls.keeping,
    calls.retry_orphans
local service, reap, shut = links.service, links.reap, links.shut
local sweep_watches, forget_watches, forget_unowned = watch.sweep_watches, watch.forget_watches, keep.forget_unowned
local sleep_horizon = watch.sleep_horizon

local HUB_IDLE_MS = 10000      -- a hub with nothing to do for this long stops
local HUB_SLICE_MS = 500       -- the longest the hub sleeps without looking at the worker's state
local SWEEP_MS = calls.UNCLAIMED_MS -- how often the loop sweeps results nobody took
local WATCH_SWEEP_MS = 1000    -- how often it sweeps the watches of requests killed while they waited
local EXIT_GC_MS = 5000        -- an exiting worker's hub that keeps locks collects garbage this often
local QUIET_GC_MS = 1000       -- with no call for this long, its push of the collector is not bounded (see loop)
local GC_STEP_KB = 1024        -- else a push does at most this much (a heap of 10 MB: a cycle in 5 pushes)
-- Each connect costs the timer's request a little memory that nginx frees
-- only when the timer ends: after this many, the hub starts a fresh timer at
-- its first quiet moment (nothing in flight, no tail).
local ROTATE_CONNECTS = 1000

-- idle_ms: how long a hub with nothing to do keeps its timer and connections;
-- rotate_connects: after how many connects it starts a fresh timer (module
-- fields, read on every turn, so a test can change them).
local _M = { idle_ms = HUB_IDLE_MS, rotate_connects = ROTATE_CONNECTS }

local hubs = {}  -- configuration key -> hub, for this worker

-- Work the hub must stay for: operations in flight, tails, results not
-- taken, and commands not written yet (a failed acquire's cleanup or a
-- release held behind a connection still being set up: the engine bounds
-- that by the connect timeout), as rl_client_free waits for them.
local function busy(e)
    return C.rl_engine_inflight(e) + C.rl_engine_tails(e) + C.rl_engine_done(e) + C.rl_engine_unwritten(e) > 0
end

-- The hub's loop: one turn per wake-up (work posted, a reader fed replies)
-- or engine deadline (kept locks' included).
local function loop(hub, premature)
    local e, work = hub.e, hub.work
    local exit_by = premature and now_ms() + hub.node_timeout or nil
    local sweep_at, watch_sweep_at = now_ms() + SWEEP_MS, now_ms() + WATCH_SWEEP_MS
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
            sweep_at = now + SWEEP_MS
        end
        if now >= watch_sweep_at then
            sweep_watches(hub)
            -- What only the collector ends (a killed request's kept lock, or
            -- its watch) must not wait for a collection that a worker
            -- allocating little may never make, quiet or not (lock calls
            -- that allocate too little to collect, a starved waiter's own
            -- retries among them): each sweep does as much collecting as a
            -- tenth of the heap allocated would, at most GC_STEP_KB while
            -- calls come in (a step's cost grows with the heap).
            if keeping(hub) or next(hub.chans) ~= nil then
                local kb = math_ceil(collectgarbage("count") / 10)
                if now - hub.last_call < QUIET_GC_MS and kb > GC_STEP_KB then kb = GC_STEP_KB end
                collectgarbage("step", kb)
            end
            watch_sweep_at = now + WATCH_SWEEP_MS
        end
        if hub.ended[1] ~= nil then reap(hub) end
        if exit_by == nil and ngx.worker.exiting() then exit_by = now + hub.node_timeout end
        if exit_by ~= nil then
            -- the worker exits. Kept locks keep the hub extending them: the
            -- requests holding them run on, and nginx waits for those anyway
            -- (a lock object dropped without unlock is released once it is
            -- collected, one whose owner ended is left to lapse: so collect).
            -- Operations begun are served until decided (the engine bounds
            -- that), tails for a node timeout, waits on a watched channel
            -- until they end.
            if keeping(hub) then
                if now >= gc_at then
                    collectgarbage()
                    forget_unowned(hub)
                    gc_at = now + EXIT_GC_MS
                end
            elseif C.rl_engine_inflight(e) == 0 and (not busy(e) or now >= exit_by) and now >= sleep_horizon(hub) then
                -- (requests still waiting on a watched channel keep it: without
                -- the hub each of their attempts would start one, connect to
                -- every node, and stop again)
                return "the nginx worker is exiting"
            end
        elseif not busy(e) and next(hub.waiters) == nil then
            -- idle: no call for idle_ms, nobody sleeping on a watched channel, no kept lock,
            -- no result left to sweep (one handed to a request killed before it woke)
            if now - hub.last_call >= _M.idle_ms and not keeping(hub) and now >= sleep_horizon(hub) then return nil end
            if hub.connects >= _M.rotate_connects then return nil, true end
        end
        local at = C.rl_engine_deadline(e)
        local wait_ms = HUB_SLICE_MS
        if exit_by == nil and not busy(e) and not keeping(hub) and next(hub.waiters) == nil then
            local idle_left = math_max(hub.last_call + _M.idle_ms, sleep_horizon(hub)) - now
            if idle_left < wait_ms then wait_ms = idle_left end
        end
        if at >= 0 and at - now < wait_ms then wait_ms = at - now end
        if exit_by ~= nil and now < exit_by and exit_by - now < wait_ms then wait_ms = exit_by - now end
        -- nginx's timers count whole milliseconds: never ask for less than one
        if wait_ms > 0 then work:wait(wait_ms < 1 and 0.001 or wait_ms / 1000) end
    end
end

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

-- The configuration key of a client: everything rl_engine_new is given
-- (t: opts.tls as redlock.nginx.tls's config made it).
local function config_key(urls, n, opts, t)
    local parts = {}
    for i = 0, n - 1 do
        local u = ffi_string(urls[i])
        parts[#parts + 1] = #u .. ":" .. u
    end
    local prefix = (opts.prefix ~= nil and opts.prefix_len > 0) and ffi_string(opts.prefix, opts.prefix_len) or ""
    -- (no_stats too: the engine counts for every client of its hub, or for none)
    parts[#parts + 1] = ("%d,%d,%d,%d,%d,%d,%.17g,%d,%d,%d:%s"):format(opts.node_timeout_ms, opts.connect_timeout_ms,
        opts.reconnect_min_ms, opts.reconnect_max_ms, opts.stall_reset_ms, opts.quorum, opts.drift_factor,
        opts.replicas, opts.no_stats, #prefix, prefix)
    -- TLS: clients that verify differently, or show another certificate, get hubs of their own
    parts[#parts + 1] = "tls " .. (t.verify and 1 or 0)
    for _, f in ipairs(tls.STRINGS) do
        local v = t[f]
        parts[#parts + 1] = v and (#v .. ":" .. v) or "-"
    end
    return table.concat(parts, "\n")
end

local function new_hub(e, n, opts, t)
    local hub = {
        main = hub_main, -- the timer's callback (redlock.nginx.calls's start)
        tls = t, tlss = {}, snis = {}, sessions = {}, fed = {}, said = {},
        chans = {}, watches = {}, epoch = 0, -- hand-off: resource -> watch, id -> watch
        sleeping = {}, -- semaphore -> { until_ = end of its request's sleep, on = its watches } (redlock.nginx.watch)
        e = e, n = n, res = ffi_new("rl_result"), waiters = {},
        kept = {}, orphans = {},                      -- ids of kept locks still extended (redlock.nginx.keep)
        owners = setmetatable({}, { __mode = "v" }),  -- kept lock's id -> ngx.ctx of who kept it
        socks = {}, readers = {}, writers = {}, wakers = {}, failed = {}, gen = {}, up = {}, hosts = {}, ports = {},
        names = {},
        work = nil, running = false, started_at = nil, token = nil, last_call = 0, now = 0, connects = 0, ended = {},
        node_timeout = opts.node_timeout_ms, connect_timeout = opts.connect_timeout_ms,
        slots_held = {}, quorum = C.rl_engine_quorum(e),
    }
    hub.placed = 0
    links.place(hub) -- every link: the nodes' command connections, then their subscribers
    return hub
end

--- Every hub of this worker (configuration key -> hub), for its metrics.
function _M.all()
    return hubs
end

-- The engine's finalizer, which clears alive.on first. When the worker's
-- Lua state closes (lua_close, at exit or reload) every finalizer runs, in
-- no particular order: a kept lock's guard (redlock.keep) that comes after
-- the engine's must not call into it (redlock.nginx.keep checks alive.on).
-- It holds alive, never the hub or the engine, so the engine can be
-- collected.
local function engine_finalizer(alive)
    return function(e)
        alive.on = false
        C.rl_engine_free(e)
    end
end

--- The worker's hub for a client of these rl_client_new arguments (its
--- configuration: the same servers and options share one), made on first
--- use; nil with errbuf filled on bad arguments.
function _M.get(urls, n, opts, errbuf, errlen)
    local t = tls.config(opts.tls)
    local key = config_key(urls, n, opts, t)
    local hub = hubs[key]
    if hub ~= nil then return hub end
    local e = C.rl_engine_new(urls, n, opts, errbuf, errlen)
    if e == nil then return nil end
    local why = tls.check(e, n, t)
    if why then
        ffi.copy(errbuf, why:sub(1, errlen - 1))
        C.rl_engine_free(e)
        return nil
    end
    local alive = { on = true }
    hub = new_hub(ffi.gc(e, engine_finalizer(alive)), n, opts, t)
    hub.alive = alive
    hubs[key] = hub
    for i = 0, n - 1 do
        if hub.tlss[i] then tls.notes(hub); break end
    end
    return hub
end

return _M
