-- redlock.nginx.calls: the calls' side of the hub (redlock.cosocket has the
-- whole picture): the phases a call may run in, making sure the hub's timer
-- runs and waking it, what a call waits on (a waiter: its semaphore, a copy
-- of its result), handing finished results to the calls waiting for them,
-- and what happens to a result whose call is gone. Pure engine work and
-- semaphores, no I/O: any coroutine of the worker may do it.

local ffi = require "ffi"
local C = require("redlock.cdefs").lib
local semaphore = require "ngx.semaphore"

local ngx = ngx
local ffi_string, ffi_new, ffi_copy = ffi.string, ffi.new, ffi.copy
local now_ms = C.rl_now_ms
local pairs, setmetatable, tostring = pairs, setmetatable, tostring

local OP_ACQUIRE, ERR_FULL, STATUS_OK = C.RL_OP_ACQUIRE, C.RL_ERR_FULL, C.RL_STATUS_OK
local RESULT_SIZE = ffi.sizeof("rl_result")
local STALE_MS = 10000 -- a result nobody took for this long is dropped (its call is gone)
-- A result handed to a call that was waiting for it and has not woken to
-- take it for this long: its request was killed between the hand-over and
-- its turn to run (the semaphore still holds the post). Its call is gone.
local UNCLAIMED_MS = 1000

local _M = { STALE_MS = STALE_MS, UNCLAIMED_MS = UNCLAIMED_MS, RESULT_SIZE = RESULT_SIZE }

-- The phases where nginx offers cosockets (ngx.get_phase()).
local COSOCKET_PHASES = { server_rewrite = true, rewrite = true, access = true, content = true, timer = true,
                          ssl_cert = true, ssl_session_fetch = true, ssl_client_hello = true }

--- nil, or why no lock call can run in this phase.
function _M.phase_refusal()
    local phase = ngx.get_phase()
    if COSOCKET_PHASES[phase] then return nil end
    return ("no redlock call can run in nginx's %s phase: it has no cosockets (and blocking the worker is not an option); "
        .. "lock in server_rewrite_by_lua*, rewrite_by_lua*, access_by_lua*, content_by_lua* or an ngx.timer "
        .. "callback"):format(phase)
end

--- Wake hub's loop (work posted, a reader fed replies).
local function wake(hub)
    local sema = hub.work
    if sema and sema:count() < 1 then sema:post(1) end
end
_M.wake = wake

-- How long a started hub timer may take to run before it counts as dropped
-- (nginx drops a pending timer when lua_max_running_timers are all busy,
-- logging it) and another is started.
local HUB_START_MS = 1000

--- Make sure hub's timer runs (its callback: hub.main, redlock.nginx.hub's
--- loop). nil, or why it cannot.
function _M.start(hub)
    if hub.running and (hub.started_at == nil or now_ms() - hub.started_at < HUB_START_MS) then return nil end
    if hub.work == nil then hub.work = semaphore.new(0) end
    local token = {}
    local ok, err = ngx.timer.at(0, hub.main, hub, token)
    if not ok then return "cannot start the hub's ngx.timer: " .. tostring(err) end
    hub.running, hub.started_at, hub.token = true, now_ms(), token
    return nil
end

---------------------------------------------------------------------------
-- waiters: what a call waits on (its semaphore, a copy of its result), and
-- who it is (the coroutine that began it, the resource of an acquire: see
-- "calls that are gone")

local free_waiters, nfree = {}, 0

function _M.take_waiter()
    local w
    if nfree > 0 then
        w = free_waiters[nfree]
        free_waiters[nfree] = nil
        nfree = nfree - 1
    else
        w = { sema = semaphore.new(0), res = ffi_new("rl_result"), done = false, done_at = 0, err = nil, id = -1,
              co = nil, ctx = nil, resource = nil, waiting = false, abandoned = false }
    end
    return w
end

-- Only a waiter whose semaphore holds nothing (it was waited on to the end,
-- or never posted) goes back to the list.
function _M.give_waiter(w)
    w.done, w.err, w.id, w.co, w.ctx, w.resource, w.abandoned = false, nil, -1, nil, nil, nil, false
    if w.sema:count() ~= 0 then return end
    nfree = nfree + 1
    free_waiters[nfree] = w
end

---------------------------------------------------------------------------
-- orphans: grants whose call is gone, released by the hub for nobody

-- Release resource's lock of value (a semaphore's: slot's; else slot 0)
-- from the hub, for nobody (a grant whose request is gone): its result is
-- dropped. An engine with every slot taken gets it again on the loop's
-- next turn.
local function release_orphan(hub, resource, value, slot)
    local id
    if slot > 0 then id = C.rl_engine_begin_on_slot(hub.e, C.RL_OP_RELEASE, resource, #resource, slot, value, 0, now_ms())
    else id = C.rl_engine_begin_release(hub.e, resource, #resource, value, now_ms()) end
    if id == ERR_FULL then
        local o = hub.orphans
        o[#o + 1] = { resource, value, slot }
    end
    wake(hub)
end

--- Begin the orphans' releases an engine with every slot taken refused.
function _M.retry_orphans(hub)
    local list = hub.orphans
    hub.orphans = {}
    for k = 1, #list do release_orphan(hub, list[k][1], list[k][2], list[k][3]) end
end

--- Kept locks the hub must run for (extended, or releases not decided), and
--- releases of orphans not begun yet.
function _M.keeping(hub)
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
--
-- nginx reuses the coroutine of a finished request, a killed one's too, for
-- a later request: a coroutine found killed is marked with its request's
-- ngx.ctx (w.ctx, see request), and the mark counts for that request only;
-- a call begun on the coroutine clears it.

-- coroutine -> the ngx.ctx of its request found killed (weak both ways: a
-- mark outlives neither the coroutine nor the killed request's ctx)
local gone_cos = setmetatable({}, { __mode = "kv" })

local function ngx_ctx() return ngx.ctx end

--- The running request's ngx.ctx (one per request: its light threads share
--- it; a timer has its own), which no later request has; or nil where
--- there is none.
function _M.request()
    local ok, ctx = pcall(ngx_ctx)
    return ok and ctx or nil
end

--- Coroutine co begins a call: it is not (or no longer) the killed request
--- it was marked for.
function _M.running(co)
    if co then gone_cos[co] = nil end
end

local function granted(r)
    return r.op == OP_ACQUIRE and r.status == STATUS_OK
end

-- Nobody will take r, the result of w's operation.
local function orphaned(hub, w, r)
    if granted(r) and w.resource then release_orphan(hub, w.resource, ffi_string(r.value), r.slot) end
end

-- The request of coroutine co (of ngx.ctx ctx) is gone: results of its
-- other operations that came in before and are not taken never will be.
local function forsake(hub, co, ctx)
    local waiters = hub.waiters
    for id, w in pairs(waiters) do
        if w.co == co and w.ctx == ctx and w.done then
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
        if co and gone_cos[co] ~= w.ctx then
            gone_cos[co] = w.ctx
            forsake(hub, co, w.ctx)
        end
        return true
    end
    return w.co ~= nil and w.ctx ~= nil and gone_cos[w.co] == w.ctx
end

--- Hand every finished operation to the call waiting for it. Pure engine
--- work, no I/O: any coroutine of the worker may do it.
function _M.deliver(hub)
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

--- Fail every call still waiting (the hub is stopping or broke); one whose
--- result is in takes it as it is.
function _M.fail_waiters(hub, why)
    for id, w in pairs(hub.waiters) do
        if not w.done and gone(hub, w) then
            hub.waiters[id] = nil
        elseif not w.done then
            w.err, w.done, w.done_at = why, true, hub.now
            w.sema:post(1)
        end
    end
end

-- Was w's result handed over long ago to a call that never woke to take it?
local function unclaimed(w, now)
    return w.waiting and now - w.done_at > UNCLAIMED_MS and w.sema:count() > 0
end

--- Results whose call is gone (killed while it waited, and not seen to be:
--- say, between its wake-up and its turn to run) are dropped: a result
--- handed to a waiting call that has not woken within UNCLAIMED_MS, any
--- result not taken within STALE_MS; a lock one grants is released.
function _M.sweep(hub, now)
    local waiters = hub.waiters
    for id, w in pairs(waiters) do
        if w.done and (now - w.done_at > STALE_MS or unclaimed(w, now)) then
            waiters[id] = nil
            if w.err == nil then orphaned(hub, w, w.res) end
        end
    end
end

return _M
