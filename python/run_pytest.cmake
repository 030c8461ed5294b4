# Runs one pytest suite for CTest (python/CMakeLists.txt): PYTHONPATH at the package,
# FLASHLAB_LIBRARY at this build's libflashlab.so. Fails when pytest fails, and also when it
# collects no test at all (its exit code 5), so a mis-wired suite cannot pass.
#   cmake -DPYTHON=… -DSOURCE_DIR=… -DLIBRARY=… -DTESTS=path[|path…] [-DEXTRA_ENV=NAME=VALUE[|…]] -P run_pytest.cmake
if(NOT PYTHON)
  message(FATAL_ERROR "no Python ≥ 3.9 with pytest and numpy was found when CMake configured this build\n"
                      "hint: apt-get install python3-pytest python3-numpy (`make deps` does), then re-run cmake")
endif()
string(REPLACE "|" ";" TESTS "${TESTS}")
string(REPLACE "|" ";" EXTRA_ENV "${EXTRA_ENV}")
set(ENV{PYTHONPATH} "${SOURCE_DIR}/python")
set(ENV{FLASHLAB_LIBRARY} "${LIBRARY}")
set(ENV{PYTHONDONTWRITEBYTECODE} 1)
foreach(assignment IN LISTS EXTRA_ENV)
  string(FIND "${assignment}" "=" eq)
  string(SUBSTRING "${assignment}" 0 ${eq} key)
  math(EXPR start "${eq} + 1")
  string(SUBSTRING "${assignment}" ${start} -1 value)
  set(ENV{${key}} "${value}")
endforeach()
execute_process(COMMAND "${PYTHON}" -m pytest -q -p no:cacheprovider ${TESTS}
                WORKING_DIRECTORY "${SOURCE_DIR}" RESULT_VARIABLE rc)
if(rc EQUAL 5)
  message(FATAL_ERROR "pytest collected no tests from ${TESTS}")
elseif(NOT rc EQUAL 0)
  message(FATAL_ERROR "pytest failed (exit code ${rc})")
endif()
