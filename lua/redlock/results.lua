-- redlock.results: what a call hands back. The scratch space the core
-- writes results and errors into, the words for statuses and node states,
-- and the (nil, err, detail) of a failure.

local ffi = require "ffi"
local C = require("redlock.cdefs").lib
require("redlock.check").ours()

local ffi_string, ffi_new = ffi.string, ffi.new
local table_new = require "table.new"

local _M = {}

-- Result buffers. A call takes one before the core writes into it and
-- gives it back once it has read it, so that no call reads what another
-- wrote: inside nginx a call holds its own while it waits (other requests'
-- calls take others meanwhile), and a finalizer that calls redlock while
-- another call is under way (it runs at whatever allocation the collector
-- chose) takes one of its own. A call that raises gives nothing back: the
-- collector has that one. POOL_MAX are kept for reuse, in a table made at
-- that size: giving back never grows it, so never runs the collector (nor
-- a finalizer) half-way.
local POOL_MAX = 64
local pool, pooled = table_new(POOL_MAX + 1, 0), 0

--- A result buffer of this call's own.
function _M.take()
    if pooled == 0 then return ffi_new("rl_result") end
    local r = pool[pooled]
    pool[pooled] = nil
    pooled = pooled - 1
    return r
end

--- Give r back (once, and read it no more).
function _M.give(r)
    if pooled < POOL_MAX then
        pool[pooled + 1] = r
        pooled = pooled + 1
    end
end

_M.errbuf = ffi_new("char[?]", C.RL_ERR_LEN)
_M.ERR_LEN = C.RL_ERR_LEN

-- The words come from the core (words.c), read once into tables for the hot path.
local STATUS_WORDS, NODE_WORDS = {}, {}
for code = C.RL_STATUS_PENDING, C.RL_STATUS_NOT_HELD do STATUS_WORDS[code] = ffi_string(C.rl_status_word(code)) end
for code = C.RL_NODE_PENDING, C.RL_NODE_TIMEOUT do NODE_WORDS[code] = ffi_string(C.rl_node_state_word(code)) end
_M.status_words, _M.node_words = STATUS_WORDS, NODE_WORDS

--- The detail of round r on client d: per node its name, state and error.
local function detail_of(d, r)
    local t = { ok = r.ok, quorum = r.quorum, elapsed = r.elapsed_ms, status = STATUS_WORDS[r.status] }
    for i = 0, r.nodes - 1 do
        local n = r.node[i]
        t[i + 1] = {
            server = d.names[i + 1],
            state = NODE_WORDS[n.state],
            error = n.errstr[0] ~= 0 and ffi_string(n.errstr) or nil,
        }
    end
    return t
end
_M.detail_of = detail_of

--- nil, err, detail for a round that failed.
function _M.failure(d, r)
    return nil, STATUS_WORDS[r.status] or "invalid", detail_of(d, r)
end

--- The same, r given back.
function _M.failure_given(d, r)
    local _, err, detail = _M.failure(d, r)
    _M.give(r)
    return nil, err, detail
end

--- Fill r as a round that no node could answer, every node's error why:
--- the transport failed (inside nginx: the hub's timer could not start, or
--- no result came from it in time). Its failure reads "unavailable".
function _M.unavailable(d, r, why)
    r.status, r.ok, r.failed, r.taken = C.RL_STATUS_UNAVAILABLE, 0, #d.names, 0
    r.nodes, r.quorum, r.elapsed_ms, r.validity_ms, r.token, r.slot = #d.names, d.quorum, 0, 0, 0, 0
    why = why:sub(1, C.RL_NODE_ERR_LEN - 1)
    for i = 0, #d.names - 1 do
        r.node[i].state = C.RL_NODE_ERROR
        ffi.copy(r.node[i].errstr, why)
    end
end

--- nil, word, detail for a call refused before anything was sent (invalid,
--- expired): the detail has the shape of a round's, no node asked, and says
--- why in detail.message.
function _M.refusal(d, word, message)
    local t = { ok = 0, quorum = d.quorum, elapsed = 0, status = word, message = message }
    for i = 1, #d.names do t[i] = { server = d.names[i], state = "pending" } end
    return nil, word, t
end

return _M
