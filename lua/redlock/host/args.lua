--- Command-line options, getopt style: -x, -xVALUE, -x VALUE, bundled short
-- flags (-nv), --long, --long=VALUE, --long VALUE, "--" ends the options.
-- Parsing stops at the first operand, so a command's own options (exec's
-- COMMAND, run's SCRIPT ARGS) are never taken for ours.
--
-- A spec is a list of { name =, short =, long =, arg = "METAVAR", check = } where
-- check is one of "ms" (integer > 0), "ms0" (integer >= 0), "status" (0..255),
-- "count" (integer >= 1) or nil (any string); numbers above MAX (what a C int
-- holds, and the most any core call takes in ms) are refused. Misuse returns
-- nil and a message naming the option.

local _M = {}

local MAX = 2147483647
_M.MAX = MAX

local checks = {
    ms = { ("a number of milliseconds from 1 to %d"):format(MAX),
        function(n) return n and n > 0 and n <= MAX end },
    ms0 = { ("a number of milliseconds from 0 to %d"):format(MAX),
        function(n) return n and n >= 0 and n <= MAX end },
    status = { "an exit status from 0 to 255", function(n) return n and n >= 0 and n <= 255 end },
    count = { ("an integer from 1 to %d"):format(MAX), function(n) return n and n >= 1 and n <= MAX end },
}

local function convert(opt, text, shown)
    if not opt.check then return text end
    local what, ok = checks[opt.check][1], checks[opt.check][2]
    local n = text:match("^%d+$") and tonumber(text)
    if not ok(n) then
        return nil, ("%s expects %s, got '%s'"):format(shown, what, text)
    end
    return n
end

--- Parse argv[i..]. Return the options table and the index of the first
-- operand (#argv + 1 if none), or nil and a message naming the option.
function _M.parse(argv, i, spec)
    local by_short, by_long, opts = {}, {}, {}
    for _, o in ipairs(spec) do
        if o.short then by_short[o.short] = o end
        if o.long then by_long[o.long] = o end
    end
    local function set(o, value, shown)
        if o.arg == nil then
            opts[o.name] = true
            return true
        end
        local v, err = convert(o, value, shown)
        if v == nil then return nil, err end
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
            return opts, i + 1
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
            return opts, i
        end
        i = i + 1
    end
    return opts, i
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
