// PLACEHOLDER — replaced by the real command before anything lands.
#include "commands.hpp"
#include <iostream>
namespace flashlab::app {
int cmd_step(const Args&) { std::cerr << "error: flashlab step is not built yet\n"; return kFailed; }
}  // namespace flashlab::app
