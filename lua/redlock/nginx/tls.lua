-- redlock.nginx.tls: TLS on the hub's cosockets (rediss:// nodes), and
-- opening a link's connection (connect, then the handshake).
--
-- A cosocket speaks TLS after sock:sslhandshake(session, server_name,
-- verify). What it verifies against is nginx's, not the client's:
-- lua_ssl_trusted_certificate (the CAs) and lua_ssl_verify_depth; this
-- ngx_lua has no per-socket CA, so tls.cafile and tls.capath are not used
-- inside nginx (the hub says so in the error log once). server_name is both
-- the SNI and the name the certificate must be for: tls.server_name, else the
-- URL's host name, or the hostname a cluster master announces. ngx_lua
-- checks host names only (a certificate for IP:127.0.0.1 "does not match
-- host 127.0.0.1"), and checks no name at all when given none: the chain
-- alone would pass. So with verification on, a link to an IP address needs
-- tls.server_name: a client whose URLs are IP addresses is refused when it
-- is made, and a link learnt later (a cluster master that announces only
-- its address) is refused each time it would connect, a failed vote that
-- says what to set; with verify off such a link is sent no SNI. A client
-- certificate (tls.certfile, and its key from tls.keyfile or else from the
-- same PEM file) is parsed once per hub and set on every socket with
-- sock:setclientcert.
--
-- There is no keepalive pool to reuse TLS connections from: the hub keeps
-- one connection per node for as long as it runs, and every call of the
-- worker goes over it, so a handshake is paid once per connection, not per
-- request. When a connection is made again (a lost node, a hub started
-- anew, the subscriber), the handshake resumes the node's last TLS session
-- (kept per node by the hub) when the server still has it. That is TLS 1.2,
-- what this ngx_lua offers by default: over TLS 1.3 (lua_ssl_protocols)
-- sslhandshake returns the session before the server's ticket arrives, and
-- every connect is a full handshake.

local ffi = require "ffi"
local C = require("redlock.cdefs").lib

local ngx = ngx
local ffi_string = ffi.string
local now_ms = C.rl_now_ms
local tostring, ipairs, pcall, type = tostring, ipairs, pcall, type

local _M = {}

-- Is host an IP address (no SNI, no name to verify)?
local function ip_literal(host)
    return host:find("^%d+%.%d+%.%d+%.%d+$") ~= nil or host:find(":", 1, true) ~= nil
end

-- The TLS settings of rl_options.tls as Lua values (verify a boolean,
-- strings or nil); load adds the parsed client certificate.
local TLS_STRINGS = { "cafile", "capath", "certfile", "keyfile", "server_name" }

function _M.config(t)
    local c = { verify = t.verify ~= 0 }
    for _, f in ipairs(TLS_STRINGS) do
        if t[f] ~= nil then c[f] = ffi_string(t[f]) end
    end
    return c
end

local PEM_MAX = 1048576 -- a certificate chain or key file is far smaller (and /dev/zero never ends)

-- The text of file path (tls.<what>), or nil and "tls.<what> '<path>': why".
local function read_file(path, what)
    local f, err = io.open(path, "rb")
    local s
    if f then
        s, err = f:read(PEM_MAX + 1)
        f:close()
    end
    local why
    if not f then
        why = tostring(err)
        if why:sub(1, #path + 2) == path .. ": " then why = why:sub(#path + 3) end -- io.open's "path: reason"
    elseif not s and err then
        why = tostring(err)
    elseif not s or s == "" then
        why = "empty"
    elseif #s > PEM_MAX then
        why = "larger than 1 MB: not a certificate or key file"
    end
    if why == "Is a directory" then why = "is a directory" end
    if why then return nil, ("tls.%s '%s': %s"):format(what, path, why) end
    return s
end

local check_opts = ffi.new("rl_tls_options")
local check_err = ffi.new("char[?]", C.RL_ERR_LEN)

-- The client certificate c.certfile and its key (c.keyfile, or in the same
-- file) as the C client checks them (rl_tls_check): nil, or why not.
local function check_pair(c)
    check_opts.certfile, check_opts.keyfile = c.certfile, c.keyfile
    local rc = C.rl_tls_check(check_opts, check_err, C.RL_ERR_LEN)
    check_opts.certfile, check_opts.keyfile = nil, nil
    if rc ~= C.RL_OK then return ffi_string(check_err) end
    return nil
end

-- Load what a TLS hub needs from nginx (the client certificate, parsed
-- once) and check that this ngx_lua has it. nil, or why not.
function _M.load(c)
    pcall(require, "resty.core.socket") -- adds sslhandshake and setclientcert (nginx loads it first anyway)
    local sock_mt = debug.getregistry().__tcp_cosocket_mt
    if type(sock_mt) ~= "table" or type(sock_mt.sslhandshake) ~= "function" then
        return "rediss:// needs cosocket sslhandshake, which this nginx's lua module lacks"
    end
    if c.certfile then
        local ok, ssl = pcall(require, "ngx.ssl")
        if not ok or type(ssl.parse_pem_cert) ~= "function" or type(ssl.parse_pem_priv_key) ~= "function" then
            return "a client certificate inside nginx needs ngx.ssl.parse_pem_cert/parse_pem_priv_key "
                .. "(lua-resty-core), which is missing"
        end
        if type(sock_mt.setclientcert) ~= "function" then
            return "a client certificate inside nginx needs cosocket setclientcert "
                .. "(lua-nginx-module 0.10.21+ with lua-resty-core), which this nginx lacks"
        end
        local pem, err = read_file(c.certfile, "certfile")
        if not pem then return err end
        local cert, cerr = ssl.parse_pem_cert(pem)
        if not cert then return ("tls.certfile '%s': %s"):format(c.certfile, tostring(cerr)) end
        if c.keyfile then -- else the key is in certfile's PEM too
            pem, err = read_file(c.keyfile, "keyfile")
            if not pem then return err end
        end
        -- the client's own checks of the pair before the key is parsed: a
        -- key that does not match, or one that is encrypted (its parse would
        -- have OpenSSL ask for a passphrase on the worker's stdin, and wait)
        local why = check_pair(c)
        if why then return why end
        local key, kerr = ssl.parse_pem_priv_key(pem)
        if not key then
            return ("tls.%s '%s': %s"):format(c.keyfile and "keyfile" or "certfile (no tls.keyfile: its key)",
                c.keyfile or c.certfile, tostring(kerr))
        end
        c.cert, c.key = cert, key
    end
    return nil
end

-- lua-resty-core up to 0.1.26 (Debian 12 has 0.1.25) raises "assertion
-- failed!" in sslhandshake when the handshake itself succeeded but the
-- certificate did not verify (lua-resty-core issue 499): the error it had
-- just read is still in resty.core's shared errmsg buffer. The handshake
-- error, from what sslhandshake raised.
local errmsg_ptr
local function handshake_assert(raised)
    raised = tostring(raised)
    if raised:find("assertion failed", 1, true) then
        if errmsg_ptr == nil then
            local ok, base = pcall(require, "resty.core.base")
            errmsg_ptr = ok and base.get_errmsg_ptr and base.get_errmsg_ptr() or false
        end
        if errmsg_ptr and errmsg_ptr[0] ~= nil then
            local text = ffi_string(errmsg_ptr[0])
            if text == "certificate host mismatch" or text == "timeout" or text == "closed"
                or text:find("^handshake failed") then
                return text
            end
            return "0: " .. text -- a verify error, as sslhandshake returns them ("20: unable to ...")
        end
    end
    return "sslhandshake raised: " .. raised
end

-- A node's reason for a failed handshake (sslhandshake's error), short: the
-- engine keeps RL_NODE_ERR_LEN bytes of it.
local function handshake_reason(hub, i, err)
    err = tostring(err)
    if err == "timeout" then return ("TLS handshake timed out after %d ms"):format(hub.connect_timeout) end
    if err == "certificate host mismatch" then
        return ("certificate verify failed: not for '%s'"):format(hub.snis[i])
    end
    local text = err:match("^%d+: (.+)$") -- an X509 verify error: "20: unable to get local issuer ..."
    if text then return "certificate verify failed: " .. text end
    if err == "handshake failed" then
        -- OpenSSL's reason (an alert: the server refused our certificate or
        -- our lack of one, no cipher in common, ...; a reset) is in nginx's
        -- error log only: sslhandshake does not say whether the server even
        -- asked for a client certificate
        return hub.tls.cert == nil and "TLS handshake failed (see nginx's error log; no client certificate set)"
            or "TLS handshake failed (see nginx's error log)"
    end
    return "TLS handshake failed: " .. err
end

-- A node's reason for a connection that ended. A TLS connection that ends
-- before its first reply may be the server refusing our client certificate
-- (or our lack of one: over TLS 1.3 it refuses after the handshake), or
-- anything else: without one, that is said as a fact, not as the cause.
function _M.lost_reason(hub, i, err)
    if hub.tlss[i] and not hub.fed[i] then
        return ("connection lost before any reply: %s%s"):format(tostring(err),
            hub.tls.cert == nil and " (no client certificate set)" or "")
    end
    return "connection lost: " .. tostring(err)
end

-- A verified TLS link with no name to check the certificate against (an IP
-- address, no tls.server_name) is not connected: sslhandshake would check
-- the chain alone. Its reason (short: a shard's is followed by "(master
-- address)" in RL_NODE_ERR_LEN bytes), and the longer word said once per
-- hub in the error log.
local NO_NAME = "no host name to verify: set tls.server_name or announce hostnames"

local function refuse_nameless(hub, i)
    if not hub.said_nameless then
        hub.said_nameless = true
        ngx.log(ngx.WARN, "redlock: not connecting rediss:// ", hub.hosts[i], " port ", hub.ports[i],
            ": inside nginx a certificate is checked against a host name only, and this link has none ",
            "(an IP address); set tls.server_name to a name in the nodes' certificates, or have the ",
            "cluster announce hostnames (cluster-announce-hostname, cluster-preferred-endpoint-type hostname)")
    end
    return nil, NO_NAME
end

-- Connect sock to node i (read_timeout, send_timeout: its reads' and sends' timeouts once connected) and, for a
-- rediss:// node, do the TLS handshake
-- within what is left of connect_timeout. true, or nil and why (the node's
-- reason). The engine is told of the handshake (its connect deadline then
-- says the handshake timed out, as ours does). A TLS link to verify with no
-- name to verify against fails at once (see refuse_nameless).
function _M.open(hub, i, sock, read_timeout, send_timeout)
    if hub.tlss[i] and hub.tls.verify and hub.snis[i] == nil then return refuse_nameless(hub, i) end
    local t0 = now_ms()
    sock:settimeouts(hub.connect_timeout, hub.node_timeout, read_timeout)
    local ok, err
    if hub.ports[i] == 0 then
        ok, err = sock:connect("unix:" .. hub.hosts[i])
    else
        ok, err = sock:connect(hub.hosts[i], hub.ports[i])
    end
    if not ok and err == "timeout" then return nil, ("connect timed out after %d ms"):format(hub.connect_timeout) end
    if not ok then return nil, "connect failed: " .. tostring(err) end
    if not hub.tlss[i] then
        sock:settimeouts(hub.connect_timeout, send_timeout, read_timeout)
        return true
    end
    C.rl_engine_node_handshaking(hub.e, i)
    local left = math.floor(hub.connect_timeout - (now_ms() - t0))
    if left < 1 then return nil, ("TLS handshake timed out after %d ms"):format(hub.connect_timeout) end
    sock:settimeouts(left, hub.node_timeout, read_timeout) -- ngx_lua times the handshake with it
    local tls = hub.tls
    if tls.cert then
        local set, serr = sock:setclientcert(tls.cert, tls.key)
        if not set then return nil, "TLS client certificate refused: " .. tostring(serr) end
    end
    local done, sess, herr = pcall(sock.sslhandshake, sock, hub.sessions[i], hub.snis[i], tls.verify)
    if not done then sess, herr = nil, handshake_assert(sess) end
    if not sess then
        hub.sessions[i] = nil
        return nil, handshake_reason(hub, i, herr)
    end
    hub.sessions[i] = sess -- resumed by the next connection to the node
    sock:settimeouts(hub.connect_timeout, send_timeout, read_timeout)
    return true
end

-- Say once per hub, in the error log, what a TLS client's settings mean
-- inside nginx where that differs from elsewhere.
function _M.notes(hub)
    local tls = hub.tls
    if tls.cafile or tls.capath then
        ngx.log(ngx.NOTICE, "redlock: tls.cafile/tls.capath are not used inside nginx: cosockets verify ",
            "rediss:// nodes against lua_ssl_trusted_certificate (and lua_ssl_verify_depth)")
    end
end

_M.ip_literal = ip_literal
_M.STRINGS = TLS_STRINGS

--- A new engine e's TLS nodes checked against the client's TLS settings c
--- (config's): nil, or a message for client_new's errbuf.
function _M.check(e, n, c)
    local tls_nodes = {}
    for i = 0, n - 1 do
        if C.rl_engine_node_tls(e, i) ~= 0 then tls_nodes[#tls_nodes + 1] = i end
    end
    if tls_nodes[1] == nil then return nil end
    local why, i = _M.load(c), tls_nodes[1]
    if not why and c.verify and c.server_name == nil then
        -- fail closed: ngx_lua can check a certificate against names only
        for _, k in ipairs(tls_nodes) do
            if C.rl_engine_node_port(e, k) ~= 0 and ip_literal(ffi_string(C.rl_engine_node_host(e, k))) then
                why, i = "inside nginx a certificate is checked against host names only, not an IP "
                    .. "address: set tls.server_name to a name in the node's certificate", k
                break
            end
        end
    end
    if why then return ("server %d: '%s': %s"):format(i + 1, ffi_string(C.rl_engine_node_name(e, i)), why) end
    return nil
end

return _M
