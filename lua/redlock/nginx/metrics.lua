-- redlock.nginx.metrics: one /metrics location for every worker of an nginx.
-- Each worker counts in its own engines (one per hub: per configuration of
-- clients); a worker cannot read another's, so each one writes its counts,
-- summed over its hubs, into a lua_shared_dict the configuration names,
-- under its worker id: every `every` seconds from a timer (start), and at
-- once before it serves /metrics (text). The location renders the sum over
-- every worker's entry in the Prometheus text exposition (redlock.metrics).
-- A worker that replaced one (a reload) writes under the same id, so the sum
-- never counts a worker twice; counters may then go back, which Prometheus
-- reads as a reset.
--
--   lua_shared_dict redlock_metrics 1m;
--   init_worker_by_lua_block { require("redlock.nginx.metrics").start("redlock_metrics") }
--   location = /metrics { content_by_lua_block { require("redlock.nginx.metrics").serve("redlock_metrics") } }

local ffi = require "ffi"
local C = require("redlock.cdefs").lib
local hub_mod = require "redlock.nginx.hub"
local stats = require "redlock.stats"
local metrics = require "redlock.metrics"

local ngx = ngx
local pairs, tostring, error, type = pairs, tostring, error, type

local _M = {}

local DEFAULT_EVERY_S = 1
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
        C.rl_engine_stats(hub.e, buf)
        local names = {}
        for i = 1, hub.n do names[i] = hub.names[i - 1] end
        metrics.samples(stats.table(buf, names), map)
    end
    return map
end

local function push(dict)
    local prefix = tostring(ngx.worker.id() or 0) .. "\t"
    for key, value in pairs(worker_samples()) do
        local ok, err = dict:set(prefix .. key, value)
        if not ok then return nil, err end
    end
    return true
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
    local ok, err = ngx.timer.every(every, function() push(dict) end)
    if not ok then return nil, err end
    return true
end

--- The exposition of the sum over every worker (this one's counts pushed
--- first).
function _M.text(name)
    local dict = dict_of(name, "text")
    local ok, err = push(dict)
    if not ok then ngx.log(ngx.ERR, "redlock metrics: ", err) end
    local sum = {}
    for _, key in pairs(dict:get_keys(0)) do
        local sample = key:match("^%d+\t(.*)$")
        local v = sample and dict:get(key)
        if v then sum[sample] = (sum[sample] or 0) + v end
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
