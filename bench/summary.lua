-- summary.lua — our figures beside the floor's and the best peer's, with the
-- targets of issue 4 (and of issue 14: node 1 stalled, node 1 far), from the
-- JSON lines of the peers harness.
--
--   luajit bench/summary.lua RUN1.jsonl [RUN2.jsonl ...] [--scaling S.jsonl] [--keepalive K.jsonl]
--   luajit bench/summary.lua --ab AB1.jsonl [AB2.jsonl ...]
--   luajit bench/summary.lua --far FAR.jsonl [--far-delay MS]
--   luajit bench/summary.lua --tls TLS.jsonl
--   luajit bench/summary.lua --stall STALL.jsonl [RUN1.jsonl ...]
--
-- Ratios are taken within each run (same nodes, same minute), then the median
-- over runs is shown with its [min..max]. In FAR.jsonl (bench/run's far-node
-- step) a run is a round: rows carry "round", workloads seq / conc (all nodes
-- direct), seq-far1 / conc-far1 (node 1 behind the delaying proxy) and
-- seq-pass1 / conc-pass1 (node 1 behind a proxy that delays nothing). TLS.jsonl
-- likewise: seq / conc over plain TCP, seq-tls / conc-tls over TLS, same nodes.
-- STALL.jsonl (bench/run's step 5c) likewise: seq with node 1 healthy (seq),
-- stopped (seq-stall1) and killed (seq-kill1), and redis-benchmark's PING
-- lines; the harness runs given beside it supply the peers' seq-stall1.

local runs, scaling_file, keepalive_file, ab = {}, nil, nil, false
local far_file, far_delay = nil, nil
local tls_file, stall_file = nil, nil
do
    local i = 1
    while arg[i] do
        if arg[i] == "--ab" then ab = true; i = i + 1
        elseif arg[i] == "--scaling" then scaling_file = arg[i + 1]; i = i + 2
        elseif arg[i] == "--keepalive" then keepalive_file = arg[i + 1]; i = i + 2
        elseif arg[i] == "--far" then far_file = arg[i + 1]; i = i + 2
        elseif arg[i] == "--far-delay" then far_delay = arg[i + 1]; i = i + 2
        elseif arg[i] == "--tls" then tls_file = arg[i + 1]; i = i + 2
        elseif arg[i] == "--stall" then stall_file = arg[i + 1]; i = i + 2
        else runs[#runs + 1] = arg[i]; i = i + 1 end
    end
end

-- flat JSON objects, one per line (bench/jsonl.lua)
local parse = dofile((arg[0]:match("^(.*)/") or ".") .. "/jsonl.lua").parse

local function load(file)
    local rows = {}
    local f = io.open(file)
    if not f then return rows end
    for line in f:lines() do
        local o = line:match("^%s*{") and parse(line)
        if o and o.peer then rows[#rows + 1] = o end
    end
    f:close()
    return rows
end

local function median(xs)
    local a = {}
    for _, x in ipairs(xs) do if type(x) == "number" then a[#a + 1] = x end end
    if #a == 0 then return nil end
    table.sort(a)
    local m = math.floor(#a / 2)
    if #a % 2 == 1 then return a[m + 1] end
    return (a[m] + a[m + 1]) / 2
end
local function spread(xs)
    local a = {}
    for _, x in ipairs(xs) do if type(x) == "number" then a[#a + 1] = x end end
    if #a == 0 then return nil end
    table.sort(a)
    return a[1], a[#a]
end

local NPM_PEERS = { ["node-redlock@4"] = true, ["node-redlock@5b2"] = true, ["sesamecare-redlock"] = true,
    ["redis-semaphore"] = true, ["redlock-universal"] = true }
local FLOOR, C, LUA = "floor-c-mux", "redlock-c", "redlock-lua"

-- per run: index[peer][workload] = row; best peer per workload (by rate)
local per_run = {}
for _, file in ipairs(runs) do
    local idx, best = {}, {}
    for _, r in ipairs(load(file)) do
        idx[r.peer] = idx[r.peer] or {}
        idx[r.peer][r.workload] = r
        if NPM_PEERS[r.peer] and type(r.rate) == "number" then
            local b = best[r.workload]
            if not b or r.rate > b.rate then best[r.workload] = r end
        end
    end
    per_run[#per_run + 1] = { idx = idx, best = best }
end

local function get(run, who, wl, field)
    local r
    if who == "best" then r = run.best[wl]
    elseif who == "best-stall" then -- the peer with the best seq-stall1 of this run, any workload
        local b = run.best["seq-stall1"]
        r = b and run.idx[b.peer] and run.idx[b.peer][wl]
    else r = run.idx[who] and run.idx[who][wl] end
    return r and r[field]
end
local function series(who, wl, field)
    local xs = {}
    for _, run in ipairs(per_run) do xs[#xs + 1] = get(run, who, wl, field) end
    return xs
end
local function ratio_series(a, wa, fa, b, wb, fb)
    local xs = {}
    for _, run in ipairs(per_run) do
        local x, y = get(run, a, wa, fa), get(run, b, wb, fb)
        if type(x) == "number" and type(y) == "number" and y ~= 0 then xs[#xs + 1] = x / y end
    end
    return xs
end
-- as ratio_series, but a zero denominator (a driver recorded as hung: rate 0) against a
-- non-zero numerator counts as an infinite ratio instead of being left out
local function ratio_series_inf(a, wa, fa, b, wb, fb)
    local xs = {}
    for _, run in ipairs(per_run) do
        local x, y = get(run, a, wa, fa), get(run, b, wb, fb)
        if type(x) == "number" and type(y) == "number" then
            if y ~= 0 then xs[#xs + 1] = x / y elseif x > 0 then xs[#xs + 1] = math.huge end
        end
    end
    return xs
end
local function fmt(x, d)
    if x == nil then return "-" end
    if x == math.huge then return "inf" end
    return (("%." .. (d or 0) .. "f"):format(x))
end
local function med_fmt(xs, d)
    local m = median(xs)
    if not m then return "-" end
    local lo, hi = spread(xs)
    if #xs > 1 and lo ~= hi then return ("%s [%s..%s]"):format(fmt(m, d), fmt(lo, d), fmt(hi, d)) end
    return fmt(m, d)
end
-- one target row: each driver's figures (median [min..max], d decimals, 2 by default) and a
-- verdict on the medians; a driver without a figure does not fail the target (it shows "-")
local function target_row(name, xc, xl, ok, d)
    local mc, ml = median(xc), median(xl)
    local v
    if not mc and not ml then v = "not measured"
    else v = ((not mc or ok(mc)) and (not ml or ok(ml))) and "**met**" or "**not met**" end
    print(("| %s | %s | %s | %s |"):format(name, med_fmt(xc, d or 2), med_fmt(xl, d or 2), v))
end
local function best_names(wl)
    local seen, names = {}, {}
    for _, run in ipairs(per_run) do
        local b = run.best[wl]
        if b and not seen[b.peer] then seen[b.peer] = true; names[#names + 1] = b.peer end
    end
    return #names > 0 and table.concat(names, "/") or "-"
end

-- the rows of a file of rounds (bench/run's steps 5, 5b, 5c: each row has "round"), as a
-- list of runs in round order, the shape per_run has
local function load_rounds(file)
    local rounds, order, list = {}, {}, {}
    for _, r in ipairs(load(file)) do
        local k = r.round or 1
        if not rounds[k] then rounds[k] = { idx = {}, best = {} }; order[#order + 1] = k end
        local idx = rounds[k].idx
        idx[r.peer] = idx[r.peer] or {}
        idx[r.peer][r.workload] = r
    end
    table.sort(order)
    for _, k in ipairs(order) do list[#list + 1] = rounds[k] end
    return list
end

if far_file then
    -- far node: rounds of (redlock-c, redlock-lua) x (direct, far, plain proxy)
    per_run = load_rounds(far_file)
    local nr, d = #per_run, far_delay or "5"
    local has_pass = #series(C, "seq-pass1", "rate") + #series(LUA, "seq-pass1", "rate") > 0
    print(("## Far node: node 1 of 5 behind rl-faultproxy, every reply +%s ms (%d round%s; C and Lua, direct / far%s in rotating order on one cluster)"):format(
        d, nr, nr == 1 and "" or "s", has_pass and " / through a proxy that delays nothing" or ""))
    print()
    -- direct: all 5 nodes direct; far: node 1 via the delaying proxy; proxy: node 1 via a
    -- second proxy that delays nothing (what the extra hop costs by itself, on these CPUs)
    print("| driver | workload | direct cycles/s | far cycles/s | far / direct | proxy, no delay, cycles/s | far / proxy | p50 µs direct / far / proxy (seq: acquire; conc: whole cycle) | seq release p50 µs direct / far / proxy |")
    print("|---|---|---|---|---|---|---|---|---|")
    for _, w in ipairs { C, LUA } do
        for _, wl in ipairs { "seq", "conc" } do
            local f, pw = wl .. "-far1", wl .. "-pass1"
            print(("| %s | %s | %s | %s | %s | %s | %s | %s / %s / %s | %s |"):format(w, wl,
                med_fmt(series(w, wl, "rate")), med_fmt(series(w, f, "rate")),
                med_fmt(ratio_series(w, f, "rate", w, wl, "rate"), 2),
                med_fmt(series(w, pw, "rate")), med_fmt(ratio_series(w, f, "rate", w, pw, "rate"), 2),
                fmt(median(series(w, wl, "p50_us"))), fmt(median(series(w, f, "p50_us"))), fmt(median(series(w, pw, "p50_us"))),
                wl == "seq" and ("%s / %s / %s"):format(fmt(median(series(w, wl, "rel_p50_us"))),
                    fmt(median(series(w, f, "rel_p50_us"))), fmt(median(series(w, pw, "rel_p50_us"))))
                    or ""))
        end
    end
    print()
    print("| target (issue 14; ratios within each round) | redlock-c | redlock-lua | verdict |")
    print("|---|---|---|---|")
    local function both(name, wl, ok)
        local xc = ratio_series(C, wl .. "-far1", "rate", C, wl, "rate")
        local xl = ratio_series(LUA, wl .. "-far1", "rate", LUA, wl, "rate")
        local mc, ml = median(xc), median(xl)
        local v
        if not ok then v = (mc or ml) and "reported" or "not measured"
        elseif not mc and not ml then v = "not measured"
        else v = ((not mc or ok(mc)) and (not ml or ok(ml))) and "**met**" or "**not met**" end
        print(("| %s | %s | %s | %s |"):format(name, med_fmt(xc, 2), med_fmt(xl, 2), v))
    end
    both(("far node (+%s ms): seq >= 0.8x unfaulted seq"):format(d), "seq", function(x) return x >= 0.8 end)
    both(("far node (+%s ms): conc beside unfaulted conc (no target)"):format(d), "conc", nil)
    do -- the same seq ratio against the plain proxy: the library's share, the hop's cost aside
        local xc = ratio_series(C, "seq-far1", "rate", C, "seq-pass1", "rate")
        local xl = ratio_series(LUA, "seq-far1", "rate", LUA, "seq-pass1", "rate")
        if median(xc) or median(xl) then
            print(("| far node (+%s ms) seq / seq through the plain proxy (diagnostic, no target) | %s | %s | reported |"):format(
                d, med_fmt(xc, 2), med_fmt(xl, 2)))
        end
    end
    print()
    os.exit(0)
end

if tls_file then
    -- TLS beside plain: rounds of (redlock-c, redlock-lua) x (plain, TLS) on the same nodes
    per_run = load_rounds(tls_file)
    local nr = #per_run
    print(("## TLS beside plain TCP: 5 nodes serving both (%d round%s; C and Lua, plain / TLS in rotating order)"):format(
        nr, nr == 1 and "" or "s"))
    print()
    print("| driver | workload | plain cycles/s | TLS cycles/s | TLS / plain | p50 µs plain / TLS (seq: acquire; conc: whole cycle) | client CPU ms / 1000 cycles plain / TLS | server CPU ms / 1000 cycles plain / TLS |")
    print("|---|---|---|---|---|---|---|---|")
    for _, w in ipairs { C, LUA } do
        for _, wl in ipairs { "seq", "conc" } do
            local t = wl .. "-tls"
            print(("| %s | %s | %s | %s | %s | %s / %s | %s / %s | %s / %s |"):format(w, wl,
                med_fmt(series(w, wl, "rate")), med_fmt(series(w, t, "rate")),
                med_fmt(ratio_series(w, t, "rate", w, wl, "rate"), 2),
                fmt(median(series(w, wl, "p50_us"))), fmt(median(series(w, t, "p50_us"))),
                fmt(median(series(w, wl, "cpu_ms_per_1k")), 1), fmt(median(series(w, t, "cpu_ms_per_1k")), 1),
                fmt(median(series(w, wl, "srv_cpu_ms_per_1k")), 1), fmt(median(series(w, t, "srv_cpu_ms_per_1k")), 1)))
        end
    end
    print()
    print("| target (TLS; ratios within each round) | redlock-c | redlock-lua | verdict |")
    print("|---|---|---|---|")
    local xc = ratio_series(C, "conc-tls", "rate", C, "conc", "rate")
    local xl = ratio_series(LUA, "conc-tls", "rate", LUA, "conc", "rate")
    local mc, ml = median(xc), median(xl)
    local v = (not mc and not ml) and "not measured"
        or (((not mc or mc >= 0.7) and (not ml or ml >= 0.7)) and "**met**" or "**not met**")
    print(("| conc over TLS >= 0.7x conc over plain TCP | %s | %s | %s |"):format(med_fmt(xc, 2), med_fmt(xl, 2), v))
    print(("| seq over TLS beside seq over plain TCP (no target) | %s | %s | reported |"):format(
        med_fmt(ratio_series(C, "seq-tls", "rate", C, "seq", "rate"), 2),
        med_fmt(ratio_series(LUA, "seq-tls", "rate", LUA, "seq", "rate"), 2)))
    print()
    os.exit(0)
end

if stall_file then
    -- node 1 healthy / stopped / killed: rounds of (redlock-c, redlock-lua) x 3 on one cluster;
    -- the harness runs (if given) supply the best peer's seq-stall1 and its own within-run ratio
    local h_best = series("best", "seq-stall1", "rate")
    local h_names = best_names("seq-stall1")
    local h_floor = series(FLOOR, "seq", "rate")
    local h_ratio = {
        [C] = ratio_series_inf(C, "seq-stall1", "rate", "best", "seq-stall1", "rate"),
        [LUA] = ratio_series_inf(LUA, "seq-stall1", "rate", "best", "seq-stall1", "rate"),
    }
    local peer_stall = median(h_best)
    per_run = load_rounds(stall_file)
    local nr, dur = #per_run, nil
    for _, run in ipairs(per_run) do
        local r = run.idx[C] and run.idx[C].seq or run.idx[LUA] and run.idx[LUA].seq
        dur = dur or (r and r.secs)
    end
    print(("## Node 1 stopped, node 1 killed (issue 23): seq on 5 nodes, node 1 healthy / stopped (SIGSTOP) / killed (SIGKILL) after the warm-up (%d round%s of about %s s each; C and Lua, the three in rotating order on one cluster)"):format(
        nr, nr == 1 and "" or "s", fmt(dur, 0)))
    print()
    -- the step's redis-benchmark PING lines (no round): one per client count
    local pl = {}
    for _, r in ipairs(load(stall_file)) do
        if r.peer == "redis-benchmark" then pl[#pl + 1] = ("%d client%s: p50 %s µs, %s/s"):format(
            r.clients or 0, r.clients == 1 and "" or "s", fmt(r.p50_us), fmt(r.rate)) end
    end
    if #pl > 0 then print("Loopback PING on this machine during the step (redis-benchmark -t ping -n 20000): " .. table.concat(pl, "; ") .. ".") end
    if median(h_floor) then print(("The floor's seq in the harness runs: %s cycles/s."):format(med_fmt(h_floor))) end
    if #pl > 0 or median(h_floor) then print() end
    local conds = { { "seq", "healthy" }, { "seq-stall1", "stopped" }, { "seq-kill1", "killed" } }
    print("| driver | node 1 | cycles/s median [min..max] | / healthy (within a round) | acquire p50 / p99 µs | release p50 / p99 µs | client CPU ms / 1000 cycles | server CPU ms / 1000 cycles (nodes 2-5) | notes |")
    print("|---|---|---|---|---|---|---|---|---|")
    for _, w in ipairs { C, LUA } do
        for _, c in ipairs(conds) do
            local wl = c[1]
            local notes = {}
            for i, run in ipairs(per_run) do
                local r = run.idx[w] and run.idx[w][wl]
                if r and r.note then notes[#notes + 1] = ("round %d: %s"):format(i, r.note) end
                if r and type(r.errors) == "number" and r.errors > 0 then notes[#notes + 1] = ("round %d: %d errors"):format(i, r.errors) end
            end
            print(("| %s | %s | %s | %s | %s / %s | %s / %s | %s | %s | %s |"):format(w, c[2],
                med_fmt(series(w, wl, "rate")),
                wl == "seq" and "" or med_fmt(ratio_series(w, wl, "rate", w, "seq", "rate"), 2),
                fmt(median(series(w, wl, "p50_us"))), fmt(median(series(w, wl, "p99_us"))),
                fmt(median(series(w, wl, "rel_p50_us"))), fmt(median(series(w, wl, "rel_p99_us"))),
                med_fmt(series(w, wl, "cpu_ms_per_1k"), 1), fmt(median(series(w, wl, "srv_cpu_ms_per_1k")), 1),
                table.concat(notes, "; ")))
        end
    end
    if peer_stall then
        print(("| best peer in seq-stall1 (%s; harness runs) | stopped | %s | | | | | | |"):format(h_names, med_fmt(h_best)))
    end
    print()
    print("| target (issue 23) | redlock-c | redlock-lua | verdict |")
    print("|---|---|---|---|")
    local target = target_row
    local function at_least(t) return function(x) return x >= t end end
    target("seq-stall1 >= 0.9x seq (ratio within a round)", ratio_series(C, "seq-stall1", "rate", C, "seq", "rate"),
        ratio_series(LUA, "seq-stall1", "rate", LUA, "seq", "rate"), at_least(0.9))
    target("seq-stall1 >= 0.9x seq-kill1 (ratio within a round)", ratio_series(C, "seq-stall1", "rate", C, "seq-kill1", "rate"),
        ratio_series(LUA, "seq-stall1", "rate", LUA, "seq-kill1", "rate"), at_least(0.9))
    local function per_peer(w) -- this step's seq-stall1, each round, over the harness's best peer (median)
        local xs = {}
        if not peer_stall then return xs end
        for _, x in ipairs(series(w, "seq-stall1", "rate")) do
            xs[#xs + 1] = peer_stall > 0 and x / peer_stall or (x > 0 and math.huge or nil)
        end
        return xs
    end
    target(("seq-stall1 >= 1.5x the best peer's seq-stall1 (these rounds over the harness runs' best peer, %s cycles/s)"):format(fmt(peer_stall)),
        per_peer(C), per_peer(LUA), at_least(1.5))
    if median(h_ratio[C]) or median(h_ratio[LUA]) then
        target("seq-stall1 >= 1.5x the best peer's seq-stall1 (harness runs: ratio within each run)", h_ratio[C], h_ratio[LUA], at_least(1.5))
    end
    print()
    os.exit(0)
end

local n = #per_run
if ab then
    -- interleaved seq rounds (floor, redlock-c, redlock-lua in rotating order, same nodes)
    print(("## seq, interleaved: %d rounds of floor / redlock-c / redlock-lua in rotating order on one cluster"):format(n))
    print()
    print("| driver | seq cycles/s median [min..max] | acquire p50 µs | release p50 µs | client CPU ms / 1000 cycles |")
    print("|---|---|---|---|---|")
    for _, w in ipairs { FLOOR, C, LUA } do
        print(("| %s | %s | %s | %s | %s |"):format(w, med_fmt(series(w, "seq", "rate")), fmt(median(series(w, "seq", "p50_us"))),
            fmt(median(series(w, "seq", "rel_p50_us"))), fmt(median(series(w, "seq", "cpu_ms_per_1k")), 1)))
    end
    print()
    print("| target (ratio within each round) | median [min..max] | verdict (median) |")
    print("|---|---|---|")
    local function t(name, xs, ok)
        local m = median(xs)
        print(("| %s | %s | %s |"):format(name, med_fmt(xs, 2), m and (ok(m) and "**met**" or "**not met**") or "not measured"))
    end
    t("redlock-c seq >= floor", ratio_series(C, "seq", "rate", FLOOR, "seq", "rate"), function(x) return x >= 1 end)
    t("redlock-lua seq >= floor", ratio_series(LUA, "seq", "rate", FLOOR, "seq", "rate"), function(x) return x >= 1 end)
    t("Lua API within 10% of C API (Lua/C)", ratio_series(LUA, "seq", "rate", C, "seq", "rate"), function(x) return math.abs(x - 1) <= 0.10 end)
    print()
    os.exit(0)
end
print(("## Figures (medians of %d run%s; [min..max] over runs)"):format(n, n == 1 and "" or "s"))
print()
print("| | seq cycles/s | seq acquire p50/p99 µs | conc (64 in flight) cycles/s | client CPU ms / 1000 cycles (conc) | hand-off acquisitions/s | hand-off p50 ms | violations | gave up |")
print("|---|---|---|---|---|---|---|---|---|")
local function row(label, who)
    print(("| %s | %s | %s / %s | %s | %s | %s | %s | %s | %s |"):format(label,
        med_fmt(series(who, "seq", "rate")),
        fmt(median(series(who, "seq", "p50_us"))), fmt(median(series(who, "seq", "p99_us"))),
        med_fmt(series(who, "conc", "rate")),
        fmt(median(series(who, "conc", "cpu_ms_per_1k")), 1),
        who == FLOOR and "-" or med_fmt(series(who, "handoff", "rate")),
        who == FLOOR and "-" or fmt(median(series(who, "handoff", "p50_us")) and median(series(who, "handoff", "p50_us")) / 1e3, 1),
        who == FLOOR and "-" or table.concat((function() local t = {} for _, v in ipairs(series(who, "handoff", "violations")) do t[#t + 1] = tostring(v) end return t end)(), "/"),
        who == FLOOR and "-" or table.concat((function() local t = {} for _, v in ipairs(series(who, "handoff", "acquire_gave_up")) do t[#t + 1] = tostring(v) end return t end)(), "/")))
end
row("floor (C, waits for all 5)", FLOOR)
print(("| best peer (seq: %s; conc: %s; hand-off: %s) | %s | %s / %s | %s | %s | %s | %s | | |"):format(
    best_names("seq"), best_names("conc"), best_names("handoff"),
    med_fmt(series("best", "seq", "rate")), fmt(median(series("best", "seq", "p50_us"))), fmt(median(series("best", "seq", "p99_us"))),
    med_fmt(series("best", "conc", "rate")), fmt(median(series("best", "conc", "cpu_ms_per_1k")), 1),
    med_fmt(series("best", "handoff", "rate")),
    fmt(median(series("best", "handoff", "p50_us")) and median(series("best", "handoff", "p50_us")) / 1e3, 1)))
row("**redlock-c** (C API)", C)
row("**redlock-lua** (Lua API)", LUA)
if #series("redlock-lua-poll", "handoff", "rate") > 0 then
    row("redlock-lua, notifications off (hand-off only)", "redlock-lua-poll")
end
print()

-- degraded pass of the harness: seq again, node 1 SIGSTOPped after the warm-up
do
    local any = false
    for _, run in ipairs(per_run) do
        for _, w in pairs(run.idx) do if w["seq-stall1"] then any = true end end
    end
    if any then
        local function notes(who)
            local t = {}
            for _, run in ipairs(per_run) do
                local r = get(run, who, "seq-stall1", "note")
                r = r and { note = r }
                if r and r.note then t[#t + 1] = r.note end
            end
            return #t > 0 and (" (" .. table.concat(t, "; ") .. ")") or ""
        end
        print("## Degraded: node 1 of 5 stopped (SIGSTOP) after the warm-up, harness workload seq-stall1")
        print()
        print("| | seq cycles/s | seq-stall1 cycles/s | seq-stall1 / seq | seq-stall1 acquire p50 / p99 µs | seq-stall1 release p50 / p99 µs |")
        print("|---|---|---|---|---|---|")
        local function srow(label, who)
            print(("| %s | %s | %s%s | %s | %s / %s | %s / %s |"):format(label,
                med_fmt(series(who, "seq", "rate")), med_fmt(series(who, "seq-stall1", "rate")), notes(who),
                med_fmt(ratio_series(who, "seq-stall1", "rate", who, "seq", "rate"), 2),
                fmt(median(series(who, "seq-stall1", "p50_us"))), fmt(median(series(who, "seq-stall1", "p99_us"))),
                fmt(median(series(who, "seq-stall1", "rel_p50_us"))), fmt(median(series(who, "seq-stall1", "rel_p99_us")))))
        end
        -- the peer with the best seq-stall1, beside its own seq
        srow(("best peer in seq-stall1 (%s)"):format(best_names("seq-stall1")), "best-stall")
        srow("**redlock-c** (C API)", C)
        srow("**redlock-lua** (Lua API)", LUA)
        print()
        print("| target (issue 14; ratios within each run) | redlock-c | redlock-lua | verdict |")
        print("|---|---|---|---|")
        local t2 = target_row
        t2("seq-stall1 >= 0.9x own seq", ratio_series(C, "seq-stall1", "rate", C, "seq", "rate"),
            ratio_series(LUA, "seq-stall1", "rate", LUA, "seq", "rate"), function(x) return x >= 0.9 end)
        t2("seq-stall1 >= 1.2x best peer's seq-stall1", ratio_series_inf(C, "seq-stall1", "rate", "best", "seq-stall1", "rate"),
            ratio_series_inf(LUA, "seq-stall1", "rate", "best", "seq-stall1", "rate"), function(x) return x >= 1.2 end)
        print()
    end
end

-- targets
local function lowest(...)
    local all = {}
    for _, xs in ipairs { ... } do for _, x in ipairs(xs) do all[#all + 1] = x end end
    return all
end
print("## Targets (issue 4), ratios within each run")
print()
print("| target | redlock-c | redlock-lua | verdict |")
print("|---|---|---|---|")
local trow = target_row
trow("seq cycles/s >= floor's (ratio >= 1)", ratio_series(C, "seq", "rate", FLOOR, "seq", "rate"),
    ratio_series(LUA, "seq", "rate", FLOOR, "seq", "rate"), function(x) return x >= 1 end)
trow("seq cycles/s >= 1.3x best peer", ratio_series(C, "seq", "rate", "best", "seq", "rate"),
    ratio_series(LUA, "seq", "rate", "best", "seq", "rate"), function(x) return x >= 1.3 end)
trow("conc cycles/s >= 0.7x floor's", ratio_series(C, "conc", "rate", FLOOR, "conc", "rate"),
    ratio_series(LUA, "conc", "rate", FLOOR, "conc", "rate"), function(x) return x >= 0.7 end)
trow("conc cycles/s >= 7x best peer", ratio_series(C, "conc", "rate", "best", "conc", "rate"),
    ratio_series(LUA, "conc", "rate", "best", "conc", "rate"), function(x) return x >= 7 end)
trow("conc client CPU <= 15 ms / 1000 cycles", series(C, "conc", "cpu_ms_per_1k"), series(LUA, "conc", "cpu_ms_per_1k"),
    function(x) return x <= 15 end, 1)
do
    local xs = ratio_series(LUA, "seq", "rate", C, "seq", "rate")
    local m = median(xs)
    print(("| Lua API vs C API on seq: within 10%% (Lua/C cycles/s) | | %s | %s |"):format(med_fmt(xs, 2),
        m and (math.abs(m - 1) <= 0.10 and "**met**" or "**not met**") or "not measured"))
end
do
    -- 10x the best peer against the ceiling: one process alone doing lock, hold,
    -- unlock (the drivers measure it just before their hand-off run)
    local ten = {}
    for _, x in ipairs(series("best", "handoff", "rate")) do ten[#ten + 1] = 10 * x end
    local ceiling = lowest(series(C, "handoff", "ceiling_rate"), series(LUA, "handoff", "ceiling_rate"))
    local name = "hand-off acquisitions/s vs best peer (target >= 10x)"
    if #ceiling > 0 and #ten > 0 then
        name = ("%s: 10x is %s/s, the uncontended ceiling %s/s"):format(name, med_fmt(ten, 0), med_fmt(ceiling, 0))
    end
    trow(name, ratio_series(C, "handoff", "rate", "best", "handoff", "rate"),
        ratio_series(LUA, "handoff", "rate", "best", "handoff", "rate"), function(x) return x >= 10 end)
    trow("hand-off acquisitions/s vs the uncontended ceiling (one process: lock, hold, unlock; proposed target >= 0.8x)",
        ratio_series(C, "handoff", "rate", C, "handoff", "ceiling_rate"),
        ratio_series(LUA, "handoff", "rate", LUA, "handoff", "ceiling_rate"), function(x) return x >= 0.8 end)
end
do
    local c, l = series(C, "handoff", "p50_us"), series(LUA, "handoff", "p50_us")
    local mc, ml = median(c), median(l)
    print(("| hand-off p50 < 1 ms (target) | %s ms | %s ms | %s |"):format(fmt(mc and mc / 1e3, 1), fmt(ml and ml / 1e3, 1),
        (mc and ml) and ((mc < 1000 and ml < 1000) and "**met**" or "**not met** (needs release notifications)") or "not measured"))
    local v = {}
    for _, who in ipairs { C, LUA } do for _, x in ipairs(series(who, "handoff", "violations")) do v[#v + 1] = x end end
    local bad = 0
    for _, x in ipairs(v) do bad = bad + x end
    print(("| hand-off violations = 0 | %s | %s | %s |"):format(
        table.concat((function() local t = {} for _, x in ipairs(series(C, "handoff", "violations")) do t[#t + 1] = tostring(x) end return t end)(), "/"),
        table.concat((function() local t = {} for _, x in ipairs(series(LUA, "handoff", "violations")) do t[#t + 1] = tostring(x) end return t end)(), "/"),
        #v == 0 and "not measured" or (bad == 0 and "**met**" or "**not met**")))
end
if #series(C, "sem", "rate") + #series(LUA, "sem", "rate") > 0 then
    -- issue 25's semaphore (RB_WORKLOADS=sem): 16 lockers, limit 4, against redis-semaphore
    local function ms(xs) local t = {} for _, x in ipairs(xs) do t[#t + 1] = x / 1e3 end return t end
    trow("sem acquisitions/s vs redis-semaphore's (target >= 2x)", ratio_series(C, "sem", "rate", "best", "sem", "rate"),
        ratio_series(LUA, "sem", "rate", "best", "sem", "rate"), function(x) return x >= 2 end)
    trow("sem wait p99 < 20 ms", ms(series(C, "sem", "p99_us")), ms(series(LUA, "sem", "p99_us")),
        function(x) return x < 20 end, 1)
    local function most(xs) return #xs > 0 and { math.max(unpack(xs)) } or {} end
    trow("sem violations = 0 (the most in a run)", most(series(C, "sem", "violations")),
        most(series(LUA, "sem", "violations")), function(x) return x == 0 end, 0)
end
if keepalive_file then
    local ka = load(keepalive_file)
    local rss, cpu, lost, locks = {}, {}, {}, nil
    for _, r in ipairs(ka) do
        rss[#rss + 1], cpu[#cpu + 1], lost[#lost + 1], locks = r.rss_mb, r.keepalive_cpu_pct, r.lost, r.locks
    end
    if #rss > 0 then
        local mr, mc = median(rss), median(cpu)
        print(("| %s locks kept alive: RSS < 64 MB | %s MB (host) | | %s |"):format(tostring(locks), med_fmt(rss, 1), mr < 64 and "**met**" or "**not met**"))
        print(("| %s locks kept alive: keep-alive CPU < 5%% of a core | %s %% (host) | | %s |"):format(tostring(locks), med_fmt(cpu, 2), mc < 5 and "**met**" or "**not met**"))
    end
end
print()

if scaling_file then
    local rows = load(scaling_file)
    local by = {}
    local ns, whos, seen_n = {}, {}, {}
    for _, r in ipairs(rows) do
        if r.workload == "seq" then
            local k = r.nodes .. "\0" .. r.peer
            if not by[k] then
                by[k] = {}
                if not seen_n[r.nodes] then seen_n[r.nodes] = true; ns[#ns + 1] = r.nodes end
                if not whos[r.peer] then whos[r.peer] = true; whos[#whos + 1] = r.peer end
            end
            table.insert(by[k], r)
        end
    end
    table.sort(ns)
    local order = {}
    for _, w in ipairs { FLOOR, C, LUA } do if whos[w] then order[#order + 1] = w end end
    print("## Scaling: seq (one client, one resource), by number of nodes")
    print()
    print("| N | quorum | driver | cycles/s | acquire p50 / p99 µs | release p50 / p99 µs |")
    print("|---|---|---|---|---|---|")
    for _, nn in ipairs(ns) do
        for _, w in ipairs(order) do
            local rs = by[nn .. "\0" .. w] or {}
            local function s(f) local t = {} for _, r in ipairs(rs) do t[#t + 1] = r[f] end return t end
            print(("| %d | %d | %s | %s | %s / %s | %s / %s |"):format(nn, math.floor(nn / 2) + 1, w,
                fmt(median(s("rate"))), fmt(median(s("p50_us"))), fmt(median(s("p99_us"))),
                fmt(median(s("rel_p50_us"))), fmt(median(s("rel_p99_us")))))
        end
    end
    print()
end

if keepalive_file then
    local ka = load(keepalive_file)
    if #ka > 0 then
        print("## Keep-alive: locks held by one host process, extended by its keep-alive thread")
        print()
        print("| run | locks | ttl ms | window s | RSS MB (before locking) | keep-alive CPU % of a core | µs CPU per extension | extensions/s (expected) | redis CPU % (5 nodes) | lost |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for i, r in ipairs(ka) do
            print(("| %d | %d | %d | %.0f | %.1f (%.1f) | %.2f | %.1f | %.0f | %.1f | %d |"):format(i, r.locks, r.ttl_ms, r.secs,
                r.rss_mb, r.rss_before_mb, r.keepalive_cpu_pct, r.keepalive_us_per_extend, r.extends_per_s, r.srv_cpu_pct, r.lost))
        end
        print()
    end
end
