--- Command-line options, getopt style: -x, -xVALUE, -x VALUE, bundled short
-- flags (-nv), --long, --long=VALUE, --long VALUE, "--" ends the options.
-- Parsing stops at the first operand, so a command's own options (exec's
-- COMMAND, run's SCRIPT ARGS) are never taken for ours.
--
-- A spec is a list of { name =, short =, long =, arg = "METAVAR", check =,
-- warn_bare = } where check is one of "ms" (a time > 0), "ms0" (a time >= 0),
-- "status" (0..255), "count" (integer >= 1), "limit" (a semaphore's: 1 to
-- RL_MAX_LIMIT) or nil (any string). A time is a
-- number with a unit (500ms, 10s, 1.5s, 2m, 1h) or a bare number of
-- milliseconds, and comes out in whole milliseconds; numbers above MAX (what
-- a C int holds, and the most any core call takes in ms) are refused. With
-- warn_bare, a bare number from 1 to 999 (ms where seconds were likely meant)
-- gives a warning. Misuse returns nil and a message naming the option.

local _M = {}

local MAX = 2147483647
_M.MAX = MAX
local MAX_LIMIT = require("redlock.cdefs").lib.RL_MAX_LIMIT

-- The units a time may carry, in ms.
local UNITS = { ms = 1, s = 1000, m = 60000, h = 3600000 }

--- The milliseconds text stands for: a bare whole number (ms), or a number
-- with a unit (10s, 1.5s, 2m), whole ms only. Return ms and whether the
-- number was bare, or nil.
function _M.time_ms(text)
    local int, dot, frac, unit = text:match("^(%d+)(%.?)(%d*)(%a*)$")
    if not int or (dot == "." and frac == "") then return nil end
    if unit == "" then
        if dot ~= "" then return nil end -- a bare number is whole ms
        return tonumber(int), true
    end
    local factor = UNITS[unit]
    if not factor then return nil end
    frac = frac:gsub("0+$", "")
    if #frac > 7 then return nil end -- finer than 1 ms in any unit
    local scale = 10 ^ #frac
    local part = (tonumber(frac) or 0) * factor -- exact: under 2^53
    if part % scale ~= 0 then return nil end
    return tonumber(int) * factor + part / scale, false
end

local TIME = "(500ms, 10s, 1.5s, 2m, 1h; a bare number is ms)"

local checks = {
    ms = { ("a time from 1 ms to %d ms %s"):format(MAX, TIME),
        function(n) return n and n > 0 and n <= MAX end, true },
    ms0 = { ("a time from 0 ms to %d ms %s"):format(MAX, TIME),
        function(n) return n and n >= 0 and n <= MAX end, true },
    status = { "an exit status from 0 to 255", function(n) return n and n >= 0 and n <= 255 end },
    count = { ("an integer from 1 to %d"):format(MAX), function(n) return n and n >= 1 and n <= MAX end },
    limit = { ("an integer from 1 to %d"):format(MAX_LIMIT),
        function(n) return n and n >= 1 and n <= MAX_LIMIT end },
}

-- The value of option opt given as text (shown: the option as typed), and
-- whether it was a bare number of ms; or nil and a message.
local function convert(opt, text, shown)
    if not opt.check then return text end
    local what, ok, time = checks[opt.check][1], checks[opt.check][2], checks[opt.check][3]
    local n, bare
    if time then
        n, bare = _M.time_ms(text)
    else
        n = text:match("^%d+$") and tonumber(text)
    end
    if not ok(n) then
        return nil, ("%s expects %s, got '%s'"):format(shown, what, text)
    end
    return n, bare
end

--- Parse argv[i..]. Return the options table, the index of the first
-- operand (#argv + 1 if none) and a list of warnings (likely unit mistakes),
-- or nil and a message naming the option.
function _M.parse(argv, i, spec)
    local by_short, by_long, opts, warnings = {}, {}, {}, {}
    for _, o in ipairs(spec) do
        if o.short then by_short[o.short] = o end
        if o.long then by_long[o.long] = o end
    end
    local function set(o, value, shown)
        if o.arg == nil then
            opts[o.name] = true
            return true
        end
        local v, bare = convert(o, value, shown)
        if v == nil then return nil, bare end -- bare: the message
        if o.warn_bare and bare and v > 0 and v < 1000 then
            warnings[#warnings + 1] = ("%s %s means %d ms; did you mean %ss? (write %dms to keep ms)")
                :format(shown, value, v, value, v)
        end
        if o.list then
            opts[o.name] = opts[o.name] or {}
            table.insert(opts[o.name], v)
        else
            opts[o.name] = v
        end
        return true
    end
    while i <= #argv do
        local a = argv[i]
        if a == "--" then
            return opts, i + 1, warnings
        elseif a:sub(1, 2) == "--" then
            local name, value = a:match("^%-%-([^=]+)=(.*)$")
            name = name or a:sub(3)
            local o = by_long[name]
            if not o then return nil, ("unknown option --%s"):format(name) end
            if o.arg and value == nil then
                i = i + 1
                value = argv[i]
                if value == nil then return nil, ("option --%s needs a value (%s)"):format(name, o.arg) end
            elseif not o.arg and value ~= nil then
                return nil, ("option --%s takes no value"):format(name)
            end
            local ok, err = set(o, value, "--" .. name)
            if not ok then return nil, err end
        elseif a:sub(1, 1) == "-" and #a > 1 then
            local k = 2
            while k <= #a do
                local ch = a:sub(k, k)
                local o = by_short[ch]
                if not o then return nil, ("unknown option -%s"):format(ch) end
                if o.arg then
                    local value = a:sub(k + 1)
                    if value == "" then
                        i = i + 1
                        value = argv[i]
                        if value == nil then return nil, ("option -%s needs a value (%s)"):format(ch, o.arg) end
                    end
                    local ok, err = set(o, value, "-" .. ch)
                    if not ok then return nil, err end
                    break
                end
                set(o, nil, "-" .. ch)
                k = k + 1
            end
        else
            return opts, i, warnings
        end
        i = i + 1
    end
    return opts, i, warnings
end

--- The option every command takes.
_M.HELP = { name = "help", short = "h", long = "help", help = "show this help" }

--- The option lines of a help text, aligned.
function _M.describe(spec)
    local rows, width = {}, 0
    for _, o in ipairs(spec) do
        if o.help then
            local left = (o.short and ("-" .. o.short .. (o.long and ", " or "")) or "    ")
                .. (o.long and ("--" .. o.long) or "")
                .. (o.arg and (" " .. o.arg) or "")
            rows[#rows + 1] = { left, o.help }
            if #left > width then width = #left end
        end
    end
    local out = {}
    for _, r in ipairs(rows) do
        out[#out + 1] = ("  %-" .. width .. "s  %s"):format(r[1], r[2])
    end
    return table.concat(out, "\n")
end

return _M
