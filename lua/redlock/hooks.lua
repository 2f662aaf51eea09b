-- redlock.hooks: the extension point for a host, a program that embeds the
-- library and must know what it is doing (docs/lua-api.md, "Extending
-- (hosts)"). redlock.hooks(t) installs them; the library calls them:
--
--   acquiring(dlm)    before every lock, try_lock, lock_many and adopt (with_lock's
--                     lock too), before its arguments are checked
--   acquired()        after it, whatever ended it: a result, a failure, or
--                     an error raised (which then passes on); if it raises,
--                     what the call took is released and its error passes on
--   sleeping()        before each call of the retry policy and each sleep
--                     between two attempts of a call: nothing is in flight
--                     for it then, so a host may end the process meanwhile
--                     (the policy may also yield and never be resumed)
--   awake()           after that policy call or sleep (not after a policy
--                     that raised: acquired() follows), before the next
--                     attempt
--   client_defaults   options redlock.new takes when its caller does not
--                     give them (a host makes keep-alive its default)
--   default_servers() redlock.default()'s servers when configure gave none,
--                     instead of REDLOCK_SERVERS: a list of URLs, or nil;
--                     it may raise (a host's own usage error)
--
-- Each call sets the hooks it names; false removes one; the others stay.

local check = require "redlock.check"
local options = require "redlock.options"
check.ours()

local pcall, error, type, pairs = pcall, error, type, pairs
local argerror, show = check.argerror, check.show

local _M = {}

-- The hooks in force (fields as above). `guarded`: acquiring or acquired is
-- set, so lock calls go through guard(); read on every lock call.
local on = { guarded = false }
_M.on = on

local FUNCTIONS = { acquiring = true, acquired = true, sleeping = true, awake = true, default_servers = true }

--- redlock.hooks(t): install the hooks t names (see above).
function _M.set(t)
    if type(t) ~= "table" then argerror(1, "hooks", "table expected, got " .. show(t)) end
    local checked = {} -- client_defaults as checked: a copy, which the caller's later changes do not reach
    for k, v in pairs(t) do
        if FUNCTIONS[k] then
            if v ~= false and type(v) ~= "function" then
                argerror(1, "hooks", ("%s must be a function or false, got %s"):format(k, show(v)))
            end
        elseif k == "client_defaults" then
            if v ~= false then
                if type(v) ~= "table" then
                    argerror(1, "hooks", "client_defaults must be a table or false, got " .. show(v))
                end
                checked[k] = options.check_client("hooks", v)
            end
        else
            argerror(1, "hooks", ("unknown hook %s")
                :format(type(k) == "string" and ("'" .. k .. "'") or ("[" .. show(k) .. "]")))
        end
    end
    for k, v in pairs(t) do
        if v == false then on[k] = nil else on[k] = checked[k] or v end
    end
    on.guarded = on.acquiring ~= nil or on.acquired ~= nil
end

local function finish(acquired, ok, ...)
    if acquired then
        local fine, err = pcall(acquired)
        if not fine then
            -- its caller never gets what was taken: let it go, then raise
            local taken = ok and ...
            if type(taken) == "table" and type(taken.unlock) == "function" then pcall(taken.unlock, taken) end
            error(err, 0)
        end
    end
    if not ok then error((...), 0) end
    return ...
end

--- call(d, a, b, c) between acquiring(d) and acquired(), whatever ends it.
function _M.guard(call, d, a, b, c)
    local acquiring, acquired = on.acquiring, on.acquired
    if acquiring then acquiring(d) end
    return finish(acquired, pcall(call, d, a, b, c))
end

--- opts with the client defaults filled in where opts has nil (a copy when
--- any is; opts itself is never changed).
function _M.client_defaults(opts)
    local defaults = on.client_defaults
    if defaults == nil then return opts end
    local copy
    for k, v in pairs(defaults) do
        if opts[k] == nil then
            if copy == nil then
                copy = {}
                for k2, v2 in pairs(opts) do copy[k2] = v2 end
            end
            copy[k] = v
        end
    end
    return copy or opts
end

return _M
