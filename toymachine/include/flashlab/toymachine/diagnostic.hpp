/// @file diagnostic.hpp
/// @brief A located error in a trace or machine file, printed compiler-style with the source
/// line echoed and a caret under the offending token.
#pragma once

#include <string>

namespace flashlab::toy {

/// One error, located in a source file.
struct Diagnostic {
  std::string file;         ///< file name as given to the parser
  int line = 0;             ///< 1-based line
  int col = 0;              ///< 1-based column (in characters) of the offending token
  int length = 1;           ///< length of the token in characters (the caret run)
  std::string message;      ///< what is wrong, e.g. "machine matmul3 has no register R3"
  std::string hint;         ///< what to do, in the machine's words
  std::string source_line;  ///< the source line, echoed under the message
};

/// "file:line:col: error: msg\n  <source line>\n  <carets under token>\nhint: …\n"
/// (the source and caret lines are left out when source_line is empty, the hint line when hint is).
std::string format_diagnostic(const Diagnostic& d);

}  // namespace flashlab::toy
