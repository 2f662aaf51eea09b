--- redlock status [RESOURCE]: with RESOURCE, per node whether the key
-- exists, its value (and the holder's label in it), the fence counter and
-- its PTTL; whether one value holds a quorum, who holds it and for how long.
-- Without, per node whether it answers and how fast. With --limit L, per
-- slot of the semaphore RESOURCE, the value most nodes hold and its label.
--
-- Reads the nodes directly, all at once (rl_host_probe in core/host/probe.c,
-- hiredis' blocking API behind a plain struct, on a thread per node), so it shows what is really on each
-- node, whatever client wrote it; a Redis Cluster node at the master
-- serving the key's slot, under the names the engine gives its keys there. It never takes part in a lock: holders
-- pay nothing for it (the label travels in the value they write anyway).

local host = require "redlock.host"
local args = require "redlock.host.args"
local config = require "redlock.host.config"
local sys = require "redlock.host.sys"

local EXIT = host.EXIT
local _M = {}

local TIMEOUT_MS = 500
local SHARED_MARK = "redlock:shared" -- a key held by shared holders (core/src/shared.h)

local SPEC = config.spec {
    { name = "limit", long = "limit", arg = "L", check = "limit",
        help = "RESOURCE is a semaphore of L slots: show each slot's holder instead" },
}
_M.SPEC = SPEC

function _M.help()
    return ([[
Usage: redlock status [OPTIONS] [RESOURCE]

With RESOURCE: show, node by node, whether RESOURCE's key exists, the first
characters of its value (the holder's lock value), the holder's label carried
in it (HOST:PID for a holder started by redlock, --label, or a Lua client's
label option), the fenced lock's counter (the holder's fencing token, for a
fenced lock) and its remaining time to live; then whether one value is held
by a quorum (N/2+1) of the nodes, by whom, and how long a quorum still holds
it. Without RESOURCE: show whether each node answers a PING and how fast,
and whether a quorum does. A node that has not answered within %d ms in all
(connect, AUTH, SELECT, the commands), or answers with an error or with
something other than what they return, is shown as an error and counts as
not answering.
A Redis Cluster node (redis-cluster://h:p+h:p) is one node, read at the
master serving RESOURCE's hash slot: its seeds are asked in order until one
answers, then a MOVED or ASK reply is followed (5 times at most), all
within those %d ms; without RESOURCE, it answers when a seed does.
A resource held shared (redlock exec --shared, or { shared = true }) shows
"read" and its number of shared holders on each node, then each holder: its
value's first characters, the nodes it is on and its most time left. Each
node lists at most 64 holders (those expiring first); when a node has more,
status says how many it left out and counts "at least" N on a quorum.
Control characters in values and labels are shown as \xNN.

Options:
%s

A semaphore's RESOURCE shows as free (its slots are keys of their own):
status then says that it looks like one (its waiters left its limit, or
one of its first 8 slots is held). With --limit L, RESOURCE is a
semaphore: one line per slot (its key redlock:slot:<k>:<key>; on a cluster
node redlock:slot:<k>:<base>, docs/cluster.md) saying which
value holds it on how many nodes, and its holder's label ("unknown" where
too few nodes answered), then the number of slots held by a quorum and the
nodes that did not answer (each asked once); exit status 0 when a quorum
of nodes answered, 69 when too few did.

Exit status: 0 held by a quorum (without RESOURCE: a quorum answers),
1 not held by a quorum, 64 usage, 69 too few nodes answered to tell.
]]):format(TIMEOUT_MS, TIMEOUT_MS, args.describe(SPEC))
end

-- values, labels and errors come from the nodes: shown with their control
-- bytes as \xNN
local printable = host.printable

-- The shared holders seen on the nodes (probe results r with r.readers):
-- one line per holder, with the nodes it is on and the most ms it has left
-- there. Return the number of holders on a quorum. A node lists only the
-- holders that expire first (RL_HOST_PROBE_READERS in core/host/host.h):
-- when a node has more, that number is a floor, the list says how many it
-- left out, and the most holders a node listed and the most a node has
-- are returned too.
local function shared_lines(results, quorum)
    local seen, order = {}, {}
    local listed, most, unlisted = 0, 0, 0
    for _, r in ipairs(results) do
        local shared = r.shared or {}
        listed = math.max(listed, #shared)
        most = math.max(most, r.readers)
        unlisted = math.max(unlisted, r.readers - #shared)
        for _, h in ipairs(shared) do
            local s = seen[h.value]
            if not s then
                s = { value = h.value, nodes = 0, pttl = 0 }
                seen[h.value], order[#order + 1] = s, s
            end
            s.nodes, s.pttl = s.nodes + 1, math.max(s.pttl, h.pttl)
        end
    end
    local on_quorum = 0
    if #order > 0 then print("shared holders:") end
    for _, s in ipairs(order) do
        if s.nodes >= quorum then on_quorum = on_quorum + 1 end
        print(("  %s...  on %d node%s, pttl %d ms"):format(printable(s.value:sub(1, 12)), s.nodes,
            s.nodes == 1 and "" or "s", s.pttl))
    end
    if unlisted > 0 then
        print(("  ... and up to %d more a node, not listed"):format(unlisted))
        return on_quorum, listed, most
    end
    return on_quorum
end

local function show_pttl(pttl)
    if pttl >= 0 then return pttl .. " ms" end
    if pttl == -1 then return "none (no expiry!)" end
    return "-"
end

--- The label a lock value carries ("label/" then hex), or nil.
local function label_of(value)
    return value and value:match("^([!-.0-~]+)/%x+$")
end
_M.label_of = label_of

-- Probe every node at once (key nil: PING; what: sys.probe's, nil for the
-- lock key); rows, the probes that answered, and
-- their number; or nil and the exit status of a usage error. failed: the
-- rows of nodes that did not answer an earlier probe (index -> row), not
-- asked again (each would cost TIMEOUT_MS again); the nodes that do not
-- answer this one are added.
local function probe_all(opts, servers, key, failed, what)
    local tls = config.tls_options(opts)
    local rows, answers, answered = {}, {}, 0
    local asked, urls = {}, {}
    for idx, url in ipairs(servers) do
        if failed and failed[idx] then
            rows[idx] = failed[idx]
        else
            asked[#asked + 1], urls[#urls + 1] = idx, url
        end
    end
    local found = sys.probe_all(urls, key, TIMEOUT_MS, tls, what)
    for i, idx in ipairs(asked) do
        local r, perr, kind, name = unpack(found[i], 1, 4)
        if not r and kind == sys.PROBE_EINVAL then
            return nil, host.fail(EXIT.USAGE, "%s", config.flag_message(perr, opts))
        end
        rows[idx] = { name = r and r.name or name, state = "error", info = perr }
        if r then
            answered = answered + 1
            answers[idx] = r
        elseif failed then
            failed[idx] = rows[idx]
        end
    end
    -- one server named twice (two spellings of its address) votes once, as
    -- a client's engine finds at its connections' setup
    local first_of = {}
    for idx = 1, #servers do
        local r = answers[idx]
        local id = r and r.run_id
        if id and first_of[id] then
            answers[idx], answered = nil, answered - 1
            rows[idx].info = ("same server as node %d (run_id %s...)"):format(first_of[id], id:sub(1, 8))
        elseif id then
            first_of[id] = idx
        end
    end
    return rows, answers, answered
end

local function print_rows(rows)
    local width = 4
    for _, row in ipairs(rows) do width = math.max(width, #row.name) end
    for idx, row in ipairs(rows) do
        print((("  %2d  %-" .. width .. "s  %-5s  %s"):format(idx, row.name, row.state, printable(row.info))
            :gsub("%s+$", "")))
    end
end

-- redlock status without RESOURCE.
local function nodes_status(opts, servers, quorum)
    local rows, answers, answered = probe_all(opts, servers)
    if not rows then return answers end
    for idx, r in pairs(answers) do rows[idx].state, rows[idx].info = "up", ("%.1f ms"):format(r.latency_ms) end
    print(("%d nodes, quorum %d"):format(#servers, quorum))
    print_rows(rows)
    print(("%s: %d of %d nodes answer (quorum %d)"):format(answered >= quorum and "up" or "down", answered,
        #servers, quorum))
    return answered >= quorum and EXIT.OK or EXIT.UNAVAILABLE
end

-- What tells the value a probe r found apart from others: the value, or
-- for one longer than the probe keeps (r.value is its first bytes), those
-- bytes, its length and the digest of all of it (two values that differ
-- only past those bytes are two values).
local function value_id(r)
    return #r.value == r.value_len and r.value or (r.value .. "\0" .. r.value_len .. "\0" .. r.value_digest)
end

-- How long a quorum still holds the value of id (value_id): the quorum-th
-- longest PTTL among the nodes that hold it, a key without expiry (PTTL -1)
-- the longest of all (nil if a quorum holds it without expiry).
local function quorum_left(answers, id, quorum)
    local left = {}
    for _, r in pairs(answers) do
        if r.exists and value_id(r) == id then left[#left + 1] = r.pttl < 0 and math.huge or r.pttl end
    end
    table.sort(left, function(a, b) return a > b end)
    local v = left[quorum]
    return v ~= math.huge and v or nil
end

-- The value with the most votes (value -> count), and its count; nil, 0
-- when there are none.
local function most_common(votes)
    local best, count = nil, 0
    for v, c in pairs(votes) do
        if c > count then best, count = v, c end
    end
    return best, count
end

-- The holder's fencing token: the counter a quorum of the nodes holding
-- the value of id (value_id) agree on (the grant's commit left its quorum
-- at the token; a node whose grant came too late counts higher, one the
-- commit missed lower).
-- A token is what INCR leaves, 1 to 2^63-1 in decimal, as the engine reads
-- one (the probe's fence_token): a counter that is not one (written there
-- by something else, or a key of another type) is no token.
-- "unknown" when no quorum of them agrees on a token; nil when none holds a
-- counter.
local function token_of(answers, id, quorum)
    local counts = {}
    for _, r in pairs(answers) do
        if r.exists and value_id(r) == id and (r.fence or r.fence_other_type) then
            local counter = r.fence_token or "not a token"
            counts[counter] = (counts[counter] or 0) + 1
        end
    end
    local best, count = most_common(counts)
    if best == nil then return nil end
    return count >= quorum and best ~= "not a token" and best or "unknown"
end

-- A node's fence counter as its line shows it ("" without one): "fence "
-- and the counter, "..." after one longer than the probe keeps; "not a
-- string" for a key of another type. sep goes before it.
local function fence_shown(r, sep)
    if r.fence_other_type then return sep .. "fence not a string" end
    if not r.fence then return "" end
    return sep .. "fence " .. r.fence .. (r.fence_len > #r.fence and "..." or "")
end

-- most_common of what the probes that answered say: value_of(r), or nil
-- for a probe that says nothing.
local function tally(answers, value_of)
    local votes = {}
    for _, r in pairs(answers) do
        local v = value_of(r)
        if v ~= nil then votes[v] = (votes[v] or 0) + 1 end
    end
    return most_common(votes)
end

local function held_value(r) return r.exists and value_id(r) or nil end
local function limit_value(r) return r.exists and tonumber(r.value) or nil end

-- The limit a semaphore's waiters left on the nodes that answered (the
-- most common), or nil: they leave it while they wait, for a minute.
local function limit_left(opts, servers, key, failed)
    local rows, answers = probe_all(opts, servers, key, failed, sys.PROBE_LIMIT)
    if not rows then return nil end
    return (tally(answers, limit_value))
end

-- A semaphore of limit slots on key: per slot, the value most nodes hold,
-- on how many, and its label (unknown when too few nodes answered); then
-- the nodes that did not answer, each asked once. Exit status: OK, or
-- UNAVAILABLE when fewer than a quorum of nodes answered.
local function slots_status(opts, servers, key, limit, resource, quorum)
    local n = #servers
    print(("semaphore '%s' of %d slots on %d nodes, quorum %d"):format(resource, limit, n, quorum))
    local held, worst, failed = 0, n, {}
    for slot = 1, limit do
        local rows, answers, answered = probe_all(opts, servers, key, failed, slot)
        if not rows then return answers end
        if answered < worst then worst = answered end
        local best, count = tally(answers, held_value)
        if best and count >= quorum then held = held + 1 end
        local label = label_of(best)
        local shown = answered < quorum and count < quorum and ("unknown: only %d of %d nodes answered"):format(answered, n)
            or best and ("%s... on %d of %d nodes%s%s"):format(printable(best:sub(1, 12)), count, n,
                count >= quorum and "" or " (no quorum)", label and ("  label " .. printable(label)) or "")
            or "free"
        print(("  slot %-3d %s"):format(slot, shown))
    end
    print(("%d of %d slots held by a quorum"):format(held, limit))
    if next(failed) then
        print("nodes that did not answer:")
        local list = {}
        for idx, row in pairs(failed) do list[#list + 1] = { idx = idx, row = row } end
        table.sort(list, function(a, b) return a.idx < b.idx end)
        for _, f in ipairs(list) do
            print((("  %2d  %s  %s"):format(f.idx, printable(f.row.name), printable(f.row.info)):gsub("%s+$", "")))
        end
    end
    local left = limit_left(opts, servers, key, failed)
    if left and left ~= limit then
        print(("note: the waiters of '%s' say its limit is %d, not %d"):format(resource, left, limit))
    end
    return worst >= quorum and EXIT.OK or EXIT.UNAVAILABLE
end

-- The slots a free RESOURCE's hint looks at: a holder takes a slot in a
-- random order, so the first alone is held by one holder in L.
local HINT_SLOTS = 8

-- A free RESOURCE may be a semaphore's (its slots are keys of their own):
-- say so when one of its first HINT_SLOTS slots is held on a node, or its
-- waiters left a limit. rows: the nodes' rows of the probe of RESOURCE
-- (those that did not answer are not asked again).
local function semaphore_hint(opts, servers, key, resource, rows)
    local failed = {}
    for idx, row in ipairs(rows) do
        if row.state == "error" then failed[idx] = row end
    end
    local limit = limit_left(opts, servers, key, failed)
    local held_slot
    for slot = 1, limit and 0 or HINT_SLOTS do
        local srows, answers = probe_all(opts, servers, key, failed, slot)
        if srows then
            for _, r in pairs(answers) do held_slot = held_slot or (r.exists and slot) end
        end
        if held_slot then break end
    end
    if limit or held_slot then
        print(("'%s' looks like a semaphore (%s): redlock status --limit %s %s shows its slots"):format(resource,
            limit and ("its waiters say limit " .. limit) or ("its slot %d is held"):format(held_slot),
            limit or "L", resource))
    end
end

function _M.run(opts, argv, k)
    local resource = argv[k]
    if resource == "" then return host.usage_error("status", "RESOURCE is empty") end
    if resource ~= nil and argv[k + 1] ~= nil then return host.usage_error("status", "one RESOURCE at a time") end
    local servers, err = config.servers(opts)
    if not servers then return host.fail(EXIT.USAGE, "%s", err) end
    -- a bad URL, or one named twice (it would count twice toward the quorum),
    -- is a usage error
    local ok, cerr = config.check_servers(servers)
    if not ok then return host.fail(EXIT.USAGE, "%s", cerr) end
    -- and what exec and run refuse: a reserved prefix, a TLS file that
    -- cannot be read (status makes no client: that would connect)
    local pok, perr = config.check_label_and_prefix(opts)
    if not pok then return host.fail(EXIT.USAGE, "%s", perr) end
    local tok, terr = config.check_tls(opts)
    if not tok then return host.fail(EXIT.USAGE, "%s", terr) end
    local n = #servers
    local quorum = math.floor(n / 2) + 1
    if resource == nil and opts.limit then return host.usage_error("status", "--limit needs RESOURCE") end
    if resource == nil then return nodes_status(opts, servers, quorum) end
    local key = (opts.prefix or os.getenv("REDLOCK_PREFIX") or "") .. resource
    if opts.limit then
        return slots_status(opts, servers, key, opts.limit, resource, quorum)
    end

    local rows, answers, answered = probe_all(opts, servers, key)
    if not rows then return answers end
    local votes, results, held_values = {}, {}, {} -- held_values: value_id -> the value
    for idx = 1, n do
        local r, row = answers[idx], rows[idx]
        if r then results[#results + 1] = r end
        if r and r.exists and r.readers > 0 then
            votes[SHARED_MARK] = (votes[SHARED_MARK] or 0) + 1
            row.state = "read"
            row.info = ("%d shared holder%s, pttl %s"):format(r.readers, r.readers == 1 and "" or "s", show_pttl(r.pttl))
        elseif r and r.exists then
            local id = value_id(r)
            votes[id], held_values[id] = (votes[id] or 0) + 1, r.value
            local shown = r.value:sub(1, 12) .. (r.value_len > 12 and "..." or "")
            local label = label_of(r.value)
            row.state = "held"
            row.info = ("%-15s pttl %s%s%s"):format(shown, show_pttl(r.pttl), label and ("  label " .. label) or "",
                fence_shown(r, "  "))
        elseif r then
            row.state, row.info = "free", fence_shown(r, "")
        end
    end

    print(("resource '%s'%s on %d nodes, quorum %d"):format(resource,
        key ~= resource and (" (key '" .. key .. "')") or "", n, quorum))
    print_rows(rows)
    local best, count = most_common(votes)
    local readers, listed, most = shared_lines(results, quorum)
    if best == SHARED_MARK and count >= quorum then
        print(("held shared: %s%d holder%s on a quorum%s; the mark on %d of %d nodes (quorum %d)")
            :format(listed and "at least " or "", readers, readers == 1 and "" or "s",
                listed and (" (each node's list cut at %d, those expiring first; up to %d on a node)")
                    :format(listed, most) or "",
                count, n, quorum))
        return EXIT.OK
    end
    if best and count >= quorum then
        local value = held_values[best]
        local label, token, left = label_of(value), token_of(answers, best, quorum), quorum_left(answers, best, quorum)
        print(("held: value %s... on %d of %d nodes (quorum %d)"):format(printable(value:sub(1, 12)), count, n, quorum))
        print(("  holder %s, fencing token %s, quorum held for %s more"):format(
            label and ("'" .. printable(label) .. "'") or "(no label)", printable(token or "none"),
            left and (left .. " ms") or "ever (no expiry!)"))
        return EXIT.OK
    end
    if answered < quorum then
        print(("unknown: only %d of %d nodes answered (quorum %d)"):format(answered, n, quorum))
        return EXIT.UNAVAILABLE
    end
    if best then
        print(("not held: at most %d of %d nodes agree on a value (quorum %d)"):format(count, n, quorum))
    else
        print(("free: no node holds '%s'"):format(key))
        semaphore_hint(opts, servers, key, resource, rows)
    end
    return EXIT.FAIL
end

return _M
