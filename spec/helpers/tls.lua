-- Spec helper: throwaway certificates for TLS tests, made with the openssl
-- command-line tool in a temporary directory.
--
--   local tls = require "helpers.tls"
--   local pki = tls.make()   -- the same table for every call in a process
--   pki.ca, pki.ca_key                    the test CA
--   pki.server_cert, pki.server_key       signed by ca; SAN DNS:localhost, IP:127.0.0.1
--   pki.client_cert, pki.client_key       signed by ca; for mutual TLS
--   pki.wrong_ca                          an unrelated CA (verification must fail)
--   pki.other_cert, pki.other_key         signed by ca; SAN only DNS:other.example
--   pki.localhost_cert, pki.localhost_key signed by ca; SAN only DNS:localhost (not for
--                                         127.0.0.1: a name must be checked, not the address)
--   pki.nosan_cert, pki.nosan_key         signed by ca; CN localhost and no SAN (names are
--                                         checked against SANs only: it is for no name)
--   pki.dir                               the directory holding them all
--   tls.cleanup()                         removes the directory
--   tls.env(opts), tls.from_env()         tls options to a worker process and back
--
-- Keys are EC P-256 (fast to make); certificates are valid for 2 days.
-- Raises with openssl's output when a step fails.

local M = {}

local OPENSSL = os.getenv("REDLOCK_OPENSSL") or "openssl"
local DAYS = "2"

local made

local function q(s)
  return "'" .. tostring(s):gsub("'", [['\'']]) .. "'"
end

local function sh(cmd)
  local p = assert(io.popen("(" .. cmd .. ") 2>&1; echo \"<rc=$?>\""))
  local out = p:read("*a")
  p:close()
  local body, rc = out:match("^(.-)<rc=(%d+)>%s*$")
  if tonumber(rc) ~= 0 then
    error("helpers.tls: command failed: " .. cmd .. "\n" .. (body or out), 3)
  end
  return body
end

local function write(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

-- A new EC P-256 key at path.
local function key(path)
  sh(("%s genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out %s")
    :format(q(OPENSSL), q(path)))
end

-- A self-signed CA certificate for key_path.
local function ca(dir, name, key_path, cert_path)
  local ext = dir .. "/" .. name .. ".ext"
  write(ext, table.concat({
    "[req]", "distinguished_name = dn", "prompt = no",
    "[dn]", "CN = " .. name,
    "[v3_ca]",
    "basicConstraints = critical, CA:TRUE",
    "keyUsage = critical, keyCertSign, cRLSign",
    "subjectKeyIdentifier = hash",
    "",
  }, "\n"))
  sh(("%s req -x509 -new -key %s -out %s -days %s -config %s -extensions v3_ca")
    :format(q(OPENSSL), q(key_path), q(cert_path), DAYS, q(ext)))
end

-- A leaf certificate for key_path signed by ca; san is e.g.
-- "DNS:localhost, IP:127.0.0.1" (nil for none); usage "serverAuth" or
-- "clientAuth"; its subject's CN is cn (default: name).
local function leaf(dir, name, key_path, cert_path, ca_cert, ca_key, san, usage, cn)
  local ext = dir .. "/" .. name .. ".ext"
  local lines = {
    "[req]", "distinguished_name = dn", "prompt = no",
    "[dn]", "CN = " .. (cn or name),
    "[v3_leaf]",
    "basicConstraints = critical, CA:FALSE",
    "keyUsage = critical, digitalSignature, keyEncipherment",
    "extendedKeyUsage = " .. usage,
  }
  if san then lines[#lines + 1] = "subjectAltName = " .. san end
  lines[#lines + 1] = ""
  write(ext, table.concat(lines, "\n"))
  local csr = dir .. "/" .. name .. ".csr"
  sh(("%s req -new -key %s -out %s -config %s")
    :format(q(OPENSSL), q(key_path), q(csr), q(ext)))
  sh(("%s x509 -req -in %s -CA %s -CAkey %s -CAcreateserial -out %s -days %s -extfile %s -extensions v3_leaf")
    :format(q(OPENSSL), q(csr), q(ca_cert), q(ca_key), q(cert_path), DAYS, q(ext)))
  os.remove(csr)
end

--- Make (once per process) and return the table of absolute paths.
function M.make()
  if made then return made end
  local base = os.getenv("TMPDIR") or "/tmp"
  local dir = sh("mktemp -d " .. q(base .. "/redlock-tls.XXXXXX")):gsub("%s+$", "")
  if dir:sub(1, 1) ~= "/" then
    dir = sh("cd " .. q(dir) .. " && pwd"):gsub("%s+$", "")
  end
  local p = function(f) return dir .. "/" .. f end
  local t = {
    dir = dir,
    ca = p("ca.crt"), ca_key = p("ca.key"),
    server_cert = p("server.crt"), server_key = p("server.key"),
    client_cert = p("client.crt"), client_key = p("client.key"),
    wrong_ca = p("wrong-ca.crt"), wrong_ca_key = p("wrong-ca.key"),
    other_cert = p("other.crt"), other_key = p("other.key"),
    localhost_cert = p("localhost.crt"), localhost_key = p("localhost.key"),
    nosan_cert = p("nosan.crt"), nosan_key = p("nosan.key"),
  }
  local ok, err = pcall(function()
    key(t.ca_key)
    ca(dir, "redlock-test-ca", t.ca_key, t.ca)
    key(t.wrong_ca_key)
    ca(dir, "redlock-wrong-ca", t.wrong_ca_key, t.wrong_ca)
    key(t.server_key)
    leaf(dir, "server", t.server_key, t.server_cert, t.ca, t.ca_key,
      "DNS:localhost, IP:127.0.0.1", "serverAuth")
    key(t.client_key)
    leaf(dir, "client", t.client_key, t.client_cert, t.ca, t.ca_key, nil, "clientAuth")
    key(t.other_key)
    leaf(dir, "other", t.other_key, t.other_cert, t.ca, t.ca_key,
      "DNS:other.example", "serverAuth")
    key(t.localhost_key)
    leaf(dir, "localhost", t.localhost_key, t.localhost_cert, t.ca, t.ca_key, "DNS:localhost", "serverAuth")
    key(t.nosan_key)
    leaf(dir, "nosan", t.nosan_key, t.nosan_cert, t.ca, t.ca_key, nil, "serverAuth", "localhost")
  end)
  if not ok then
    os.execute("rm -rf -- " .. q(dir))
    error(err, 2)
  end
  made = t
  return t
end

-- Worker processes get their tls options through the environment.
local ENV = { cafile = "REDLOCK_SPEC_TLS_CAFILE", certfile = "REDLOCK_SPEC_TLS_CERTFILE",
              keyfile = "REDLOCK_SPEC_TLS_KEYFILE", server_name = "REDLOCK_SPEC_TLS_SERVER_NAME" }

--- The environment variables that hand tls options (cafile, certfile,
-- keyfile, server_name) to a worker process; env: a table to add them to.
function M.env(opts, env)
  env = env or {}
  for k, name in pairs(ENV) do
    if opts[k] then env[name] = opts[k] end
  end
  return env
end

--- In a worker: the tls options M.env handed over, or nil.
function M.from_env()
  local t
  for k, name in pairs(ENV) do
    local v = os.getenv(name)
    if v and v ~= "" then
      t = t or {}
      t[k] = v
    end
  end
  return t
end

--- Remove the certificates' directory (the next make() creates a new one).
function M.cleanup()
  if made then
    os.execute("rm -rf -- " .. q(made.dir))
    made = nil
  end
end

return M
