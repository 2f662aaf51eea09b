-- redlock.nginx.keep: kept locks inside nginx, a thin driver of the engine's
-- keep-alive (rl_engine_keep_*: redlock.h, "Keep-alive", the same rules as
-- rl_keeper's), and the keeper object of the transport contract
-- (backend.lua).
--
-- Kept locks are extended by the hub, not by an ngx.timer each: nginx
-- allows lua_max_pending_timers of those per worker, and one left pending
-- after an unlock counts until it fires. rl_engine_deadline counts the
-- schedule, rl_engine_advance begins the extensions due as ordinary rounds
-- (they go out with whatever else was begun in that turn), and their
-- results stay in the engine. The hub runs while the engine keeps locks
-- (rl_engine_keeping), and knows which request or timer kept each one
-- (hub.owners: by with_lock's frame for its lock, which the request cannot
-- replace; else by the ngx.ctx it had when it kept it), for an exiting worker.
--
-- A keeper (one per redlock client) names its kept locks by id; the hub of
-- its client extends them, together with every other keeper's of the same
-- configuration, for as long as the worker runs. When the worker exits
-- (reload, stop), the hub keeps extending them while their requests run on:
-- nothing is released under a request, and nothing lapses unseen.

local ffi = require "ffi"
local C = require("redlock.cdefs").lib
local calls = require "redlock.nginx.calls"
local watch = require "redlock.nginx.watch"

local ngx = ngx
local ffi_string, ffi_new, ffi_copy = ffi.string, ffi.new, ffi.copy
local now_ms = C.rl_now_ms
local pairs, pcall, type, setmetatable = pairs, pcall, type, setmetatable
local phase_refusal, start, wake = calls.phase_refusal, calls.start, calls.wake

local RL_OK, RL_ERR, STATUS_OK = C.RL_OK, C.RL_ERR, C.RL_STATUS_OK

local _M = {}

--- The worker exits: a kept lock whose owner (the request or timer that
--- kept it, by with_lock's frame or its ngx.ctx, which end with it) has ended
--- and been collected is not extended any more, so that it cannot hold the
--- worker up (one left in a module-level table, say). It is not released
--- either: it stays held until its validity less the margin runs out, then
--- lost (rl_engine_keep_lapse).
function _M.forget_unowned(hub)
    local kept, owners = hub.kept, hub.owners
    for id in pairs(kept) do
        if owners[id] == nil then
            kept[id] = nil
            C.rl_engine_keep_lapse(hub.e, id)
        end
    end
end

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
    return self:add_slot(resource, len, 0, value, ttl, valid_until, margin, errbuf, errlen)
end

function keeper:add_slot(resource, len, slot, value, ttl, valid_until, margin, errbuf, errlen)
    local hub = self.hub
    local why = start(hub)
    if why then
        ffi_copy(errbuf, why:sub(1, errlen - 1))
        return RL_ERR
    end
    local e = hub.e
    local before = C.rl_engine_deadline(e)
    local id = C.rl_engine_keep_add_slot(e, resource, len, slot, value, ttl, valid_until, margin, now_ms())
    if id < 0 then
        ffi_copy(errbuf, ffi_string(C.rl_engine_errstr(e)):sub(1, errlen - 1))
        return RL_ERR
    end
    -- the strings: for release_entry (interned already: the lock object has them)
    self.entries[id] = (type(resource) == "string" and len == #resource) and resource or ffi_string(resource, len)
    self.values[id] = type(value) == "string" and value or ffi_string(value)
    self.slots[id] = slot
    hub.kept[id], hub.owners[id] = true, owner()
    local at = C.rl_engine_deadline(e)
    if before < 0 or at < before then wake(hub) end -- the hub may sleep past it
    return id
end

-- Owner who (nil: the request or timer running, by its ngx.ctx) holds
-- kept lock id: an exiting worker goes on extending it while who lives
-- (see forget_unowned).
function keeper:own(id, who)
    if self.entries[id] then self.hub.owners[id] = who or owner() end
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
    self.entries[id], self.values[id], self.slots[id] = nil, nil, nil
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
-- hub was doing when the finalizer ran. No timer is started or woken here:
-- a finalizer also runs while the worker's Lua state is being closed
-- (reload, quit), where ngx.timer.at crashed the worker. The hub runs while
-- it keeps a lock, and releases this one within its slice (HUB_SLICE_MS).
function keeper:drop(id)
    local hub = self.hub
    -- (a guard's finalizer after the engine's, as the worker's Lua state closes)
    if not self.entries[id] or not hub.alive.on then return RL_ERR end
    -- a semaphore's slot: the worker's waiters may attempt again
    if self.slots[id] > 0 then watch.forget_slot(hub, self.entries[id], self.values[id]) end
    forget(self, id)
    return C.rl_engine_keep_drop(hub.e, id, now_ms())
end

-- Release entry id, here if this phase has cosockets, else from the hub.
-- 1 if a quorum released it here, else 0.
function keeper:release_entry(id)
    if not self.entries[id] then return 0 end
    if phase_refusal() then
        self:drop(id)
        pcall(poke, self.hub) -- not a finalizer: the hub may release it now
        return 0
    end
    local resource, value, slot = self.entries[id], self.values[id], self.slots[id]
    self:remove(id)
    local rc
    if slot > 0 then rc = self.client:on_slot(C.RL_OP_RELEASE, resource, #resource, slot, value, 0, self.result)
    else rc = self.client:release(resource, #resource, value, self.result) end
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
keeper.close = keeper.free

--- The keeper of client d (a redlock.new table): its kept locks are
--- extended by the hub of d's client while the worker runs.
function _M.keeper_new(d)
    return setmetatable({ client = d.client, hub = d.client.hub, entries = {}, values = {}, slots = {},
                          result = ffi_new("rl_result") }, keeper_mt)
end

return _M
