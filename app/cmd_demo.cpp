// PLACEHOLDER — replaced by the real command before anything lands.
#include "commands.hpp"
#include <iostream>
namespace flashlab::app {
int cmd_demo(const Args&) { std::cerr << "error: flashlab demo is not built yet\n"; return kFailed; }

}  // namespace flashlab::app
