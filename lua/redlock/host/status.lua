--- redlock status RESOURCE: per node, whether the key exists, a prefix of its
-- value and its PTTL; whether one value holds a quorum.
--
-- Reads the nodes directly (rl_host_probe in core/host/probe.c, hiredis'
-- blocking API behind a plain struct), so it shows what is really on each
-- node, whatever client wrote it.

local host = require "redlock.host"
local args = require "redlock.host.args"
local config = require "redlock.host.config"
local sys = require "redlock.host.sys"

local EXIT = host.EXIT
local _M = {}

local TIMEOUT_MS = 500

local SPEC = config.spec {
    { name = "limit", long = "limit", arg = "L", check = "count",
        help = "RESOURCE is a semaphore of L slots: show each slot's holder instead" },
}
_M.SPEC = SPEC

function _M.help()
    return ([[
Usage: redlock status [OPTIONS] RESOURCE

Show, node by node, whether RESOURCE's key exists, the first characters of its
value (the holder's lock value), and its remaining time to live; then whether
one value is held by a quorum (N/2+1) of the nodes. A node that has not
answered within %d ms in all (connect, AUTH, SELECT, GET, PTTL), or answers
with an error or with something other than what GET and PTTL return, is
shown as an error and counts as not answering.

Options:
%s

With --limit L, RESOURCE is a semaphore: one line per slot (its key
redlock:slot:<k>:<key>) saying which value holds it on how many nodes, and
the number of slots held by a quorum; exit status 0 when a quorum of nodes
answered, 69 when too few did.

Exit status: 0 held by a quorum, 1 not held by a quorum, 64 usage,
69 too few nodes answered to tell.
]]):format(TIMEOUT_MS, args.describe(SPEC))
end

local function show_pttl(pttl)
    if pttl >= 0 then return pttl .. " ms" end
    if pttl == -1 then return "none (no expiry!)" end
    return "-"
end

-- A semaphore of limit slots on key: per slot, the value most nodes hold
-- and on how many. Exit status: OK, or UNAVAILABLE when fewer than a
-- quorum of nodes answered.
local function show_slots(servers, key, limit, tls, resource)
    local n = #servers
    local quorum = math.floor(n / 2) + 1
    print(("semaphore '%s' of %d slots on %d nodes, quorum %d"):format(resource, limit, n, quorum))
    local held, worst = 0, n
    for slot = 1, limit do
        local votes, answered = {}, 0
        for _, url in ipairs(servers) do
            local r = sys.probe(url, ("redlock:slot:%d:%s"):format(slot, key), TIMEOUT_MS, tls)
            if r then
                answered = answered + 1
                if r.exists then votes[r.value] = (votes[r.value] or 0) + 1 end
            end
        end
        if answered < worst then worst = answered end
        local best, count = nil, 0
        for v, c in pairs(votes) do
            if c > count then best, count = v, c end
        end
        if best and count >= quorum then held = held + 1 end
        print(("  slot %-3d %s"):format(slot, best and ("%s... on %d of %d nodes%s"):format(best:sub(1, 12), count, n,
            count >= quorum and "" or " (no quorum)") or "free"))
    end
    print(("%d of %d slots held by a quorum"):format(held, limit))
    return worst >= quorum and EXIT.OK or EXIT.UNAVAILABLE
end

function _M.run(opts, argv, k)
    local resource = argv[k]
    if resource == nil or resource == "" then return host.usage_error("status", "missing RESOURCE") end
    if argv[k + 1] ~= nil then return host.usage_error("status", "one RESOURCE at a time") end
    local servers, err = config.servers(opts)
    if not servers then return host.fail(EXIT.USAGE, "%s", err) end
    -- a bad URL, or one named twice (it would count twice toward the quorum),
    -- is a usage error
    local ok, cerr = config.check_servers(servers)
    if not ok then return host.fail(EXIT.USAGE, "%s", cerr) end
    local key = (opts.prefix or os.getenv("REDLOCK_PREFIX") or "") .. resource
    local n = #servers
    local quorum = math.floor(n / 2) + 1

    local tls = config.tls_options(opts)
    if opts.limit then
        if opts.limit > 1024 then return host.usage_error("status", "--limit must be from 1 to 1024") end
        return show_slots(servers, key, opts.limit, tls, resource)
    end
    local rows, votes, answered = {}, {}, 0
    for idx, url in ipairs(servers) do
        local r, perr, kind, name = sys.probe(url, key, TIMEOUT_MS, tls)
        if not r and kind == sys.PROBE_EINVAL then return host.fail(EXIT.USAGE, "%s", config.flag_message(perr)) end
        local row = { name = r and r.name or name }
        if not r then
            row.state, row.info = "error", perr
        else
            answered = answered + 1
            if r.exists then
                -- a value longer than what the probe keeps is told apart by its length too
                local id = #r.value == r.value_len and r.value or (r.value .. "\0" .. r.value_len)
                votes[id] = (votes[id] or 0) + 1
                row.state = "held"
                local shown = r.value:sub(1, 12) .. (r.value_len > 12 and "..." or "")
                row.info = ("%-15s pttl %s"):format(shown, show_pttl(r.pttl))
            else
                row.state, row.info = "free", ""
            end
        end
        rows[idx] = row
    end

    local width = 4
    for _, row in ipairs(rows) do width = math.max(width, #row.name) end
    print(("resource '%s'%s on %d nodes, quorum %d"):format(resource,
        key ~= resource and (" (key '" .. key .. "')") or "", n, quorum))
    for idx, row in ipairs(rows) do
        print((("  %2d  %-" .. width .. "s  %-5s  %s"):format(idx, row.name, row.state, row.info)
            :gsub("%s+$", "")))
    end
    local best, count = nil, 0
    for v, c in pairs(votes) do
        if c > count then best, count = v, c end
    end
    if best and count >= quorum then
        print(("held: value %s... on %d of %d nodes (quorum %d)"):format(best:sub(1, 12), count, n, quorum))
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
    end
    return EXIT.FAIL
end

return _M
