-- redlock.devcluster.node: one node of a cluster (redlock.devcluster has the
-- whole picture): its files, the redis-server command line that launches it
-- (port or TLS port, password, extra arguments, wrapper words), the
-- redis-cli command line that reaches it, and the wait for its first PONG.
-- Each function takes the cluster object and the node's index.

local sys = require "redlock.devcluster.sys"

local shell_quote, read_file, run = sys.shell_quote, sys.read_file, sys.run
local pid_alive, now_ms, sleep_ms = sys.pid_alive, sys.now_ms, sys.sleep_ms

local _M = {}

local REDIS_SERVER = os.getenv("REDLOCK_REDIS_SERVER") or "redis-server"
local REDIS_CLI = os.getenv("REDLOCK_REDIS_CLI") or "redis-cli"

--- The redis-cli command line (without arguments) that reaches node i.
function _M.cli_prefix(self, i)
    local t = { shell_quote(REDIS_CLI), "-h", "127.0.0.1", "-p", tostring(self.ports[i]) }
    if self.password then
        t[#t + 1] = "-a " .. shell_quote(self.password) .. " --no-auth-warning"
    end
    local tls = self.tls
    if tls then
        t[#t + 1] = "--tls --cacert " .. shell_quote(tls.ca)
        if tls.client_cert then
            t[#t + 1] = "--cert " .. shell_quote(tls.client_cert)
                .. " --key " .. shell_quote(tls.client_key)
        end
    end
    return table.concat(t, " ")
end

local cli_prefix = _M.cli_prefix

--- The pid file and the log file of node i.
function _M.files(self, i)
    local port = self.ports[i]
    return self.dir .. "/redis-" .. port .. ".pid", self.dir .. "/redis-" .. port .. ".log"
end

local node_files = _M.files

--- Launch node i (daemonized) on self.ports[i]; do not wait.
function _M.launch(self, i)
    local pidfile, logfile = node_files(self, i)
    os.remove(pidfile) -- a SIGKILLed node leaves its pid file behind
    local argv = { shell_quote(REDIS_SERVER) }
    local tls = self.tls
    if tls then
        -- The TLS port replaces the plain one: a TLS node has no plain listener.
        for _, a in ipairs {
            "--port", "0",
            "--tls-port", tostring(self.ports[i]),
            "--tls-cert-file", shell_quote(tls.cert),
            "--tls-key-file", shell_quote(tls.key),
            "--tls-ca-cert-file", shell_quote(tls.ca),
            "--tls-auth-clients", tls.auth_clients,
        } do argv[#argv + 1] = a end
    else
        argv[#argv + 1] = "--port"
        argv[#argv + 1] = tostring(self.ports[i])
    end
    for _, a in ipairs {
        "--bind", "127.0.0.1",
        "--save", "''",
        "--appendonly", "no",
        "--daemonize", "yes",
        "--pidfile", shell_quote(pidfile),
        "--logfile", shell_quote(logfile),
        "--dir", shell_quote(self.dir),
    } do argv[#argv + 1] = a end
    if self.password then
        argv[#argv + 1] = "--requirepass " .. shell_quote(self.password)
    end
    for _, a in ipairs(self.args or {}) do argv[#argv + 1] = shell_quote(a) end
    -- opts.wrap[i]: words run before redis-server for node i
    for k, w in ipairs(self.wrap and self.wrap[i] or {}) do table.insert(argv, k, shell_quote(w)) end
    local out, ok = run(table.concat(argv, " "))
    if not ok then
        return nil, "redis-server did not start: " .. out:gsub("%s+$", "")
    end
    return true
end

--- Wait until node i has written its pid file and answers PING.
-- Return true, or nil and a reason ("port" when the port was taken).
function _M.await(self, i, deadline)
    local pidfile, logfile = node_files(self, i)
    local pid
    while true do
        if not pid then
            pid = tonumber(read_file(pidfile) or "")
            if pid then self.pids[i] = pid end
        end
        if pid then
            if not pid_alive(pid) then break end
            local out = run(cli_prefix(self, i) .. " PING")
            if out:match("^%s*PONG%s*$") then return true end
        end
        if now_ms() > deadline then break end
        sleep_ms(10)
    end
    local tail = sys.log_tail(logfile)
    if tail:find("Address already in use", 1, true) then
        return nil, "port", tail
    end
    return nil, "other", tail
end

return _M
