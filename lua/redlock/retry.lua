-- redlock.retry: retry policies. A policy is any function
--   policy(attempt, last_err, last_detail) -> delay_ms, or nil to give up
-- called after attempt number `attempt` (1-based) failed with `last_err`.
-- Jitter comes from the core's per-process generator, not math.random, so
-- processes started together do not retry in lockstep.

local C = require("redlock.cdefs").lib

local _M = {}

local MAX_MS = 2147483647  -- the longest sleep the core takes, ms

-- A value as an error message shows it.
local function show(v)
    if type(v) == "string" then return ("string %q"):format(v) end
    if type(v) == "number" then return tostring(v) end
    return type(v)
end

local function check_ms(fname, pos, name, v, allow_zero)
    if type(v) ~= "number" or not (v >= 0 and v <= MAX_MS) or (v == 0 and not allow_zero) then
        error(("bad argument #%d to '%s' (%s must be a %s number of ms up to %d, got %s)"):format(
            pos, fname, name, allow_zero and "non-negative" or "positive", MAX_MS, show(v)), 3)
    end
end

-- v, or d when v is nil (only nil: false is a bad value, not "the default").
local function or_default(v, d)
    if v == nil then return d end
    return v
end

local function check_attempts(fname, pos, n)
    if type(n) ~= "number" or n < 1 or n % 1 ~= 0 then
        error(("bad argument #%d to '%s' (attempts must be a positive integer, got %s)"):format(pos, fname, show(n)), 3)
    end
end

--- Always wait delay_ms; make at most `attempts` attempts in all.
function _M.fixed(delay_ms, attempts)
    check_ms("fixed", 1, "delay", delay_ms, true)
    check_attempts("fixed", 2, attempts)
    return function(attempt)
        if attempt < attempts then return delay_ms end
    end
end

--- Wait a uniform random time in [min_ms, max_ms); at most `attempts` attempts.
function _M.jitter(min_ms, max_ms, attempts)
    check_ms("jitter", 1, "min", min_ms, true)
    check_ms("jitter", 2, "max", max_ms)
    if max_ms < min_ms then error("bad argument #2 to 'jitter' (max must be >= min)", 2) end
    check_attempts("jitter", 3, attempts)
    local span = max_ms - min_ms
    return function(attempt)
        if attempt < attempts then return min_ms + C.rl_random() * span end
    end
end

--- Exponential backoff with full jitter: uniform in [0, min(cap, base * 2^(attempt-1))).
function _M.exponential(opts)
    if type(opts) ~= "table" then error("bad argument #1 to 'exponential' (table expected, got " .. show(opts) .. ")", 2) end
    for k in pairs(opts) do
        if k ~= "base" and k ~= "cap" and k ~= "attempts" then
            error(("bad argument #1 to 'exponential' (unknown option %s)"):format(
                type(k) == "string" and ("'" .. k .. "'") or ("[" .. show(k) .. "]")), 2)
        end
    end
    local base, cap, attempts = or_default(opts.base, 10), or_default(opts.cap, 1000), or_default(opts.attempts, 32)
    check_ms("exponential", 1, "base", base)
    check_ms("exponential", 1, "cap", cap)
    check_attempts("exponential", 1, attempts)
    return function(attempt)
        if attempt >= attempts then return nil end
        local ceiling = base * 2 ^ (attempt - 1)
        if ceiling > cap then ceiling = cap end
        return C.rl_random() * ceiling
    end
end

--- Never give up: uniform in [min_ms, max_ms) (default 50-250 ms). Bound it with `wait`.
function _M.forever(min_ms, max_ms)
    min_ms, max_ms = or_default(min_ms, 50), or_default(max_ms, 250)
    check_ms("forever", 1, "min", min_ms, true)
    check_ms("forever", 2, "max", max_ms)
    if max_ms < min_ms then error("bad argument #2 to 'forever' (max must be >= min)", 2) end
    local span = max_ms - min_ms
    return function()
        return min_ms + C.rl_random() * span
    end
end

--- The default: jitter 50-250 ms, 32 attempts.
_M.default = _M.jitter(50, 250, 32)

--- The makers above by function, to name one passed where a policy goes
--- (`retry = redlock.retry.forever` for `redlock.retry.forever()`); the
--- module's own, not part of the API.
_M._makers = { [_M.fixed] = "fixed", [_M.jitter] = "jitter", [_M.exponential] = "exponential",
    [_M.forever] = "forever" }

return _M
