# Writes the viewer's page into a C++ source as a byte array, so the flashlab binary serves it
# without reading any file at run time. Run at build time:
#   cmake -DIN=index.html -DOUT=stream_viewer_page.cpp -P embed.cmake
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" hex_length)
math(EXPR size "${hex_length} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
string(REGEX REPLACE "(0x[0-9a-f][0-9a-f],0x[0-9a-f][0-9a-f],0x[0-9a-f][0-9a-f],0x[0-9a-f][0-9a-f],0x[0-9a-f][0-9a-f],0x[0-9a-f][0-9a-f],0x[0-9a-f][0-9a-f],0x[0-9a-f][0-9a-f],0x[0-9a-f][0-9a-f],0x[0-9a-f][0-9a-f],0x[0-9a-f][0-9a-f],0x[0-9a-f][0-9a-f],0x[0-9a-f][0-9a-f],0x[0-9a-f][0-9a-f],0x[0-9a-f][0-9a-f],0x[0-9a-f][0-9a-f])" "\\1\n" bytes "${bytes}")
file(WRITE "${OUT}.tmp"
"// Generated at build time from app/stream/viewer/index.html by app/stream/viewer/embed.cmake.\n"
"#include <string_view>\n"
"namespace flashlab::app {\n"
"namespace {\n"
"const unsigned char kPage[] = {\n${bytes}0x00};\n"
"}  // namespace\n"
"std::string_view viewer_page() { return {reinterpret_cast<const char*>(kPage), ${size}}; }\n"
"}  // namespace flashlab::app\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
