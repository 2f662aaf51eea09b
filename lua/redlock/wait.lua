-- redlock.wait: waiting for a lock. The attempts of lock and lock_many
-- under their retry policy and `wait`, the sleeps between them, and
-- hand-off: a waiter listens for releases of what it waits for and wakes
-- when one is heard (redlock.h, "Hand-off"), and a releaser that waiters
-- heard gives them a head start before it locks the same resource again.

local C = require("redlock.cdefs").lib
local check = require "redlock.check"
local hooks = require "redlock.hooks"
local results = require "redlock.results"
check.ours()

local floor, ceil = math.floor, math.ceil
local type, pcall, error, pairs = type, pcall, error, pairs
local raise, show, live_client = check.raise, check.show, check.live_client
local now = C.rl_now_ms
local on = hooks.on
local MAX_MS = check.MAX_MS

local _M = {}

-- What a waiter listens to is its resource (a string), or for lock_many
-- resources of the list, counted together (rl_heard(NULL)): at most
-- WATCH_MANY of them (the one that refused the last attempt first), since
-- each watch costs its client a lookup among the others. holder:
-- a table of this wait's own, which its unwatch passes too (a transport
-- may tell by it that a waiter killed in between will never unwatch).
local function watch(client, a, holder)
    if type(a) == "string" then
        client:watch(a, #a, holder)
    else
        for i = 1, #a do client:watch(a[i], #a[i], holder) end
    end
end

-- linger: a semaphore's wait took its slot, and left the nodes' queues;
-- its subscription lingers for the next wait (rl_unwatch_won). A wait that
-- failed may still be queued somewhere, and unsubscribes at once. A lock's
-- does too: a releaser that locks again at once owes the waiter its release
-- woke a head start, and a lingering subscription would hear that release's
-- own broadcast from the slower nodes and end the head start at once.
local function unwatch(client, a, linger, holder)
    local method = linger and client.unwatch_won or client.unwatch
    if type(a) == "string" then
        method(client, a, #a, holder)
    else
        for i = 1, #a do method(client, a[i], #a[i], holder) end
    end
end

local WATCH_MANY = 64

-- The resources a waiter of a (after an attempt refused on detail) listens to.
local function listened(a, detail)
    if type(a) == "string" or #a <= WATCH_MANY then return a end
    local t, refused = {}, detail and detail.resource
    if type(refused) == "string" then t[1] = refused end
    for i = 1, #a do
        if #t >= WATCH_MANY then break end
        if a[i] ~= refused then t[#t + 1] = a[i] end
    end
    return t
end

local function heard(client, a)
    if type(a) == "string" then return client:heard(a, #a) end
    return client:heard(nil, 0)
end

-- Whether a waiter of kind for a stands in its client's line of waiters of
-- a (see retries): it waits for one resource, with notifications on, as a
-- kind that queues on the nodes under the client's waiter id.
local function lined(d, kind, a)
    return d.notify and kind.queued ~= nil and type(a) == "string"
end

-- The sleeps between attempts, between the host's sleeping() and awake()
-- (redlock.hooks; the retry policy's call too: policy_delay): ms, or (sleep_until) up to ms or until a release of a is
-- heard since seen (1 then, else 0). since: when the waiter began to wait,
-- for a waiter in its client's line (nil otherwise); of the line's waiters
-- asleep, a wake-up meant for one goes to the one that has waited longest
-- (nginx: many requests wait on one worker's client).
local function nap(client, ms)
    local f = on.sleeping
    if f then f() end
    client:sleep(ms)
    f = on.awake
    if f then f() end
end

local function sleep_until(client, a, seen, ms, since)
    local f = on.sleeping
    if f then f() end
    local woke
    if type(a) == "string" then
        woke = client:sleep_until(a, #a, seen, ms, since)
    else
        woke = client:sleep_until(nil, 0, seen, ms, since)
    end
    f = on.awake
    if f then f() end
    return woke
end

-- The delay a policy returned after attempt n, as whole ms; nil to give up.
-- A policy is the caller's code: what it raises passes through, and a delay
-- that is not a number of ms the core can sleep is misuse, raised at the
-- caller of lock. The policy runs between attempts, so between the host's
-- sleeping() and awake() as the sleeps do: it may take its time, or yield
-- its coroutine and never be resumed (awake() is not called when it raises;
-- acquired() follows).
local function policy_delay(policy, n, err, detail)
    local f = on.sleeping
    if f then f() end
    local delay = policy(n, err, detail)
    f = on.awake
    if f then f() end
    if not delay then return nil end
    if type(delay) == "number" and delay >= 0 and delay <= MAX_MS then return floor(delay) end
    raise(("bad retry policy: after attempt %d it returned %s (expected nil or a number of ms from 0 to %d)")
        :format(n, show(delay), MAX_MS))
end

-- After a wake-up, a uniform whole delay of 0 to span-1 ms, span = the
-- waiters that listened for the release (its message says), at most this:
-- waiters woken by one release spread out instead of splitting the votes
-- among them, and a lone waiter goes at once. In the harness's hand-off
-- workload (8 waiters, 1 ms holds) 0-1 ms gave 320/s with a p50 of 1.2 ms,
-- none 230/s and 1.8 ms, 0-3 ms 400/s and 0.87 ms, 0-5 ms 380/s and 1.0 ms.
local WAKE_JITTER_MS = 4

local function wake_jitter(client, a)
    local span = type(a) == "string" and client:listeners(a, #a) or client:listeners(nil, 0)
    if span == 0 or span > WAKE_JITTER_MS then span = WAKE_JITTER_MS end
    local ms = floor(C.rl_random() * span)
    if ms > 0 then nap(client, ms) end
end

-- Sleep until by (rl_now_ms), whatever is heard meanwhile. since: as for
-- sleep_until; a waiter in its client's line sleeps as one of it (a nap
-- would not keep its place there: after a while, the line takes it for
-- gone, and a newer waiter for the first).
local function sleep_out(client, a, by, since)
    local left = floor(by - now())
    if since == nil then
        if left > 0 then nap(client, left) end
        return
    end
    while left > 0 do
        sleep_until(client, a, heard(client, a), left, since)
        left = floor(by - now())
    end
end

-- A semaphore's waiter woken by a release hears it from every node that
-- gives it the turn, each once that node has freed the slot; a node that
-- has not yet would refuse it. So it waits, at most this many ms, until it
-- has heard a quorum of them (since seen) before it attempts.
local QUORUM_OF_WAKES_MS = 2

local function quorum_of_wakes(client, a, seen, quorum, since)
    local by, h = now() + QUORUM_OF_WAKES_MS, heard(client, a)
    while (h - seen) % 4294967296 < quorum do
        local left = ceil(by - now())
        if left <= 0 or sleep_until(client, a, h, left, since) ~= 1 then return end
        h = heard(client, a)
    end
end

-- A releaser that locks the same resource again at once would nearly always
-- beat the waiter its release woke: that waiter first sleeps its 0-3 ms, then
-- needs a round. A release that a waiter heard (the script answers 2, counted
-- in rl_result.heard) therefore marks its resource, and a lock of it by the
-- same client within this many ms first waits out the rest (a release heard
-- meanwhile ends the wait, as for any waiter). Two processes that lock again
-- as soon as they unlock: 16% of the releases went to the other one without
-- it, ~100% with it. Without waiters a release is not marked, and costs nothing.
local HEAD_START_MS = 2 * WAKE_JITTER_MS

-- A head start that nobody used (it ran out with no release heard, and the
-- releaser's attempt then found the resource free) was wasted: a subscriber
-- that listens and never asks (a stopped waiter's process) makes every
-- release heard, and without this a client that locks the resource again at
-- once would wait out every head start, 8 ms a lock. After a wasted one, the
-- client's next releases of the resource give none: 1, then 2, 4, ... up to
-- HEAD_START_SKIPS_MAX after wastes in a row. One used (a release heard
-- during it, or the resource found busy after it) ends that.
local HEAD_START_SKIPS_MAX = 64

--- Client d released resource, and waiters heard it: mark it, unless a
--- wasted head start says to skip this one.
function _M.mark_head_start(d, resource)
    local skip = d.head_start_skips[resource]
    if skip and skip.left > 0 then
        skip.left = skip.left - 1
        return
    end
    local marks, t = d.head_starts, now()
    if d.head_start_n >= 64 then -- forget the marks that ran out (resources not locked again)
        local n = 0
        for r, until_ms in pairs(marks) do
            if until_ms <= t then marks[r] = nil else n = n + 1 end
        end
        d.head_start_n = n
    end
    if marks[resource] == nil then d.head_start_n = d.head_start_n + 1 end
    marks[resource] = t + HEAD_START_MS
end

-- The latest head start that a (list of) resource(s) still owes, and the
-- resources that owe one (a list); their marks go.
local function head_start_owed(d, a)
    if d.head_start_n == 0 then return 0 end
    local marks, until_ms, owing = d.head_starts, 0, nil
    for i = 1, type(a) == "string" and 1 or #a do
        local r = type(a) == "string" and a or a[i]
        local u = marks[r]
        if u then
            marks[r], d.head_start_n = nil, d.head_start_n - 1
            if u > until_ms then until_ms = u end
            owing = owing or {}
            owing[#owing + 1] = r
        end
    end
    return until_ms - now(), owing
end

-- The head start that the resources in owing waited out was used (true),
-- wasted (false), or neither can be told (nil: the attempt after it failed
-- other than busy, or was not made).
local function head_start_ended(d, owing, used)
    if owing == nil or used == nil then return end
    local skips = d.head_start_skips
    for _, r in ipairs(owing) do
        local skip = skips[r]
        if used then
            if skip then skips[r], d.head_start_skip_n = nil, d.head_start_skip_n - 1 end
        elseif skip then
            skip.left, skip.next = skip.next, math.min(2 * skip.next, HEAD_START_SKIPS_MAX)
        else
            if d.head_start_skip_n >= 64 then -- forget them all: the worst is one head start more each
                skips = {}
                d.head_start_skips, d.head_start_skip_n = skips, 0
            end
            skips[r], d.head_start_skip_n = { left = 1, next = 2 }, d.head_start_skip_n + 1
        end
    end
end

-- Whether the attempt that followed a head start says it was used: a lock
-- taken, wasted; refused busy, used; anything else, unknown.
local function used_by_outcome(got, err)
    if got then return false end
    if err == "busy" then return true end
    return nil
end

-- Attempts on wake-ups in each WAKE_WINDOW_MS of a delay of the policy, at
-- most: a release heard after that is attempted on once the window is
-- over. Anyone who may publish on a node can send messages that look like
-- ours; this bounds what a flood of them costs (this many attempts a
-- window), while a waiter that keeps losing real hand-offs still gets this
-- many tries a window. Per window, not per delay: attempts that fail in a
-- burst (a semaphore's waiters whose nodes do not agree yet undo what they
-- got, and each undo wakes the queue again) used up a delay's wake-ups in
-- milliseconds, and with retry.fixed(2000) every waiter then slept out its
-- 2 s while slots were free (docs/semaphore.md).
local WAKE_ATTEMPTS = 4
local WAKE_WINDOW_MS = 100

-- A waiter: one lock call between its attempts, made once its first attempt
-- failed or when a head start is owed before it.
--   d, client     the client (a redlock.new table) and its transport's client
--   kind          how to attempt: kind.try(d, client, a, b) makes one attempt
--                 (a lock, or nil, err, detail); kind.queued, if set, the
--                 same as a waiter that joins the nodes' queues (a
--                 semaphore's, kind.slots set, also takes the waiter's
--                 ticket: rl_wall_ms() when it began waiting, its place)
--   a, b          what an attempt takes: the resource (or list) and the ttl
--   policy        the retry policy; deadline: when the last attempt may
--                 start at the latest (rl_now_ms), or nil
--   since         when it began to wait (rl_now_ms), its order among the
--                 client's waiters of the same resource
--   err, detail   how the last attempt failed
local function waiter(d, client, kind, a, b, policy, deadline)
    return { d = d, client = client, kind = kind, a = a, b = b, policy = policy, deadline = deadline,
             since = now(), err = nil, detail = nil }
end

-- Run w's attempts under its policy, within its deadline if it has one. With
-- notifications on, the sleep between attempts ends early when a release of
-- the resource is heard: the count of releases heard is taken before each
-- attempt (for the first, when the watch begins, just after it), so one
-- heard during an attempt ends the next sleep at once; one missed costs a
-- poll interval. Attempts made on a wake-up are extra: the policy counts
-- those made after its delay, and WAKE_ATTEMPTS bounds them per delay.
-- Of a client's waiters of one resource, only the first (the one that has
-- waited longest) attempts: the nodes' queues hold the client once, by
-- its waiter id (redlock.h, "Hand-off"), and that place is the first's.
-- The others sleep on until they are first: each delay of their policy
-- that passes counts as an attempt that found the resource busy (so a
-- policy that gives up does, and its delays grow as after attempts), and
-- each sleep lasts 1 ms at least (a delay of 0 must still yield to the
-- first). The end of the first's wait wakes the next (watched_retries).
-- owed: a head start still owed (ms), before the first attempt; else the
-- first attempt has been made, and w.err, w.detail say how it failed.
local function retries(w, owed)
    local d, client, a, b, since = w.d, w.client, w.a, w.b, w.since
    local try, err, detail = w.kind.try, w.err, w.detail
    -- a semaphore's waiters hear the releases of every slot: as many
    -- wake-ups per slot as a lock's waiters get
    local wake_attempts = WAKE_ATTEMPTS * (w.kind.slots or 1)
    local n = 1
    local notify = d.notify
    local seen = notify and heard(client, a)
    local single, in_line = type(a) == "string", lined(d, w.kind, a)
    local fname = single and "lock" or "lock_many" -- (for the closed client's error)
    -- a semaphore's waiters of one client attempt together, as many as
    -- slots the client does not hold: none while its calls hold every slot
    -- (an attempt could only be refused; their releases wake the next, and
    -- a slot the client lost without a release stops counting when its
    -- validity ends)
    local slots = w.kind.slots
    local function first()
        if not in_line then return true end
        local room = slots and slots - client:slots_held(a, #a)
        if room and room <= 0 then return false end
        return client:first(a, #a, since, room or 1)
    end
    -- only a waiter in line sleeps as one (its place among the sleepers)
    local line_since = in_line and since or nil
    local got
    local tried = w.err ~= nil and not w.behind -- (an attempt made before the retries)
    local owing -- (resources whose head start is waited out below, until its attempt tells)
    if owed then
        if sleep_until(client, a, seen, ceil(owed), line_since) == 1 then
            wake_jitter(client, a)
            head_start_ended(d, w.owing, true)
        else
            owing = w.owing
        end
        seen = heard(client, a)
    end
    -- a waiter of one plain lock joins the queue at once, rather than after
    -- the first delay (not one with no time left: it would only leave its
    -- place in the nodes' queues behind). After a head start this is the
    -- first attempt: it is made.
    local queued = notify and w.kind.queued
    if queued then try = queued end
    local ticket = w.kind.slots and C.rl_wall_ms() or nil
    -- A waiter in line that gives up (its policy or its wait at an end)
    -- without ever having been first makes one attempt of its own first, so
    -- that it fails busy only when the nodes say so: the first may be
    -- sleeping out a long delay of its own policy past a lock that expired
    -- (no release to wake it).
    local function give_up()
        if not tried and in_line and d.client == client and (not slots or slots - client:slots_held(a, #a) > 0) then
            local last
            last, err, detail = try(d, client, a, b, ticket)
            if last then return last end
        end
        return nil, err, detail
    end
    local time_left = owed or w.deadline == nil or now() < w.deadline
    if (queued or owed) and time_left then
        if first() then
            tried = true
            got, err, detail = try(d, client, a, b, ticket)
            head_start_ended(d, owing, used_by_outcome(got, err))
            if got then return got end
        elseif err == nil then
            local _
            _, err, detail = results.refusal(d, "busy", "this client's calls hold every slot")
        end
    end
    while true do
        local delay = policy_delay(w.policy, n, err, detail)
        if not delay then return give_up() end
        -- closed by the policy, or by another coroutine while it yielded?
        live_client(d, fname)
        if delay < 1 and in_line and not first() then delay = 1 end
        if w.deadline then
            local left = w.deadline - now()
            if left <= 0 then return give_up() end
            if delay > left then delay = left end
        end
        if notify then
            -- a release heard within the delay earns an extra attempt that the
            -- policy does not count (a busy resource would otherwise use up
            -- its attempts in wake-ups), WAKE_ATTEMPTS of them a window at
            -- most; the policy's attempt comes when the delay has passed
            local wake_by, extra, window_end = now() + delay, 0, now() + WAKE_WINDOW_MS
            while true do
                local woke = sleep_until(client, a, seen, delay, line_since) == 1
                -- (the windows: WAKE_WINDOW_MS each from the delay's start)
                while now() >= window_end do extra, window_end = 0, window_end + WAKE_WINDOW_MS end
                if woke and extra >= wake_attempts then
                    -- this window's wake-ups are used up: sleep out the rest
                    -- of it (or of the delay), then attempt on this release
                    sleep_out(client, a, math.min(window_end, wake_by), line_since)
                    extra, window_end = 0, window_end + WAKE_WINDOW_MS
                elseif woke and w.kind.slots then
                    quorum_of_wakes(client, a, seen, d.quorum, line_since)
                elseif woke then
                    wake_jitter(client, a)
                end
                seen = heard(client, a)
                delay = floor(wake_by - now())
                if not woke or delay <= 0 then break end
                live_client(d, fname) -- (closed by another coroutine while this one slept?)
                if first() then
                    extra, tried = extra + 1, true
                    -- (a failure here is superseded by the policy's attempt below)
                    got = try(d, client, a, b, ticket)
                    if got then return got end
                end
            end
        else
            nap(client, delay)
        end
        n = n + 1
        live_client(d, fname) -- (closed by another coroutine while this one slept?)
        if first() then
            tried = true
            got, err, detail = try(d, client, a, b, ticket)
            if got then return got end
        end
    end
end

-- retries with notifications on: the resource watched throughout. Whatever
-- ends them (a result, the policy's error, misuse, an attempt that raises)
-- ends the watch, unless the client is closed by then, and a waiter in its
-- client's line passes the turn to the next, if one sleeps.
local function watched_retries(w, owed)
    local d, client, a = w.d, w.client, w.a
    -- a list whose wait is over makes no attempt more: nothing to listen for
    if type(a) == "table" and not owed and w.deadline and now() >= w.deadline then return retries(w) end
    local holder, heard_on = {}, listened(a, w.detail)
    watch(client, heard_on, holder)
    local ok, got, why, detail = pcall(retries, w, owed)
    if d.client == client then
        local slots = w.kind.slots
        local took_slot = ok and got ~= nil and slots ~= nil
        unwatch(client, heard_on, took_slot, holder)
        -- the client now holds every slot: the next would only be refused,
        -- and the client's own next release wakes it
        if lined(d, w.kind, a) then
            client:pass_turn(a, #a, w.since, took_slot and client:slots_held(a, #a) >= slots)
        end
    end
    if not ok then error(got, 0) end
    return got, why, detail
end

--- The first attempt, then the retries (see waiter for the arguments; wait:
--- the ms within which the last attempt starts after the first, or nil). A
--- head start owed (see above) is waited out first; with notifications on,
--- within the same watch as the retries, so that a release heard ends it.
--- A call that finds others of its client's line (nginx: of its worker)
--- waiting for the same resource stands behind them instead, and makes no
--- attempt until it is the first of them (retries); its policy is asked
--- as if each of its delays had ended in an attempt that found it busy.
--- A lock (or group), or nil, err, detail.
function _M.with_retries(d, client, kind, a, b, policy, wait)
    local deadline = wait and now() + wait
    local owed, owing = head_start_owed(d, a)
    if lined(d, kind, a) and client:waiting(a, #a) > 0 then
        local w = waiter(d, client, kind, a, b, policy, deadline)
        local _
        _, w.err, w.detail = results.refusal(d, "busy", "other calls of this client wait for it first")
        w.behind = true
        return watched_retries(w)
    end
    if owed > 0 then
        if d.notify then
            local w = waiter(d, client, kind, a, b, policy, deadline)
            w.owing = owing
            return watched_retries(w, owed)
        end
        nap(client, ceil(owed))
    else
        owing = nil
    end
    if d.notify and kind.slots and (deadline == nil or now() < deadline) then
        -- a semaphore's waiter listens from the start: its first attempt is
        -- already its queued one (a second, at once, would be refused too);
        -- with no time to wait (wait = 0), it makes a plain one below
        return watched_retries(waiter(d, client, kind, a, b, policy, deadline))
    end
    local got, err, detail = kind.try(d, client, a, b)
    head_start_ended(d, owing, used_by_outcome(got, err))
    if got then return got end
    local w = waiter(d, client, kind, a, b, policy, deadline)
    w.err, w.detail = err, detail
    if not d.notify then return retries(w) end
    return watched_retries(w)
end

return _M
