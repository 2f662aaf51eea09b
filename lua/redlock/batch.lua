-- redlock.batch: operations in flight together, and room for them. A
-- client takes RL_ID_SLOTS operations in flight at most; a call that finds
-- every slot taken (RL_ERR_FULL: nothing was sent) makes room by taking the
-- results it began itself, or else lets the tails of earlier operations end.

local ffi = require "ffi"
local cdefs = require "redlock.cdefs"
local C = cdefs.lib
local check = require "redlock.check"
local results = require "redlock.results"
check.ours()

local ffi_string = ffi.string
local RL_OK, RL_ERR_FULL, UNREACHABLE = C.RL_OK, C.RL_ERR_FULL, cdefs.UNREACHABLE
local take_result, give_result = results.take, results.give
local raise = check.raise

local _M = {}

-- The longest a call waits for room in a full client: as long as the tails
-- of earlier operations may take to end (a node timeout, a connect).
local function room_deadline(d)
    return C.rl_now_ms() + d.options.node_timeout_ms + d.options.connect_timeout_ms
end

--- A blocking form op(client, ..., out) returned rc, not RL_OK: while that
--- is RL_ERR_FULL, let earlier tails end and call op again, within
--- room_deadline. A client still full then, or whose transport failed
--- (cdefs.UNREACHABLE: inside nginx, its hub could not start or answer),
--- fills out with "unavailable" and the reason as every node's error: the
--- call returns that like any failed round. Anything else (what the core
--- refused: a tampered value, a phase without cosockets) raises.
function _M.again_when_full(d, client, rc, op, ...)
    local deadline = room_deadline(d)
    while rc == RL_ERR_FULL and C.rl_now_ms() < deadline do
        client:sleep(1)
        rc = op(client, ...)
    end
    if rc == RL_OK then return end
    if rc ~= RL_ERR_FULL and rc ~= UNREACHABLE then raise("redlock: " .. ffi_string(client:errstr())) end
    results.unavailable(d, select(select("#", ...), ...), ffi_string(client:errstr()))
end

--- Operations one run keeps in flight at most: a node answers a pipeline
--- in order, so the last of a larger one would wait for all before it, and
--- time out though the node answers every command (each operation's node
--- timeout starts when it begins). Half a window is taken before more
--- begin.
_M.WINDOW = 512

--- Bytes of names one run keeps in flight at most, for the same reason:
--- long names take a node longer to read and answer, and 100 names of 64
--- KiB in one window took longer than the default 50 ms node timeout. With
--- 256 KiB, such a batch on loopback nodes still succeeds with a 20 ms node
--- timeout (with 1 MiB it failed at 30 ms). Half of this is taken before
--- more begin.
_M.WINDOW_BYTES = 256 * 1024

--- A done() for results nobody reads.
function _M.ignore() end

-- Take the next result of run t (its state: see run) and hand it to done.
local function take_one(t)
    local taken = t.taken + 1
    t.taken = taken
    local id = t.ids[taken]
    if id then t.ops.done(t.s, taken, t.client:wait(id, t.r) == RL_OK, t.r) end
    t.bytes = t.bytes - t.sizes[taken]
    t.ids[taken], t.sizes[taken] = nil, nil
end

local function take_upto(t, upto)
    while t.taken < upto do take_one(t) end
end

--- n operations in flight together: ops.begin(s, i) starts the i-th (its
--- id; a negative number when it cannot start; nil when there is nothing
--- to start) and returns the length of its name second, ops.done(s, i, got,
--- r) takes its result from r, a buffer of the run's own, read before done
--- returns (got false: none came, the reason is client:errstr()). At most
--- WINDOW operations and WINDOW_BYTES of names are in flight. While the
--- client is full, the operations begun so far are taken to make room, else
--- earlier tails are let end, all within one room_deadline. ops.stop(s), if
--- there is one, says when to begin no more; a begin that fails then ends
--- the beginning too. Returns nil, or why the first operation that could
--- not start failed.
---
--- ops holds functions made once, at load (never closures made per call),
--- and everything of the call is in s: a compiled trace of this loop keeps
--- the functions it calls alive as long as it lives, and with a closure
--- made per call it kept that call's state, the locks of a lock_many
--- included, alive (and kept alive by keep-alive) until the trace was
--- flushed.
function _M.run(d, client, n, ops, s)
    local t = { client = client, ops = ops, s = s, ids = {}, sizes = {}, taken = 0, bytes = 0, r = take_result() }
    local begin, stop = ops.begin, ops.stop
    local begun, deadline, why = 0, nil, nil
    local window, window_bytes = _M.WINDOW, _M.WINDOW_BYTES
    for i = 1, n do
        if begun - t.taken >= window or t.bytes >= window_bytes then
            while begun - t.taken > window / 2 or t.bytes > window_bytes / 2 do take_one(t) end
        end
        if stop and (why or stop(s)) then break end
        local id, size = begin(s, i)
        while id == RL_ERR_FULL do
            if t.taken < begun then
                take_upto(t, begun)
            else
                deadline = deadline or room_deadline(d)
                if C.rl_now_ms() >= deadline then break end
                client:sleep(1)
            end
            id, size = begin(s, i)
        end
        if id and id < 0 then why = why or ffi_string(client:errstr()) end
        t.ids[i] = id and id >= 0 and id
        t.sizes[i] = t.ids[i] and size or 0
        t.bytes = t.bytes + t.sizes[i]
        begun = i
    end
    take_upto(t, begun)
    give_result(t.r)
    return why
end

return _M
