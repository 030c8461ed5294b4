// PLACEHOLDER — replaced by the real command before anything lands.
#include "commands.hpp"
#include <iostream>
namespace flashlab::app {
int cmd_run(const Args&) { std::cerr << "error: flashlab run is not built yet\n"; return kFailed; }
int cmd_machines(const Args&) { std::cerr << "error: not built yet\n"; return kFailed; }
}  // namespace flashlab::app
