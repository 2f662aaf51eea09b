--- redlock demo: worker processes contend for one lock on a throwaway
-- cluster (or the configured servers) and update a shared file; the demo
-- prints every acquisition with its per-node votes, pauses one node midway
-- to show the quorum at work, and checks the result: no two holders at once
-- (a checker over the workers' enter/exit log) and no lost update.
--
-- Workers are this executable again: `redlock demo-worker ...` (worker below).

local host = require "redlock.host"
local args = require "redlock.host.args"
local config = require "redlock.host.config"
local sys = require "redlock.host.sys"

local EXIT = host.EXIT
local _M = {}

local RESOURCE = "redlock-demo:counter"
local WORKER_TTL = 2000

-- its own options, then the server options every command that talks to
-- nodes takes (config.OPTIONS), and --help
local SPEC = config.spec {
    { name = "workers", long = "workers", arg = "N", check = "count", help = "worker processes (4)" },
    { name = "rounds", long = "rounds", arg = "N", check = "count", help = "acquisitions per worker (5)" },
    { name = "nodes", long = "nodes", arg = "N", check = "count",
        help = "nodes of the throwaway cluster, 1 to 16 (5)" },
}
_M.SPEC = SPEC

function _M.help()
    return ([[
Usage: redlock demo [OPTIONS]

Without configuration: start a throwaway cluster of redis-server nodes, run
worker processes that contend for one resource and do an unsafe
read-modify-write of a shared counter file under the lock, print every
acquisition (attempts, wait, each node's vote), pause one node for a while
(SIGSTOP) to show that a quorum is enough, then check the workers' log: no
two holders at once and no lost update. Every node it started is stopped at
the end, also on Ctrl-C. With --servers, --servers-file or REDLOCK_SERVERS,
uses those nodes instead; the workers then take the TLS options, --prefix and
--label as the other commands do.

Options:
%s

Exit status: 0 when the check passes, 1 when it does not, 64 usage (a bad
option, a bad server URL or one named twice), 69 when no cluster could be
started, 128+N when signal N interrupts it (130 for Ctrl-C, 143 for
SIGTERM).
]]):format(args.describe(SPEC))
end

local shell_quote = require("redlock.devcluster").shell_quote

local function read_file(path)
    local f = io.open(path, "rb")
    if not f then return nil end
    local s = f:read("*a")
    f:close()
    return s
end

local function write_file(path, s)
    local f = assert(io.open(path, "wb"))
    f:write(s)
    f:close()
end

local function make_temp_dir()
    local p = io.popen("mktemp -d \"${TMPDIR:-/tmp}/redlock-demo.XXXXXX\"")
    local dir = p:read("*l")
    p:close()
    return dir
end

local function parse_event(line)
    local kind, rest = line:match("^(%a+) (.*)$")
    if kind == "enter" then
        local id, round, t, attempts, waited, votes = rest:match("^(%d+) (%d+) (%S+) (%d+) (%S+) (%S+)$")
        if id then
            return { kind = kind, id = tonumber(id), round = tonumber(round), t = tonumber(t),
                              attempts = tonumber(attempts), waited = tonumber(waited), votes = votes }
        end
    elseif kind == "exit" then
        local id, round, t = rest:match("^(%d+) (%d+) (%S+)$")
        if id then return { kind = kind, id = tonumber(id), round = tonumber(round), t = tonumber(t) } end
    elseif kind == "fail" then
        local id, round, why = rest:match("^(%d+) (%d+) (.*)$")
        if id then return { kind = kind, id = tonumber(id), round = tonumber(round), why = why } end
    end
    return nil
end

local VOTE_SHOWN = { ok = "ok", taken = "taken", timeout = "--", error = "err", pending = ".", unknown = "?" }

local function show_votes(votes)
    local t = {}
    for v in votes:gmatch("[^,]+") do t[#t + 1] = ("%-5s"):format(VOTE_SHOWN[v] or v) end
    return table.concat(t, " ")
end

--- Check the log: overlaps between holders, and the counter.
local function analyse(events, counter)
    local intervals, open = {}, {}
    for _, e in ipairs(events) do
        local key = e.id .. ":" .. e.round
        if e.kind == "enter" then open[key] = e
        elseif e.kind == "exit" and open[key] then
            intervals[#intervals + 1] = { from = open[key].t, to = e.t, id = e.id }
            open[key] = nil
        end
    end
    table.sort(intervals, function(a, b) return a.from < b.from end)
    local overlaps, last_to = 0, -math.huge
    for _, iv in ipairs(intervals) do
        if iv.from < last_to then overlaps = overlaps + 1 end
        if iv.to > last_to then last_to = iv.to end
    end
    return { sections = #intervals, overlaps = overlaps, lost = #intervals - counter }
end

function _M.run(opts, argv, k)
    if argv[k] ~= nil then return host.usage_error("demo", "unexpected '" .. argv[k] .. "'") end
    local nworkers, rounds, nnodes = opts.workers or 4, opts.rounds or 5, opts.nodes or 5
    if nnodes > 16 then -- a client's most (RL_MAX_NODES), as redlock dev says
        return host.usage_error("demo", ("--nodes must be from 1 to 16, got %d"):format(nnodes))
    end
    local exe = (package.loaded["redlock.host.self"] or {}).exe or arg[0]

    sys.defer_signals(true) -- Ctrl-C must reach the cleanup below
    local out = io.stdout
    local function say(fmt, ...)
        out:write(fmt:format(...), "\n")
        out:flush()
    end

    -- the label and prefix the workers will use, and configured servers with
    -- their TLS files, are checked before any worker starts, as run does
    local named, lerr = config.check_label_and_prefix(opts)
    if not named then return host.fail(EXIT.USAGE, "%s", lerr) end
    local cl, servers, dir
    if opts.servers or opts.servers_file or os.getenv("REDLOCK_SERVERS") then
        local err
        servers, err = config.servers(opts)
        if not servers then return host.fail(EXIT.USAGE, "%s", err) end
        local usable, uerr = config.check_usable(servers, opts)
        if not usable then return host.fail(EXIT.USAGE, "%s", uerr) end
        dir = make_temp_dir()
        say("redlock demo: using the %d configured nodes", #servers)
    else
        say("redlock demo: starting %d throwaway redis-server nodes ...", nnodes)
        local ok, c = pcall(require("redlock.devcluster").start, { n = nnodes })
        if not ok then return host.fail(EXIT.UNAVAILABLE, "%s", tostring(c)) end
        cl, servers, dir = c, c.urls, c.dir
        say("  ports %s (pids %s)", table.concat(cl.ports, " "), table.concat(cl.pids, " "))
    end
    local quorum = math.floor(#servers / 2) + 1
    local log, counter = dir .. "/demo.log", dir .. "/counter"
    write_file(counter, "0\n")
    write_file(log, "")

    local workers, status = {}, {}
    local function stop_all(sig_name)
        for _, pid in ipairs(workers) do
            if status[pid] == nil then sys.kill(pid, sys.SIGTERM, true) end
        end
        local deadline = sys.now_ms() + 3000
        for _, pid in ipairs(workers) do
            while status[pid] == nil do
                local what, code = sys.wait(pid, false)
                if what ~= "running" then status[pid] = code or -1
                elseif sys.now_ms() > deadline then sys.kill(pid, sys.SIGKILL, true)
                else sys.sleep_ms(10) end
            end
        end
        if cl then
            local ok, err = cl:stop()
            say("redlock demo: %s; stopped the %d nodes%s", sig_name, #servers,
                ok and "" or (" (" .. tostring(err) .. ")"))
        end
    end

    say("\n%d workers, %d rounds each, on resource '%s' (ttl %d ms, quorum %d of %d).",
        nworkers, rounds, RESOURCE, WORKER_TTL, quorum, #servers)
    say("Under the lock each worker reads the counter file, sleeps, and writes it back + 1.\n")
    say("votes: node 1 .. node %d   (ok = granted, taken = held by another, -- = no answer)", #servers)
    -- the workers take the servers from REDLOCK_SERVERS (passwords stay out
    -- of their command lines) and every other server option as given
    sys.setenv("REDLOCK_SERVERS", table.concat(servers, ","))
    local worker_argv = { exe, "demo-worker" }
    for _, o in ipairs(config.OPTIONS) do
        local v = opts[o.name]
        if v ~= nil and o.name ~= "servers" and o.name ~= "servers_file" then
            worker_argv[#worker_argv + 1] = "--" .. o.long
            if o.arg then worker_argv[#worker_argv + 1] = v end
        end
    end
    local first_operand = #worker_argv + 1
    for w = 1, nworkers do
        worker_argv[first_operand], worker_argv[first_operand + 1] = RESOURCE, dir
        worker_argv[first_operand + 2], worker_argv[first_operand + 3] = tostring(w), tostring(rounds)
        local pid, err = sys.spawn(worker_argv, sys.NEWPGRP + sys.DIE_WITH_HOST)
        if not pid then
            stop_all("failed")
            return host.fail(EXIT.FAIL, "cannot start a worker: %s", err)
        end
        workers[w] = pid
    end

    local events, seen_bytes, total = {}, 0, nworkers * rounds
    local paused, resumed = false, false
    local function consume()
        local text = read_file(log) or ""
        local chunk = text:sub(seen_bytes + 1)
        local last_nl = chunk:match(".*()\n")
        if not last_nl then return end
        seen_bytes = seen_bytes + last_nl
        for line in chunk:sub(1, last_nl):gmatch("[^\n]+") do
            local e = parse_event(line)
            if e then
                events[#events + 1] = e
                if e.kind == "enter" then
                    local n = 0
                    for _, x in ipairs(events) do if x.kind == "enter" then n = n + 1 end end
                    say("  %3d/%d  worker %d  %2d attempt%s  waited %5.0f ms   %s", n, total, e.id, e.attempts,
                        e.attempts == 1 and " " or "s", e.waited, show_votes(e.votes))
                    if cl and #servers >= 3 and not paused and n >= total / 3 then
                        paused = true
                        cl:kill(1, "STOP")
                        say("         node 1 paused (SIGSTOP): %d of %d nodes still make a quorum of %d",
                            #servers - 1, #servers, quorum)
                    elseif paused and not resumed and n >= 2 * total / 3 then
                        resumed = true
                        cl:kill(1, "CONT")
                        say("         node 1 resumed (SIGCONT)")
                    end
                elseif e.kind == "fail" then
                    say("          worker %d  gave up: %s", e.id, e.why)
                end
            end
        end
    end

    local started = sys.now_ms()
    while true do
        local sig = sys.pending_signal()
        if sig then
            consume()
            stop_all("interrupted")
            return 128 + sig
        end
        consume()
        local running = 0
        for _, pid in ipairs(workers) do
            if status[pid] == nil then
                local what, code = sys.wait(pid, false)
                if what == "running" then running = running + 1 else status[pid] = code or -1 end
            end
        end
        if running == 0 then break end
        sys.sleep_ms(20)
    end
    consume()
    local elapsed = sys.now_ms() - started
    if paused and not resumed then cl:kill(1, "CONT") end

    local final = tonumber((read_file(counter) or ""):match("%d+")) or -1
    local a = analyse(events, final)
    local per = {}
    local node_votes = {}
    for _, e in ipairs(events) do
        if e.kind == "enter" then
            local p = per[e.id] or { n = 0, attempts = 0, waited = 0 }
            p.n, p.attempts, p.waited = p.n + 1, p.attempts + e.attempts, p.waited + e.waited
            per[e.id] = p
            local j = 0
            for v in e.votes:gmatch("[^,]+") do
                j = j + 1
                node_votes[j] = node_votes[j] or {}
                node_votes[j][v] = (node_votes[j][v] or 0) + 1
            end
        end
    end
    say("\nworker  acquisitions  attempts  waited ms  exit")
    for w, pid in ipairs(workers) do
        local p = per[w] or { n = 0, attempts = 0, waited = 0 }
        say("  %-6d  %-12d  %-8d  %-9.0f  %s", w, p.n, p.attempts, p.waited, tostring(status[pid]))
    end
    local vline = {}
    for j = 1, #servers do
        local v = node_votes[j] or {}
        vline[#vline + 1] = ("node %d: %d ok, %d no answer"):format(j, v.ok or 0, (v.timeout or 0) + (v.error or 0))
    end
    say("votes for the granted locks: %s", table.concat(vline, "; "))
    say("\n%d critical sections in %.1f s; counter = %d (expected %d)", a.sections, elapsed / 1000,
        final, a.sections)
    say("overlaps: %d   lost updates: %d", a.overlaps, a.lost)
    local workers_ok = true
    for _, pid in ipairs(workers) do if status[pid] ~= 0 then workers_ok = false end end
    local pass = a.overlaps == 0 and a.lost == 0 and a.sections == total and workers_ok

    if cl then
        local ok, err = cl:stop()
        say("stopped the %d redis-server nodes%s", #servers, ok and "" or (" (" .. tostring(err) .. ")"))
    else
        os.execute("rm -rf -- " .. shell_quote(dir))
    end
    sys.defer_signals(false)
    if pass then
        say("OK: one holder at a time, every update kept.")
        return EXIT.OK
    end
    say("FAILED: see above.")
    return EXIT.FAIL
end

---------------------------------------------------------------------------
-- redlock demo-worker [SERVER OPTIONS] RESOURCE DIR ID ROUNDS (internal)

_M.worker = { SPEC = config.spec {} }

function _M.worker.help()
    return "usage: redlock demo-worker [SERVER OPTIONS] RESOURCE DIR ID ROUNDS (used by redlock demo;"
        .. " the servers from REDLOCK_SERVERS)\n"
end

-- Each node's vote for lock, taken by dlm: read from the nodes (under
-- dlm's prefix, with the TLS options tls) when the lock does not say.
local function votes_of(lock, dlm, tls)
    if type(lock.detail) == "table" and #lock.detail > 0 then
        local t = {}
        for j, node in ipairs(lock.detail) do t[j] = node.state or "unknown" end
        return table.concat(t, ",")
    end
    -- The Lua API does not report a granted lock's votes: ask each node
    -- whether it holds our value (the nodes that granted it do).
    local t = {}
    for j, url in ipairs(dlm.servers) do
        local r = sys.probe(url, (dlm.prefix or "") .. lock.resource, 60, tls)
        t[j] = not r and "timeout" or (r.value == lock.value and "ok" or "taken")
    end
    return table.concat(t, ",")
end

function _M.worker.run(opts, argv, k)
    local resource, dir, id, rounds = argv[k], argv[k + 1], tonumber(argv[k + 2]), tonumber(argv[k + 3])
    if not (resource and dir and id and rounds) then
        return host.usage_error("demo-worker", "expected RESOURCE DIR ID ROUNDS")
    end
    config.insecure_warned() -- (the demo said so once, for all of its workers)
    local tls = config.tls_options(opts)
    local dlm = assert(config.client(opts)) -- (the demo checked its options)
    math.randomseed(sys.getpid())
    local redlock = require "redlock"
    local logf = assert(io.open(dir .. "/demo.log", "a"))
    local function log(fmt, ...)
        logf:write(fmt:format(...), "\n")
        logf:flush()
    end
    local counter = dir .. "/counter"
    local jitter = redlock.retry.forever(10, 60)
    for round = 1, rounds do
        local attempts = 0
        local t0 = sys.now_ms()
        local lock, err, detail = dlm:lock(resource, {
            ttl = WORKER_TTL, wait = 30000,
            retry = function(n, e) attempts = n; return jitter(n, e) end,
        })
        if not lock then
            log("fail %d %d %s", id, round, tostring(err))
            if detail then io.stderr:write(config.describe_detail(detail), "\n") end
            return EXIT.UNAVAILABLE
        end
        local waited = sys.now_ms() - t0
        local votes = votes_of(lock, dlm, tls)
        log("enter %d %d %.3f %d %.1f %s", id, round, sys.now_ms(), attempts + 1, waited, votes)
        -- the unsafe read-modify-write the lock protects
        local n = tonumber((read_file(counter) or ""):match("%d+")) or 0
        sys.sleep_ms(10 + math.random(0, 30))
        write_file(counter, (n + 1) .. "\n")
        log("exit %d %d %.3f", id, round, sys.now_ms())
        lock:unlock()
        sys.sleep_ms(math.random(0, 20)) -- let the others in
    end
    logf:close()
    return EXIT.OK
end

return _M
