-- Spec helper: one Redis command over a connected socket, for specs and their
-- helper processes. Works with luasocket and with nginx's cosockets alike
-- (both have send(data) and receive("*l") / receive(n)).
--
--   local resp = require "helpers.resp"
--   resp.call(sock, "SET", "counter", 1)   --> "+OK"
--   resp.call(sock, "GET", "counter")      --> "1" (nil for a nil bulk)
-- Other replies come back as their first line ("+OK", ":1", "-ERR ...").

local M = {}

function M.call(sock, ...)
  local t = { "*" .. select("#", ...) }
  for i = 1, select("#", ...) do
    local a = tostring((select(i, ...)))
    t[#t + 1] = "$" .. #a
    t[#t + 1] = a
  end
  assert(sock:send(table.concat(t, "\r\n") .. "\r\n"))
  local line = assert(sock:receive("*l"))
  if line:sub(1, 1) ~= "$" then return line end
  local n = tonumber(line:sub(2))
  if n < 0 then return nil end
  return assert(sock:receive(n + 2)):sub(1, n)
end

return M
