-- One version: CMakeLists.txt's project(VERSION) is the source, and every
-- place that states a version says the same: redlock.h (RL_VERSION and its
-- numbers), the library (rl_version), the Lua modules (_VERSION), the host
-- (--version), the release rockspec, the pkg-config file, the Debian package
-- and its changelog, the man page and CHANGELOG.md. Reads the build tree
-- (REDLOCK_BUILD_DIR, default build/) for what the build makes.

local proc = require "helpers.proc"

local ROOT, BUILD = proc.root, proc.build

local function read(path)
  return assert(proc.read_file(path), "cannot read " .. path)
end

local VERSION = read(ROOT .. "/CMakeLists.txt"):match("\nproject%(redlock VERSION (%d+%.%d+%.%d+)")

-- A rockspec's fields, read the way LuaRocks reads one (a Lua chunk in an
-- empty environment).
local function rockspec(path)
  local chunk = assert(loadfile(path))
  local t = {}
  setfenv(chunk, t)
  chunk()
  return t
end

describe("the version", function()
  it("is stated by CMakeLists.txt's project()", function()
    assert.is_string(VERSION, "no 'project(redlock VERSION X.Y.Z' in CMakeLists.txt")
  end)

  it("is redlock.h's RL_VERSION, and its numbers", function()
    local h = read(ROOT .. "/core/include/redlock.h")
    assert.are.equal(VERSION, h:match('\n#define RL_VERSION "([^"]*)"'))
    local major, minor, patch = VERSION:match("^(%d+)%.(%d+)%.(%d+)$")
    assert.are.equal(major, h:match("\n#define RL_VERSION_MAJOR (%d+)"))
    assert.are.equal(minor, h:match("\n#define RL_VERSION_MINOR (%d+)"))
    assert.are.equal(patch, h:match("\n#define RL_VERSION_PATCH (%d+)"))
  end)

  it("is what the library's rl_version() returns", function()
    local ffi = require "ffi"
    assert.are.equal(VERSION, ffi.string(require("redlock.cdefs").lib.rl_version()))
  end)

  it("is the Lua modules' _VERSION", function()
    local redlock = require "redlock"
    assert.are.equal(VERSION, redlock._VERSION)
    assert.are.equal(VERSION, redlock.core_version)
    assert.are.equal(VERSION, require("redlock.devcluster")._VERSION)
  end)

  it("is what redlock --version prints", function()
    local out, rc = proc.sh(proc.quote(BUILD .. "/redlock") .. " --version")
    assert.are.equal(0, rc, out)
    assert.are.equal("redlock " .. VERSION .. " ", out:match("^redlock %S+ "), out)
  end)

  it("is the release rockspec's, rocks/redlock-" .. tostring(VERSION) .. "-1.rockspec", function()
    local path = ROOT .. "/rocks/redlock-" .. VERSION .. "-1.rockspec"
    assert.is_truthy(proc.read_file(path), "no " .. path)
    local spec = rockspec(path)
    assert.are.equal("redlock", spec.package)
    assert.are.equal(VERSION .. "-1", spec.version)
    -- scripts/pack-rock packs the tarball of that name beside it.
    assert.are.equal("redlock-" .. VERSION .. ".tar.gz", spec.source.url)
    assert.are.equal("redlock-" .. VERSION, spec.source.dir)
  end)

  it("is the pkg-config file's", function()
    local pc = read(BUILD .. "/redlock.pc")
    assert.are.equal(VERSION, pc:match("\nVersion: (%S+)"))
  end)

  it("is the Debian package's, with its changelog entry", function()
    local cpack = read(BUILD .. "/CPackConfig.cmake")
    assert.are.equal(VERSION, cpack:match('\nset%(CPACK_PACKAGE_VERSION "([^"]*)"%)'))
    local release = cpack:match('\nset%(CPACK_DEBIAN_PACKAGE_RELEASE "([^"]*)"%)')
    assert.is_truthy(release, "CPACK_DEBIAN_PACKAGE_RELEASE is not set")
    local changelog = read(BUILD .. "/deb/changelog.Debian")
    assert.are.equal("redlock (" .. VERSION .. "-" .. release .. ")", changelog:match("^redlock %(%S+%)"))
  end)

  it("is the man page's", function()
    local page = read(BUILD .. "/redlock.1")
    assert.are.equal("redlock " .. VERSION, page:match('\n%.TH REDLOCK "1" "[^"]*" "([^"]*)"'))
  end)

  it("has the first entry of CHANGELOG.md, dated", function()
    local changelog = read(ROOT .. "/CHANGELOG.md")
    local first = changelog:match("\n## %[(%d+%.%d+%.%d+)%] %- %d%d%d%d%-%d%d%-%d%d\n")
    assert.are.equal(VERSION, first)
  end)
end)

describe("the license", function()
  it("is MIT, in LICENSE", function()
    local license = read(ROOT .. "/LICENSE")
    assert.is_truthy(license:match("^MIT License\n\nCopyright %(c%) %d+ the redlock authors\n"), license:sub(1, 200))
  end)

  it("is named by the rockspecs and the Debian package", function()
    assert.are.equal("MIT", rockspec(ROOT .. "/rocks/redlock-" .. VERSION .. "-1.rockspec").description.license)
    assert.are.equal("MIT", rockspec(ROOT .. "/redlock-scm-1.rockspec").description.license)
    local copyright = read(BUILD .. "/deb/copyright")
    assert.is_truthy(copyright:match("\nLicense: Expat\n Permission is hereby granted"), copyright)
  end)
end)
