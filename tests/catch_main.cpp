// The one Catch2 main shared by every test executable (Catch2 v2 ships no Catch2WithMain).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
