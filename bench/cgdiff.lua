-- cgdiff.lua SMALL.out LARGE.out CYCLES [TOP] — instructions per cycle from two
-- callgrind runs of the same workload that differ only in their cycle count:
-- (LARGE - SMALL) / CYCLES, in total and per function (self and inclusive), so
-- start-up, connection and warm-up costs cancel out. Needs callgrind_annotate.
local small, large, cycles, top = arg[1], arg[2], tonumber(arg[3]), tonumber(arg[4] or 25)
if not (small and large and cycles) then
    io.stderr:write("usage: luajit cgdiff.lua SMALL.out LARGE.out CYCLES [TOP]\n")
    os.exit(2)
end

local function short(fn)
    local name, obj = fn:match("^(.-)%s+%[(.-)%]$")
    name = name or fn
    name = name:match("^.*:([^:]+)$") or name
    obj = obj and obj:match("([^/]+)$") or "?"
    if name:match("^0x%x+$") then
        -- anonymous code: LuaJIT's machine code has no object file
        return obj == "?" and "(JIT-compiled Lua)" or ("(anon) " .. obj)
    end
    return name .. " (" .. obj:gsub("%.so[%.%d]*$", ".so") .. ")"
end

local function load(file, inclusive)
    local p = io.popen(("callgrind_annotate --auto=no --inclusive=%s --threshold=100 %q 2>/dev/null")
        :format(inclusive and "yes" or "no", file))
    local t, total = {}, nil
    for line in p:lines() do
        local num, rest = line:match("^%s*([%d,]+)%s+%([%s%d%.]+%%%)%s+(.*)$")
        if num then
            local v = tonumber((num:gsub(",", "")))
            if rest == "PROGRAM TOTALS" then
                total = v
            else
                local k = short(rest)
                t[k] = (t[k] or 0) + v
            end
        end
    end
    p:close()
    return t, total
end

local function diff(inclusive)
    local a, ta = load(small, inclusive)
    local b, tb = load(large, inclusive)
    local rows = {}
    for k, v in pairs(b) do rows[#rows + 1] = { k, (v - (a[k] or 0)) / cycles } end
    table.sort(rows, function(x, y) return x[2] > y[2] end)
    return rows, (tb - ta) / cycles
end

local self_rows, total = diff(false)
local incl_rows = diff(true)
print(("instructions per lock+unlock cycle: %.0f"):format(total))
print("\nself cost per cycle (top " .. top .. "):")
for i = 1, math.min(top, #self_rows) do
    local r = self_rows[i]
    print(("  %8.0f  %5.1f%%  %s"):format(r[2], r[2] / total * 100, r[1]))
end
print("\ninclusive cost per cycle (top " .. top .. "):")
local shown = 0
for i = 1, #incl_rows do
    local r = incl_rows[i]
    if r[2] <= total * 1.001 then -- skip the frames above main
        print(("  %8.0f  %5.1f%%  %s"):format(r[2], r[2] / total * 100, r[1]))
        shown = shown + 1
        if shown >= top then break end
    end
end
