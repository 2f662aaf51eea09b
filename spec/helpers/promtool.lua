-- Spec helper: `promtool check metrics` (Debian's prometheus package) on an
-- exposition text. check(text) returns ok, promtool's output.

local proc = require "helpers.proc"

local M = {}

--- Is promtool installed?
function M.available()
  local _, rc = proc.sh("command -v promtool")
  return rc == 0
end

--- Run `promtool check metrics` on text: true if it passes (lint
--- warnings included), and what it printed.
function M.check(text)
  local dir = proc.tmpdir()
  local path = dir .. "/metrics.txt"
  proc.write_file(path, text)
  local out, rc = proc.sh("promtool check metrics < " .. proc.quote(path))
  proc.rmdir(dir)
  return rc == 0 and out == "", out
end

return M
