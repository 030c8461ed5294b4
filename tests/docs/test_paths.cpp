// Every path of the repository that a page or a comment names exists in the tree: the Markdown
// pages (README.md, docs/, the READMEs beside the code and the data), the comments of the sources,
// scripts and CMake files. A path is a word that starts with one of the repository's top folders
// (`cuda/src/attention/attention_fwd_ws.cu`, `docs/optimisation.md`, `tests/cuda/`); braces name
// several (`mta_{fwd,bwd}.cu`), a `*` any that matches, and a path cut off by `…` or `<name>`
// stands for its folder. A page moved or deleted without its mentions fails here, naming the
// file and line of each mention.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

// The repository's top folders: a word starting with one of them and a '/' is a repository path.
const std::vector<std::string> kTopFolders = {"app",     "bench",     "capi",  "cuda",      "docs",  "examples",
                                              "fuzz",    "lessons",   "python", "reference", "tests", "toymachine"};

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// What of a file is checked: Markdown whole, other text files their comments only.
enum class Kind { markdown, slash_comments, hash_comments, none };

Kind kind_of(const fs::path& p) {
  const std::string name = p.filename().string(), ext = p.extension().string();
  if (ext == ".md") return Kind::markdown;
  if (ext == ".cpp" || ext == ".hpp" || ext == ".h" || ext == ".c" || ext == ".cu" || ext == ".cuh")
    return Kind::slash_comments;
  if (ext == ".sh" || ext == ".py" || ext == ".cmake" || ext == ".in" || name == "CMakeLists.txt" ||
      name == "Makefile")
    return Kind::hash_comments;
  return Kind::none;
}

/// The text of a file that may name paths, line by line (other characters blanked, so line numbers
/// stay right): comments of C-like sources (// and /* */, outside string literals), # comments of
/// scripts and CMake files, and Markdown whole.
std::string checked_text(const std::string& text, Kind kind) {
  if (kind == Kind::markdown) return text;
  std::string out(text.size(), ' ');
  bool in_line = false, in_block = false, in_string = false;
  char quote = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      out[i] = '\n';
      in_line = false;
      if (kind == Kind::hash_comments) in_string = false;
      continue;
    }
    if (in_line || in_block) {
      out[i] = c;
      if (in_block && c == '*' && i + 1 < text.size() && text[i + 1] == '/') in_block = false;
      continue;
    }
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == quote) in_string = false;
      continue;
    }
    if (kind == Kind::slash_comments) {
      if (c == '/' && i + 1 < text.size() && text[i + 1] == '/') in_line = true;
      else if (c == '/' && i + 1 < text.size() && text[i + 1] == '*') in_block = true;
      else if (c == '"' || (c == '\'' && !(i > 0 && std::isalnum(static_cast<unsigned char>(text[i - 1])))))
        in_string = true, quote = c;  // a ' after a letter or digit is a digit separator or an apostrophe
    } else if (c == '#') {
      in_line = true;
    } else if (c == '"' || c == '\'') {
      in_string = true, quote = c;
    }
  }
  return out;
}

/// `a{b,c}d` → {abd, acd} (nested braces expanded one level at a time).
std::vector<std::string> expand_braces(const std::string& s) {
  const auto open = s.find('{');
  if (open == std::string::npos) return {s};
  const auto close = s.find('}', open);
  if (close == std::string::npos) return {s.substr(0, open)};
  std::vector<std::string> out;
  std::string alt;
  std::istringstream parts(s.substr(open + 1, close - open - 1));
  while (std::getline(parts, alt, ','))
    for (const std::string& rest : expand_braces(s.substr(close + 1))) out.push_back(s.substr(0, open) + alt + rest);
  return out;
}

/// Whether a path (relative to the repository, possibly with `*` in its last part) names something.
bool exists_at(const fs::path& root, const std::string& path) {
  const auto star = path.find('*');
  if (star == std::string::npos) return fs::exists(root / path);
  const auto slash = path.rfind('/', star);
  const std::string dir = path.substr(0, slash), pattern = path.substr(slash + 1);
  if (!fs::is_directory(root / dir)) return false;
  std::string re;
  for (const char c : pattern) {
    if (c == '*') re += ".*";
    else if (std::string(".^$|()[]+?\\").find(c) != std::string::npos) re += std::string("\\") + c;
    else re += c;
  }
  const std::regex match(re);
  for (const auto& entry : fs::directory_iterator(root / dir))
    if (std::regex_match(entry.path().filename().string(), match)) return true;
  return false;
}

/// Whether a path that a file names exists: from the repository's root, from the file's folder (a
/// CMakeLists.txt naming the sources of its subfolders), or as a library's header or source folder
/// the way includes name them (`toymachine/policy.hpp` is a header of toymachine/include/flashlab/,
/// `reference/stream` the folder reference/src/stream).
bool exists_in_tree(const fs::path& root, const std::string& path, const std::string& file) {
  const std::string top = path.substr(0, path.find('/')), rest = path.substr(path.find('/') + 1);
  const std::string folder = fs::path(file).parent_path().generic_string();
  for (const std::string& candidate : {path, folder.empty() ? path : folder + "/" + path,
                                       top + "/include/flashlab/" + path, top + "/src/" + rest})
    if (exists_at(root, candidate)) return true;
  return false;
}

/// A path whose folder or name is a placeholder (`fuzz/corpus/NAME/`, `lessons/data/ID/`) stands
/// for the folder above the placeholder.
std::string cut_placeholder(const std::string& path) {
  static const std::set<std::string> placeholders = {"NAME", "ID", "LABEL", "X"};
  std::size_t start = 0;
  while (start < path.size()) {
    const std::size_t slash = path.find('/', start);
    const std::string part = path.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    std::string token;
    std::istringstream words(std::regex_replace(part, std::regex("[_.-]"), " "));
    while (words >> token)
      if (placeholders.count(token)) return path.substr(0, start);
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return path;
}

struct Mention {
  std::string where;  // file:line
  std::string path;
};

/// The repository paths a text names. `file` is the text's own path (for `../` links).
std::vector<Mention> mentions(const std::string& text, const std::string& file) {
  std::string tops;
  for (const std::string& t : kTopFolders) tops += (tops.empty() ? "" : "|") + t;
  // A top folder and '/', then path characters; braces and '*' name several.
  const std::regex path_re("(" + tops + R"()/[A-Za-z0-9_.{},*+/-]*)");
  std::vector<Mention> out;
  std::istringstream lines(text);
  std::string line;
  int number = 0;
  while (std::getline(lines, line)) {
    ++number;
    for (auto it = std::sregex_iterator(line.begin(), line.end(), path_re); it != std::sregex_iterator(); ++it) {
      const auto at = std::size_t(it->position(0));
      std::string path = it->str(0);
      std::string base_dir;  // a `../` link is relative to the file's folder
      if (at > 0) {
        const char before = line[at - 1];
        if (before == '/') {
          if (at >= 3 && line.compare(at - 3, 3, "../") == 0) {
            base_dir = fs::path(file).parent_path().parent_path().generic_string();
          } else {
            continue;  // the tail of a longer path: build/cuda/app/flashlab, https://…/docs/…
          }
        } else if (std::isalnum(static_cast<unsigned char>(before)) || before == '_' || before == '-' ||
                   before == '.' || before == '~' || before == '$' || before == '@') {
          continue;  // part of another word or a variable: my_app/…, ${PROJECT_SOURCE_DIR}/…
        }
      }
      const std::size_t after = at + it->length(0);
      // Cut off by a placeholder or an ellipsis: the folder stands for the path.
      const bool cut = after < line.size() &&
                       (line[after] == '<' || line.compare(after, 3, "…") == 0 || line.compare(after, 3, "...") == 0);
      while (!path.empty() && std::string(".,:;)").find(path.back()) != std::string::npos) path.pop_back();
      if (path.size() >= 3 && path.compare(path.size() - 3, 3, "...") == 0) path.resize(path.size() - 3);
      if (cut || path.find("...") != std::string::npos) path = path.substr(0, path.rfind('/') + 1);
      path = cut_placeholder(path);
      if (!base_dir.empty()) path = (fs::path(base_dir) / path).lexically_normal().generic_string();
      out.push_back({file + ":" + std::to_string(number), path});
    }
  }
  return out;
}

/// Every file of the repository whose text is checked (the build folder and .git left out).
std::vector<fs::path> checked_files(const fs::path& root) {
  std::vector<fs::path> files;
  for (const char* top : {"README.md", "CMakeLists.txt", "Makefile"})
    if (fs::exists(root / top)) files.push_back(root / top);
  for (const std::string& top : kTopFolders) {
    if (!fs::is_directory(root / top)) continue;
    for (auto it = fs::recursive_directory_iterator(root / top); it != fs::recursive_directory_iterator(); ++it)
      if (it->is_regular_file() && kind_of(it->path()) != Kind::none) files.push_back(it->path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

TEST_CASE("paths: the path finder reads comments, braces, stars, links and cut-off paths", "[docs][paths]") {
  const std::string src = "f(\"docs/not_a_comment.md\");  // see docs/x.md, and `docs/y.md`\n"
                          "/* cuda/src/{core,mta}/y.cuh */ const char* s = \"app/z\";\n"
                          "x = 'docs/q.md';  // build/cuda/app/flashlab and docs/plots_*.svg.\n";
  const std::string text = checked_text(src, Kind::slash_comments);
  std::vector<std::string> found;
  for (const Mention& m : mentions(text, "cuda/RESULTS.md")) found.push_back(m.where + " " + m.path);
  CHECK(found == std::vector<std::string>{"cuda/RESULTS.md:1 docs/x.md", "cuda/RESULTS.md:1 docs/y.md",
                                          "cuda/RESULTS.md:2 cuda/src/{core,mta}/y.cuh",
                                          "cuda/RESULTS.md:3 docs/plots_*.svg"});
  CHECK(expand_braces("cuda/src/{core,mta}/y.cuh") == std::vector<std::string>{"cuda/src/core/y.cuh", "cuda/src/mta/y.cuh"});
  const auto md = mentions("![p](../docs/a.svg) `tests/cuda/` bench/bench_<name>.cpp lessons/data/… fuzz/fuzz_NAME.cpp "
                           "cuda/FAST_NOTES.md",
                           "cuda/RESULTS.md");
  REQUIRE(md.size() == 6);
  CHECK(md[0].path == "docs/a.svg");
  CHECK(md[1].path == "tests/cuda/");
  CHECK(md[2].path == "bench/");
  CHECK(md[3].path == "lessons/data/");
  CHECK(md[4].path == "fuzz/");
  CHECK(md[5].path == "cuda/FAST_NOTES.md");
  const fs::path root = FLASHLAB_SOURCE_DIR;
  CHECK(exists_in_tree(root, "toymachine/cmd_step.cpp", "app/CMakeLists.txt"));      // beside the file
  CHECK(exists_in_tree(root, "toymachine/policy.hpp", "lessons/src/checker.cpp"));   // as included
  CHECK(!exists_in_tree(root, "cuda/FAST_NOTES.md", "cuda/src/attention/attention_fwd_tc.cu"));
  CHECK(exists_at(root, "docs/measured_*.svg"));
  CHECK(!exists_at(root, "docs/measured_*.nothing"));
  CHECK(checked_text("set(x \"docs/a.md\")  # docs/b.md\n", Kind::hash_comments).find("docs/a.md") == std::string::npos);
}

TEST_CASE("paths: every repository path named in a page or a comment exists", "[docs][paths]") {
  const fs::path root = FLASHLAB_SOURCE_DIR;
  int checked = 0;
  std::set<std::string> missing;
  for (const fs::path& file : checked_files(root)) {
    const std::string rel = fs::relative(file, root).generic_string();
    for (const Mention& m : mentions(checked_text(read_text(file), kind_of(file)), rel)) {
      ++checked;
      bool found = false;
      for (const std::string& p : expand_braces(m.path)) found = found || exists_in_tree(root, p, rel);
      if (!found) missing.insert(m.where + ": " + m.path);
    }
  }
  INFO(checked << " mentions checked");
  CHECK(checked > 300);  // the pages name hundreds of paths: far fewer means the finder broke
  for (const std::string& m : missing) FAIL_CHECK("no such path in the tree: " << m);
}
