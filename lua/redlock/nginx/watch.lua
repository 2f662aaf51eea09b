-- redlock.nginx.watch: hand-off on the hub, a thin driver of the engine's
-- subscriptions (rl_engine_watch and the rest: redlock.h, "Hand-off").
--
-- Calls that wait for a lock watch their resource on the hub's engine
-- (refcounted per hub: the engine subscribes on every node, over the
-- subscriber links the loop drives like any other, and counts the release
-- messages it hears). Each call sleeps on a semaphore of its own; after
-- every read of a subscriber link, the watches that heard a release post the
-- semaphores of the calls asleep on them. A node down, refusing AUTH or
-- SUBSCRIBE, or sending what the engine drops costs its wake-ups only: the
-- engine connects again after its backoff, and waiters poll as the retry
-- policy says.
--
-- A watch counts who holds it: the waits that watch, each by the holder
-- table it passes (redlock.wait: one per wait, held by the wait's frame;
-- not by coroutine, which nginx reuses for a later request, a killed
-- one's too; nor by ngx.ctx, which user code may replace). A request
-- killed while it waited never unwatches; once the garbage collector has
-- collected its wait's holder, the hub's sweep (sweep_watches) takes its
-- holds off, and the last one ends the watch. Else the hub would
-- listen on for it until idle, which a busy worker never is: the nodes
-- would keep the worker's place in their queues, and a release would wake
-- the worker, where nobody waits, instead of the next waiter; a
-- semaphore's node would keep a free slot for it.
--
-- Here: the hub's side (post_heard, sweep_watches, forget_watches) and
-- the client's methods of the transport contract that hand-off needs
-- (methods: watch, unwatch, unwatch_won, heard, listeners, sleep_until,
-- waiting, first, pass_turn, slot_taken, slots_held, listening;
-- redlock.nginx.client takes them), and hand_off, which a release of the
-- worker calls.

local C = require("redlock.cdefs").lib
local calls = require "redlock.nginx.calls"
local semaphore = require "ngx.semaphore"

local ffi_new = require("ffi").new
local now_ms = C.rl_now_ms
local pairs, type, math_max, setmetatable = pairs, type, math.max, setmetatable
local phase_refusal, start, wake = calls.phase_refusal, calls.start, calls.wake

local int_out = ffi_new("int[1]")

-- How long a waiter awake in line (see methods:first), or woken and not
-- yet resumed, counts as waiting without a sign of life: longer than an
-- attempt takes.
local AWAKE_MS = 1000

local _M = {}

local watching -- (the client's side)

-- Holds given no holder table (a caller outside redlock.wait) count as
-- this one's, which is never collected.
local ANYONE = {}

---------------------------------------------------------------------------
-- the hub's side

-- The requests asleep on watch c: c.sleepers[sema] = when its request
-- began to wait (the `since` its sleep_until was given) while it is
-- registered; c.posted[sema] = when a message woke it (its count 0 until
-- it resumes); c.outside[sema] = true for a call asleep outside the line
-- (lock_many, asleep on every watch of its client, or a fenced or shared
-- lock: none of them queues on the nodes, and none takes a wake-up meant
-- for the line). A
-- semaphore with count 0 that nobody posted belongs to a request that was
-- killed asleep (client abort, ngx.exit from another thread), one posted
-- that has not resumed AWAKE_MS later to a request killed in between;
-- either is dropped, so that it swallows no wake-up.
local function asleep(c, sema, t0)
    local posted = c.posted[sema]
    if posted then return t0 - posted < AWAKE_MS end
    return sema:count() < 0
end

local function drop(c, sema)
    c.sleepers[sema], c.posted[sema], c.outside[sema] = nil, nil, nil
end

-- Wake the request asleep on watch c that has waited longest, unless one
-- woken before has yet to resume: the worker is one waiter in the nodes'
-- queues, whose turn goes to its requests in the order they began to wait.
-- (A call asleep outside the line is not one of them.) another: a slot of
-- a semaphore was freed, room for one more than those woken already, so
-- the oldest not yet woken is. Whether one was woken.
local function wake_oldest(c, another)
    local t0, oldest, since = now_ms(), nil, nil
    for sema, t in pairs(c.sleepers) do
        if not asleep(c, sema, t0) then
            drop(c, sema)
        elseif not c.outside[sema] then
            if c.posted[sema] then
                if not another then return false end
            elseif oldest == nil or t < since then
                oldest, since = sema, t
            end
        end
    end
    if oldest == nil then return false end
    oldest:post(1)
    c.posted[oldest] = t0
    return true
end

-- Watch c heard a release: wake whoever sleeps on it. broadcast: on the
-- resource's channel, whose message is the number of connections that
-- listened (this worker's is one); with the requests asleep here, that is
-- how many waiters compete, and all are woken. Otherwise only on the hub's
-- wake channel (the hub was the oldest in a node's queue): one request is
-- woken, alone, the one that has waited longest (wake_oldest).
local function wake_sleepers(hub, c, broadcast)
    if not broadcast then
        wake_oldest(c)
        c.listeners = 1
        return
    end
    local n, t0 = 0, now_ms()
    for sema in pairs(c.sleepers) do
        if not asleep(c, sema, t0) then
            drop(c, sema)
        else
            n = n + 1
            if not c.posted[sema] then
                sema:post(1)
                c.posted[sema] = t0
            end
        end
    end
    local said = C.rl_engine_heard_listeners(hub.e, c.resource, #c.resource)
    c.listeners = said - 1 + math_max(n, 1)
end

-- Whether the request asleep on sema (hub.sleeping's record rec) still is:
-- waiting on it, or posted less than AWAKE_MS ago and not yet resumed. One
-- killed asleep is neither.
local function still_asleep(rec, sema, t0)
    if sema:count() < 0 then return true end
    local on = rec.on
    for k = 1, #on do
        local posted = on[k].posted[sema]
        if posted and t0 - posted < AWAKE_MS then return true end
    end
    return false
end

--- A call of the worker began the release of resource (value: the value
--- of the semaphore's slot it releases, else nil) on hub's engine. The
--- slot is no longer the worker's (see slot_taken). The request of the
--- worker that has waited longest for resource, if one is asleep in line,
--- is woken now: the attempt it makes goes to every node behind the
--- release, on the same connections, so each node has freed what it asks
--- for. Each slot released wakes one more (several holders' holds often
--- end in the same tick of nginx's timers). Woken by the nodes' messages
--- instead, it would attempt two trips later (the release's, then the
--- messages'), and a semaphore's waiter after a quorum of them. So this
--- counts as a quorum of messages heard on its watch (handed), and its
--- waiters as one (listeners): the woken request neither waits for more
--- nor spreads out its attempt. Whose turn it is stays the nodes' to
--- say, for a semaphore and a plain lock alike: a waiter elsewhere ahead of
--- the worker in their queues still gets the slot or the lock, and this
--- attempt is refused (docs/waiting.md, "Whose turn it is").
function _M.hand_off(hub, resource, value)
    if value ~= nil then _M.forget_slot(hub, resource, value) end
    local c = hub.chans[resource]
    if c == nil or not wake_oldest(c, value ~= nil) then return end
    c.handed = c.handed + hub.quorum
    c.listeners = 1
end

--- The worker's request no longer holds the slot of value of the semaphore
--- resource (see slot_taken): its release began, or the engine releases
--- it (a kept lock dropped). Safe anywhere, a finalizer included.
function _M.forget_slot(hub, resource, value)
    local held = hub.slots_held[resource]
    if held then held[value] = nil end
end

-- How many slots of the semaphore r the worker's requests still hold at
-- t0 (see slot_taken); those whose validity has ended are forgotten.
local function slots_still_held(hub, r, t0)
    local held = hub.slots_held[r]
    if held == nil then return 0 end
    local n = 0
    for value, until_ms in pairs(held) do
        if until_ms > t0 then n = n + 1 else held[value] = nil end
    end
    if n == 0 then hub.slots_held[r] = nil end
    return n
end

--- When the last request still asleep on hub's watches wakes at the
--- latest (rl_now_ms; 0 when none is): what holds the hub, idle or in an
--- exiting worker, for them. Requests killed asleep do not count, and are
--- forgotten.
function _M.sleep_horizon(hub)
    local horizon, t0 = 0, now_ms()
    local sleeping = hub.sleeping
    for sema, rec in pairs(sleeping) do
        if not still_asleep(rec, sema, t0) then
            sleeping[sema] = nil
        elseif rec.until_ > horizon then
            horizon = rec.until_
        end
    end
    return horizon
end

--- After a read of a subscriber link: wake the requests asleep on watches
--- that heard a release.
function _M.post_heard(hub)
    local e, watches = hub.e, hub.watches
    while true do
        local id = C.rl_engine_heard_next(e, int_out)
        if id < 0 then return end
        local c = watches[id]
        if c then wake_sleepers(hub, c, int_out[0] ~= 0) end
    end
end

-- End hub's watch c (nobody holds it now) with unwatch (rl_engine_unwatch,
-- or rl_engine_unwatch_won: lingering).
local function end_watch(hub, c, unwatch)
    local r = c.resource
    hub.chans[r], hub.watches[c.id] = nil, nil
    unwatch(hub.e, r, #r, now_ms())
    wake(hub)
end

--- Take off the holds of waits that are gone (their holders collected: see
--- the top), end the watches nobody else holds, forget the requests
--- killed asleep, and the slots taken whose validity has ended (released
--- otherwise than by a call of the worker: a lock dropped or lost, or
--- released for a request that is gone). The hub's loop calls it now and then.
function _M.sweep_watches(hub)
    _M.sleep_horizon(hub)
    local t0 = now_ms()
    for r in pairs(hub.slots_held) do slots_still_held(hub, r, t0) end
    for _, c in pairs(hub.chans) do
        local held = 0
        for _, h in pairs(c.holders) do held = held + h.n end
        if held < c.refs then
            c.refs = held
            -- each client's count of its watches of the resource, anew
            local r = c.resource
            for client in pairs(c.clients) do
                local n = 0
                for _, h in pairs(c.holders) do
                    if h.client == client then n = n + h.n end
                end
                watching(client)[r] = n > 0 and n or nil
            end
            if held == 0 then end_watch(hub, c, C.rl_engine_unwatch) end
        end
    end
end

--- The hub's engine's counts into out (an rl_stats), with the waiters as the
--- worker's waits count them: the engine watches a resource once for all of
--- the worker's requests that wait for it, and counts watches, not waits.
function _M.stats(hub, out)
    C.rl_engine_stats(hub.e, out)
    local n = 0
    for _, c in pairs(hub.chans) do n = n + c.refs end
    out.waiters = n
end

--- The hub stopped for good (idle, the worker exiting): whatever was still
--- watched is forgotten (a call killed while it waited never unwatches).
function _M.forget_watches(hub)
    local e, now = hub.e, now_ms()
    for resource in pairs(hub.chans) do C.rl_engine_unwatch(e, resource, #resource, now) end
    hub.chans, hub.watches, hub.epoch = {}, {}, hub.epoch + 1
end

---------------------------------------------------------------------------
-- the client's side (self: a redlock.nginx.client). Resource nil
-- (lock_many): every resource this client watches, counted together.

local methods = {}
_M.methods = methods

local free_semas = {}

local function name_of(resource, len)
    return len ~= #resource and resource:sub(1, len) or resource
end

-- This client's watches (resource -> count), as of the hub's epoch: a hub
-- that stopped for good forgot every watch, and so does the client.
function watching(self)
    local hub = self.hub
    if self.epoch ~= hub.epoch then self.watched, self.epoch = {}, hub.epoch end
    return self.watched
end

local WEAK_KEYS = { __mode = "k" }

function methods:watch(resource, len, holder)
    if phase_refusal() then return 0 end
    local hub = self.hub
    if start(hub) then return 0 end -- no timer: the waiter polls
    local mine = watching(self)
    local r = name_of(resource, len)
    local c = hub.chans[r]
    if c == nil then
        local id = C.rl_engine_watch(hub.e, r, #r, now_ms())
        if id < 0 then return 0 end -- out of memory: the waiter polls
        -- holders[holder] = { n = its holds, client = its client }; clients: every client that held it
        c = { id = id, resource = r, refs = 0, listeners = 0, handed = 0, sleepers = {}, posted = {}, outside = {}, line = {},
              holders = setmetatable({}, WEAK_KEYS), clients = setmetatable({}, WEAK_KEYS) }
        hub.chans[r], hub.watches[id] = c, c
        wake(hub) -- the loop subscribes (and connects the subscriber links)
    end
    c.refs = c.refs + 1
    mine[r] = (mine[r] or 0) + 1
    local who = holder or ANYONE
    local h = c.holders[who]
    if h then h.n = h.n + 1 else c.holders[who] = { n = 1, client = self } end
    c.clients[self] = true
    return 0
end

-- One watch of resource fewer; the last one ends the hub's watch with
-- unwatch (see end_watch). A caller whose hold is not there any more (the
-- hub forgot its watches, or the sweep took its holds off) has none to end.
local function unwatch_with(self, resource, len, holder, unwatch)
    local hub = self.hub
    local mine = watching(self)
    local r = name_of(resource, len)
    local c = hub.chans[r]
    if c == nil then return end
    local who = holder or ANYONE
    local h = c.holders[who]
    if h == nil then return end
    h.n = h.n - 1
    if h.n == 0 then c.holders[who] = nil end
    local k = mine[r]
    if k then mine[r] = k > 1 and k - 1 or nil end
    c.refs = c.refs - 1
    if c.refs <= 0 then end_watch(hub, c, unwatch) end
end

function methods:unwatch(resource, len, holder)
    unwatch_with(self, resource, len, holder, C.rl_engine_unwatch)
end

function methods:unwatch_won(resource, len, holder)
    unwatch_with(self, resource, len, holder, C.rl_engine_unwatch_won)
end

-- The releases heard on the hub's watch of r: the engine's count of the
-- nodes' messages, and the worker's own releases handed off (hand_off).
local function heard_on(hub, r)
    local c = hub.chans[r]
    return C.rl_engine_heard(hub.e, r, #r) + (c and c.handed or 0)
end

function methods:heard(resource, len)
    local hub = self.hub
    if resource == nil then
        local total = 0
        for r in pairs(watching(self)) do total = total + heard_on(hub, r) end
        return total % 4294967296
    end
    return heard_on(hub, name_of(resource, len)) % 4294967296
end

-- A request of the worker took slot value of the semaphore resource, valid
-- until until_ms (rl_now_ms). The worker counts its slots by value until
-- their release begins (hand_off) or their validity ends (a lock dropped
-- or lost without one): only to know how many of its waiters to let
-- attempt, never whether it may hold one.
function methods:slot_taken(resource, len, value, until_ms)
    local hub, r = self.hub, name_of(resource, len)
    local held = hub.slots_held[r]
    if held == nil then
        held = {}
        hub.slots_held[r] = held
    end
    held[value] = until_ms
end

-- How many slots of the semaphore resource the worker's requests hold, as
-- far as it knows (slot_taken).
function methods:slots_held(resource, len)
    return slots_still_held(self.hub, name_of(resource, len), now_ms())
end

-- The waiters that competed for the last release heard of resource (nil:
-- the most over what this client watches); 0 when unknown.
function methods:listeners(resource, len)
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
-- was read either shows in the count here or posts the semaphore. since:
-- when the request, one in the line, began to wait (rl_now_ms), which
-- orders the line's sleepers for the wake-ups meant for one (wake_oldest);
-- nil for a call outside the line, which such wake-ups pass by.
function methods:sleep_until(resource, len, seen, ms, since)
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
    -- (the hub stays for it until then, unless it is killed asleep: see sleep_horizon)
    hub.sleeping[sema] = { until_ = now_ms() + ms, on = list }
    local line = resource ~= nil and since and list[1].line
    local outside = since == nil or nil
    since = since or now_ms()
    for k = 1, #list do list[k].sleepers[sema], list[k].outside[sema] = since, outside end
    if line then line[since] = sema end
    sema:wait(ms / 1000)
    hub.sleeping[sema] = nil
    for k = 1, #list do drop(list[k], sema) end
    if line then line[since] = now_ms() + AWAKE_MS end
    -- posted as the wait timed out, or by more than one channel: drain it
    while sema:count() > 0 do sema:wait(0) end
    free_semas[#free_semas + 1] = sema
    return self:heard(resource, len) ~= seen and 1 or 0
end

-- The requests of the worker (every client on this hub) that wait for one
-- resource share its place in the nodes' queues (the hub's waiter id), and
-- take it in the order they began to wait: c.line[since] for each, by when
-- it began, is the semaphore it sleeps on, or while it is awake (it
-- attempts, or sleeps out a jitter) until when it counts as waiting
-- without a sign of life. One killed asleep shows in its semaphore, one
-- killed awake (or woken, before it resumed) once AWAKE_MS have passed;
-- either then leaves the line.
--   waiting    how many watch the resource now
--   first      whether none in line began before since: the one whose
--              attempts use the place (the caller counts as awake); for a
--              semaphore, room: how many may attempt together (the slots
--              the worker does not hold), and whether none asleep began
--              before since and fewer than room awake did
--   pass_turn  the one of since stopped waiting (it took the resource, or
--              gave up): it leaves the line, and the one asleep that has
--              waited longest is woken (an acquire that won took the
--              worker out of the queues, and that one takes its own place
--              there at once, rather than at its policy's next attempt).
--              quiet: nobody is woken (the worker took the last slot it
--              could hold: an attempt now would only be refused, and the
--              worker's own next release wakes the next, see hand_off)
function methods:waiting(resource, len)
    local c = self.hub.chans[name_of(resource, len)]
    return c and c.refs or 0
end

function methods:first(resource, len, since, room)
    local c = self.hub.chans[name_of(resource, len)]
    if c == nil then return true end
    local line, t0, awake = c.line, now_ms(), 0
    line[since] = t0 + AWAKE_MS
    for t, v in pairs(line) do
        if t < since then
            if type(v) == "number" and v > t0 then
                awake = awake + 1
            elseif type(v) ~= "number" and asleep(c, v, t0) then
                return false
            else
                line[t] = nil
            end
        end
    end
    return awake < (room or 1)
end

function methods:pass_turn(resource, len, since, quiet)
    local c = self.hub.chans[name_of(resource, len)]
    if c == nil then return end
    c.line[since] = nil
    if not quiet then wake_oldest(c) end
end

function methods:listening()
    return C.rl_engine_listening(self.hub.e)
end

return _M
