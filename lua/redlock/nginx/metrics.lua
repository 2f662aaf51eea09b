-- redlock.nginx.metrics: one /metrics location for every worker of an nginx.
-- Each worker counts in its own engines (one per hub: per configuration of
-- clients); a worker cannot read another's, so each one writes its counts,
-- summed over its hubs, into a lua_shared_dict the configuration names, as
-- one entry under its worker id: every `every` seconds from a timer (start),
-- and at once before it serves /metrics (text). One entry a worker means a
-- reader sees each worker's counts whole (a histogram stays cumulative), a
-- full dict refuses the write instead of evicting other entries, and a
-- worker's entry holds only the series it has now. The location renders the
-- sum over every worker's entry in the Prometheus text exposition
-- (redlock.metrics). A worker that replaced one (a reload) writes under the
-- same id, so the sum never counts a worker twice; counters may then go
-- back, which Prometheus reads as a reset. An entry nobody writes for
-- a minute (a worker id gone with a smaller worker_processes) drops out.
--
--   lua_shared_dict redlock_metrics 1m;
--   init_worker_by_lua_block { require("redlock.nginx.metrics").start("redlock_metrics") }
--   location = /metrics { content_by_lua_block { require("redlock.nginx.metrics").serve("redlock_metrics") } }

local ffi = require "ffi"
local hub_mod = require "redlock.nginx.hub"
local watch = require "redlock.nginx.watch"
local stats = require "redlock.stats"
local metrics = require "redlock.metrics"

local ngx = ngx
local pairs, tostring, tonumber, error, type = pairs, tostring, tonumber, error, type
local concat = table.concat

local _M = {}

local DEFAULT_EVERY_S = 1
local ENTRY_TTL_S = 60           -- a worker's entry lives this long after its last write,
local entry_ttl_s = ENTRY_TTL_S  -- or three of start's intervals if longer
local ENTRY_PREFIX = "worker:"   -- the dict's keys: ENTRY_PREFIX .. worker id
local buf = ffi.new("rl_stats")

local function dict_of(name, fname)
    if type(name) ~= "string" then error(("bad argument #1 to '%s' (the lua_shared_dict's name expected)"):format(fname), 3) end
    local dict = ngx.shared[name]
    if dict == nil then error(("bad argument #1 to '%s' (no lua_shared_dict '%s')"):format(fname, name), 3) end
    return dict
end

-- This worker's samples: every hub's counts.
local function worker_samples()
    local map = {}
    for _, hub in pairs(hub_mod.all()) do
        watch.stats(hub, buf)
        local names = {}
        for i = 1, hub.n do names[i] = hub.names[i - 1] end
        metrics.samples(stats.table(buf, names), map)
    end
    return map
end

-- A sample map as one string: a line per sample, its value, a space, its
-- key (keys hold no newline: label values have theirs escaped).
local function encode(map)
    local lines, n = {}, 0
    for key, value in pairs(map) do
        n = n + 1
        lines[n] = ("%.17g %s"):format(value, key)
    end
    return concat(lines, "\n")
end

-- Add the samples of an encoded map to sum.
local function add_encoded(sum, text)
    for value, key in text:gmatch("(%S+) ([^\n]*)") do
        local v = tonumber(value)
        if v then sum[key] = (sum[key] or 0) + v end
    end
end

local last_written -- this worker's entry as it last wrote it

local function push(dict)
    local key, text = ENTRY_PREFIX .. tostring(ngx.worker.id() or 0), encode(worker_samples())
    local ok, err = dict:safe_set(key, text, entry_ttl_s)
    if not ok then
        -- a value of another size frees the old one before it takes room for
        -- itself: without room, both are gone; the old one goes back
        if last_written then dict:safe_set(key, last_written, entry_ttl_s) end
        return nil, err
    end
    last_written = text
    return true
end

-- push(dict), saying why in the error log when it cannot.
local function push_or_log(dict)
    local ok, err = push(dict)
    if not ok then
        ngx.log(ngx.ERR, "redlock metrics: this worker's counts were not written (", err,
            "): make the lua_shared_dict larger")
    end
    return ok
end

--- Write this worker's counts into the shared dict name now. true, or nil
--- and the dict's error (no memory: make the dict larger).
function _M.push(name)
    return push(dict_of(name, "push"))
end

--- In init_worker_by_lua: push this worker's counts every `every` seconds
--- (default 1), and once more when the worker exits.
function _M.start(name, every)
    local dict = dict_of(name, "start")
    every = every or DEFAULT_EVERY_S
    if type(every) ~= "number" or every <= 0 then error("bad argument #2 to 'start' (seconds > 0 expected)", 2) end
    entry_ttl_s = math.max(ENTRY_TTL_S, 3 * every)
    local ok, err = ngx.timer.every(every, function() push_or_log(dict) end)
    if not ok then return nil, err end
    return true
end

--- The exposition of the sum over every worker (this one's counts pushed
--- first).
function _M.text(name)
    local dict = dict_of(name, "text")
    push_or_log(dict)
    local sum = {}
    for _, key in pairs(dict:get_keys(0)) do
        local text = key:sub(1, #ENTRY_PREFIX) == ENTRY_PREFIX and dict:get(key)
        if type(text) == "string" then add_encoded(sum, text) end
    end
    return metrics.render(sum)
end

--- In content_by_lua: answer with text(name), as Prometheus reads it.
function _M.serve(name)
    local body = _M.text(name)
    ngx.header["Content-Type"] = "text/plain; version=0.0.4" -- luacheck: ignore 122
    ngx.print(body)
end

return _M
