-- redlock.stats: what the engine counted (an rl_stats: redlock.h,
-- "Counting") as a plain Lua table, and the sum of two such tables. The
-- table (docs/observability.md has every field):
--   operations[kind][outcome]   rounds decided; kind: acquire, release,
--                               extend, fenced, commit, slot; outcome: the status
--                               words (ok, busy, unavailable, timeout, not held)
--   decision_ms[kind]           a histogram (below) of the time to decide
--   tails, cleanups, wakeups    counters; inflight, tails_running, waiters: now
--   keepalive                   { extensions = {outcome = n}, releases = {...},
--                                 lost = n, kept = n (now) }
--   nodes[i]                    { name, up, suspect, votes = {state = n},
--                                 timeouts, connects, reconnects, resets, lost,
--                                 step_checks, suspected, moved, ask, tryagain,
--                                 reply_ms = histogram }
-- A histogram: { count = n, sum_ms = ms, buckets = { { le_ms = 0.5,
-- count = n }, ..., { le_ms = math.huge, count = n } } }, each bucket's
-- count cumulative (the times of at most le_ms).

local ffi = require "ffi"
local C = require("redlock.cdefs").lib

local ffi_string, tonumber, type, pairs = ffi.string, tonumber, type, pairs

local _M = {}

local KINDS, OUTCOMES, STATES, BOUNDS = {}, {}, {}, {}
for k = 1, C.RL_STATS_KINDS - 1 do KINDS[k] = ffi_string(C.rl_stats_kind_word(k)) end
for s = 1, C.RL_STATS_OUTCOMES - 1 do OUTCOMES[s] = ffi_string(C.rl_status_word(s)) end
for s = 0, C.RL_STATS_STATES - 1 do STATES[s] = ffi_string(C.rl_node_state_word(s)) end
for i = 0, C.RL_STATS_BUCKETS - 2 do BOUNDS[i + 1] = C.rl_stats_bucket_ms(i) end
BOUNDS[C.RL_STATS_BUCKETS] = math.huge
_M.KINDS, _M.OUTCOMES, _M.STATES, _M.BOUNDS = KINDS, OUTCOMES, STATES, BOUNDS

local function outcomes(row)
    local t = {}
    for s, word in ipairs(OUTCOMES) do t[word] = tonumber(row[s]) end
    return t
end

local function histogram(h)
    local buckets, n = {}, 0
    for i, le in ipairs(BOUNDS) do
        n = n + tonumber(h.count[i - 1])
        buckets[i] = { le_ms = le, count = n }
    end
    return { count = n, sum_ms = h.sum_ms, buckets = buckets }
end

local function node(n, name)
    local votes = {}
    for s = 0, #STATES do votes[STATES[s]] = tonumber(n.votes[s]) end
    return {
        name = name, up = n.up ~= 0, votes = votes, timeouts = tonumber(n.timeouts),
        connects = tonumber(n.connects), reconnects = tonumber(n.reconnects), resets = tonumber(n.resets),
        lost = tonumber(n.lost), step_checks = tonumber(n.step_checks), reply_ms = histogram(n.reply),
        suspected = tonumber(n.suspected), suspect = n.suspect ~= 0,
        moved = tonumber(n.moved), ask = tonumber(n.ask), tryagain = tonumber(n.tryagain),
    }
end

--- The table of st (an rl_stats); names: the node names, in server order.
function _M.table(st, names)
    local t = {
        operations = {}, decision_ms = {},
        tails = tonumber(st.tails), cleanups = tonumber(st.cleanups), wakeups = tonumber(st.wakeups),
        inflight = st.inflight, tails_running = st.tails_running, waiters = st.waiters,
        keepalive = { extensions = outcomes(st.keep_extends), releases = outcomes(st.keep_releases),
                      lost = tonumber(st.locks_lost), kept = st.kept },
        nodes = {},
    }
    for k, word in ipairs(KINDS) do
        t.operations[word] = outcomes(st.ops[k])
        t.decision_ms[word] = histogram(st.decision[k])
    end
    for i = 1, st.nodes do t.nodes[i] = node(st.node[i - 1], names[i]) end
    return t
end

--- Add from into into, field by field (counts add, booleans or; strings
--- and histogram bounds stay into's): two tables of the same nodes in the
--- same order.
local function add(into, from)
    for k, v in pairs(from) do
        local mine = into[k]
        if k == "le_ms" then into[k] = v
        elseif type(v) == "number" then into[k] = (mine or 0) + v
        elseif type(v) == "boolean" then into[k] = mine or v
        elseif type(v) == "table" then
            if mine == nil then mine = {}; into[k] = mine end
            add(mine, v)
        elseif mine == nil then into[k] = v end
    end
    return into
end
_M.add = add

return _M
