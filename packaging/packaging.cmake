# packaging.cmake — what `cmake --install` adds for C programs and people
# (the shared library, redlock.h, redlock.pc, the man page, the docs), and the
# Debian package CPack makes of an install to /usr (scripts/pack-deb):
#
#   cmake -S . -B build-deb -DCMAKE_INSTALL_PREFIX=/usr && cmake --build build-deb
#   (cd build-deb && cpack)                  # redlock_X.Y.Z-1_ARCH.deb
#
# The package holds what a plain install does, plus Debian's own doc files
# (copyright, changelog.gz, changelog.Debian.gz: the "deb" component, left
# out of `cmake --install`). Its dependencies are read off the binaries by
# dpkg-shlibdeps. With the prefix /usr, the Lua modules land in
# /usr/share/lua/5.1 and redlock_core.so in /usr/lib/<triplet>/lua/5.1, where
# LuaJIT and nginx's lua module look without any path settings.

include(GNUInstallDirs)
find_program(GZIP gzip REQUIRED)

# -- C programs: libredlock.so, redlock.h, redlock.pc -------------------------
if(REDLOCK_C_LIBRARY)
  install(TARGETS redlock_shared LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(FILES core/include/redlock.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  configure_file(packaging/redlock.pc.in redlock.pc @ONLY)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/redlock.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endif()

# -- redlock(1), from the host's --help texts (packaging/manpage.cmake) --------
if(TARGET redlock)
  find_program(HELP2MAN help2man)
  if(HELP2MAN)
    configure_file(packaging/redlock.h2m.in redlock.h2m @ONLY)
    file(GLOB REDLOCK_HOST_LUA CONFIGURE_DEPENDS lua/redlock/host/*.lua)
    add_custom_command(OUTPUT redlock.1 redlock.1.gz
      COMMAND ${CMAKE_COMMAND} -DREDLOCK=$<TARGET_FILE:redlock> -DHELP2MAN=${HELP2MAN}
              -DINCLUDE=${CMAKE_CURRENT_BINARY_DIR}/redlock.h2m -DVERSION=${PROJECT_VERSION}
              -DOUT=${CMAKE_CURRENT_BINARY_DIR}/redlock.1 -P ${PROJECT_SOURCE_DIR}/packaging/manpage.cmake
      COMMAND ${GZIP} -9nf -k redlock.1
      DEPENDS redlock ${REDLOCK_HOST_LUA} packaging/manpage.cmake ${CMAKE_CURRENT_BINARY_DIR}/redlock.h2m
      COMMENT "Generating the man page redlock.1 from redlock --help")
    add_custom_target(redlock_man ALL DEPENDS redlock.1.gz)
    install(FILES ${CMAKE_CURRENT_BINARY_DIR}/redlock.1.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
  else()
    message(WARNING "help2man not found: no man page (on Debian: apt-get install help2man)")
  endif()
endif()

# -- documentation --------------------------------------------------------------
# Off in the rockspecs: LuaRocks passes no CMAKE_INSTALL_PREFIX, so the doc
# directory would be /usr/local's, outside the rock's tree.
if(REDLOCK_INSTALL_DOCS)
  # docs/ as in the checkout, so that README's links (docs/*.md) hold
  install(FILES README.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
  install(DIRECTORY docs/ DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs FILES_MATCHING PATTERN "*.md")
  # The license and the changelog under their own names; the package has them
  # as Debian's copyright and changelog.gz instead (below).
  install(FILES LICENSE CHANGELOG.md DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT plain)
endif()

# -- the Debian package ---------------------------------------------------------
set(REDLOCK_DEB_MAINTAINER "the redlock authors <maintainers@users.noreply.a-seed-6e2dd13f.example>"
  CACHE STRING "Maintainer field of the Debian package (Name <address>)")
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME redlock)
set(CPACK_PACKAGE_VENDOR "the redlock authors")
set(CPACK_PACKAGE_CONTACT "${REDLOCK_DEB_MAINTAINER}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "distributed locks (Redlock) over N independent Redis nodes")
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
"redlock takes a lock when a majority of independent Redis (or Valkey) masters
agree, asking all of them at once. It comes with fencing tokens, hand-off to
waiters in arrival order, and TLS.

This package holds the redlock command (run a command or a LuaJIT job script
while holding a lock, like flock(1) across machines), the LuaJIT module
(require \"redlock\", also inside nginx's Lua module with no path settings),
and the C library with its header and pkg-config file.")
set(CPACK_DEBIAN_PACKAGE_RELEASE 1)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION utils)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "luajit2 | luajit, libnginx-mod-http-lua, redis-server")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA ${PROJECT_SOURCE_DIR}/packaging/debian/triggers)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_STRIP_FILES ON)
set(CPACK_INSTALL_DEFAULT_DIRECTORY_PERMISSIONS
  OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
# One package of every component but "plain".
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_GROUPING ALL_COMPONENTS_IN_ONE)
set(CPACK_COMPONENTS_ALL Unspecified deb)
set(CPACK_VERBATIM_VARIABLES ON)
set(REDLOCK_DEB_VERSION "${PROJECT_VERSION}-${CPACK_DEBIAN_PACKAGE_RELEASE}")

# Debian's doc files: copyright (LICENSE in Debian's format), changelog.gz
# (CHANGELOG.md) and changelog.Debian.gz (one entry per package release,
# dated SOURCE_DATE_EPOCH when set, for a reproducible package).
file(READ LICENSE license)
string(REGEX MATCH "Copyright \\(c\\) ([^\n]+)" copyright "${license}")
set(copyright "${CMAKE_MATCH_1}")
string(FIND "${license}" "Permission is hereby granted" at)
string(SUBSTRING "${license}" ${at} -1 license)
string(STRIP "${license}" license)
string(REGEX REPLACE "\n\n" "\n.\n" license "${license}")
string(REGEX REPLACE "\n" "\n " license "${license}")
file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/deb/copyright
"Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: redlock

Files: *
Copyright: ${copyright}
License: Expat
 ${license}
")
string(TIMESTAMP REDLOCK_DEB_DATE "%a, %d %b %Y %H:%M:%S +0000" UTC)
configure_file(packaging/debian/changelog.in deb/changelog.Debian @ONLY)
add_custom_command(OUTPUT deb/changelog.gz deb/changelog.Debian.gz
  COMMAND ${GZIP} -9nc ${PROJECT_SOURCE_DIR}/CHANGELOG.md > deb/changelog.gz
  COMMAND ${GZIP} -9nf -k deb/changelog.Debian
  DEPENDS CHANGELOG.md ${CMAKE_CURRENT_BINARY_DIR}/deb/changelog.Debian)
add_custom_target(redlock_deb_docs ALL DEPENDS deb/changelog.gz deb/changelog.Debian.gz)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/deb/copyright ${CMAKE_CURRENT_BINARY_DIR}/deb/changelog.gz
              ${CMAKE_CURRENT_BINARY_DIR}/deb/changelog.Debian.gz
  DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT deb EXCLUDE_FROM_ALL)
install(FILES packaging/debian/lintian-overrides RENAME redlock
  DESTINATION ${CMAKE_INSTALL_DATADIR}/lintian/overrides COMPONENT deb EXCLUDE_FROM_ALL)

include(CPack)
