-- bench/jsonl.lua: the reader of the JSON lines the benchmark drivers print,
-- shared by bench/summary.lua and bench/absummary.lua. Flat objects only
-- (strings, numbers, booleans), one per line: all the drivers write.

local _M = {}

--- The object on line, or nil when the line holds none.
function _M.parse(line)
    local o, pos = {}, line:find("{")
    if not pos then return nil end
    pos = pos + 1
    while true do
        local k, e = line:match('^%s*"([^"]*)"%s*:%s*()', pos)
        if not k then break end
        pos = e
        local c = line:sub(pos, pos)
        if c == '"' then
            local j, buf = pos + 1, {}
            while j <= #line do
                local ch = line:sub(j, j)
                if ch == "\\" then buf[#buf + 1] = line:sub(j + 1, j + 1); j = j + 2
                elseif ch == '"' then break
                else buf[#buf + 1] = ch; j = j + 1 end
            end
            o[k] = table.concat(buf)
            pos = j + 1
        else
            local v, e2 = line:match("^([^,}]*)()", pos)
            v = v:gsub("%s+$", "")
            o[k] = tonumber(v) or (v == "true" and true) or (v == "false" and false) or nil
            pos = e2
        end
        local sep, e3 = line:match("^%s*([,}])()", pos)
        if sep ~= "," then break end
        pos = e3
    end
    return o
end

return _M
