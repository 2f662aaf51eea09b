# manpage.cmake — make redlock(1) from the host's own help texts (cmake -P).
#
#   cmake -DREDLOCK=path/to/redlock -DHELP2MAN=help2man -DINCLUDE=redlock.h2m
#         -DVERSION=0.4.0 -DOUT=redlock.1 -P manpage.cmake
#
# help2man turns `redlock --help` into the page; every command listed under
# "Commands:" there gets a section of its own, made by help2man from
# `redlock COMMAND --help` (its SYNOPSIS, DESCRIPTION and OPTIONS, one level
# down).
# INCLUDE adds NAME, SEE ALSO and COPYRIGHT. Nothing is written by hand, so
# the page says what the executable says.

foreach(var REDLOCK HELP2MAN INCLUDE VERSION OUT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "manpage.cmake: -D${var}=... is missing")
  endif()
endforeach()

function(run out)
  execute_process(COMMAND ${ARGN} OUTPUT_VARIABLE text ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    string(REPLACE ";" " " cmd "${ARGN}")
    message(FATAL_ERROR "manpage.cmake: '${cmd}' failed (${rc}): ${err}")
  endif()
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

# The commands: the first word of each line of the "Commands:" block.
run(help ${REDLOCK} --help)
string(REGEX MATCH "\nCommands:\n([^\n]+\n)+" block "${help}")
string(REGEX MATCHALL "\n  [a-z][a-z-]*" words "${block}")
set(commands "")
foreach(w IN LISTS words)
  string(STRIP "${w}" w)
  list(APPEND commands "${w}")
endforeach()
if(NOT commands)
  message(WARNING "manpage.cmake: no \"Commands:\" block in 'redlock --help': no section per command")
endif()

get_filename_component(dir "${OUT}" DIRECTORY)
set(sections "${dir}/redlock-commands.h2m")
file(WRITE "${sections}" "")
foreach(cmd IN LISTS commands)
  run(page ${HELP2MAN} --no-info "--version-string=${VERSION}" "--help-option=${cmd} --help" ${REDLOCK})
  # From its SYNOPSIS (the "Usage: redlock CMD ..." line) to the end.
  string(FIND "${page}" "\n.SH SYNOPSIS\n" at)
  if(at LESS 0)
    message(FATAL_ERROR "manpage.cmake: help2man found no usage line in 'redlock ${cmd} --help'")
  endif()
  string(SUBSTRING "${page}" ${at} -1 body)
  # Its sections (SYNOPSIS, DESCRIPTION, OPTIONS, ...) become subsections of
  # the command's.
  string(REGEX REPLACE "\n\\.SH ([^\n]*)" "\n.SS \\1" body "${body}")
  string(SUBSTRING "${body}" 1 -1 body)
  string(TOUPPER "${cmd}" upper)
  file(APPEND "${sections}" "[REDLOCK ${upper}]\n${body}\n")
endforeach()

run(ignored ${HELP2MAN} --no-info "--version-string=${VERSION}" --section=1
    "--include=${INCLUDE}" "--include=${sections}" --output=${OUT} ${REDLOCK})
