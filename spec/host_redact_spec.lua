-- The host's redaction of passwords in what it prints: the linear form
-- (lua/redlock/host/init.lua) against the two gsub patterns it replaced,
-- whose time was quadratic in a run of letters (a long resource name).

local host = require "redlock.host.init"

-- The gsub form, as it was (the reference).
local function redact_cut(scheme, user, rest)
  if rest:sub(1, 3) == "***" then return nil end
  if user ~= "" and (user:sub(1, 1) == "[" or rest:match("^port$") or rest:match("^port[+)]")
      or rest:match("^%d+[:.;]?$") or rest:match("^%d+[/?)%]+]")
      or rest:match("^%d+[;|]%a[%w+.-]*://")) then
    return nil
  end
  return scheme .. user .. ":***"
end

local function reference(text)
  text = text:gsub("(%a[%w+.-]*://[^:/@%s'\",]*:)[^@%s'\",]*@", "%1***@")
  return (text:gsub("(%a[%w+.-]*://)([^:/@%s'\",]*):([^@%s'\",]*)", redact_cut))
end

describe("the host's redaction of passwords", function()
  it("hides them as before", function()
    for text, want in pairs {
      ["cannot reach redis://u:secret@127.0.0.1:6379/0"] = "cannot reach redis://u:***@127.0.0.1:6379/0",
      ["redis://:pw@h:1, rediss://a:b@h:2"] = "redis://:***@h:1, rediss://a:***@h:2",
      ["a list cut at a comma: redis://u:pa"] = "a list cut at a comma: redis://u:***",
      ["keeps ports: redis://127.0.0.1:6379"] = "keeps ports: redis://127.0.0.1:6379",
      ["no URL at all: " .. ("r"):rep(100)] = "no URL at all: " .. ("r"):rep(100),
    } do
      assert.are.equal(want, host.redact(text))
    end
  end)

  it("gives what the gsub form gives, on 100,000 random texts of URL pieces", function()
    local pieces = { "a", "b", "1", "+", ".", "-", ":", "/", "@", " ", "'", ",", "[", "]", ";", "|",
                     "redis", "://", "port", "***", "6379" }
    local seed = os.time()
    math.randomseed(seed)
    for _ = 1, 100000 do
      local parts = {}
      for i = 1, math.random(0, 24) do parts[i] = pieces[math.random(#pieces)] end
      local text = table.concat(parts)
      assert.are.equal(reference(text), host.redact(text), ("seed %d: %q"):format(seed, text))
    end
  end)
end)
