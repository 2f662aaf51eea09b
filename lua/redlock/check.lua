-- redlock.check: argument checks, and how misuse is raised.
--
-- Misuse raises "bad argument #N to 'fn' (...)" at the line of the code
-- that called into the library: the error level is found by walking the
-- stack to the first frame outside the library's files (the facade,
-- init.lua, and the modules that register with check.ours()), so a check
-- may sit at any depth and in any of them, and with_lock's checks name
-- with_lock, not the lock call it makes. The transports (libev.lua,
-- cosocket.lua), redlock.retry and the host are callers like any other.

local ffi = require "ffi"
local C = require("redlock.cdefs").lib
local backend = require "redlock.backend"

local getinfo, getmetatable, next = debug.getinfo, getmetatable, next
local type, error, tostring = type, error, tostring
local ffi_string = ffi.string

local _M = {}

_M.MAX_MS = 2147483647  -- what fits the core's int milliseconds
local MAX_MS = _M.MAX_MS

-- The sources (debug.getinfo's .source) of the library's files.
local OURS = { [getinfo(1, "S").source] = true }

--- Count the file that calls this among the library's own (at its load).
function _M.ours()
    OURS[getinfo(2, "S").source] = true
end

-- Raise msg at the first caller outside the library. A pcall of ours (a C
-- frame between two of ours, as the one that guards a watch) is passed
-- over; a caller's pcall is that first caller, as for any Lua function.
local function raise(msg)
    local level = 2
    while true do
        local info = getinfo(level, "S")
        if info == nil then level = 0; break end -- no caller outside: no position
        if not OURS[info.source] then
            local above = info.what == "C" and getinfo(level + 1, "S")
            if not (above and OURS[above.source]) then break end
        end
        level = level + 1
    end
    error(msg, level)
end
_M.raise = raise

local function argerror(pos, fname, msg)
    raise(("bad argument #%d to '%s' (%s)"):format(pos, fname, msg))
end
_M.argerror = argerror

-- A value as a message shows it: numbers as they are, strings quoted with
-- their type, anything else by its type.
local function show(v)
    local t = type(v)
    if t == "number" then return tostring(v) end
    if t == "string" then
        if #v > 40 then v = v:sub(1, 40) .. "..." end
        return (("string %q"):format(v):gsub("\\\n", "\\n"))
    end
    if t == "boolean" then return "boolean " .. tostring(v) end
    return t
end
_M.show = show

local function is_int(v, lo, hi)
    return type(v) == "number" and v >= lo and v <= hi and v % 1 == 0
end
_M.is_int = is_int

--- A URL as a message shows it (show), its password replaced by *** as the
--- core's messages replace it (core/src/url.c, shown_url): what lies between
--- the user's ':' and the last '@' (the whole userinfo when it has no ':'),
--- or, with no '@', what follows a ':' right after "://" unless it is a
--- port (a password cut from its host). Unix socket URLs carry none.
function _M.show_url(v)
    if type(v) ~= "string" or v:sub(1, 7) == "unix://" then return show(v) end
    local head, rest = v:match("^(.-://)(.*)$")
    if not head then head, rest = "", v end
    local userinfo, tail = rest:match("^(.*)(@[^@]*)$")
    if userinfo then return show(head .. (userinfo:match("^[^:]*:") or "") .. "***" .. tail) end
    -- no '@': "[user]:REST" where REST is no port (digits, ending the address,
    -- followed by '+' as in a cluster's list, or by ';' or '|' and another URL:
    -- a list split at the wrong character) is a password cut from its host (a
    -- list split inside it: "user:top,secret@h"): not shown
    local authority, after = rest:match("^([^/?#]*)(.*)$")
    local host_end = authority:sub(1, 1) == "[" and (authority:find("]", 1, true) or #authority) or 0
    local colon = authority:find(":", host_end + 1, true)
    local port = colon and (authority:sub(colon + 1) .. after)
    if head ~= "" and port and port ~= "" and not port:match("^%d+$") and not port:match("^%d+[+/?#]")
            and not port:match("^%d+[;|]%a[%w+.-]*://") then
        return show(head .. authority:sub(1, colon) .. "***" .. after)
    end
    return show(v)
end

-- A table key as a message names it: 'name' for a string, [v] otherwise.
local function key_name(k)
    return type(k) == "string" and ("'" .. k .. "'") or ("[" .. show(k) .. "]")
end

--- Raise unless the table t (the argument at pos, called name) has no keys
--- but the whole numbers 1 to #t: a hole, or another key (an option put
--- inside the list), would be passed over unseen.
function _M.list(pos, fname, name, t)
    local n = #t
    for k in next, t do
        if not is_int(k, 1, n) then
            argerror(pos, fname, ("%s must be a list without holes or other keys, has the key %s besides [1] to [%d]")
                :format(name, key_name(k), n))
        end
    end
end

--- v must be an object of metatable mt (a method called with a colon; pos:
--- where v is among the arguments, 1 unless given).
function _M.self(v, mt, fname, what, how, pos)
    if getmetatable(v) ~= mt then
        argerror(pos or 1, fname, ("%s expected, got %s; call it as %s"):format(what, show(v), how))
    end
end

-- Why the key of resource (prefix .. resource) is one of ours and may not
-- be locked (redlock.h, rl_reserved_key: it starts with "redlock:" or ends
-- with ":fence"), or nil. d: a client (its prefix).
local function reserved(d, resource)
    local prefix = d.prefix or ""
    local why = C.rl_reserved_key(prefix, #prefix, resource, #resource)
    return why ~= nil and ffi_string(why) or nil
end
_M.reserved = reserved

local function check_resource(d, pos, fname, resource, name)
    if type(resource) ~= "string" or #resource == 0 then
        argerror(pos, fname, ("%s must be a non-empty string, got %s")
            :format(name or "resource", resource == "" and "an empty string" or show(resource)))
    end
    local room = C.RL_MAX_KEY_LEN - #(d.prefix or "")
    if #resource > room then
        argerror(pos, fname, ("%s is %d bytes long, more than a key may be (%d bytes with the prefix)")
            :format(name or "resource", #resource, C.RL_MAX_KEY_LEN))
    end
    local why = reserved(d, resource)
    if why then argerror(pos, fname, ("%s %s is reserved: %s"):format(name or "resource", show(resource), why)) end
end
_M.resource = check_resource

--- lock_many's list: non-empty, no holes or other keys, at most as many
--- names as operations can be in flight on one client (ids % RL_ID_SLOTS
--- differ), none repeated.
function _M.resources(d, fname, resources)
    if type(resources) ~= "table" or #resources == 0 then
        argerror(1, fname, "resources must be a non-empty list of strings, got " ..
            (type(resources) ~= "table" and show(resources) or next(resources) == nil and "an empty table"
                or "a table with no [1]"))
    end
    if #resources > C.RL_ID_SLOTS then
        argerror(1, fname, ("resources may list at most %d names, got %d"):format(C.RL_ID_SLOTS, #resources))
    end
    _M.list(1, fname, "resources", resources)
    local seen = {}
    for i = 1, #resources do
        local r = resources[i]
        check_resource(d, 1, fname, r, ("resources[%d]"):format(i))
        if seen[r] then argerror(1, fname, ("resources[%d] repeats resources[%d]"):format(i, seen[r])) end
        seen[r] = i
    end
end

--- A whole number of ms the core takes (1 to MAX_MS).
function _M.ms(pos, fname, name, v)
    if not is_int(v, 1, MAX_MS) then
        argerror(pos, fname, ("%s must be a whole number of ms from 1 to %d, got %s"):format(name, MAX_MS, show(v)))
    end
end

--- opts must be nil or a table whose keys are all in `known`; returns opts.
function _M.opts(pos, fname, opts, known)
    if opts == nil then return nil end
    if type(opts) ~= "table" then
        argerror(pos, fname, "options must be a table or nil, got " .. show(opts))
    end
    for k in next, opts do
        if not known[k] then
            argerror(pos, fname, "unknown option " .. key_name(k))
        end
    end
    return opts
end

local sweep = backend.sweep

--- The backend client of d (a redlock.new table); raises once d is closed.
--- First, the transport undoes what waits that are gone still hold on it
--- (backend.sweep, where the transport has one).
function _M.live_client(d, fname)
    local client = d.client
    if client == nil then raise(("'%s' on a closed client"):format(fname)) end
    if sweep then sweep(client) end
    return client
end

--- Raise if the transport can do no I/O here (inside nginx, a phase without
--- cosockets), before a call changes any state.
function _M.phase()
    local why = backend.phase_refusal and backend.phase_refusal()
    if why then raise("redlock: " .. why) end
end

return _M
