-- absummary.lua — the table of bench/ab: every figure for the old and the new
-- revision, from the JSON lines bench/ab wrote (each row carries "rev" = old or
-- new and "round").
--
--   luajit bench/absummary.lua ab.jsonl
--
-- old and new are medians over the rounds; new/old is the median of the
-- per-round ratios (old and new measured back to back in one round), shown
-- with their [min..max], and whether that range holds 1.00. Then the runs that gave no figure or reported errors,
-- violations or lost locks, after a line "problems: N".

local file = arg[1]
if not file then
    io.stderr:write("usage: luajit bench/absummary.lua ab.jsonl\n")
    os.exit(2)
end

-- flat JSON objects, one per line (bench/jsonl.lua)
local parse = dofile((arg[0]:match("^(.*)/") or ".") .. "/jsonl.lua").parse

local rows = {}
do
    local f = assert(io.open(file))
    for line in f:lines() do
        local o = line:match("^%s*{") and parse(line)
        if o then rows[#rows + 1] = o end
    end
    f:close()
end

local function median(xs)
    if #xs == 0 then return nil end
    local a = {}
    for i, x in ipairs(xs) do a[i] = x end
    table.sort(a)
    local n = #a
    if n % 2 == 1 then return a[(n + 1) / 2] end
    return (a[n / 2] + a[n / 2 + 1]) / 2
end

-- value[peer][workload][rev][round] = row
local by = {}
local rounds_seen = {}
for _, o in ipairs(rows) do
    if o.peer and o.workload and o.rev and o.round then
        by[o.peer] = by[o.peer] or {}
        by[o.peer][o.workload] = by[o.peer][o.workload] or { old = {}, new = {} }
        local t = by[o.peer][o.workload][o.rev]
        if t then t[o.round] = o end
        rounds_seen[o.round] = true
    end
end
local rounds = {}
for r in pairs(rounds_seen) do rounds[#rounds + 1] = r end
table.sort(rounds)

-- the value of a figure in one row; get is a field name or a function of the
-- rows of that round ({ peer = { workload = row } } for one revision)
local function values(peer, workload, get, rev)
    local out = {}
    for _, r in ipairs(rounds) do
        local v
        if type(get) == "function" then
            v = get(function(p, w)
                local t = by[p] and by[p][w] and by[p][w][rev]
                return t and t[r]
            end)
        else
            local t = by[peer] and by[peer][workload] and by[peer][workload][rev]
            local o = t and t[r]
            v = o and o[get]
        end
        if type(v) == "number" and v == v and v >= 0 then out[r] = v end
    end
    return out
end

local function list(byround)
    local a = {}
    for _, r in ipairs(rounds) do if byround[r] then a[#a + 1] = byround[r] end end
    return a
end

local FIG = {}
local function fig(label, better, fmt, peer, workload, get)
    FIG[#FIG + 1] = { label = label, better = better, fmt = fmt, peer = peer, workload = workload, get = get }
end
local INT, D1, D2 = "%.0f", "%.1f", "%.2f"
-- a figure's getter: field (µs) of peer's workload, in ms
local function in_ms(peer, workload, field)
    return function(row)
        local o = row(peer, workload)
        return o and o[field] and o[field] / 1000
    end
end
for _, d in ipairs { { "redlock-c", "C" }, { "redlock-lua", "Lua" } } do
    local peer, n = d[1], d[2]
    fig(n .. " seq cycles/s", "higher", INT, peer, "seq", "rate")
    fig(n .. " seq acquire p50 µs", "lower", INT, peer, "seq", "p50_us")
    fig(n .. " seq release p50 µs", "lower", INT, peer, "seq", "rel_p50_us")
    fig(n .. " seq client CPU ms / 1000 cycles", "lower", D1, peer, "seq", "cpu_ms_per_1k")
    fig(n .. " conc cycles/s", "higher", INT, peer, "conc", "rate")
    fig(n .. " conc cycle p50 µs", "lower", INT, peer, "conc", "p50_us")
    fig(n .. " conc client CPU ms / 1000 cycles", "lower", D1, peer, "conc", "cpu_ms_per_1k")
    fig(n .. " seq-stall1 cycles/s", "higher", INT, peer, "seq-stall1", "rate")
    fig(n .. " seq-stall1 release p50 µs", "lower", INT, peer, "seq-stall1", "rel_p50_us")
    fig(n .. " hand-off acquisitions/s", "higher", INT, peer, "handoff", "rate")
    fig(n .. " hand-off p50 ms", "lower", D2, peer, "handoff", in_ms(peer, "handoff", "p50_us"))
    fig(n .. " hand-off ceiling/s (one process alone)", "higher", INT, peer, "handoff", "ceiling_rate")
    fig(n .. " sem acquisitions/s", "higher", INT, peer, "sem", "rate")
    fig(n .. " sem wait p99 ms", "lower", D2, peer, "sem", in_ms(peer, "sem", "p99_us"))
    fig(n .. " sem ceiling/s", "higher", INT, peer, "sem", "ceiling_rate")
    fig(n .. " sem node CPU ms / 1000", "lower", INT, peer, "sem", "srv_cpu_ms_per_1k")
    fig(n .. " seq-tls cycles/s", "higher", INT, peer, "seq-tls", "rate")
    fig(n .. " seq-tls acquire p50 µs", "lower", INT, peer, "seq-tls", "p50_us")
end
fig("keep-alive RSS MB", "lower", D1, "redlock-keepalive", "keepalive", "rss_mb")
fig("keep-alive CPU % of a core", "lower", D2, "redlock-keepalive", "keepalive", "keepalive_cpu_pct")
fig("keep-alive µs CPU per extension", "lower", D1, "redlock-keepalive", "keepalive", "keepalive_us_per_extend")
fig("nginx /ping req/s (no lock: the reference)", "higher", INT, "nginx", "nginx-ping", "rate")
fig("nginx /lock req/s", "higher", INT, "nginx", "nginx-lock", "rate")
fig("nginx /lock p50 ms", "lower", D2, "nginx", "nginx-lock", "p50_ms")
fig("nginx /lock req/s / /ping req/s", "higher", D2, "nginx", "nginx-lock", function(row)
    local l, p = row("nginx", "nginx-lock"), row("nginx", "nginx-ping")
    return l and p and l.rate and p.rate and p.rate > 0 and l.rate / p.rate or nil
end)

local function f(fmt, v) return v and fmt:format(v) or "-" end

print("| figure | better | old | new | new/old | per round [min..max] | rounds | 1.00 in range |")
print("|---|---|---|---|---|---|---|---|")
for _, g in ipairs(FIG) do
    local o = values(g.peer, g.workload, g.get, "old")
    local n = values(g.peer, g.workload, g.get, "new")
    local lo, ln = list(o), list(n)
    if #lo > 0 or #ln > 0 then
        local ratios = {}
        for _, r in ipairs(rounds) do
            if o[r] and n[r] and o[r] > 0 then ratios[#ratios + 1] = n[r] / o[r] end
        end
        local mr = median(ratios)
        local lo_r, hi_r = math.huge, -math.huge
        for _, x in ipairs(ratios) do lo_r, hi_r = math.min(lo_r, x), math.max(hi_r, x) end
        local range, reading = "-", ""
        if #ratios > 0 then range = ("[%.2f..%.2f]"):format(lo_r, hi_r) end
        if #ratios > 1 then
            if lo_r <= 1 and hi_r >= 1 then reading = "yes"
            elseif (lo_r > 1) == (g.better == "higher") then reading = "no: new better"
            else reading = "no: new worse" end
        end
        print(("| %s | %s | %s | %s | %s | %s | %d | %s |"):format(g.label, g.better, f(g.fmt, median(lo)),
            f(g.fmt, median(ln)), mr and ("%.2f"):format(mr) or "-", range, #ratios, reading))
    end
end
print()
print("old, new: medians over the rounds. new/old: the median of the per-round ratios (old and new back")
print("to back in one round); [min..max]: their range. A ratio whose range holds 1.00 is within the noise")
print("of this run. With n rounds of pure noise every ratio falls on one side of 1.00 for about one figure")
print("in 2^(n-1) (1 in 8 with 4 rounds): a \"no\" alone is a lead, not a verdict; see whether it")
print("comes back in a second run or with more rounds.")
print()

-- what did not go as it should
local problems = {}
local function sum(peer, workload, field, rev)
    local s = 0
    for _, r in ipairs(rounds) do
        local t = by[peer] and by[peer][workload] and by[peer][workload][rev]
        local o = t and t[r]
        if o and type(o[field]) == "number" then s = s + o[field] end
    end
    return s
end
for _, o in ipairs(rows) do
    local where = ("round %s, %s %s %s"):format(tostring(o.round), tostring(o.rev), tostring(o.peer), tostring(o.workload))
    if o.failed then problems[#problems + 1] = where .. ": " .. tostring(o.note) end
    if (o.errors or 0) > 0 then problems[#problems + 1] = where .. (": %d errors"):format(o.errors) end
    if (o.violations or 0) > 0 then problems[#problems + 1] = where .. (": %d violations"):format(o.violations) end
    if (o.lost or 0) > 0 then problems[#problems + 1] = where .. (": %d locks lost"):format(o.lost) end
end
local gave = {}
for _, peer in ipairs { "redlock-c", "redlock-lua" } do
    for _, rev in ipairs { "old", "new" } do
        local g = sum(peer, "handoff", "acquire_gave_up", rev)
        if g > 0 then gave[#gave + 1] = ("%s %s %d"):format(rev, peer, g) end
    end
end
if #gave > 0 then print("hand-off waiters that gave up (retries exhausted): " .. table.concat(gave, ", ")) print() end
print(("problems: %d"):format(#problems))
for _, p in ipairs(problems) do print("* " .. p) end
