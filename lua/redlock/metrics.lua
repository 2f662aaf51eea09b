-- redlock.metrics: the Prometheus text exposition (format 0.0.4) of what
-- clients counted (redlock.stats tables). Names start with redlock_,
-- counters end in _total, durations are histograms in seconds, and every
-- family has its HELP and TYPE lines. Labels: node (a node's name, its URL
-- without password), kind, outcome, state; never a resource, so the number
-- of series does not grow with the resources locked. Series of several
-- clients with the same labels are summed (two clients of the same nodes
-- show as one); redlock.metrics passes each engine's table once, so
-- clients that share one (inside nginx) are not counted twice.
--
-- Samples are kept in a flat map, key -> value, the key being
-- family TAB suffix TAB labels TAB le: nginx workers sum their maps through
-- a shared dict (redlock.nginx.metrics), then render the sum.

local stats = require "redlock.stats"

local pairs, ipairs, tostring, tonumber, type, select = pairs, ipairs, tostring, tonumber, type, select
local concat, sort, huge = table.concat, table.sort, math.huge

local _M = {}

-- Every family, in the order shown: name, type, help.
local FAMILIES = {
    { "redlock_operations_total", "counter", "Rounds decided, by kind and outcome (keep-alive's rounds are counted apart)." },
    { "redlock_decision_seconds", "histogram", "Time from a round's start to its decision." },
    { "redlock_tails_total", "counter", "Rounds decided before every node had answered." },
    { "redlock_cleanups_total", "counter", "Failed acquires whose release (cleanup) was begun." },
    { "redlock_inflight", "gauge", "Operations begun and not decided yet." },
    { "redlock_tails_running", "gauge", "Decided rounds whose tail or cleanup still runs." },
    { "redlock_wakeups_total", "counter", "Release messages heard by waiters (hand-off)." },
    { "redlock_waiters", "gauge", "Waiters listening for releases now." },
    { "redlock_kept_locks", "gauge", "Locks kept alive now." },
    { "redlock_keepalive_extensions_total", "counter", "Keep-alive's extensions, by outcome." },
    { "redlock_keepalive_releases_total", "counter", "Releases of kept locks (dropped or released at exit), by outcome." },
    { "redlock_locks_lost_total", "counter", "Kept locks that were lost." },
    { "redlock_votes_total", "counter", "Votes at each round's decision, by node and state." },
    { "redlock_node_timeouts_total", "counter", "Operations a node left unanswered past the node timeout." },
    { "redlock_node_reply_seconds", "histogram", "Time from a command being queued to the node's reply." },
    { "redlock_node_connects_total", "counter", "Connections asked for, the first included." },
    { "redlock_node_reconnects_total", "counter", "Connections asked for after one failed or was reset." },
    { "redlock_node_resets_total", "counter", "Connections the engine ended (out of step, stalled, refused setup, timeout)." },
    { "redlock_node_connections_lost_total", "counter", "Connections that failed or were lost." },
    { "redlock_node_step_checks_total", "counter",
      "Step checks sent to a node that answered late, and probes of a suspect node." },
    { "redlock_node_suspected_total", "counter", "Times a node was found not answering (it became suspect)." },
    { "redlock_node_moved_total", "counter", "MOVED replies a cluster node's shards sent (its map changed)." },
    { "redlock_node_ask_total", "counter", "ASK replies a cluster node's shards sent (a slot migrating)." },
    { "redlock_node_tryagain_total", "counter",
      "TRYAGAIN replies a cluster node's shards sent (a slot migrating; the command went again)." },
    { "redlock_node_up", "gauge", "Connections to the node that are up (one per client and worker)." },
    { "redlock_node_suspect", "gauge",
      "Clients (and workers) that find the node not answering now: it is sent nothing but probes." },
}
local ORDER = {}
for i, f in ipairs(FAMILIES) do ORDER[f[1]] = i end
local SUFFIX_ORDER = { [""] = 0, _bucket = 1, _sum = 2, _count = 3 }

-- s with NUL and every byte that is not part of a UTF-8 sequence replaced
-- by U+FFFD. Shortest forms only, no surrogates, nothing above U+10FFFF.
local REPLACEMENT = "\239\191\189"
local function utf8_only(s)
    if not s:find("[%z\128-\255]") then return s end
    local out, i, n = {}, 1, #s
    while i <= n do
        local c = s:byte(i)
        local len, lo, hi = 0, 0x80, 0xBF
        if c >= 0x01 and c <= 0x7F then len = 1
        elseif c >= 0xC2 and c <= 0xDF then len = 2
        elseif c >= 0xE0 and c <= 0xEF then len = 3; lo = c == 0xE0 and 0xA0 or 0x80; hi = c == 0xED and 0x9F or 0xBF
        elseif c >= 0xF0 and c <= 0xF4 then len = 4; lo = c == 0xF0 and 0x90 or 0x80; hi = c == 0xF4 and 0x8F or 0xBF
        end
        local ok = len > 0 and i + len - 1 <= n
        for k = 1, len - 1 do
            local b = ok and s:byte(i + k)
            if not b or b < (k == 1 and lo or 0x80) or b > (k == 1 and hi or 0xBF) then ok = false end
        end
        if ok then
            out[#out + 1] = s:sub(i, i + len - 1)
            i = i + len
        else
            out[#out + 1] = REPLACEMENT
            i = i + 1
        end
    end
    return concat(out)
end

-- A label value as the exposition writes it: backslash, quote and newline
-- escaped; a NUL (the samples' separator here), and bytes that are not
-- UTF-8 (a label value must be), as U+FFFD.
local function escape(v)
    v = tostring(v):gsub("[\\\"\n]", { ["\\"] = "\\\\", ['"'] = '\\"', ["\n"] = "\\n" })
    return utf8_only(v)
end

-- Labels as the exposition writes them, from name, value pairs.
local function labels(...)
    local parts = {}
    for i = 1, select("#", ...), 2 do
        parts[#parts + 1] = select(i, ...) .. '="' .. escape(select(i + 1, ...)) .. '"'
    end
    return concat(parts, ",")
end

local function le_text(le_ms)
    if le_ms == huge then return "+Inf" end
    return ("%.6g"):format(le_ms / 1000)
end

-- A sample's key: its family, suffix, labels and le, NUL between them (no
-- label value holds one: escape).
local function put(map, family, suffix, lbl, le, value)
    local key = family .. "\0" .. suffix .. "\0" .. lbl .. "\0" .. (le or "")
    map[key] = (map[key] or 0) + value
end

local function put_histogram(map, family, lbl, h)
    for _, b in ipairs(h.buckets) do put(map, family, "_bucket", lbl, le_text(b.le_ms), b.count) end
    put(map, family, "_sum", lbl, nil, h.sum_ms / 1000)
    put(map, family, "_count", lbl, nil, h.count)
end

local function put_outcomes(map, family, counts)
    for _, word in ipairs(stats.OUTCOMES) do put(map, family, "", labels("outcome", word), nil, counts[word] or 0) end
end

--- Add the samples of one stats table (dlm:stats()) to map; return map.
function _M.samples(t, map)
    map = map or {}
    for _, kind in ipairs(stats.KINDS) do
        for _, word in ipairs(stats.OUTCOMES) do
            put(map, "redlock_operations_total", "", labels("kind", kind, "outcome", word), nil, t.operations[kind][word])
        end
        put_histogram(map, "redlock_decision_seconds", labels("kind", kind), t.decision_ms[kind])
    end
    put(map, "redlock_tails_total", "", "", nil, t.tails)
    put(map, "redlock_cleanups_total", "", "", nil, t.cleanups)
    put(map, "redlock_inflight", "", "", nil, t.inflight)
    put(map, "redlock_tails_running", "", "", nil, t.tails_running)
    put(map, "redlock_wakeups_total", "", "", nil, t.wakeups)
    put(map, "redlock_waiters", "", "", nil, t.waiters)
    local k = t.keepalive
    put(map, "redlock_kept_locks", "", "", nil, k.kept)
    put_outcomes(map, "redlock_keepalive_extensions_total", k.extensions)
    put_outcomes(map, "redlock_keepalive_releases_total", k.releases)
    put(map, "redlock_locks_lost_total", "", "", nil, k.lost)
    for _, n in ipairs(t.nodes) do
        local node = labels("node", n.name)
        for s = 0, #stats.STATES do
            local state = stats.STATES[s]
            put(map, "redlock_votes_total", "", labels("node", n.name, "state", state), nil, n.votes[state])
        end
        put(map, "redlock_node_timeouts_total", "", node, nil, n.timeouts)
        put_histogram(map, "redlock_node_reply_seconds", node, n.reply_ms)
        put(map, "redlock_node_connects_total", "", node, nil, n.connects)
        put(map, "redlock_node_reconnects_total", "", node, nil, n.reconnects)
        put(map, "redlock_node_resets_total", "", node, nil, n.resets)
        put(map, "redlock_node_connections_lost_total", "", node, nil, n.lost)
        put(map, "redlock_node_step_checks_total", "", node, nil, n.step_checks)
        put(map, "redlock_node_suspected_total", "", node, nil, n.suspected)
        put(map, "redlock_node_moved_total", "", node, nil, n.moved or 0)
        put(map, "redlock_node_ask_total", "", node, nil, n.ask or 0)
        put(map, "redlock_node_tryagain_total", "", node, nil, n.tryagain or 0)
        put(map, "redlock_node_up", "", node, nil, (n.up == true and 1) or (type(n.up) == "number" and n.up) or 0)
        local suspect = (n.suspect == true and 1) or (type(n.suspect) == "number" and n.suspect) or 0
        put(map, "redlock_node_suspect", "", node, nil, suspect)
    end
    return map
end

local function split(key)
    local family, suffix, lbl, le = key:match("^([^%z]*)%z([^%z]*)%z([^%z]*)%z(.*)$")
    return family, suffix, lbl, le
end

local function le_value(le)
    return le == "+Inf" and huge or (tonumber(le) or -1)
end

-- Family, labels, suffix, then le as a number.
local function before(a, b)
    local fa, sa, la, ea = split(a)
    local fb, sb, lb, eb = split(b)
    if fa ~= fb then return (ORDER[fa] or 1e9) < (ORDER[fb] or 1e9) end
    if la ~= lb then return la < lb end
    if sa ~= sb then return SUFFIX_ORDER[sa] < SUFFIX_ORDER[sb] end
    return le_value(ea) < le_value(eb)
end

local function number(v)
    if v == huge then return "+Inf" end
    if v == math.floor(v) and v < 1e15 and v > -1e15 then return ("%d"):format(v) end
    return ("%.17g"):format(v)
end

--- The exposition of a sample map (_M.samples, or summed maps).
function _M.render(map)
    local keys = {}
    for key in pairs(map) do keys[#keys + 1] = key end
    sort(keys, before)
    local out, shown = {}, nil
    for _, key in ipairs(keys) do
        local family, suffix, lbl, le = split(key)
        local f = FAMILIES[ORDER[family]]
        if f and family ~= shown then
            shown = family
            out[#out + 1] = "# HELP " .. family .. " " .. f[3]
            out[#out + 1] = "# TYPE " .. family .. " " .. f[2]
        end
        if le ~= "" then lbl = lbl == "" and ('le="' .. le .. '"') or (lbl .. ',le="' .. le .. '"') end
        out[#out + 1] = family .. suffix .. (lbl ~= "" and ("{" .. lbl .. "}") or "") .. " " .. number(map[key])
    end
    out[#out + 1] = ""
    return concat(out, "\n")
end

--- The exposition of stats tables (dlm:stats() of each client shown).
function _M.text(tables)
    local map = {}
    for _, t in ipairs(tables) do _M.samples(t, map) end
    return _M.render(map)
end

return _M
